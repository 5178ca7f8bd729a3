// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2 sequence-parallel=true' --bmt-zero --bmt-checkpoint='mode=none' --bmt-summary='world-size=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=SP
// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' --bmt-zero --bmt-checkpoint='mode=none' --bmt-summary='world-size=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=TP
// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2 sequence-parallel=true' --bmt-zero --bmt-checkpoint='mode=all' --bmt-summary='world-size=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=SP-ALL
// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2 sequence-parallel=true' --bmt-zero --bmt-checkpoint='mode=auto budget-gib=0.125 micro-batch=256 world-size=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=SP-AUTO
// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' --bmt-zero --bmt-checkpoint='mode=auto budget-gib=0.125 micro-batch=256 world-size=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=TP-AUTO

// The memory estimate of a sequence-parallel plan (docs/passes/memory-estimate.md): the pre-norm MLP blocks of tensor-parallel-sp.mlir at T = 2,
// f32, micro-batch 1, seq-len 1024: 1024 tokens x 4 bytes = 4 KiB per
// element per token; a value split along the sequence (after a
// tp_reduce_scatter, up to the next tp_all_gather) holds 512 tokens: 2 KiB.
//
// A block, per token: layer_norm 8 (split: 4), tp_all_gather 8 (the whole
// sequence, saved by the column matmul), w1 16 / 2 = 8, relu 8, w2 8 (the
// partial sums, whole sequence), tp_reduce_scatter 8 (split: 4), the
// residual add 8 (split: 4): 4 + 8 + 8 + 8 + 8 + 4 + 4 = 44 -> 180224 bytes;
// its input, split: 4 -> 16384 bytes. Outside: the vocab-parallel lookup's
// sub, lt, ge, or, masked_fill of the ids (1 each: 5), the embedding 8, its
// masked_fill 8, the tp_reduce_scatter 8 (split: 4), the LM head's
// tp_all_gather 8 and its logits 10 / 2 = 5: 38 -> 155648 bytes.
// Kept blocks: 155648 + 2 x 180224 = 516096 (504 KiB).
// SP: activations: 504.0 KiB (516096 bytes; outside the blocks 155648, a block's saved 180224, its inputs 16384)
//
// Without sequence parallelism every value holds the whole sequence: a
// block 8 (layer_norm) + 8 + 8 + 8 (linear, relu, linear) + 8 (tp_all_reduce)
// + 8 (add) = 48 -> 196608, its input 8 -> 32768; outside 5 + 8 + 8 + 8
// (tp_all_reduce) + 5 = 34 -> 139264; 139264 + 2 x 196608 = 532480 (520 KiB).
// TP: activations: 520.0 KiB (532480 bytes; outside the blocks 139264, a block's saved 196608, its inputs 32768)
//
// Both blocks recomputed: the backward of block 1 holds block 0's input and
// block 1's activations: 155648 + 16384 + 180224 = 352256 (344 KiB).
// SP-ALL: activations: 344.0 KiB (352256 bytes;
//
// --checkpoint auto at micro-batch 256 (1 MiB per element per token), a
// 128 MiB budget (the state is 18 KiB, nothing gathered: N / T = 1): with
// sequence parallelism keeping both blocks costs 38 + 2 x 44 = 126 MiB, which
// fits; without it 34 + 2 x 48 = 130 MiB does not, and recomputing block 0
// gives 34 + 8 + 48 = 90 MiB.
// SP-AUTO: bmt-checkpoint: 0 of 2 blocks recomputed (estimate 126.0 MiB per rank of 128.0 MiB budget at world size 2, micro-batch 256, seq-len 1024)
// TP-AUTO: bmt-checkpoint: 1 of 2 blocks recomputed (estimate 90.0 MiB per rank of 128.0 MiB budget at world size 2, micro-batch 256, seq-len 1024)
bmt.parameter @emb.w : tensor<10x8xf32> {aliases = ["head.w"], requires_grad}
bmt.parameter @h.0.ln.w : tensor<8xf32> {requires_grad}
bmt.parameter @h.0.ln.b : tensor<8xf32> {requires_grad}
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.ln.w : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.ln.b : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> (!bmt.tensor {bmt.name = "logits"}) {
  %e = bmt.get_global @emb.w : !bmt.tensor
  %x = bmt.aten "aten::embedding"(%e, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %e, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %lw = bmt.get_global @h.0.ln.w : !bmt.tensor
  %lb = bmt.get_global @h.0.ln.b : !bmt.tensor
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %n = bmt.aten "aten::layer_norm"(%x, [8], %lw, %lb, 1.0e-05, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%n, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%x, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %lw = bmt.get_global @h.1.ln.w : !bmt.tensor
  %lb = bmt.get_global @h.1.ln.b : !bmt.tensor
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %n = bmt.aten "aten::layer_norm"(%x, [8], %lw, %lb, 1.0e-05, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%n, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%x, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}

