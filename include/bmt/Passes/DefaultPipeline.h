//===- DefaultPipeline.h - the default pipeline and its options -*- C++ -*-===//
//
// The one declaration of the default pipeline's options: the named pipeline
// `--bmt-default-pipeline='world-size=8 ...'`, bmt-opt's top-level flags
// (--world-size 8 ...; bmt::CompileFlags) and the compile path all use
// DefaultPipelineOptions. See docs/passes/default-pipeline.md.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_DEFAULTPIPELINE_H
#define BMT_PASSES_DEFAULTPIPELINE_H

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

namespace bmt {

/// ZeRO stage of bmt-zero: 3 re-gathers a block's parameters for backward,
/// 2 keeps them gathered from forward to backward.
enum class ZeroStage { Three = 3, Two = 2 };
/// Which blocks bmt-checkpoint recomputes in backward.
enum class CheckpointMode { All, None, Auto };

/// A choice as the command line spells it ("3", "auto").
llvm::StringRef toString(ZeroStage stage);
llvm::StringRef toString(CheckpointMode mode);
/// Every choice of the enum of `any`, for --help ("3|2", "all|none|auto").
llvm::StringRef choiceNames(ZeroStage any);
llvm::StringRef choiceNames(CheckpointMode any);

/// Reads a choice of `option` from `arg`. Returns false, after printing one
/// line ("error: --zero-stage must be 3 or 2, got 1"; the option's name
/// without "--" inside a pipeline string), for any other spelling.
bool parseChoice(const llvm::cl::Option &option, llvm::StringRef arg, ZeroStage &value);
bool parseChoice(const llvm::cl::Option &option, llvm::StringRef arg, CheckpointMode &value);

/// The command-line parser of an enum choice, for llvm::cl and pass options.
template <typename Enum> class ChoiceParser : public llvm::cl::basic_parser<Enum> {
public:
  ChoiceParser(llvm::cl::Option &option) : llvm::cl::basic_parser<Enum>(option) {}
  /// True (an error, already printed) when `arg` is not a choice.
  bool parse(llvm::cl::Option &option, llvm::StringRef, llvm::StringRef arg, Enum &value) {
    return !parseChoice(option, arg, value);
  }
  llvm::StringRef getValueName() const override { return choiceNames(Enum()); }
  void printOptionDiff(const llvm::cl::Option &option, Enum value,
                       const llvm::cl::OptionValue<Enum> &defaultValue,
                       size_t globalWidth) const {
    this->printOptionName(option, globalWidth);
    llvm::outs() << "= " << toString(value);
    if (defaultValue.hasValue())
      llvm::outs() << " (default: " << toString(defaultValue.getValue()) << ")";
    llvm::outs() << "\n";
  }
  /// Pass options print their values through this (--dump-pass-pipeline).
  static void print(llvm::raw_ostream &os, Enum value) { os << toString(value); }
};

} // namespace bmt

namespace llvm::cl {
template <> class parser<bmt::ZeroStage> : public bmt::ChoiceParser<bmt::ZeroStage> {
public:
  using ChoiceParser::ChoiceParser;
};
template <> class parser<bmt::CheckpointMode> : public bmt::ChoiceParser<bmt::CheckpointMode> {
public:
  using ChoiceParser::ChoiceParser;
};
} // namespace llvm::cl

