// RUN: not bmt-opt %s --split-input-file --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' -o /dev/null 2>&1 | FileCheck %s

// Chains the pass can follow but upstream's sharding-propagation cannot
// shard as one: it splits a parameter the chain reads, which the pass
// keeps whole (a program where a whole [16] bias meets the rank's 8
// columns). One error, naming the op; nothing is compiled.

// A bias added after the column-parallel matmul, not as its argument.
// CHECK: error: bmt-tensor-parallel: cannot split aten::add.Tensor in h.0.forward by --tensor-parallel 2: upstream's sharding-propagation splits parameter h.0.b (operand 1) along dim -1, which the pass keeps whole: the chain has no one sharding
// CHECK-NOT: error
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.0.b : tensor<16xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.b : tensor<16xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %b = bmt.get_global @h.0.b : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::add.Tensor"(%0, %b, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::gelu"(%1, "none") : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %b = bmt.get_global @h.1.b : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::add.Tensor"(%0, %b, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::gelu"(%1, "none") : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}

// -----

// A learned per-head scale [heads, 1, 1] on the scores: upstream splits it
// at the heads like the scores (its size-1 dims broadcast and stay whole).
// CHECK: error: bmt-tensor-parallel: cannot split aten::mul.Tensor in h.0.forward by --tensor-parallel 2: upstream's sharding-propagation splits parameter h.0.scale (operand 1) along dim -3, which the pass keeps whole: the chain has no one sharding
// CHECK-NOT: error
bmt.parameter @h.0.wq : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.wo : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.0.scale : tensor<2x1x1xf32> {requires_grad}
bmt.parameter @h.1.wq : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.wo : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.scale : tensor<2x1x1xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %wq = bmt.get_global @h.0.wq : !bmt.tensor
  %wo = bmt.get_global @h.0.wo : !bmt.tensor
  %scale = bmt.get_global @h.0.scale : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::transpose.int"(%2, -1, -2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::matmul"(%2, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::mul.Tensor"(%4, %scale) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::softmax.int"(%5, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::matmul"(%6, %2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::transpose.int"(%7, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::reshape"(%8, [2, 4, 16]) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::linear"(%9, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %10 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %wq = bmt.get_global @h.1.wq : !bmt.tensor
  %wo = bmt.get_global @h.1.wo : !bmt.tensor
  %scale = bmt.get_global @h.1.scale : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::transpose.int"(%2, -1, -2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::matmul"(%2, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::mul.Tensor"(%4, %scale) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::softmax.int"(%5, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::matmul"(%6, %2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::transpose.int"(%7, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::reshape"(%8, [2, 4, 16]) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::linear"(%9, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %10 : !bmt.tensor
}
