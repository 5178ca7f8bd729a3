// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=3' --bmt-zero --bmt-checkpoint='mode=none' --bmt-summary='world-size=3' -o /dev/null 2>&1 | FileCheck %s
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint='mode=none' --bmt-summary='world-size=1' -o /dev/null 2>&1 | FileCheck %s --check-prefix=ONE

// The memory estimate (docs/passes/memory-estimate.md) of grouped-query
// attention whose kv heads T does not divide (tensor-parallel-kv.mlir: 6
// query heads of 4 on 2 kv heads, T = 3): the k/v projections replicated,
// so their activations are whole on every rank, and each rank narrows the
// repeat of the kv heads, a copy of all 6 heads, to its 2 query heads; the
// narrowed view keeps that copy alive. The repeat's reshape reads its head
// dim with aten::size.int, as traces write it (the walk keeps the head dim
// of the expand it reshapes). f32, micro-batch 1, seq-len 1024: 4 KiB per
// element per token.
//
// A block on each of the 3 ranks, per token: q 24 / 3 = 8; k 8 and v 8
// (replicated: 2 kv heads x 4, the whole projection); the repeats of k and
// v, 6 heads x 4 = 24 each; the scores and their softmax 2 heads x 1024
// each; scores x values 8; o 24 (row-parallel: whole width, partial sums)
// and its tp_all_reduce 24: 8 + 8 + 8 + 24 + 24 + 2048 + 2048 + 8 + 24 + 24
// = 4224 -> 17301504 bytes. Block 0's input is the program's argument (1
// element per token: 4096 bytes), block 1's block 0's o (24: 98304). Two
// blocks: 34603008 (33 MiB).
// CHECK: activations: 33.0 MiB (34603008 bytes; outside the blocks 0, a block's saved 17301504, its inputs 4096 to 98304)
//
// On one rank the walk sees no repeat's copy (the reshape of the expand
// reads as a view; the narrow is what shows the TP pass's copy): q 24, k 8,
// v 8, scores and softmax 6 x 1024 each, scores x values 8, o 24:
// 12360 -> 50626560 bytes a block, 101253120 for two.
// ONE: activations: 96.6 MiB (101253120 bytes; outside the blocks 0, a block's saved 50626560, its inputs 4096 to 98304)
bmt.parameter @h.0.q : tensor<24x24xf32> {requires_grad}
bmt.parameter @h.0.k : tensor<8x24xf32> {requires_grad}
bmt.parameter @h.0.kb : tensor<8xf32> {requires_grad}
bmt.parameter @h.0.v : tensor<8x24xf32> {requires_grad}
bmt.parameter @h.0.o : tensor<24x24xf32> {requires_grad}
bmt.parameter @h.1.q : tensor<24x24xf32> {requires_grad}
bmt.parameter @h.1.k : tensor<8x24xf32> {requires_grad}
bmt.parameter @h.1.kb : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.v : tensor<8x24xf32> {requires_grad}
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
  %k1 = bmt.aten "aten::view"(%k, [2, 5, 2, 4]) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::transpose.int"(%k1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %k4 = bmt.aten "aten::expand"(%k3, [2, 2, 3, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %kd = bmt.aten "aten::size.int"(%k2, 3) : (!bmt.tensor) -> i64
  %k5 = bmt.aten "aten::reshape"(%k4, [2, 6, 5, %kd]) : (!bmt.tensor, i64) -> !bmt.tensor
  %v = bmt.aten "aten::linear"(%x, %wv, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %v1 = bmt.aten "aten::view"(%v, [2, 5, 2, 4]) : (!bmt.tensor) -> !bmt.tensor
  %v2 = bmt.aten "aten::transpose.int"(%v1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %v3 = bmt.aten "aten::unsqueeze"(%v2, 2) : (!bmt.tensor) -> !bmt.tensor
  %v4 = bmt.aten "aten::expand"(%v3, [2, 2, 3, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %vd = bmt.aten "aten::size.int"(%v2, 3) : (!bmt.tensor) -> i64
  %v5 = bmt.aten "aten::reshape"(%v4, [2, 6, 5, %vd]) : (!bmt.tensor, i64) -> !bmt.tensor
  %kt = bmt.aten "aten::transpose.int"(%k5, 2, 3) : (!bmt.tensor) -> !bmt.tensor
  %s = bmt.aten "aten::matmul"(%q2, %kt) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %p = bmt.aten "aten::softmax.int"(%s, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %a = bmt.aten "aten::matmul"(%p, %v5) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %a1 = bmt.aten "aten::transpose.int"(%a, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %a2 = bmt.aten "aten::reshape"(%a1, [2, 5, 24]) : (!bmt.tensor) -> !bmt.tensor
  %o = bmt.aten "aten::linear"(%a2, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %o : !bmt.tensor
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
  %k1 = bmt.aten "aten::view"(%k, [2, 5, 2, 4]) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::transpose.int"(%k1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %k4 = bmt.aten "aten::expand"(%k3, [2, 2, 3, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %kd = bmt.aten "aten::size.int"(%k2, 3) : (!bmt.tensor) -> i64
  %k5 = bmt.aten "aten::reshape"(%k4, [2, 6, 5, %kd]) : (!bmt.tensor, i64) -> !bmt.tensor
  %v = bmt.aten "aten::linear"(%x, %wv, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %v1 = bmt.aten "aten::view"(%v, [2, 5, 2, 4]) : (!bmt.tensor) -> !bmt.tensor
  %v2 = bmt.aten "aten::transpose.int"(%v1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %v3 = bmt.aten "aten::unsqueeze"(%v2, 2) : (!bmt.tensor) -> !bmt.tensor
  %v4 = bmt.aten "aten::expand"(%v3, [2, 2, 3, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %vd = bmt.aten "aten::size.int"(%v2, 3) : (!bmt.tensor) -> i64
  %v5 = bmt.aten "aten::reshape"(%v4, [2, 6, 5, %vd]) : (!bmt.tensor, i64) -> !bmt.tensor
  %kt = bmt.aten "aten::transpose.int"(%k5, 2, 3) : (!bmt.tensor) -> !bmt.tensor
  %s = bmt.aten "aten::matmul"(%q2, %kt) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %p = bmt.aten "aten::softmax.int"(%s, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %a = bmt.aten "aten::matmul"(%p, %v5) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %a1 = bmt.aten "aten::transpose.int"(%a, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %a2 = bmt.aten "aten::reshape"(%a1, [2, 5, 24]) : (!bmt.tensor) -> !bmt.tensor
  %o = bmt.aten "aten::linear"(%a2, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %o : !bmt.tensor
}