namespace bmt {

/// Options of the default pipeline. Those commandLineFlags() lists are also
/// bmt-opt's top-level flags of the same names.
struct DefaultPipelineOptions : mlir::PassPipelineOptions<DefaultPipelineOptions> {
  Option<int64_t> worldSize{
      *this, "world-size",
      llvm::cl::desc("ranks of the training job (memory estimate, auto checkpoint)"),
      llvm::cl::init(1)};
  Option<int64_t> tensorParallel{
      *this, "tensor-parallel",
      llvm::cl::desc("ranks of one tensor-parallel group: blocks are split over groups of this "
                     "many consecutive ranks, ZeRO shards across the groups (1: none; "
                     "bmt-tensor-parallel)"),
      llvm::cl::init(1)};
  Option<int64_t> expertParallel{
      *this, "expert-parallel",
      llvm::cl::desc("ranks of one expert group: each MoE layer's experts are split over groups "
                     "of this many consecutive ranks, tokens go to their experts' ranks by "
                     "all-to-all (1: none; bmt-moe-layers)"),
      llvm::cl::init(1)};
  Option<int64_t> pipelineParallel{
      *this, "pipeline-parallel",
      llvm::cl::desc("pipeline stages: the blocks are cut into this many contiguous stages, "
                     "rank r runs stage r / (world-size / P) (1: none; bmt-pipeline-parallel, "
                     "docs/passes/pipeline.md)"),
      llvm::cl::init(1)};
  Option<int64_t> virtualStages{
      *this, "virtual-stages",
      llvm::cl::desc("with pipeline-parallel P > 1: cut the blocks into P x V chunks, stage s "
                     "holding chunks s, s + P, ... (interleaved 1F1B; 1: none; "
                     "bmt-pipeline-parallel)"),
      llvm::cl::init(1)};
  Option<bool> splitExpertWeights{
      *this, "split-expert-weights",
      llvm::cl::desc("with expert-parallel > 1 (on by default): each rank stores only its "
                     "expert group position's experts, ZeRO-sharded over the ranks of that "
                     "position; =false stores every expert on every rank (bmt-moe-layers)"),
      llvm::cl::init(true)};
  Option<bool> sequenceParallel{
      *this, "sequence-parallel",
      llvm::cl::desc("with tensor-parallel > 1: split the activations between the chains "
                     "(norms, residual adds) along the sequence too (Megatron-LM's sequence "
                     "parallelism; the sequence length must be a multiple of tensor-parallel)"),
      llvm::cl::init(false)};
  Option<ZeroStage> zeroStage{*this, "zero-stage", llvm::cl::desc("ZeRO stage: 3 or 2"),
                              llvm::cl::init(ZeroStage::Three)};
  Option<int64_t> shardGroupSize{
      *this, "shard-group-size",
      llvm::cl::desc("hybrid sharding: shard within groups of this many ranks (0: all ranks)"),
      llvm::cl::init(0)};
  Option<CheckpointMode> checkpoint{
      *this, "checkpoint", llvm::cl::desc("blocks recomputed in backward: all, none or auto"),
      llvm::cl::init(CheckpointMode::All)};
  Option<double> memoryBudgetGib{
      *this, "memory-budget-gib",
      llvm::cl::desc("checkpoint=auto: per-rank memory budget in GiB"), llvm::cl::init(0)};
  Option<int64_t> microBatch{*this, "micro-batch",
                             llvm::cl::desc("sequences per rank per forward"),
                             llvm::cl::init(1)};
  Option<int64_t> seqLen{*this, "seq-len", llvm::cl::desc("tokens per sequence"),
                         llvm::cl::init(1024)};
  Option<int64_t> prefetchDepth{
      *this, "prefetch-depth",
      llvm::cl::desc("blocks gathered ahead of the running one (0: none)"), llvm::cl::init(1)};
  Option<bool> assumeUnpadded{
      *this, "assume-unpadded",
      llvm::cl::desc("treat attention_mask as all ones, so that a causal mask ANDed with it "
                     "becomes is_causal=True (bmt-causal-attention); recorded in the plan, "
                     "bmt-run trains with all-ones masks and --dump refuses padded ones. "
                     "assume-unpadded=false keeps the padding term"),
      llvm::cl::init(true)};
  Option<bool> moeLayers{*this, "moe-layers",
                         llvm::cl::desc("lower each mixture-of-experts layer's token permutation to "
                                        "bmt.moe_dispatch / bmt.moe_combine (bmt-moe-layers)"),
                         llvm::cl::init(true)};
  Option<bool> fuseGelu{*this, "fuse-gelu",
                        llvm::cl::desc("replace GELU written out as elementwise ops by "
                                       "aten::gelu (bmt-fuse-gelu)"),
                        llvm::cl::init(true)};
  Option<bool> fuseElementwise{
      *this, "fuse-elementwise",
      llvm::cl::desc("group pointwise ops and one last-dim reduction into bmt.fused regions, "
                     "run as generated kernels (bmt-fuse-elementwise; on by default, "
                     "fuse-elementwise=false for a plan of plain ATen ops)"),
      llvm::cl::init(true)};
  Option<bool> fuseInlineCalls{
      *this, "fuse-inline-calls",
      llvm::cl::desc("with fuse-elementwise: inline calls of parameter-free pointwise "
                     "submodules (an activation) first, so their ops join the caller's regions "
                     "(bmt-fuse-elementwise inline-calls; on by default)"),
      llvm::cl::init(true)};
  Option<bool> fuseSecondResults{
      *this, "fuse-second-results",
      llvm::cl::desc("with fuse-elementwise: let regions return values read after them too, "
                     "and with fuse-inline-calls inline norm submodules, so a residual add and "
                     "the norm after it share one region (bmt-fuse-elementwise second-results; "
                     "off by default: not faster on an H200, docs/passes/fuse-elementwise.md)"),
      llvm::cl::init(false)};
  Option<bool> groupedQueryAttention{
      *this, "grouped-query-attention",
      llvm::cl::desc("let aten::scaled_dot_product_attention read the key/value heads with "
                     "enable_gqa=True instead of their repeat_kv copies "
                     "(bmt-grouped-query-attention; off by default)"),
      llvm::cl::init(false)};
  Option<bool> causalAttention{
      *this, "causal-attention",
      llvm::cl::desc("replace a causal mask built from aranges by is_causal=True in "
                     "aten::scaled_dot_product_attention (bmt-causal-attention)"),
      llvm::cl::init(true)};
  Option<std::string> freeze{
      *this, "freeze",
      llvm::cl::desc("comma-separated globs over parameter names to freeze (not train), e.g. "
                     "'model.embed_tokens.*,model.layers.[0-3].*' (bmt-freeze; "
                     "docs/passes/freeze.md)"),
      llvm::cl::init("")};
  Option<std::string> lora{
      *this, "lora",
      llvm::cl::desc("low-rank adapters: r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj "
                     "(or targets=all-linear); the base is frozen (bmt-lora; docs/passes/lora.md)"),
      llvm::cl::init("")};
  Option<bool> summary{*this, "summary",
                       llvm::cl::desc("print the plan summary to stderr at the end"),
                       llvm::cl::init(true)};

