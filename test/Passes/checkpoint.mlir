// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint 2>/dev/null | FileCheck %s --check-prefix=ALL
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint='mode=none' 2>/dev/null | FileCheck %s --check-prefix=NONE
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint='mode=auto budget-gib=1.5 micro-batch=256' 2>/dev/null | FileCheck %s --check-prefix=AUTO
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint='mode=auto budget-gib=1.5 micro-batch=256' -o /dev/null 2>&1 | FileCheck %s --check-prefix=AUTO-REMARK
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint='mode=auto budget-gib=3 micro-batch=256' -o /dev/null 2>&1 | FileCheck %s --check-prefix=ROOMY
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint='mode=auto budget-gib=0.5 micro-batch=256' 2>&1 | FileCheck %s --check-prefix=OVER
// RUN: bmt-opt %s --bmt-checkpoint -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOBLOCKS
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint='mode=auto budget-gib=1.5 micro-batch=256' --bmt-summary='world-size=1' -o /dev/null 2>&1 | FileCheck %s --check-prefix=SUMMARY

// Four blocks of two linears (64 -> 256 -> 64) after a 16x64 embedding
// tied to the head; f32, world size 1, seq-len 1024 (the default).
// Per token: a block saves 256 + 256 + 64 elements (two linears and the
// relu) and keeps 64 (its input) when recomputed; outside the blocks the
// embedding (64) and the head (16) save 80. With micro-batch 256:
// 256 x 1024 tokens x 4 bytes = 1 GiB per 1024 elements per token, so a block
// saves 576 MiB, keeps 64 MiB when recomputed, outside 80 MiB; state: (4 x
// 32768 + 1024) parameters x 16 bytes = 2064 KiB.
//   blocks kept k = 4: 80 + 4 x 576                    + 2.0 = 2386 MiB (2.3 GiB)
//   k = 3:             80 + 3 x 576 + 64               + 2.0 = 1874 MiB (1.8 GiB)
//   k = 2:             80 + 2 x 576 + 2 x 64           + 2.0 = 1362 MiB (1.3 GiB)
//   k = 0:             80 + max(4 x 64, 3 x 64 + 576)  + 2.0 =  850 MiB
// so a 1.5 GiB budget keeps the last two blocks.

// ALL-COUNT-4: bmt.checkpoint = true
// ALL-NOT: bmt.checkpoint = false
// NONE-COUNT-4: bmt.checkpoint = false
// NONE-NOT: bmt.checkpoint = true

// AUTO: module attributes {bmt.checkpoint_plan = {budget_gib = 1.500000e+00 : f64, micro_batch = 256 : i64, mode = "auto", seq_len = 1024 : i64, world_size = 1 : i64}
// AUTO: call @h.0.forward(%{{.*}}) {bmt.block = @h, bmt.block_index = 0 : i64, bmt.checkpoint = true}
// AUTO: call @h.1.forward(%{{.*}}) {bmt.block = @h, bmt.block_index = 1 : i64, bmt.checkpoint = true}
// AUTO: call @h.2.forward(%{{.*}}) {bmt.block = @h, bmt.block_index = 2 : i64, bmt.checkpoint = false}
// AUTO: call @h.3.forward(%{{.*}}) {bmt.block = @h, bmt.block_index = 3 : i64, bmt.checkpoint = false}
// AUTO-REMARK: remark: bmt-checkpoint: 2 of 4 blocks recomputed (estimate 1.3 GiB per rank of 1.5 GiB budget at world size 1, micro-batch 256, seq-len 1024)
// ROOMY: remark: bmt-checkpoint: 0 of 4 blocks recomputed (estimate 2.3 GiB per rank of 3.0 GiB budget
// OVER: warning: bmt-checkpoint: the estimate with every block recomputed, 850.0 MiB per rank (891305984 bytes), exceeds the budget of 512.0 MiB; recomputing every block
// OVER-COUNT-4: bmt.checkpoint = true
// NOBLOCKS: remark: bmt-checkpoint: no blocks (run --bmt-find-blocks first, or the model has no repeated layers); nothing to recompute

