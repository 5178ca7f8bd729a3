//===- DefaultPipeline.cpp - bmt's default pass pipeline ------------------===//
//
// What `bmt-opt model.pt -o sharded.pt` runs when no pass is named, and
// `--bmt-default-pipeline` runs on request: moe-layers, causal-attention, fuse-gelu,
// fuse-elementwise (unless fuse-elementwise=false), find-blocks,
// tensor-parallel (with tensor-parallel > 1; lora after it then), zero, checkpoint, overlap, summary. Its options are checked
// here, for the top-level flags and the named pipeline alike. See
// docs/passes/default-pipeline.md.
//
//===----------------------------------------------------------------------===//

#include "bmt/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>

using namespace mlir;

llvm::StringRef bmt::toString(ZeroStage stage) { return stage == ZeroStage::Two ? "2" : "3"; }

llvm::StringRef bmt::toString(CheckpointMode mode) {
  switch (mode) {
  case CheckpointMode::All: return "all";
  case CheckpointMode::None: return "none";
  case CheckpointMode::Auto: return "auto";
  }
  llvm_unreachable("unknown checkpoint mode");
}

llvm::StringRef bmt::choiceNames(ZeroStage) { return "3|2"; }

llvm::StringRef bmt::choiceNames(CheckpointMode) { return "all|none|auto"; }

/// "--zero-stage" for a top-level flag, "zero-stage" inside a pipeline string.
static std::string optionName(const llvm::cl::Option &option) {
  bool topLevel = option.Subs.empty() || option.Subs.count(&llvm::cl::SubCommand::getTopLevel());
  return ((topLevel ? "--" : "") + option.ArgStr).str();
}

bool bmt::parseChoice(const llvm::cl::Option &option, llvm::StringRef arg, ZeroStage &value) {
  if (arg == "3" || arg == "2") {
    value = arg == "2" ? ZeroStage::Two : ZeroStage::Three;
    return true;
  }
  llvm::errs() << "error: " << optionName(option) << " must be 3 or 2, got " << arg << "\n";
  return false;
}

bool bmt::parseChoice(const llvm::cl::Option &option, llvm::StringRef arg,
                      CheckpointMode &value) {
  for (CheckpointMode mode : {CheckpointMode::All, CheckpointMode::None, CheckpointMode::Auto})
    if (arg == toString(mode)) {
      value = mode;
      return true;
    }
  llvm::errs() << "error: " << optionName(option) << " must be all, none or auto, got '" << arg
               << "'\n";
  return false;
}

