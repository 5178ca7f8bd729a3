// RUN: bmt-opt %s | FileCheck %s
// Print -> parse -> print is a fixed point, generic form included.
// RUN: bmt-opt %s | bmt-opt | FileCheck %s
// RUN: bmt-opt %s --mlir-print-op-generic | bmt-opt | FileCheck %s

// CHECK: bmt.parameter @wte.weight : tensor<16x8xf32> {aliases = ["lm_head.weight"], requires_grad}
bmt.parameter @wte.weight : tensor<16x8xf32> {aliases = ["lm_head.weight"], requires_grad}
// CHECK: bmt.parameter @ln.weight : tensor<8xbf16>{{$}}
bmt.parameter @ln.weight : tensor<8xbf16>
// CHECK: bmt.buffer @mask : tensor<1x1x4x4xi1> {persistent}
bmt.buffer @mask : tensor<1x1x4x4xi1> {persistent}
// CHECK: bmt.buffer @ids : tensor<1x4xi64>{{$}}
bmt.buffer @ids : tensor<1x4xi64>

// CHECK-LABEL: func.func @forward
func.func @forward(%ids: !bmt.tensor {bmt.name = "input_ids"}, %n: i64) -> (!bmt.tensor, i64, !bmt.none) {
  // CHECK: %[[W:.*]] = bmt.get_global @wte.weight : !bmt.tensor
  %w = bmt.get_global @wte.weight : !bmt.tensor
  // Operands in place, constants inline, nested lists mixing both.
  // CHECK: %[[E:.*]] = bmt.aten "aten::embedding"(%[[W]], %arg0, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %e = bmt.aten "aten::embedding"(%w, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  // CHECK: %[[V:.*]] = bmt.aten "aten::view"(%[[E]], [%arg1, -1, 8]) : (!bmt.tensor, i64) -> !bmt.tensor
  %v = bmt.aten "aten::view"(%e, [%n, -1, 8]) : (!bmt.tensor, i64) -> !bmt.tensor
  // Floats: finite ones plain, non-finite ones with their type so they read back as floats.
  // CHECK: bmt.aten "aten::layer_norm"(%[[V]], [8], #bmt.none, #bmt.none, 1.000000e-05, true)
  %l = bmt.aten "aten::layer_norm"(%v, [8], #bmt.none, #bmt.none, 1.0e-05, true) : (!bmt.tensor) -> !bmt.tensor
  // CHECK: bmt.aten "aten::where.ScalarOther"(%{{.*}}, %{{.*}}, 0xFFF0000000000000 : f64)
  %m = bmt.get_global @mask : !bmt.tensor
  %x = bmt.aten "aten::where.ScalarOther"(%m, %l, 0xFFF0000000000000 : f64) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  // Strings, devices, lists of optional tensors, empty lists.
  // CHECK: bmt.aten "aten::gelu"(%{{.*}}, "tanh")
  %g = bmt.aten "aten::gelu"(%x, "tanh") : (!bmt.tensor) -> !bmt.tensor
  // CHECK: bmt.aten "aten::arange"(%arg1, 4, #bmt.none, #bmt.device<"cuda:0">, false)
  %a = bmt.aten "aten::arange"(%n, 4, #bmt.none, #bmt.device<"cuda:0">, false) : (i64) -> !bmt.tensor
  // CHECK: bmt.aten "aten::index.Tensor"(%{{.*}}, [#bmt.none, %{{.*}}])
  %i = bmt.aten "aten::index.Tensor"(%g, [#bmt.none, %a]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  // CHECK: bmt.aten "aten::permute"(%{{.*}}, [])
  %p = bmt.aten "aten::permute"(%i, []) : (!bmt.tensor) -> !bmt.tensor
  // A list result spread over as many results as the program uses.
  // CHECK: %{{.*}}:3 = bmt.aten "aten::split.Tensor"(%{{.*}}, 8, 2) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor, !bmt.tensor)
  %s:3 = bmt.aten "aten::split.Tensor"(%p, 8, 2) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor, !bmt.tensor)
  // CHECK: bmt.aten "aten::size.int"(%{{.*}}, 0) : (!bmt.tensor) -> i64
  %d = bmt.aten "aten::size.int"(%s#0, 0) : (!bmt.tensor) -> i64
  // CHECK: bmt.num_to_tensor %{{.*}} : i64 -> !bmt.tensor
  %t = bmt.num_to_tensor %d : i64 -> !bmt.tensor
  // CHECK: bmt.constant dense<5.000000e-01> : tensor<f32>
  %c = bmt.constant dense<0.5> : tensor<f32>
  // CHECK: bmt.aten "aten::mul.Tensor"
  %r = bmt.aten "aten::mul.Tensor"(%t, %c) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  // CHECK: bmt.constant #bmt.none
  %none = bmt.constant #bmt.none
  // CHECK: bmt.constant 3 : i64
  %three = bmt.constant 3 : i64
  return %r, %three, %none : !bmt.tensor, i64, !bmt.none
}

// #bmt.tensor_split prints its defaults (padded_size 0, reduce_grad false, over "tensor")
// away and parses back.
// CHECK: bmt.parameter @split.qkv : tensor<4x12xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 1, chunks = 3>}
// CHECK: bmt.parameter @split.vocab : tensor<10x4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, padded_size = 12>}
// CHECK: bmt.parameter @split.norm : tensor<4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>}
// CHECK: bmt.parameter @split.experts : tensor<4x6x2xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, over = "expert">}
// CHECK: bmt.parameter @split.tensor : tensor<4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1>}
bmt.parameter @split.qkv : tensor<4x12xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 1, chunks = 3>}
bmt.parameter @split.vocab : tensor<10x4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, padded_size = 12>}
bmt.parameter @split.norm : tensor<4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>}
bmt.parameter @split.experts : tensor<4x6x2xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, over = "expert">}
bmt.parameter @split.tensor : tensor<4xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, over = "tensor">}
