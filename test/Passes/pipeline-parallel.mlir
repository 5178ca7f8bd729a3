// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2' 2>/dev/null | FileCheck %s --check-prefix=IR
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2 world-size=4' --bmt-summary -o /dev/null 2>&1 | FileCheck %s --check-prefix=P2
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint='mode=none' --bmt-pipeline-parallel='pipeline-parallel=2' --bmt-summary -o /dev/null 2>&1 | FileCheck %s --check-prefix=KEPT
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=4' --bmt-summary -o /dev/null 2>&1 | FileCheck %s --check-prefix=P4
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=1' 2>/dev/null | FileCheck %s --check-prefix=ONE
// RUN: not bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=6' -o /dev/null 2>&1 | FileCheck %s --check-prefix=TOOMANY
// RUN: not bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2 world-size=3' -o /dev/null 2>&1 | FileCheck %s --check-prefix=WORLD
// RUN: not bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=0' -o /dev/null 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not bmt-opt %s --bmt-pipeline-parallel='pipeline-parallel=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOBLOCKS
// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2 world-size=4' --bmt-summary -o /dev/null 2>&1 | FileCheck %s --check-prefix=TP
// RUN: not bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2 world-size=6' -o /dev/null 2>&1 | FileCheck %s --check-prefix=TPWORLD
// RUN: bmt-opt %s --bmt-freeze='patterns=emb.w,h.0.*' --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2' --bmt-summary -o /dev/null 2>&1 | FileCheck %s --check-prefix=FROZEN

// Five blocks of two linears (64 -> 256 -> 64) after a 512 x 64 embedding
// tied to the head. Forward matmul FLOPs per token: a block 2 x 32768 =
// 65536 (F), the head 2 x 32768 = 65536 as well; seq-len 1024 (the
// default), micro-batch 1. A recomputed block costs 4 F (forward, the
// recompute, backward twice the forward), the head 3 F. With every block
// recomputed, 3 | 2 gives 12 F and 8 F + 3 F = 11 F, 2 | 3 gives 8 F and
// 15 F: the cut is after block 2 (F = 65536 x 1024 = 67108864, 12 F =
// 805306368). With no block recomputed, 3 | 2 ties at 9 F and 6 F + 3 F.
// Four stages: 1 1 2 1 and 2 1 1 1 both have a largest stage of 8 F;
// 1F1B keeps 4 micro-batches in flight on stage 0 and 2 on stage 2, so
// the memory estimate puts the second block of two on stage 2.

// IR: module attributes {{.*}}bmt.pipeline = {block_list = @h, bytes = array<i64: {{[0-9]+}}, {{[0-9]+}}>, first_blocks = array<i64: 0, 3>, flops = array<i64: 805306368, 738197504>, parameters = array<i64: 131072, 98304>, stages = 2 : i64, tied = ["emb.w"], world_size = 2 : i64}
// IR: call @h.0.forward({{.*}}bmt.pipeline_stage = 0 : i64}
// IR: call @h.1.forward({{.*}}bmt.pipeline_stage = 0 : i64}
// IR: call @h.2.forward({{.*}}bmt.pipeline_stage = 0 : i64}
// IR: call @h.3.forward({{.*}}bmt.pipeline_stage = 1 : i64}
// IR: call @h.4.forward({{.*}}bmt.pipeline_stage = 1 : i64}

// P2: remark: bmt-pipeline-parallel: 5 blocks of h in 2 stages (blocks per stage: 3 2), 2 data-parallel ranks per stage; tied across stages 0 and 1 (gradient summed): emb.w
// P2:      pipeline: 2 stages of h over world size 4 (stage = rank / 2), 1F1B
// P2-NEXT:   stage 0: blocks 0..2 + before the blocks, 131072 parameters, 0.805 GFLOP per micro-batch (52 %), about {{.*}} per rank
// P2-NEXT:   stage 1: blocks 3..4 + after the blocks, 98304 parameters, 0.738 GFLOP per micro-batch (48 %), about {{.*}} per rank
// P2-NEXT:   tied across stages 0 and 1 (gradient summed): emb.w

// KEPT:      stage 0: blocks 0..2 + before the blocks, 131072 parameters, 0.604 GFLOP per micro-batch (50 %)
// KEPT-NEXT: stage 1: blocks 3..4 + after the blocks, 98304 parameters, 0.604 GFLOP per micro-batch (50 %)

