//===- Passes.h - bmt passes ------------------------------------*- C++ -*-===//
//
// Declarations and registration of every bmt pass (passes/Passes.td).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_H
#define BMT_PASSES_H

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassOptions.h"

namespace bmt {

#define GEN_PASS_DECL
#include "bmt/Passes/Passes.h.inc"

/// registerBmtPasses(): registers every bmt pass with the global pass registry, so that
/// `bmt-opt --bmt-<name>` and `--pass-pipeline` find them.
#define GEN_PASS_REGISTRATION
#include "bmt/Passes/Passes.h.inc"

/// Options of the default pipeline (bmt-opt's top-level flags of the same
/// names, and `--bmt-default-pipeline='...'`); see docs/passes.md.
struct DefaultPipelineOptions : mlir::PassPipelineOptions<DefaultPipelineOptions> {
  Option<int64_t> worldSize{*this, "world-size",
                            llvm::cl::desc("ranks of the training job (memory estimate)"),
                            llvm::cl::init(1)};
  Option<int64_t> zeroStage{*this, "zero-stage", llvm::cl::desc("ZeRO stage: 3 or 2"),
                            llvm::cl::init(3)};
  Option<int64_t> shardGroupSize{
      *this, "shard-group-size",
      llvm::cl::desc("hybrid sharding: shard within groups of this many ranks (0: all)"),
      llvm::cl::init(0)};
  Option<std::string> checkpoint{*this, "checkpoint",
                                 llvm::cl::desc("blocks to recompute: all, none or auto"),
                                 llvm::cl::init("all")};
  Option<double> memoryBudgetGib{*this, "memory-budget-gib",
                                 llvm::cl::desc("checkpoint=auto: per-rank budget in GiB"),
                                 llvm::cl::init(0)};
  Option<int64_t> microBatch{*this, "micro-batch",
                             llvm::cl::desc("sequences per rank per forward"),
                             llvm::cl::init(1)};
  Option<int64_t> seqLen{*this, "seq-len", llvm::cl::desc("tokens per sequence"),
                         llvm::cl::init(1024)};
  Option<int64_t> prefetchDepth{*this, "prefetch-depth",
                                llvm::cl::desc("blocks gathered ahead of the running one"),
                                llvm::cl::init(1)};
  Option<bool> fuseGelu{*this, "fuse-gelu",
                        llvm::cl::desc("replace GELU written out as elementwise ops by "
                                       "aten::gelu (bmt-fuse-gelu)"),
                        llvm::cl::init(true)};
  Option<bool> causalAttention{
      *this, "causal-attention",
      llvm::cl::desc("replace a causal mask built from aranges by is_causal=True in "
                     "aten::scaled_dot_product_attention (bmt-causal-attention)"),
      llvm::cl::init(true)};
  Option<bool> assumeUnpadded{
      *this, "assume-unpadded",
      llvm::cl::desc("bmt-causal-attention: treat attention_mask as all ones (recorded in "
                     "the plan; bmt-run trains with all-ones masks)"),
      llvm::cl::init(true)};
  Option<bool> summary{*this, "summary",
                       llvm::cl::desc("print the plan summary to stderr at the end"),
                       llvm::cl::init(true)};
};

/// causal-attention (unless options.causalAttention is false; with
/// options.assumeUnpadded), fuse-gelu (unless options.fuseGelu is false),
/// find-blocks, zero, checkpoint, overlap, then (with options.summary) the
/// summary with the memory estimate.
void buildDefaultPipeline(mlir::OpPassManager &pm, const DefaultPipelineOptions &options);

/// Registers `--bmt-default-pipeline` with the global pass registry.
void registerDefaultPipeline();

} // namespace bmt

#endif // BMT_PASSES_H
