//===- Pipeline.cpp - the bmt-pipeline-parallel pass ----------------------===//
//
// Cuts the one block list into P contiguous pipeline stages. The ops before
// the first block call (in the blocks' caller and, before the call down, in
// each function from @forward to it) belong to stage 0, those after the
// last to stage P - 1; each block is costed by its matmul FLOPs and the cut
// minimises the largest stage's FLOPs, then its memory estimate. See
// passes/Passes.td for the contract and docs/passes/pipeline.md for the
// cost model. With virtual stages V > 1 the same cut makes P x V chunks
// (chunk 0 with the ops before the blocks, the last with those after),
// stage s holding chunks s, s + P, ... (interleaved 1F1B).
//
//===----------------------------------------------------------------------===//

#include "MemoryEstimate.h"

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/TensorSplit.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <limits>
#include <map>
#include <set>

namespace bmt {
#define GEN_PASS_DEF_PIPELINEPARALLEL
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;

namespace {

/// Whether `op` is a matmul whose parameter operand's elements count as
/// 2 FLOPs per token each.
bool isMatmul(bmt::AtenOp op) {
  StringRef name = op.getOperatorName();
  return name == "aten::linear" || name == "aten::addmm" || name == "aten::mm" ||
         name == "aten::matmul";
}

/// The elements of `p` one rank holds: a tensor-parallel split's 1/T of
/// them (its matmul FLOPs too), else all.
int64_t localElements(bmt::ParameterOp p, int64_t tp) {
  int64_t n = cast<RankedTensorType>(p.getType()).getNumElements();
  return bmt::parameterSplitOf(p).isTensorSplit() ? n / tp : n;
}

/// What one stage reads and costs, as it is being collected.
struct StageUse {
  int64_t flopsPerToken = 0;                 ///< forward matmul FLOPs per token
  llvm::SetVector<bmt::ParameterOp> params;  ///< parameters read on the stage
};

/// Collects the FLOPs and parameters of the ops given to it (with their
/// callees) into a stage's use, and who reads each parameter.
class StageCollector {
public:
  explicit StageCollector(ModuleOp module)
      : symbols(module), tp(bmt::tensorParallelOf(module)) {}

  /// The FLOPs and parameters of `op` and of the functions it calls,
  /// added to `use`; `blockIndex` (-1 outside the blocks) is recorded as a
  /// reader of each parameter, for the sharing check.
  void collect(Operation *op, StageUse &use, int64_t blockIndex) {
    op->walk([&](Operation *inner) {
      if (auto g = dyn_cast<bmt::GetGlobalOp>(inner)) {
        if (auto p = symbols.lookup<bmt::ParameterOp>(g.getGlobal())) {
          use.params.insert(p);
          readers[p].insert(blockIndex);
        }
      } else if (auto aten = dyn_cast<bmt::AtenOp>(inner)) {
        if (!isMatmul(aten))
          return;
        for (Value operand : aten.getOperands())
          if (bmt::ParameterOp p = parameterOf(operand))
            use.flopsPerToken += 2 * localElements(p, tp);
      } else if (auto call = dyn_cast<func::CallOp>(inner)) {
        auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
        if (callee && !callee.getBody().empty() && active.insert(callee).second) {
          // A parameter passed as an argument (GPT-2's tied lm_head weight
          // is read in @forward and passed to @lm_head.forward).
          for (auto [arg, operand] :
               llvm::zip(callee.getBody().front().getArguments(), call.getOperands()))
            if (bmt::ParameterOp p = parameterOf(operand))
              bound[arg] = p;
          collect(callee, use, blockIndex);
          active.erase(callee);
        }
      }
    });
  }

  /// For each parameter, the block indices (-1: outside) that read it.
  llvm::MapVector<bmt::ParameterOp, std::set<int64_t>> readers;

private:
  /// The parameter `v` is: read by a get_global, or passed down as an
  /// argument; null otherwise.
  bmt::ParameterOp parameterOf(Value v) {
    if (auto g = v.getDefiningOp<bmt::GetGlobalOp>())
      return symbols.lookup<bmt::ParameterOp>(g.getGlobal());
    return bound.lookup(v);
  }

