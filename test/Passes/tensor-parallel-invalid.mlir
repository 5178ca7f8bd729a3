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

// -----

// Multi-query attention (one kv head of 4) whose replicated k is also read
// outside the attention (a mean added to the block's output): that reader
// would see every kv head on every rank, so k/v are not replicated either.
// CHECK: error: bmt-tensor-parallel: found no chain to split (aten::matmul in h.0.forward: a matmul of a split value that is not batched over the split dim (nor can the k/v projections be replicated: func.return in h.0.forward: a replicated k/v value leaves the block))
bmt.parameter @h.0.q : tensor<24x24xf32> {requires_grad}
bmt.parameter @h.0.k : tensor<4x24xf32> {requires_grad}
bmt.parameter @h.0.kb : tensor<4xf32> {requires_grad}
bmt.parameter @h.0.v : tensor<4x24xf32> {requires_grad}
bmt.parameter @h.0.o : tensor<24x24xf32> {requires_grad}
bmt.parameter @h.1.q : tensor<24x24xf32> {requires_grad}
bmt.parameter @h.1.k : tensor<4x24xf32> {requires_grad}
bmt.parameter @h.1.kb : tensor<4xf32> {requires_grad}
bmt.parameter @h.1.v : tensor<4x24xf32> {requires_grad}
bmt.parameter @h.1.o : tensor<24x24xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %wq = bmt.get_global @h.0.q : !bmt.tensor
  %wk = bmt.get_global @h.0.k : !bmt.tensor
  %bk = bmt.get_global @h.0.kb : !bmt.tensor
  %wv = bmt.get_global @h.0.v : !bmt.tensor
  %wo = bmt.get_global @h.0.o : !bmt.tensor
  %q = bmt.aten "aten::linear"(%x, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %q1 = bmt.aten "aten::view"(%q, [2, 5, 6, 4]) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::transpose.int"(%q1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %k = bmt.aten "aten::linear"(%x, %wk, %bk) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::view"(%k, [2, 5, 1, 4]) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::transpose.int"(%k1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %k4 = bmt.aten "aten::expand"(%k3, [2, 1, 6, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %k5 = bmt.aten "aten::reshape"(%k4, [2, 6, 5, 4]) : (!bmt.tensor) -> !bmt.tensor
  %v = bmt.aten "aten::linear"(%x, %wv, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %v1 = bmt.aten "aten::view"(%v, [2, 5, 1, 4]) : (!bmt.tensor) -> !bmt.tensor
  %v2 = bmt.aten "aten::transpose.int"(%v1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %v3 = bmt.aten "aten::unsqueeze"(%v2, 2) : (!bmt.tensor) -> !bmt.tensor
  %v4 = bmt.aten "aten::expand"(%v3, [2, 1, 6, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %v5 = bmt.aten "aten::reshape"(%v4, [2, 6, 5, 4]) : (!bmt.tensor) -> !bmt.tensor
  %kt = bmt.aten "aten::transpose.int"(%k5, 2, 3) : (!bmt.tensor) -> !bmt.tensor
  %s = bmt.aten "aten::matmul"(%q2, %kt) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %p = bmt.aten "aten::softmax.int"(%s, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %a = bmt.aten "aten::matmul"(%p, %v5) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %a1 = bmt.aten "aten::transpose.int"(%a, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %a2 = bmt.aten "aten::reshape"(%a1, [2, 5, 24]) : (!bmt.tensor) -> !bmt.tensor
  %o = bmt.aten "aten::linear"(%a2, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::mean.dim"(%k2, [1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %o2 = bmt.aten "aten::add.Tensor"(%o, %m, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %o2 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %wq = bmt.get_global @h.1.q : !bmt.tensor
  %wk = bmt.get_global @h.1.k : !bmt.tensor
  %bk = bmt.get_global @h.1.kb : !bmt.tensor
  %wv = bmt.get_global @h.1.v : !bmt.tensor
  %wo = bmt.get_global @h.1.o : !bmt.tensor
  %q = bmt.aten "aten::linear"(%x, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %q1 = bmt.aten "aten::view"(%q, [2, 5, 6, 4]) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::transpose.int"(%q1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %k = bmt.aten "aten::linear"(%x, %wk, %bk) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::view"(%k, [2, 5, 1, 4]) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::transpose.int"(%k1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %k4 = bmt.aten "aten::expand"(%k3, [2, 1, 6, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %k5 = bmt.aten "aten::reshape"(%k4, [2, 6, 5, 4]) : (!bmt.tensor) -> !bmt.tensor
  %v = bmt.aten "aten::linear"(%x, %wv, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %v1 = bmt.aten "aten::view"(%v, [2, 5, 1, 4]) : (!bmt.tensor) -> !bmt.tensor
  %v2 = bmt.aten "aten::transpose.int"(%v1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %v3 = bmt.aten "aten::unsqueeze"(%v2, 2) : (!bmt.tensor) -> !bmt.tensor
  %v4 = bmt.aten "aten::expand"(%v3, [2, 1, 6, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %v5 = bmt.aten "aten::reshape"(%v4, [2, 6, 5, 4]) : (!bmt.tensor) -> !bmt.tensor
  %kt = bmt.aten "aten::transpose.int"(%k5, 2, 3) : (!bmt.tensor) -> !bmt.tensor
  %s = bmt.aten "aten::matmul"(%q2, %kt) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %p = bmt.aten "aten::softmax.int"(%s, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %a = bmt.aten "aten::matmul"(%p, %v5) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %a1 = bmt.aten "aten::transpose.int"(%a, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %a2 = bmt.aten "aten::reshape"(%a1, [2, 5, 24]) : (!bmt.tensor) -> !bmt.tensor
  %o = bmt.aten "aten::linear"(%a2, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::mean.dim"(%k2, [1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %o2 = bmt.aten "aten::add.Tensor"(%o, %m, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %o2 : !bmt.tensor
}