std::string bmt::DefaultPipelineOptions::verify(llvm::StringRef prefix) const {
  std::string problem;
  llvm::raw_string_ostream os(problem);
  auto name = [&](llvm::StringRef option) { return (prefix + option).str(); };
  bool autoMode = checkpoint == CheckpointMode::Auto;
  if (worldSize <= 0)
    os << name("world-size") << " must be positive, got " << worldSize.getValue();
  else if (tensorParallel <= 0)
    os << name("tensor-parallel") << " must be positive, got " << tensorParallel.getValue();
  else if (worldSize % tensorParallel != 0)
    os << name("world-size") << " " << worldSize.getValue() << " is not a multiple of "
       << name("tensor-parallel") << " " << tensorParallel.getValue();
  else if (expertParallel <= 0)
    os << name("expert-parallel") << " must be positive, got " << expertParallel.getValue();
  else if (expertParallel > 1 && sequenceParallel)
    os << name("expert-parallel") << " " << expertParallel.getValue() << " with "
       << name("sequence-parallel") << " is not supported (drop " << name("sequence-parallel")
       << ")";
  else if (splitExpertWeights.hasValue() && splitExpertWeights && expertParallel <= 1)
    os << name("split-expert-weights") << " needs " << name("expert-parallel") << " > 1";
  else if (splitsExperts() && shardGroupSize > 0)
    os << name("shard-group-size") << " with " << name("expert-parallel") << " "
       << expertParallel.getValue()
       << ": hybrid sharding of experts split over the expert group is not supported (add "
       << name("split-expert-weights") << "=false to store every expert on every rank)";
  else if (expertParallel > 1 && !moeLayers)
    os << name("expert-parallel") << " needs " << name("moe-layers")
       << " (it splits the experts of the layers bmt-moe-layers lowers)";
  else if (worldSize.hasValue() && worldSize % (expertParallel * tensorParallel) != 0)
    // Expert groups are formed among the data-parallel ranks of one TP rank:
    // E must divide D = N / T.
    os << name("world-size") << " " << worldSize.getValue() << " is not a multiple of "
       << name("expert-parallel") << " " << expertParallel.getValue()
       << (tensorParallel > 1 ? " x " + name("tensor-parallel") + " " +
                                    std::to_string(tensorParallel.getValue())
                              : std::string());
  else if (pipelineParallel <= 0)
    os << name("pipeline-parallel") << " must be positive, got " << pipelineParallel.getValue();
  else if (worldSize.hasValue() && worldSize % pipelineParallel != 0)
    os << name("world-size") << " " << worldSize.getValue() << " is not a multiple of "
       << name("pipeline-parallel") << " " << pipelineParallel.getValue();
  else if (virtualStages <= 0)
    os << name("virtual-stages") << " must be positive, got " << virtualStages.getValue();
  else if (virtualStages > 1 && pipelineParallel == 1)
    os << name("virtual-stages") << " " << virtualStages.getValue() << " needs "
       << name("pipeline-parallel") << " P > 1 (it cuts each stage into chunks)";
  else if (worldSize.hasValue() && tensorParallel > 1 &&
           worldSize % (pipelineParallel * tensorParallel) != 0)
    os << name("world-size") << " " << worldSize.getValue() << " is not a multiple of "
       << name("pipeline-parallel") << " " << pipelineParallel.getValue() << " x "
       << name("tensor-parallel") << " " << tensorParallel.getValue();
  else if (pipelineParallel > 1 && expertParallel > 1)
    os << name("pipeline-parallel") << " " << pipelineParallel.getValue() << " with "
       << name("expert-parallel") << " is not supported yet";
  else if (sequenceParallel && tensorParallel == 1)
    os << name("sequence-parallel") << " needs " << name("tensor-parallel")
       << " T > 1 (it splits the sequence over the T ranks of a tensor-parallel group)";
  else if (sequenceParallel && seqLen.hasValue() && seqLen > 0 && seqLen % tensorParallel != 0)
    os << name("sequence-parallel") << ": " << name("seq-len") << " " << seqLen.getValue()
       << " is not a multiple of " << name("tensor-parallel") << " " << tensorParallel.getValue();
  else if (!llvm::StringRef(lora.getValue()).trim().empty() &&
           !llvm::StringRef(freeze.getValue()).trim().empty())
    os << name("freeze") << " with " << name("lora") << " is not supported (" << name("lora")
       << " freezes the whole base already; its targets choose the adapted layers)";
  else if (fuseSecondResults && !fuseElementwise)
    os << name("fuse-second-results") << " needs the elementwise fusion (" << name("fuse-elementwise")
       << " is false)";
  else if (shardGroupSize < 0)
    os << name("shard-group-size") << " must be 0 (all ranks) or positive, got "
       << shardGroupSize.getValue();
  // Only a world size given: without one (the default 1) a plan is compiled
  // for any N, and bmt-run checks G against the N it runs on.
  else if (worldSize.hasValue() && shardGroupSize > 0 &&
           (worldSize / tensorParallel) % shardGroupSize != 0) {
    os << name("world-size") << " " << worldSize.getValue();
    if (tensorParallel > 1)
      os << " / " << name("tensor-parallel") << " " << tensorParallel.getValue() << " = "
         << worldSize / tensorParallel << " data-parallel ranks are";
    else
      os << " is";
    os << " not a multiple of " << name("shard-group-size") << " " << shardGroupSize.getValue();
  }
  else if (!(memoryBudgetGib >= 0) || !std::isfinite(memoryBudgetGib))
    os << name("memory-budget-gib") << " must be a positive number of GiB";
  else if (autoMode && memoryBudgetGib <= 0)
    os << name("checkpoint=auto") << " needs a per-rank memory budget: "
       << name("memory-budget-gib=N");
  else if (!autoMode && memoryBudgetGib > 0)
    os << name("memory-budget-gib") << " applies to " << name("checkpoint=auto")
       << " only (the checkpoint mode is " << toString(checkpoint) << ")";
  else if (microBatch <= 0)
    os << name("micro-batch") << " must be positive, got " << microBatch.getValue();
  else if (seqLen <= 0)
    os << name("seq-len") << " must be positive, got " << seqLen.getValue();
  // Bounds that keep the memory estimate's products inside 64 bits.
  else if (microBatch > (int64_t(1) << 20) || seqLen > (int64_t(1) << 24))
    os << name("micro-batch") << " (at most 2^20) or " << name("seq-len")
       << " (at most 2^24) is too large";
  else if (prefetchDepth < 0)
    os << name("prefetch-depth") << " must be 0 or positive, got " << prefetchDepth.getValue();
  return problem;
}