  SymbolTable symbols;
  int64_t tp; ///< T: a split parameter's FLOPs are 1/T per rank
  llvm::DenseSet<Operation *> active;
  llvm::DenseMap<Value, bmt::ParameterOp> bound; ///< callee arguments that are parameters
};

/// A stage's estimate.
struct StageCost {
  int64_t first = 0, count = 0; ///< blocks [first, first + count)
  int64_t flops = 0;            ///< per micro-batch, forward + backward (+ recompute)
  int64_t bytes = 0;            ///< per rank
  int64_t parameters = 0;       ///< parameter elements it holds
};

/// Splits each storage group outside the blocks whose members are read by
/// different sets of stages (`stagesOf`) into one group per set, laid out
/// as bmt-zero lays a group out and named after the set
/// ("outside_blocks.stage0.f32", "outside_blocks.stage0_3.f32" for a
/// tied weight), so that a stage holds, gathers and keeps optimizer state
/// for only the outside parameters it reads: the embedding on stage 0, the
/// final norm and the head on the last. A group something refers to
/// already is left whole. Returns the number of groups made.
int64_t splitOutsideGroups(ModuleOp module,
                           llvm::function_ref<std::set<int64_t>(bmt::ParameterOp)> stagesOf) {
  SymbolTable symbols(module);
  int64_t made = 0;
  SmallVector<bmt::StorageGroupOp> groups(module.getOps<bmt::StorageGroupOp>());
  for (bmt::StorageGroupOp g : groups) {
    if (g.getBlockAttr() || !SymbolTable::symbolKnownUseEmpty(g, module))
      continue;
    std::map<std::set<int64_t>, SmallVector<bmt::ParameterOp>> parts;
    for (Attribute ref : g.getParams()) {
      auto p = symbols.lookup<bmt::ParameterOp>(cast<FlatSymbolRefAttr>(ref).getValue());
      if (!p)
        return made;
      parts[stagesOf(p)].push_back(p);
    }
    if (parts.size() <= 1)
      continue;
    StringRef name = g.getSymName();
    OpBuilder builder(g);
    for (const auto &[stages, members] : parts) {
      std::string key = "stage";
      for (auto [i, s] : llvm::enumerate(stages))
        key += (i ? "_" : "") + std::to_string(s);
      StringRef rest = name;
      std::string partName = rest.consume_front("outside_blocks.")
                                 ? "outside_blocks." + key + "." + rest.str()
                                 : name.str() + "." + key;
      SmallVector<Attribute> refs;
      for (bmt::ParameterOp p : members)
        refs.push_back(FlatSymbolRefAttr::get(p.getSymNameAttr()));
      const bmt::StorageLayout layout = bmt::storageLayout(members, g.getAlignment());
      bmt::StorageGroupOp::create(builder, g.getLoc(), builder.getStringAttr(partName),
                                  g.getElementTypeAttr(), builder.getArrayAttr(refs),
                                  builder.getDenseI64ArrayAttr(layout.offsets),
                                  builder.getI64IntegerAttr(layout.size), g.getAlignmentAttr(),
                                  FlatSymbolRefAttr(), IntegerAttr(), g.getFrozenAttr());
      ++made;
    }
    g.erase();
  }
  return made;
}

/// The first block of each of `stages` stages of `blocks` blocks (every
/// stage at least one, contiguous) that minimises the largest stage's
/// FLOPs, among those cuts the largest stage's bytes, and among those the
/// sum of the squares of the stages' FLOPs: three exact searches over the
/// cuts, each only through stages within the earlier optima.
SmallVector<int64_t>
cheapestCut(int64_t stages, int64_t blocks,
            llvm::function_ref<StageCost(int64_t, int64_t, int64_t)> costOf) {
  // table[s][b][e]: stage s holding blocks [b, e).
  SmallVector<SmallVector<SmallVector<StageCost>>> table(
      stages, SmallVector<SmallVector<StageCost>>(blocks + 1,
                                                  SmallVector<StageCost>(blocks + 1)));
  for (int64_t s = 0; s < stages; ++s)
    for (int64_t b = s; b < (s == 0 ? 1 : blocks); ++b)
      for (int64_t e = s == stages - 1 ? blocks : b + 1; e <= blocks - (stages - 1 - s); ++e)
        table[s][b][e] = costOf(s, b, e - b);
  constexpr double kNone = std::numeric_limits<double>::infinity();
  // The best value over stages 0..s covering [0, e) of the stages' `field`
  // combined by max (or summed), each stage's FLOPs and bytes at most the
  // limits; `from` keeps the last stage's first block.
  SmallVector<SmallVector<int64_t>> from;
  auto search = [&](auto field, bool sum, int64_t flopsLimit, int64_t bytesLimit) {
    SmallVector<SmallVector<double>> best(stages, SmallVector<double>(blocks + 1, kNone));
    from.assign(stages, SmallVector<int64_t>(blocks + 1, -1));
    for (int64_t s = 0; s < stages; ++s)
      for (int64_t e = s + 1; e <= blocks - (stages - 1 - s); ++e)
        for (int64_t b = s; b < (s == 0 ? 1 : e); ++b) {
          if (s > 0 && best[s - 1][b] == kNone)
            continue;
          const StageCost &c = table[s][b][e];
          if (c.flops > flopsLimit || c.bytes > bytesLimit)
            continue;
          double before = s > 0 ? best[s - 1][b] : 0.0;
          double value = sum ? before + field(c) : std::max(before, field(c));
          if (value < best[s][e]) {
            best[s][e] = value;
            from[s][e] = b;
          }
        }
    return best[stages - 1][blocks];
  };
  constexpr int64_t kAny = std::numeric_limits<int64_t>::max();
  auto flops = static_cast<int64_t>(
      search([](const StageCost &c) { return double(c.flops); }, false, kAny, kAny));
  auto bytes = static_cast<int64_t>(
      search([](const StageCost &c) { return double(c.bytes); }, false, flops, kAny));
  // Among those, the most even FLOPs (least sum of squares): the stages
  // that do not set the step's pace still finish their share sooner.
  search([](const StageCost &c) { return double(c.flops) * double(c.flops); }, true, flops,
         bytes);
  SmallVector<int64_t> firsts(stages);
  for (int64_t s = stages - 1, e = blocks; s >= 0; --s) {
    firsts[s] = from[s][e];
    e = firsts[s];
  }
  return firsts;
}

struct PipelinePass : bmt::impl::PipelineParallelBase<PipelinePass> {
  using PipelineParallelBase::PipelineParallelBase;

