// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' 2>&1 | FileCheck %s

// The gradient-completion proof (passes/TensorParallelGradients.cpp): every
// parameter the chains leave whole gets its decision. Here a per-head norm
// weight q_norm [head_dim 8] scales the head-split queries (Qwen3's q_norm):
// it broadcasts along the split heads, so each TP rank's gradient of it is
// the sum over its own heads, and the pass marks it reduce_grad; the norm
// weight ln, read on the whole input before the chain, gets the same
// gradient on every rank and stays as it is.
// CHECK: remark: bmt-tensor-parallel: gradient completion: 2 whole parameters read beside split values, each rank's gradient a partial sum, reduce_grad (q_norm.weight); 2 whole parameters identical on every rank
// CHECK: bmt.parameter @h.0.q_norm.weight : tensor<8xf32> {bmt.tensor_split = #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>, requires_grad}
// CHECK-NEXT: bmt.parameter @h.0.ln : tensor<8xf32> {requires_grad}
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
  return %10 : !bmt.tensor
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
  return %10 : !bmt.tensor
}