// P4: remark: bmt-pipeline-parallel: 5 blocks of h in 4 stages (blocks per stage: 1 1 2 1), 1 data-parallel rank per stage
// P4:      stage 0: blocks 0..0 + before the blocks, 65536 parameters, 0.268 GFLOP
// P4-NEXT: stage 1: blocks 1..1, 32768 parameters, 0.268 GFLOP
// P4-NEXT: stage 2: blocks 2..3, 65536 parameters, 0.537 GFLOP
// P4-NEXT: stage 3: blocks 4..4 + after the blocks, 65536 parameters, 0.47 GFLOP

// With T = 2 (P x T x D = 2 x 2 x 1) the same cut; a split parameter's
// elements and FLOPs count 1/T per rank (the blocks' and the vocab-split
// embedding's), so every stage's FLOPs halve.
// TP: remark: bmt-pipeline-parallel: 5 blocks of h in 2 stages (blocks per stage: 3 2), 1 data-parallel rank x 2 tensor-parallel per stage; tied across stages 0 and 1 (gradient summed): emb.w
// TP:      pipeline: 2 stages of h over world size 4 (stage = rank / 2; 1 data-parallel x 2 tensor-parallel ranks per stage), 1F1B
// TP-NEXT:   stage 0: blocks 0..2 + before the blocks, 65536 parameters, 0.403 GFLOP per micro-batch (52 %)
// TP-NEXT:   stage 1: blocks 3..4 + after the blocks, 49152 parameters, 0.369 GFLOP per micro-batch (48 %)
// TPWORLD: error: bmt-pipeline-parallel: world size 6 is not a multiple of pipeline-parallel 2 x tensor-parallel 2

// Frozen parameters are cut like the others; the frozen tied embedding is
// read on both stages with no gradient to sum (not listed as tied).
// FROZEN: remark: bmt-pipeline-parallel: 5 blocks of h in 2 stages (blocks per stage: 3 2), 1 data-parallel rank per stage{{$}}
// FROZEN:      stage 0: blocks 0..2 + before the blocks, 131072 parameters
// FROZEN-NEXT: stage 1: blocks 3..4 + after the blocks, 98304 parameters
// FROZEN-NOT:  tied across

// ONE-NOT: bmt.pipeline
// TOOMANY: error: bmt-pipeline-parallel: pipeline-parallel 6 exceeds the 5 blocks of h; each stage needs at least one block
// WORLD: error: bmt-pipeline-parallel: world size 3 is not a multiple of pipeline-parallel 2
// ZERO: error: bmt-pipeline-parallel: pipeline-parallel must be positive, got 0
// NOBLOCKS: error: bmt-pipeline-parallel: the model has no repeated layers to cut into stages

bmt.parameter @emb.w : tensor<512x64xf32> {aliases = ["head.w"], requires_grad}
bmt.parameter @h.0.up : tensor<256x64xf32> {requires_grad}
bmt.parameter @h.0.down : tensor<64x256xf32> {requires_grad}
bmt.parameter @h.1.up : tensor<256x64xf32> {requires_grad}
bmt.parameter @h.1.down : tensor<64x256xf32> {requires_grad}
bmt.parameter @h.2.up : tensor<256x64xf32> {requires_grad}
bmt.parameter @h.2.down : tensor<64x256xf32> {requires_grad}
bmt.parameter @h.3.up : tensor<256x64xf32> {requires_grad}
bmt.parameter @h.3.down : tensor<64x256xf32> {requires_grad}
bmt.parameter @h.4.up : tensor<256x64xf32> {requires_grad}
bmt.parameter @h.4.down : tensor<64x256xf32> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> !bmt.tensor {
  %e = bmt.get_global @emb.w : !bmt.tensor
  %x = bmt.aten "aten::embedding"(%e, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = call @h.2.forward(%1) : (!bmt.tensor) -> !bmt.tensor
  %3 = call @h.3.forward(%2) : (!bmt.tensor) -> !bmt.tensor
  %4 = call @h.4.forward(%3) : (!bmt.tensor) -> !bmt.tensor
  %l = bmt.aten "aten::linear"(%4, %e, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %l : !bmt.tensor
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
func.func private @h.4.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.4"} {
  %u = bmt.get_global @h.4.up : !bmt.tensor
  %d = bmt.get_global @h.4.down : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %u, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %d, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