  int64_t configValue(ModuleOp module, StringRef key, int64_t given, int64_t fallback) {
    if (given > 0)
      return given;
    if (auto plan = module->getAttrOfType<DictionaryAttr>("bmt.checkpoint_plan"))
      if (auto v = plan.getAs<IntegerAttr>(key))
        return v.getInt();
    return fallback;
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    int64_t stages = pipelineParallel;
    auto fail = [&](const Twine &message) {
      module.emitError("bmt-pipeline-parallel: ") << message;
      signalPassFailure();
    };
    if (stages <= 0)
      return fail("pipeline-parallel must be positive, got " + Twine(stages));
    int64_t virtualStages = this->virtualStages;
    if (virtualStages <= 0)
      return fail("virtual-stages must be positive, got " + Twine(virtualStages));
    if (stages == 1 && virtualStages > 1)
      return fail("virtual-stages " + Twine(virtualStages) + " needs pipeline-parallel > 1 "
                  "(it cuts each stage into chunks)");
    if (stages == 1)
      return;
    // The parts the blocks are cut into: P stages, or P x V chunks (chunk
    // c on stage c % P). Ranks: TP innermost, then data-parallel, stages
    // outermost (docs/runtime/pipeline.md); a stage has T x D ranks.
    const int64_t chunks = stages * virtualStages;
    const int64_t tp = bmt::tensorParallelOf(module);
    int64_t world = worldSize > 0 ? int64_t(worldSize) : stages * tp;
    if (world % stages != 0)
      return fail("world size " + Twine(world) + " is not a multiple of pipeline-parallel " +
                  Twine(stages));
    if (world % (stages * tp) != 0)
      return fail("world size " + Twine(world) + " is not a multiple of pipeline-parallel " +
                  Twine(stages) + " x tensor-parallel " + Twine(tp));
    if (auto ep = module->getAttrOfType<IntegerAttr>("bmt.expert_parallel"); ep && ep.getInt() > 1)
      return fail("pipeline-parallel " + Twine(stages) + " with expert-parallel " +
                  Twine(ep.getInt()) + " is not supported yet");
    if (module.walk([](bmt::MoeDispatchOp) { return WalkResult::interrupt(); }).wasInterrupted())
      return fail("mixture-of-experts layers in a pipeline are not supported yet (bmt-run "
                  "cannot run their dispatch in a stage)");

    auto lists = llvm::to_vector(module.getOps<bmt::BlockListOp>());
    if (lists.empty())
      return fail("the model has no repeated layers to cut into stages (run --bmt-find-blocks "
                  "first; a model without block lists cannot be pipelined)");
    if (lists.size() > 1) {
      std::string names;
      for (auto list : lists)
        names += (names.empty() ? "" : ", ") + list.getSymName().str();
      return fail("the model has " + Twine(lists.size()) + " block lists (" + names +
                  "); pipelining more than one (an encoder-decoder) is not supported");
    }
    bmt::BlockListOp list = lists.front();
    int64_t numBlocks = list.getBlocks().size();
    if (stages > numBlocks)
      return fail("pipeline-parallel " + Twine(stages) + " exceeds the " + Twine(numBlocks) +
                  " blocks of " + list.getSymName() + "; each stage needs at least one block");
    if (chunks > numBlocks)
      return fail("pipeline-parallel " + Twine(stages) + " x virtual-stages " +
                  Twine(virtualStages) + " = " + Twine(chunks) + " chunks exceed the " +
                  Twine(numBlocks) + " blocks of " + list.getSymName() +
                  "; each chunk needs at least one block");
    auto caller = module.lookupSymbol<func::FuncOp>(list.getCaller());
    if (!caller || caller.getBody().empty())
      return fail("the caller @" + list.getCaller() + " of " + list.getSymName() +
                  " has no body");

    // The functions from @forward down to the blocks' caller, each with its
    // call of the next (HF models call the layers from @model.forward): in
    // each, the ops before that call run on stage 0, those after it on
    // stage P - 1.
    SmallVector<std::pair<func::FuncOp, Operation *>> chain;
    for (func::FuncOp f = caller; f.getSymName() != "forward";) {
      SmallVector<Operation *> sites;
      if (auto uses = SymbolTable::getSymbolUses(f, module))
        for (const SymbolTable::SymbolUse &use : *uses)
          if (isa<func::CallOp>(use.getUser())) // not the block list's `caller`
            sites.push_back(use.getUser());
      if (sites.size() != 1)
        return fail("@" + f.getSymName() + ", which calls the blocks of " + list.getSymName() +
                    ", is called " + Twine(sites.size()) + " times; it must be called once on "
                    "the way from @forward");
      auto parent = sites.front()->getParentOfType<func::FuncOp>();
      if (!parent || sites.front()->getBlock() != &parent.getBody().front())
        return fail("the call of @" + f.getSymName() + " is nested in a region");
      chain.push_back({parent, sites.front()});
      f = parent;
    }

    // Place every top-level op of these functions: before the blocks
    // (stage 0), a block, after them (stage P - 1); an op between two blocks
    // (rare) goes with the block before it.
    StageCollector collector(module);
    StageUse pre, post;
    SmallVector<StageUse> blocks(numBlocks);
    SmallVector<func::CallOp> calls(numBlocks);
    Block &body = caller.getBody().front();
    auto blockCall = [&](Operation *op) -> func::CallOp {
      auto call = dyn_cast<func::CallOp>(op);
      auto ref = call ? call->getAttrOfType<FlatSymbolRefAttr>("bmt.block") : nullptr;
      return ref && ref.getValue() == list.getSymName() ? call : func::CallOp();
    };
    Operation *firstCall = nullptr, *lastCall = nullptr;
    for (Operation &op : body)
      if (blockCall(&op)) {
        firstCall = firstCall ? firstCall : &op;
        lastCall = &op;
      }
    if (!firstCall)
      return fail("the block list " + list.getSymName() + " has no calls in @" +
                  list.getCaller());
    // A parameter read at the top of a function of the chain: its place is
    // that of its readers, relative to [first, last] (the blocks, or the
    // call down the chain).
    auto placeParameter = [&](bmt::GetGlobalOp g, Block &in, Operation *first,
                              Operation *last) -> LogicalResult {
      auto p = module.lookupSymbol<bmt::ParameterOp>(g.getGlobal());
      if (!p)
        return success();
      for (Operation *user : g->getUsers()) {
        while (user->getBlock() != &in)
          user = user->getParentOp();
        if (user->isBeforeInBlock(first)) {
          pre.params.insert(p);
        } else if (last->isBeforeInBlock(user)) {
          post.params.insert(p);
        } else {
          fail("parameter " + g.getGlobal() + " is passed to a block or read between two "
               "blocks; only parameters read inside a block, before the first or after the "
               "last are placed");
          return failure();
        }
        collector.readers[p].insert(-1);
      }
      return success();
    };
    int64_t seen = 0;
    for (Operation &op : body) {
      if (func::CallOp call = blockCall(&op)) {
        int64_t index = call->getAttrOfType<IntegerAttr>("bmt.block_index").getInt();
        calls[index] = call;
        collector.collect(call, blocks[index], index);
        ++seen;
        continue;
      }
      if (auto g = dyn_cast<bmt::GetGlobalOp>(op)) {
        if (failed(placeParameter(g, body, firstCall, lastCall)))
          return;
        continue;
      }
      if (seen == 0)
        collector.collect(&op, pre, -1);
      else if (seen == numBlocks)
        collector.collect(&op, post, -1);
      else
        collector.collect(&op, blocks[seen - 1], seen - 1);
    }
    if (seen != numBlocks || llvm::any_of(calls, [](func::CallOp c) { return !c; }))
      return fail("the block list " + list.getSymName() + " has " + Twine(numBlocks) +
                  " blocks but @" + list.getCaller() + " calls " + Twine(seen) + " of them");
    for (auto [f, down] : chain) {
      Block &in = f.getBody().front();
      for (Operation &op : in) {
        if (&op == down)
          continue;
        if (auto g = dyn_cast<bmt::GetGlobalOp>(op)) {
          if (failed(placeParameter(g, in, down, down)))
            return;
          continue;
        }
        collector.collect(&op, op.isBeforeInBlock(down) ? pre : post, -1);
      }
    }

    // A parameter read by blocks of different stages cannot be cut; one
    // read before and after the blocks is tied across stages 0 and P - 1.
    // (Checked after the cut, below.)

    bmt::MemoryConfig config;
    config.worldSize = world / stages; // (the estimate divides by T itself)
    config.microBatch = configValue(module, "micro_batch", microBatch, 1);
    config.seqLen = configValue(module, "seq_len", seqLen, 1024);
    if (auto overlap = module->getAttrOfType<DictionaryAttr>("bmt.overlap"))
      if (auto depth = overlap.getAs<IntegerAttr>("prefetch_depth"))
        config.prefetchDepth = depth.getInt();
    bmt::MemoryModel model = bmt::estimateMemory(module, config);
    // The estimate's block terms, by block index.
    SmallVector<const bmt::BlockCost *> costOf(numBlocks, nullptr);
    for (const bmt::BlockCost &cost : model.blocks)
      for (int64_t b = 0; b < numBlocks; ++b)
        if (cost.call == calls[b])
          costOf[b] = &cost;
    if (llvm::any_of(costOf, [](const bmt::BlockCost *c) { return !c; }))
      return fail("the memory estimate does not cover every block of " + list.getSymName() +
                  "; cannot cost the stages");
    int64_t tokens = config.microBatch * config.seqLen;
    int64_t dp = config.worldSize / tp;

    // Per-block terms.
    SmallVector<int64_t> blockFlops(numBlocks), blockKept(numBlocks), blockPeak(numBlocks);
    for (int64_t b = 0; b < numBlocks; ++b) {
      const bmt::BlockCost &cost = *costOf[b];
      bool recompute = false;
      if (auto flag = cost.call->getAttrOfType<BoolAttr>("bmt.checkpoint"))
        recompute = flag.getValue();
      int64_t forwardFlops = blocks[b].flopsPerToken * tokens;
      blockFlops[b] = forwardFlops * (recompute ? 4 : 3);
      blockKept[b] = recompute ? cost.inputBytes : cost.activationBytes;
      blockPeak[b] = recompute ? cost.activationBytes : 0;
    }
    auto paramBytes = [&](const llvm::SetVector<bmt::ParameterOp> &params, bool whole) {
      int64_t state = 0, gathered = 0, elements = 0;
      for (bmt::ParameterOp p : params) {
        auto type = cast<RankedTensorType>(p.getType());
        int64_t n = localElements(p, tp);
        int64_t eb = std::max<int64_t>(1, type.getElementType().getIntOrFloatBitWidth() / 8);
        elements += n;
        if (!p.getRequiresGrad()) {
          state += n * eb;
          continue;
        }
        state += (n + dp - 1) / dp * bmt::stateBytesPerElement(type.getElementType());
        if (whole)
          gathered += 2 * n * eb; // gathered with its full gradient for the step
      }
      return std::make_tuple(state, gathered, elements);
    };
    auto [preState, preGathered, preElements] = paramBytes(pre.params, true);
    auto [postState, postGathered, postElements] = paramBytes(post.params, true);
    int64_t preFlops = pre.flopsPerToken * tokens * 3, postFlops = post.flopsPerToken * tokens * 3;

    // Micro-batches whose activations chunk c keeps at once: 1F1B keeps
    // P - s on stage s; interleaved 1F1B keeps up to 2 (P - 1 - s) +
    // (V - 1) P + 1 of the stage's chunks' (PipelineSchedule.h), a V-th
    // of them each, rounded up.
    auto inFlightOf = [&](int64_t c) -> int64_t {
      const int64_t s = c % stages;
      if (virtualStages == 1)
        return stages - s;
      const int64_t held = 2 * (stages - 1 - s) + (virtualStages - 1) * stages + 1;
      return (held + virtualStages - 1) / virtualStages;
    };
    // The cost of chunk (stage) c holding blocks [first, first + count).
    auto stageCost = [&](int64_t chunk, int64_t first, int64_t count) {
      StageCost c;
      c.first = first;
      c.count = count;
      llvm::SetVector<bmt::ParameterOp> params;
      int64_t kept = 0, peak = 0, gatheredMax = 0;
      for (int64_t b = first; b < first + count; ++b) {
        c.flops += blockFlops[b];
        kept += blockKept[b];
        peak = std::max(peak, blockPeak[b]);
        gatheredMax = std::max(gatheredMax, costOf[b]->gatheredBytes);
        params.insert(blocks[b].params.begin(), blocks[b].params.end());
      }
      auto [state, gathered, elements] = paramBytes(params, false);
      c.parameters = elements;
      c.bytes = state;
      // ZeRO-3 keeps depth + 1 blocks gathered and one block's gradient;
      // ZeRO-2 keeps every block of the stage gathered.
      int64_t live = model.zeroStage == 2 ? count
                                          : std::min<int64_t>(config.prefetchDepth + 1, count);
      if (model.zeroStage != 0)
        c.bytes += (live + 1) * gatheredMax;
      int64_t inFlight = inFlightOf(chunk); // micro-batches between forward and backward
      int64_t outside = 0;
      if (chunk == 0) {
        c.flops += preFlops;
        c.bytes += preState + preGathered;
        c.parameters += preElements;
      }
      if (chunk == chunks - 1) {
        c.flops += postFlops;
        c.bytes += postState + postGathered;
        c.parameters += postElements;
        outside = model.outsideActivationBytes;
      }
      c.bytes += inFlight * (kept + outside) + peak;
      return c;
    };

    SmallVector<int64_t> firsts = cheapestCut(chunks, numBlocks, stageCost);
    SmallVector<StageCost> costs;
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t end = c + 1 < chunks ? firsts[c + 1] : numBlocks;
      costs.push_back(stageCost(c, firsts[c], end - firsts[c]));
    }

