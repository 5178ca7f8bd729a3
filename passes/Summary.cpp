//===- Summary.cpp - the bmt-summary pass ---------------------------------===//
//
// Prints counts of parameters, ties, buffers, functions and ops; changes
// nothing. See passes/Passes.td for the output format.
//
//===----------------------------------------------------------------------===//

#include "MemoryEstimate.h"

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/TensorSplit.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

namespace bmt {
#define GEN_PASS_DEF_SUMMARY
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;

namespace {

/// Bytes of one element of a parameter's element type (i1 is one byte, as in PyTorch).
int64_t elementBytes(Type type) {
  unsigned bits = type.getIntOrFloatBitWidth();
  return bits < 8 ? 1 : bits / 8;
}

/// The stages of bmt-pipeline-parallel (module attribute bmt.pipeline):
/// each stage's (with virtual stages each chunk's, then each stage's
/// chunks) blocks, parameters, FLOPs per micro-batch and bytes per rank.
void printPipeline(llvm::raw_ostream &os, ModuleOp module, DictionaryAttr pipeline) {
  auto stages = pipeline.getAs<IntegerAttr>("stages");
  auto list = pipeline.getAs<FlatSymbolRefAttr>("block_list");
  auto firsts = pipeline.getAs<DenseI64ArrayAttr>("first_blocks");
  auto flops = pipeline.getAs<DenseI64ArrayAttr>("flops");
  auto bytes = pipeline.getAs<DenseI64ArrayAttr>("bytes");
  auto params = pipeline.getAs<DenseI64ArrayAttr>("parameters");
  auto world = pipeline.getAs<IntegerAttr>("world_size");
  if (!stages || !list || !firsts || !flops || !bytes || !params || !world)
    return;
  int64_t v = 1;
  if (auto virtualStages = pipeline.getAs<IntegerAttr>("virtual_stages"))
    v = virtualStages.getInt();
  auto blockList = module.lookupSymbol<bmt::BlockListOp>(list.getValue());
  int64_t p = stages.getInt(), numBlocks = blockList ? blockList.getBlocks().size() : 0;
  const int64_t parts = p * v;
  if (static_cast<int64_t>(firsts.size()) != parts)
    return;
  // Ranks: TP innermost, then data-parallel, stages outermost.
  const int64_t tp = bmt::tensorParallelOf(module), d = world.getInt() / (p * tp);
  os << "  pipeline: " << p << " stages";
  if (v > 1)
    os << " x " << v << " virtual stages";
  os << " of " << list.getValue() << " over world size " << world.getInt() << " (stage = rank / "
     << world.getInt() / p;
  if (tp > 1)
    os << "; " << d << " data-parallel x " << tp << " tensor-parallel ranks per stage";
  os << "), " << (v > 1 ? "interleaved 1F1B" : "1F1B") << "\n";
  int64_t total = 0;
  for (int64_t f : flops.asArrayRef())
    total += f;
  for (int64_t c = 0; c < parts; ++c) {
    int64_t first = firsts[c], end = c + 1 < parts ? firsts[c + 1] : numBlocks;
    if (v > 1)
      os << "    chunk " << c << " (stage " << c % p << ")";
    else
      os << "    stage " << c;
    os << ": blocks " << first << ".." << end - 1;
    if (c == 0)
      os << " + before the blocks";
    if (c == parts - 1)
      os << " + after the blocks";
    os << ", " << params[c] << " parameters, "
       << llvm::format("%.3g", static_cast<double>(flops[c]) * 1e-9)
       << " GFLOP per micro-batch ("
       << llvm::format("%.0f", total ? 100.0 * flops[c] / total : 0.0) << " %), about "
       << bmt::formatBytes(bytes[c]) << " per rank\n";
  }
  for (int64_t s = 0; v > 1 && s < p; ++s) {
    int64_t stageFlops = 0, stageBytes = 0;
    os << "    stage " << s << ": chunks";
    for (int64_t c = s; c < parts; c += p) {
      os << (c == s ? " " : ", ") << c;
      stageFlops += flops[c];
      stageBytes += bytes[c];
    }
    os << ", " << llvm::format("%.0f", total ? 100.0 * stageFlops / total : 0.0)
       << " % of the FLOPs, at most about " << bmt::formatBytes(stageBytes) << " per rank\n";
  }
  if (auto tied = pipeline.getAs<ArrayAttr>("tied"); tied && !tied.empty()) {
    os << "    tied across " << (v > 1 ? "chunks" : "stages") << " 0 and " << parts - 1
       << " (gradient summed): ";
    llvm::interleaveComma(tied, os,
                          [&](Attribute a) { os << cast<StringAttr>(a).getValue(); });
    os << "\n";
  }
}

struct SummaryPass : bmt::impl::SummaryBase<SummaryPass> {
  using SummaryBase::SummaryBase;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    int64_t elements = 0, bytes = 0, tensors = 0, buffers = 0, frozenTensors = 0, frozenElements = 0;
    int64_t functions = 0, calls = 0, atenOps = 0;
    SmallVector<std::string> ties;
    for (Operation &op : module.getBody()->getOperations()) {
      if (auto p = dyn_cast<bmt::ParameterOp>(op)) {
        auto type = cast<RankedTensorType>(p.getType());
        ++tensors;
        elements += type.getNumElements();
        bytes += type.getNumElements() * elementBytes(type.getElementType());
        if (!p.getRequiresGrad()) {
          ++frozenTensors;
          frozenElements += type.getNumElements();
        }
        if (auto aliases = p.getAliases()) {
          std::string tie = p.getSymName().str();
          for (Attribute alias : *aliases)
            tie += " = " + cast<StringAttr>(alias).getValue().str();
          ties.push_back(tie);
        }
      } else if (isa<bmt::BufferOp>(op)) {
        ++buffers;
      } else if (auto f = dyn_cast<func::FuncOp>(op)) {
        ++functions;
        f.walk([&](Operation *inner) {
          calls += isa<func::CallOp>(inner);
          atenOps += isa<bmt::AtenOp>(inner);
        });
      }
    }
    llvm::raw_ostream &os = llvm::errs();
    os << "bmt summary";
    if (auto source = module->getAttrOfType<StringAttr>("bmt.source"))
      os << " of " << source.getValue();
    os << "\n  parameters: " << elements << " elements in " << tensors
       << " tensors (" << bmt::formatBytes(bytes) << ")";
    if (frozenTensors)
      os << ", " << frozenTensors << " frozen (" << frozenElements << " elements)";
    os << "\n";
    os << "  tied: " << ties.size();
    if (!ties.empty()) {
      os << " (";
      llvm::interleave(ties, os, "; ");
      os << ")";
    }
    os << "\n  buffers: " << buffers << " tensors\n";
    // Block lists, groups and the decisions of the later passes.
    bmt::MemoryConfig config;
    config.worldSize = std::max<int64_t>(1, worldSize);
    auto plan = module->getAttrOfType<DictionaryAttr>("bmt.checkpoint_plan");
    auto planValue = [&](StringRef key, int64_t fallback) {
      if (plan)
        if (auto v = plan.getAs<IntegerAttr>(key))
          return v.getInt();
      return fallback;
    };
    config.microBatch = microBatch > 0 ? int64_t(microBatch) : planValue("micro_batch", 1);
    config.seqLen = seqLen > 0 ? int64_t(seqLen) : planValue("seq_len", 1024);
    auto overlap = module->getAttrOfType<DictionaryAttr>("bmt.overlap");
    if (overlap)
      if (auto depth = overlap.getAs<IntegerAttr>("prefetch_depth"))
        config.prefetchDepth = depth.getInt();
    bmt::MemoryModel model = bmt::estimateMemory(module, config);
    bool sharded = !module.getOps<bmt::StorageGroupOp>().empty();
    int64_t tp = bmt::tensorParallelOf(module);
    for (auto list : module.getOps<bmt::BlockListOp>()) {
      auto pathOf = [&](Attribute ref) {
        auto f = module.lookupSymbol<func::FuncOp>(cast<FlatSymbolRefAttr>(ref).getValue());
        auto path = f ? f->getAttrOfType<StringAttr>("bmt.module_path") : nullptr;
        return path ? path.getValue() : cast<FlatSymbolRefAttr>(ref).getValue();
      };
      os << "  blocks: " << list.getBlocks().size() << " in " << list.getSymName();
      if (!list.getBlocks().empty())
        os << " (" << pathOf(list.getBlocks()[0]) << " ... "
           << pathOf(list.getBlocks()[list.getBlocks().size() - 1]) << ")";
      int64_t least = -1, most = -1;
      for (const bmt::BlockCost &b : model.blocks) {
        auto ref = b.call->getAttrOfType<FlatSymbolRefAttr>("bmt.block");
        if (!ref || ref.getValue() != list.getSymName())
          continue;
        least = least < 0 ? b.parameters : std::min(least, b.parameters);
        most = std::max(most, b.parameters);
      }
      if (sharded && most >= 0) {
        os << ", " << least;
        if (most != least)
          os << " to " << most;
        os << " parameters each";
        if (tp > 1)
          os << " per TP rank";
      }
      os << "\n";
    }
    if (auto what = module->getAttrOfType<StringAttr>("bmt.tensor_parallel_plan"))
      os << "  tensor parallel: " << tp << " ranks per group; " << what.getValue() << "\n";
    if (auto ep = module->getAttrOfType<IntegerAttr>("bmt.expert_parallel")) {
      int64_t layers = 0, experts = 0;
      module.walk([&](bmt::MoeDispatchOp d) {
        ++layers;
        experts = d.getNumExperts();
      });
      os << "  expert parallel: " << ep.getInt() << " ranks per expert group ("
         << (tp > 1 ? "data-parallel ranks of one TP rank, the TP group's ranks computing the "
                      "same experts"
                    : "consecutive ranks")
         << "); "
         << layers << " MoE layer" << (layers == 1 ? "" : "s") << ", " << experts / ep.getInt()
         << " of " << experts << " experts computed per rank\n";
    }
    int64_t groupBytes = 0, groups = 0, frozenGroups = 0;
    for (auto group : module.getOps<bmt::StorageGroupOp>()) {
      groupBytes += group.getSize() * elementBytes(group.getElementType());
      ++groups;
      frozenGroups += group.getFrozen();
    }
    if (groups) {
      os << "  outside blocks: " << model.outsideParameters << " parameters"
         << (tp > 1 ? " per TP rank" : "") << "\n";
      os << "  storage groups: " << groups << " (" << bmt::formatBytes(groupBytes) << ", "
         << groupBytes << " bytes";
      if (frozenGroups)
        os << "; " << frozenGroups << " of frozen parameters";
      os << "), ZeRO-" << model.zeroStage;
      if (auto zero = module->getAttrOfType<DictionaryAttr>("bmt.zero"))
        if (auto g = zero.getAs<IntegerAttr>("shard_group_size"); g && g.getInt() > 0)
          os << ", shard group size " << g.getInt();
      os << "\n";
    }
    SmallVector<bool> recomputed = model.currentFlags();
    bool decided = llvm::any_of(model.blocks, [](const bmt::BlockCost &b) {
      return b.call->hasAttr("bmt.checkpoint");
    });
    if (decided) {
      os << "  checkpoint: " << llvm::count(recomputed, true) << " of " << model.blocks.size()
         << " blocks recomputed";
      if (plan)
        if (auto mode = plan.getAs<StringAttr>("mode")) {
          os << " (mode " << mode.getValue();
          if (auto budget = plan.getAs<FloatAttr>("budget_gib"))
            os << ", budget "
               << bmt::formatBytes(static_cast<int64_t>(budget.getValueAsDouble() * 1024 *
                                                        1024 * 1024));
          os << ")";
        }
      os << "\n";
    }
    if (overlap)
      os << "  overlap: prefetch depth " << config.prefetchDepth << "\n";
    if (auto pipeline = module->getAttrOfType<DictionaryAttr>("bmt.pipeline"))
      printPipeline(os, module, pipeline);
    if (worldSize > 0) {
      int64_t total = model.totalBytes(recomputed);
      os << "  memory per rank at world size " << config.worldSize << " (micro-batch "
         << config.microBatch << ", seq-len " << config.seqLen << "): about "
         << bmt::formatBytes(total) << " (" << total << " bytes)\n";
      os << "    parameter, gradient and optimizer shards: "
         << bmt::formatBytes(model.stateBytes);
      if (groups)
        os << " (sharded over " << model.shardRanks
           << (model.expertShardRanks > 0
                   ? "; expert slices over " + std::to_string(model.expertShardRanks)
                   : std::string())
           << ")";
      os << "\n";
      if (model.frozenBytes > 0)
        os << "    frozen parameters ("
           << (frozenGroups ? "sharded over " + std::to_string(model.shardRanks) +
                                  (model.shardRanks == 1 ? " rank" : " ranks")
                            : std::string("whole on every rank"))
           << ", no gradient or optimizer state): " << bmt::formatBytes(model.frozenBytes)
           << " (" << model.frozenBytes << " bytes per rank)\n";
      os << "    gathered parameters and gradients: "
         << bmt::formatBytes(model.outsideGatheredBytes + model.blockGatheredBytes()) << "\n";
      int64_t activations = model.activationBytes(recomputed);
      os << "    activations: " << bmt::formatBytes(activations) << " (" << activations
         << " bytes; outside the blocks " << model.outsideActivationBytes;
      if (!model.blocks.empty()) {
        // The walk's terms (docs/passes/memory-estimate.md): A_i, I_i.
        auto range = [&](auto field) {
          int64_t least = -1, most = 0;
          for (const bmt::BlockCost &b : model.blocks) {
            least = least < 0 ? field(b) : std::min(least, field(b));
            most = std::max(most, field(b));
          }
          return std::to_string(least) + (most != least ? " to " + std::to_string(most) : "");
        };
        os << ", a block's saved "
           << range([](const bmt::BlockCost &b) { return b.activationBytes; })
           << ", its inputs " << range([](const bmt::BlockCost &b) { return b.inputBytes; });
      }
      os << ")\n";
    }
    os << "  functions: " << functions << ", calls: " << calls
       << ", aten ops: " << atenOps << "\n";
    markAllAnalysesPreserved();
  }
};

} // namespace
