// RUN: not bmt-opt %s --split-input-file --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' -o /dev/null 2>&1 | FileCheck %s

// A chain the pass cannot follow (a softmax over the split dim) is not
// split; with no chain left the compile fails, saying which op stopped it.
// CHECK: error: bmt-tensor-parallel: found no chain to split (aten::softmax.int in h.0.forward: a softmax over the split dim (or over an unknown dim))
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::softmax.int"(%0, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::softmax.int"(%0, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}

// -----

// Heads that T does not divide: 3 heads of 8 over 2 ranks.
// CHECK: error: bmt-tensor-parallel: cannot split aten::view in h.0.forward by --tensor-parallel 2: a width of 24 is 3 heads of 8, and 3 heads are not divisible by --tensor-parallel 2
bmt.parameter @h.0.q : tensor<24x8xf32> {requires_grad}
bmt.parameter @h.0.o : tensor<8x24xf32> {requires_grad}
bmt.parameter @h.1.q : tensor<24x8xf32> {requires_grad}
bmt.parameter @h.1.o : tensor<8x24xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %q = bmt.get_global @h.0.q : !bmt.tensor
  %o = bmt.get_global @h.0.o : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %q, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 4, -1, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::reshape"(%1, [2, 4, -1]) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %o, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %q = bmt.get_global @h.1.q : !bmt.tensor
  %o = bmt.get_global @h.1.o : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %q, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 4, -1, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::reshape"(%1, [2, 4, -1]) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %o, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