    // Parameters read in more than one chunk (stage when V = 1).
    auto chunkOfBlock = [&](int64_t b) {
      int64_t c = 0;
      while (c + 1 < chunks && firsts[c + 1] <= b)
        ++c;
      return c;
    };
    const char *part = virtualStages > 1 ? "chunks" : "stages";
    SmallVector<std::string> tied;
    for (auto &[param, readerSet] : collector.readers) {
      std::set<int64_t> chunksOf;
      for (int64_t b : readerSet)
        if (b >= 0)
          chunksOf.insert(chunkOfBlock(b));
      if (pre.params.contains(param))
        chunksOf.insert(0);
      if (post.params.contains(param))
        chunksOf.insert(chunks - 1);
      if (chunksOf.size() <= 1)
        continue;
      bool outsideOnly = llvm::all_of(readerSet, [](int64_t b) { return b < 0; });
      if (!outsideOnly)
        return fail("parameter " + param.getSymName() + " is read by blocks of " + part + " " +
                    Twine(*chunksOf.begin()) + " and " + Twine(*chunksOf.rbegin()) +
                    " (a weight shared across layers); such a model cannot be cut there");
      if (param.getRequiresGrad()) // (a frozen one is read on both, with no gradient)
        tied.push_back(param.getSymName().str());
    }