// SUMMARY: blocks: 4 in h (h.0 ... h.3), 32768 parameters each
// SUMMARY-NEXT: outside blocks: 1024 parameters
// SUMMARY-NEXT: storage groups: 5 (516.0 KiB, 528384 bytes), ZeRO-3
// SUMMARY-NEXT: checkpoint: 2 of 4 blocks recomputed (mode auto, budget 1.5 GiB)
// SUMMARY-NEXT: memory per rank at world size 1 (micro-batch 256, seq-len 1024): about 1.3 GiB (1428176896 bytes)
// SUMMARY-NEXT: parameter, gradient and optimizer shards: 2.0 MiB (sharded over 1)
// SUMMARY-NEXT: gathered parameters and gradients: 0 B
// SUMMARY-NEXT: activations: 1.3 GiB

bmt.parameter @emb.w : tensor<16x64xf32> {aliases = ["head.w"], requires_grad}
bmt.parameter @h.0.up : tensor<256x64xf32> {requires_grad}
bmt.parameter @h.0.down : tensor<64x256xf32> {requires_grad}
bmt.parameter @h.1.up : tensor<256x64xf32> {requires_grad}
bmt.parameter @h.1.down : tensor<64x256xf32> {requires_grad}
bmt.parameter @h.2.up : tensor<256x64xf32> {requires_grad}
bmt.parameter @h.2.down : tensor<64x256xf32> {requires_grad}
bmt.parameter @h.3.up : tensor<256x64xf32> {requires_grad}
bmt.parameter @h.3.down : tensor<64x256xf32> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> !bmt.tensor {
  %e = bmt.get_global @emb.w : !bmt.tensor
  %x = bmt.aten "aten::embedding"(%e, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = call @h.2.forward(%1) : (!bmt.tensor) -> !bmt.tensor
  %3 = call @h.3.forward(%2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::linear"(%3, %e, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %4 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %u = bmt.get_global @h.0.up : !bmt.tensor
  %d = bmt.get_global @h.0.down : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %u, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %d, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %u = bmt.get_global @h.1.up : !bmt.tensor
  %d = bmt.get_global @h.1.down : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %u, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %d, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.2.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.2"} {
  %u = bmt.get_global @h.2.up : !bmt.tensor
  %d = bmt.get_global @h.2.down : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %u, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %d, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.3.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.3"} {
  %u = bmt.get_global @h.3.up : !bmt.tensor
  %d = bmt.get_global @h.3.down : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %u, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %d, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}

// Bad options: one error each, and the pass fails.
// RUN: not bmt-opt %s --bmt-checkpoint='mode=foo' -o /dev/null 2>&1 | FileCheck %s --check-prefix=BADMODE
// RUN: not bmt-opt %s --bmt-checkpoint='mode=auto' -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOBUDGET
// RUN: not bmt-opt %s --bmt-checkpoint='mode=auto budget-gib=-2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=NEGBUDGET
// RUN: not bmt-opt %s --bmt-checkpoint='micro-batch=0' -o /dev/null 2>&1 | FileCheck %s --check-prefix=BADBATCH
// RUN: not bmt-opt %s --bmt-checkpoint='seq-len=-5' -o /dev/null 2>&1 | FileCheck %s --check-prefix=BADSEQ
// RUN: not bmt-opt %s --bmt-checkpoint='world-size=0' -o /dev/null 2>&1 | FileCheck %s --check-prefix=BADWORLD
// BADMODE: error: bmt-checkpoint: mode must be all, none or auto, got 'foo'
// NOBUDGET: error: bmt-checkpoint: mode=auto needs a per-rank memory budget: budget-gib=N (GiB, > 0)
// NEGBUDGET: error: bmt-checkpoint: budget-gib must be a positive number of GiB, got -2
// BADBATCH: error: bmt-checkpoint: micro-batch must be positive, got 0
// BADSEQ: error: bmt-checkpoint: seq-len must be positive, got -5
// BADWORLD: error: bmt-checkpoint: world-size must be positive, got 0
