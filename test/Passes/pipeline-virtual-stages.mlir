// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2 virtual-stages=2' 2>/dev/null | FileCheck %s --check-prefix=IR
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2 virtual-stages=2 world-size=4' --bmt-summary -o /dev/null 2>&1 | FileCheck %s --check-prefix=V2
// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2 virtual-stages=2 world-size=4' --bmt-summary -o /dev/null 2>&1 | FileCheck %s --check-prefix=TP
// RUN: not bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2 virtual-stages=3' -o /dev/null 2>&1 | FileCheck %s --check-prefix=TOOMANY
// RUN: not bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=1 virtual-stages=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOSTAGES
// RUN: not bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2 virtual-stages=0' -o /dev/null 2>&1 | FileCheck %s --check-prefix=ZERO

// The model of pipeline-parallel.mlir (five blocks of 4 F each when
// recomputed, F = 67108864 FLOPs; a head of 3 F after them) cut into
// P x V = 4 chunks, stage s holding chunks s and s + 2. Every cut has a
// chunk of two blocks (8 F); [1 1 1 2] would put 11 F on the last chunk.
// Of [2 1 1 1], [1 2 1 1] and [1 1 2 1] the largest chunk's memory is the
// last one's (the head's logits) in each, and the FLOPs' squares tie: the
// search keeps [1 1 2 1], which also happens to even the stages (52 / 48 %).

// IR: module attributes {{.*}}bmt.pipeline = {block_list = @h, bytes = array<i64: {{[0-9]+}}, {{[0-9]+}}, {{[0-9]+}}, {{[0-9]+}}>, first_blocks = array<i64: 0, 1, 2, 4>, flops = array<i64: 268435456, 268435456, 536870912, 469762048>, parameters = array<i64: 65536, 32768, 65536, 65536>, stages = 2 : i64, tied = ["emb.w"], virtual_stages = 2 : i64, world_size = 2 : i64}
// IR: call @h.0.forward({{.*}}bmt.pipeline_chunk = 0 : i64, bmt.pipeline_stage = 0 : i64}
// IR: call @h.1.forward({{.*}}bmt.pipeline_chunk = 1 : i64, bmt.pipeline_stage = 1 : i64}
// IR: call @h.2.forward({{.*}}bmt.pipeline_chunk = 2 : i64, bmt.pipeline_stage = 0 : i64}
// IR: call @h.3.forward({{.*}}bmt.pipeline_chunk = 2 : i64, bmt.pipeline_stage = 0 : i64}
// IR: call @h.4.forward({{.*}}bmt.pipeline_chunk = 3 : i64, bmt.pipeline_stage = 1 : i64}

// V2: remark: bmt-pipeline-parallel: 5 blocks of h in 2 stages x 2 virtual stages (blocks per chunk: 1 1 2 1), 2 data-parallel ranks per stage; tied across chunks 0 and 3 (gradient summed): emb.w
// V2:      pipeline: 2 stages x 2 virtual stages of h over world size 4 (stage = rank / 2), interleaved 1F1B
// V2-NEXT:   chunk 0 (stage 0): blocks 0..0 + before the blocks, 65536 parameters, 0.268 GFLOP per micro-batch (17 %), about {{.*}} per rank
// V2-NEXT:   chunk 1 (stage 1): blocks 1..1, 32768 parameters, 0.268 GFLOP per micro-batch (17 %), about {{.*}} per rank
// V2-NEXT:   chunk 2 (stage 0): blocks 2..3, 65536 parameters, 0.537 GFLOP per micro-batch (35 %), about {{.*}} per rank
// V2-NEXT:   chunk 3 (stage 1): blocks 4..4 + after the blocks, 65536 parameters, 0.47 GFLOP per micro-batch (30 %), about {{.*}} per rank
// V2-NEXT:   stage 0: chunks 0, 2, 52 % of the FLOPs, at most about {{.*}} per rank
// V2-NEXT:   stage 1: chunks 1, 3, 48 % of the FLOPs, at most about {{.*}} per rank
// V2-NEXT:   tied across chunks 0 and 3 (gradient summed): emb.w

// With T = 2 (N = P x T x D = 2 x 2 x 1) the same cut: each rank's FLOPs
// and parameters are half the split blocks' and the vocab-split embedding's.
// TP: remark: bmt-pipeline-parallel: 5 blocks of h in 2 stages x 2 virtual stages (blocks per chunk: 1 1 2 1), 1 data-parallel rank x 2 tensor-parallel per stage; tied across chunks 0 and 3 (gradient summed): emb.w
// TP:      pipeline: 2 stages x 2 virtual stages of h over world size 4 (stage = rank / 2; 1 data-parallel x 2 tensor-parallel ranks per stage), interleaved 1F1B
// TP-NEXT:   chunk 0 (stage 0): blocks 0..0 + before the blocks, 32768 parameters, 0.134 GFLOP per micro-batch (17 %)

// TOOMANY: error: bmt-pipeline-parallel: pipeline-parallel 2 x virtual-stages 3 = 6 chunks exceed the 5 blocks of h; each chunk needs at least one block
// NOSTAGES: error: bmt-pipeline-parallel: virtual-stages 2 needs pipeline-parallel > 1 (it cuts each stage into chunks)
// ZERO: error: bmt-pipeline-parallel: virtual-stages must be positive, got 0

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
