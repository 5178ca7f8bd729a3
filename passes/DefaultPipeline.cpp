//===- DefaultPipeline.cpp - bmt's default pass pipeline ------------------===//
//
// What `bmt-opt model.pt -o sharded.pt` runs when no pass is named, and
// `--bmt-default-pipeline` runs on request: causal-attention, fuse-gelu,
// find-blocks, zero, checkpoint, overlap, summary. See docs/passes.md.
//
//===----------------------------------------------------------------------===//

#include "bmt/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

void bmt::buildDefaultPipeline(OpPassManager &pm, const DefaultPipelineOptions &options) {
  // First: these rewrite every block's function alike, so identical blocks
  // stay identical for find-blocks (causal-attention also drops the mask
  // argument of every block), and the memory estimate of checkpoint and
  // summary counts what runs. bmt-run trains with attention_mask all ones,
  // so the default assumes it (recorded in the plan; --dump checks it).
  if (options.causalAttention) {
    CausalAttentionOptions causal;
    causal.assumeUnpadded = options.assumeUnpadded;
    pm.addPass(createCausalAttention(causal));
  }
  if (options.fuseGelu)
    pm.addPass(createFuseGelu());
  pm.addPass(createFindBlocks());
  ZeroOptions zero;
  zero.stage = options.zeroStage;
  zero.shardGroupSize = options.shardGroupSize;
  pm.addPass(createZero(zero));
  CheckpointOptions checkpoint;
  checkpoint.mode = options.checkpoint;
  checkpoint.budgetGib = options.memoryBudgetGib;
  checkpoint.microBatch = options.microBatch;
  checkpoint.seqLen = options.seqLen;
  checkpoint.worldSize = options.worldSize;
  checkpoint.prefetchDepth = options.prefetchDepth;
  pm.addPass(createCheckpoint(checkpoint));
  OverlapOptions overlap;
  overlap.depth = options.prefetchDepth;
  pm.addPass(createOverlap(overlap));
  if (options.summary) {
    SummaryOptions summary;
    summary.worldSize = options.worldSize;
    summary.microBatch = options.microBatch;
    summary.seqLen = options.seqLen;
    pm.addPass(createSummary(summary));
  }
}

void bmt::registerDefaultPipeline() {
  PassPipelineRegistration<DefaultPipelineOptions>(
      "bmt-default-pipeline",
      "bmt's default pipeline: causal-attention, fuse-gelu, find-blocks, zero, checkpoint, "
      "overlap, then the plan "
      "summary "
      "(what `bmt-opt model.pt -o sharded.pt` runs without pass flags)",
      buildDefaultPipeline);
}