    // The stages that read each parameter; one read nowhere is held by
    // stage 0 (as bmt-run places a group no stage reads).
    auto stagesOf = [&](bmt::ParameterOp p) {
      std::set<int64_t> s;
      if (auto it = collector.readers.find(p); it != collector.readers.end())
        for (int64_t b : it->second)
          if (b >= 0)
            s.insert(chunkOfBlock(b) % stages);
      if (pre.params.contains(p))
        s.insert(0);
      if (post.params.contains(p))
        s.insert((chunks - 1) % stages);
      if (s.empty())
        s.insert(0);
      return s;
    };
    const int64_t outsideGroups = splitOutsideGroups(module, stagesOf);

    OpBuilder builder(module.getContext());
    for (int64_t b = 0; b < numBlocks; ++b) {
      calls[b]->setAttr("bmt.pipeline_stage",
                        builder.getI64IntegerAttr(chunkOfBlock(b) % stages));
      if (virtualStages > 1)
        calls[b]->setAttr("bmt.pipeline_chunk", builder.getI64IntegerAttr(chunkOfBlock(b)));
    }
    SmallVector<int64_t> flops, bytes, parameters;
    for (const StageCost &c : costs) {
      flops.push_back(c.flops);
      bytes.push_back(c.bytes);
      parameters.push_back(c.parameters);
    }
    SmallVector<Attribute> tiedAttrs;
    for (const std::string &t : tied)
      tiedAttrs.push_back(builder.getStringAttr(t));
    SmallVector<NamedAttribute> fields{
        builder.getNamedAttr("stages", builder.getI64IntegerAttr(stages)),
        builder.getNamedAttr("block_list", FlatSymbolRefAttr::get(list.getSymNameAttr())),
        builder.getNamedAttr("first_blocks", builder.getDenseI64ArrayAttr(firsts)),
        builder.getNamedAttr("flops", builder.getDenseI64ArrayAttr(flops)),
        builder.getNamedAttr("bytes", builder.getDenseI64ArrayAttr(bytes)),
        builder.getNamedAttr("parameters", builder.getDenseI64ArrayAttr(parameters)),
        builder.getNamedAttr("tied", builder.getArrayAttr(tiedAttrs)),
        builder.getNamedAttr("world_size", builder.getI64IntegerAttr(world)),
    };
    if (virtualStages > 1)
      fields.push_back(
          builder.getNamedAttr("virtual_stages", builder.getI64IntegerAttr(virtualStages)));
    module->setAttr("bmt.pipeline", builder.getDictionaryAttr(fields));

    InFlightDiagnostic remark = emitRemark(module.getLoc());
    remark << "bmt-pipeline-parallel: " << numBlocks << " blocks of " << list.getSymName()
           << " in " << stages << " stages";
    if (virtualStages > 1)
      remark << " x " << virtualStages << " virtual stages (blocks per chunk:";
    else
      remark << " (blocks per stage:";
    for (const StageCost &c : costs)
      remark << " " << c.count;
    remark << "), " << dp << " data-parallel rank" << (dp == 1 ? "" : "s");
    if (tp > 1)
      remark << " x " << tp << " tensor-parallel";
    remark << " per stage";
    if (!tied.empty()) {
      remark << "; tied across " << part << " 0 and " << chunks - 1 << " (gradient summed): ";
      llvm::interleaveComma(tied, remark);
    }
    if (outsideGroups > 0)
      remark << "; the parameters outside the blocks in " << outsideGroups
             << " storage groups by the stages that read them";
  }
};

} // namespace