void bmt::buildDefaultPipeline(OpPassManager &pm, const DefaultPipelineOptions &options) {
  // First: every later pass reads requires_grad (zero's groups, the
  // tensor-parallel splits, the memory estimate).
  if (!llvm::StringRef(options.freeze.getValue()).trim().empty()) {
    FreezeOptions freeze;
    freeze.patterns = options.freeze.getValue();
    pm.addPass(createFreeze(freeze));
  }
  // With tensor parallelism, after bmt-tensor-parallel: the base trains
  // while the chains are found (only trainable weights are split), then
  // the adapters follow the splits and the base is frozen.
  const bool lora = !llvm::StringRef(options.lora.getValue()).trim().empty();
  auto addLora = [&] {
    LoraOptions loraOptions;
    loraOptions.spec = options.lora.getValue();
    pm.addPass(createLora(loraOptions));
  };
  if (lora && options.tensorParallel <= 1)
    addLora();
  // Before everything: fusion would take the dispatch's casts and masks
  // into regions, and every MoE block's function changes alike, so
  // find-blocks still sees identical blocks (the experts' parameters stay
  // in them).
  if (options.moeLayers) {
    MoeLayersOptions moe;
    moe.expertParallel = options.expertParallel;
    moe.splitExpertWeights = options.splitsExperts();
    pm.addPass(createMoeLayers(moe));
  }
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
  if (options.fuseElementwise) {
    FuseElementwiseOptions fuse;
    fuse.inlineCalls = options.fuseInlineCalls;
    fuse.secondResults = options.fuseSecondResults;
    pm.addPass(createFuseElementwise(fuse));
  }
  pm.addPass(createFindBlocks());
  if (options.tensorParallel > 1) {
    TensorParallelOptions tp;
    tp.tensorParallel = options.tensorParallel;
    tp.sequenceParallel = options.sequenceParallel;
    pm.addPass(createTensorParallel(tp));
    if (lora)
      addLora();
  }
  // After tensor-parallel: it splits the repeats' kv heads (or replicates
  // k/v and narrows after the repeat, which this pass then leaves alone).
  if (options.groupedQueryAttention)
    pm.addPass(createGroupedQueryAttention());
  ZeroOptions zero;
  zero.stage = static_cast<int64_t>(options.zeroStage.getValue());
  zero.shardGroupSize = options.shardGroupSize;
  pm.addPass(createZero(zero));
  CheckpointOptions checkpoint;
  checkpoint.mode = toString(options.checkpoint).str();
  checkpoint.budgetGib = options.memoryBudgetGib;
  checkpoint.microBatch = options.microBatch;
  checkpoint.seqLen = options.seqLen;
  checkpoint.worldSize = options.worldSize;
  checkpoint.prefetchDepth = options.prefetchDepth;
  pm.addPass(createCheckpoint(checkpoint));
  if (options.pipelineParallel > 1) {
    PipelineParallelOptions pipeline;
    pipeline.pipelineParallel = options.pipelineParallel;
    pipeline.virtualStages = options.virtualStages;
    pipeline.worldSize = options.worldSize.hasValue()
                             ? int64_t(options.worldSize)
                             : int64_t(options.pipelineParallel) * options.tensorParallel;
    pipeline.microBatch = options.microBatch;
    pipeline.seqLen = options.seqLen;
    pm.addPass(createPipelineParallel(pipeline));
  }
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
  registerPassPipeline(
      "bmt-default-pipeline",
      "bmt's default pipeline: moe-layers, causal-attention, fuse-gelu, fuse-elementwise, find-blocks, "
      "zero, checkpoint, overlap, then the plan summary "
      "(what `bmt-opt model.pt -o sharded.pt` runs without pass flags)",
      [](OpPassManager &pm, llvm::StringRef text,
         llvm::function_ref<LogicalResult(const llvm::Twine &)> errorHandler) {
        DefaultPipelineOptions options;
        if (failed(options.parseFromString(text)))
          return failure();
        if (std::string problem = options.verify(""); !problem.empty())
          return errorHandler("bmt-default-pipeline: " + problem);
        buildDefaultPipeline(pm, options);
        return success();
      },
      [](llvm::function_ref<void(const detail::PassOptions &)> handler) {
        handler(DefaultPipelineOptions());
      });
}