  /// The options that are also top-level flags of bmt-opt, in this order.
  llvm::SmallVector<llvm::cl::Option *> commandLineFlags() {
    return {&worldSize,       &tensorParallel, &expertParallel, &splitExpertWeights,
            &pipelineParallel, &virtualStages,  &sequenceParallel, &zeroStage, &shardGroupSize,
            &checkpoint,      &memoryBudgetGib, &microBatch, &seqLen,
            &prefetchDepth,   &assumeUnpadded, &fuseElementwise, &fuseSecondResults,
            &groupedQueryAttention, &freeze, &lora};
  }

  /// Checks the values together (sizes positive, a budget exactly with
  /// checkpoint=auto). Returns the first problem as one sentence that names
  /// options as `prefix` + name ("--world-size must be positive, got 0" with
  /// prefix "--"), or an empty string when they are fine.
  std::string verify(llvm::StringRef prefix) const;

  /// Whether the experts' weights are split over the expert group:
  /// split-expert-weights (default on) with expert-parallel > 1.
  bool splitsExperts() const { return splitExpertWeights && expertParallel > 1; }
};

/// freeze (with options.freeze), lora (with options.lora), moe-layers (unless options.moeLayers is false),
/// causal-attention (unless options.causalAttention is false; with
/// options.assumeUnpadded), fuse-gelu (unless options.fuseGelu is false),
/// fuse-elementwise (unless options.fuseElementwise is false; with
/// options.fuseInlineCalls and options.fuseSecondResults),
/// find-blocks, tensor-parallel (T > 1), grouped-query-attention (with
/// options.groupedQueryAttention), zero, checkpoint, pipeline-parallel (P > 1), overlap, then (with options.summary) the
/// summary with the memory estimate. `options` must pass verify().
void buildDefaultPipeline(mlir::OpPassManager &pm, const DefaultPipelineOptions &options);

/// Registers `--bmt-default-pipeline` with the global pass registry; bad
/// options there are one error (verify() without the "--").
void registerDefaultPipeline();

} // namespace bmt

#endif // BMT_PASSES_DEFAULTPIPELINE_H
