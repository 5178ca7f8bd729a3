// RUN: not bmt-opt %s --split-input-file --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' -o /dev/null 2>&1 | FileCheck %s

// Refusals of the gradient-completion proof (tensor-parallel-gradients.mlir
// has the decisions it makes): one error naming the parameter, the op and
// why; nothing is compiled.

// The per-head norm weight is also added to the block's output, where its
// gradient is the whole one on every rank: no one sum over the group is exact.
// CHECK: error: bmt-tensor-parallel: cannot split by --tensor-parallel 2: the gradient of the whole parameter h.0.q_norm.weight, read by aten::mul.Tensor in h.0.forward beside values split over the group, cannot be completed: each rank's gradient is a partial sum there, and it is read elsewhere too, where its gradient is already complete on every rank
// CHECK-NOT: error
bmt.parameter @h.0.wq : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.wo : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.0.q_norm.weight : tensor<8xf32> {requires_grad}
bmt.parameter @h.0.ln : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.wq : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.wo : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.q_norm.weight : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.ln : tensor<8xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %wq = bmt.get_global @h.0.wq : !bmt.tensor
  %wo = bmt.get_global @h.0.wo : !bmt.tensor
  %n = bmt.get_global @h.0.q_norm.weight : !bmt.tensor
  %ln = bmt.get_global @h.0.ln : !bmt.tensor
  %x1 = bmt.aten "aten::mul.Tensor"(%x, %ln) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x1, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %q = bmt.aten "aten::mul.Tensor"(%2, %n) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::transpose.int"(%2, -1, -2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::matmul"(%q, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::softmax.int"(%4, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::matmul"(%6, %2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::transpose.int"(%7, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::reshape"(%8, [2, 4, 16]) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::linear"(%9, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %11 = bmt.aten "aten::add.Tensor"(%10, %n, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %11 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %wq = bmt.get_global @h.1.wq : !bmt.tensor
  %wo = bmt.get_global @h.1.wo : !bmt.tensor
  %n = bmt.get_global @h.1.q_norm.weight : !bmt.tensor
  %ln = bmt.get_global @h.1.ln : !bmt.tensor
  %x1 = bmt.aten "aten::mul.Tensor"(%x, %ln) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x1, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %q = bmt.aten "aten::mul.Tensor"(%2, %n) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::transpose.int"(%2, -1, -2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::matmul"(%q, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::softmax.int"(%4, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::matmul"(%6, %2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::transpose.int"(%7, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::reshape"(%8, [2, 4, 16]) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::linear"(%9, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %11 = bmt.aten "aten::add.Tensor"(%10, %n, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %11 : !bmt.tensor
}

// -----

// A learned per-head scale [2] made [2, 1, 1] by a view: each rank would
// need its own heads' part of it, and the proof does not follow the view.
// CHECK: error: bmt-tensor-parallel: cannot split by --tensor-parallel 2: the gradient of the whole parameter h.0.scale, read by aten::mul.Tensor in h.0.forward beside values split over the group, reaches it through aten::view in h.0.forward, which the proof does not follow (calls, casts and pointwise ops with scalars)
// CHECK-NOT: error
bmt.parameter @h.0.wq : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.wo : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.0.scale : tensor<2xf32> {requires_grad}
bmt.parameter @h.0.ln : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.wq : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.wo : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.scale : tensor<2xf32> {requires_grad}
bmt.parameter @h.1.ln : tensor<8xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %wq = bmt.get_global @h.0.wq : !bmt.tensor
  %wo = bmt.get_global @h.0.wo : !bmt.tensor
  %n = bmt.get_global @h.0.scale : !bmt.tensor
  %ln = bmt.get_global @h.0.ln : !bmt.tensor
  %x1 = bmt.aten "aten::mul.Tensor"(%x, %ln) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x1, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %s3 = bmt.aten "aten::view"(%n, [2, 1, 1]) : (!bmt.tensor) -> !bmt.tensor
  %q = bmt.aten "aten::mul.Tensor"(%2, %s3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::transpose.int"(%2, -1, -2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::matmul"(%q, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::softmax.int"(%4, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::matmul"(%6, %2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::transpose.int"(%7, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::reshape"(%8, [2, 4, 16]) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::linear"(%9, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %10 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %wq = bmt.get_global @h.1.wq : !bmt.tensor
  %wo = bmt.get_global @h.1.wo : !bmt.tensor
  %n = bmt.get_global @h.1.scale : !bmt.tensor
  %ln = bmt.get_global @h.1.ln : !bmt.tensor
  %x1 = bmt.aten "aten::mul.Tensor"(%x, %ln) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x1, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %s3 = bmt.aten "aten::view"(%n, [2, 1, 1]) : (!bmt.tensor) -> !bmt.tensor
  %q = bmt.aten "aten::mul.Tensor"(%2, %s3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::transpose.int"(%2, -1, -2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::matmul"(%q, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::softmax.int"(%4, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::matmul"(%6, %2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::transpose.int"(%7, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::reshape"(%8, [2, 4, 16]) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::linear"(%9, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %10 : !bmt.tensor
}
