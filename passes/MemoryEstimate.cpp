//===- MemoryEstimate.cpp - per-rank training memory estimate -------------===//
//
// Parameter state from the storage groups; activations from a walk of the
// program from @forward that gives every tensor value a width (elements per
// token) derived from the parameter shapes, since !bmt.tensor carries no
// shape. The rules are in docs/passes/memory-estimate.md.
//
//===----------------------------------------------------------------------===//

#include "MemoryEstimate.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/TensorSplit.h"

#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <map>

using namespace mlir;
using bmt::AtenOpId;

namespace bmt {

namespace {

int64_t elementBytes(Type type) {
  unsigned bits = type.getIntOrFloatBitWidth();
  return bits < 8 ? 1 : bits / 8;
}

/// What the walk knows about a value.
struct ValueInfo {
  int64_t width = 0;        ///< elements per token; 0: not sized per token (or unknown)
  ParameterOp param;        ///< the parameter it is, if any
  int64_t headDim = 0;      ///< last dim of a [.., heads, head_dim] view, 0 if none
  bool score = false;       ///< an attention score tensor (width = heads x seq-len)
  bool seqSplit = false;    ///< holds 1 / T of the sequence (sequence parallelism)
};

/// Whether `op` saves nothing of its own for backward: its results alias its
/// input (views, conversions that change nothing; not in-place ops, whose
/// results are written).
bool savesNothing(AtenOp op) {
  const AtenOpInfo *info = lookupAtenOp(op.getName());
  return info && info->mayAlias() && !info->isInPlace();
}

/// Whether `v` is computed from the TP rank (bmt.tp_rank), as the offsets
/// of bmt-tensor-parallel's narrows to a rank's heads or sequence part are.
bool dependsOnTpRank(Value v, int depth = 0) {
  Operation *def = v.getDefiningOp();
  if (!def || depth > 8)
    return false;
  if (isa<TpRankOp>(def))
    return true;
  for (Value operand : def->getOperands())
    if (dependsOnTpRank(operand, depth + 1))
      return true;
  return false;
}

class ActivationWalker {
public:
  ActivationWalker(SymbolTable &symbols, int64_t tokens, int64_t seqLen, int64_t bytes,
                   SmallVectorImpl<BlockCost> &blocks)
      : symbols(symbols), tokens(tokens), seqLen(seqLen), bytes(bytes), blocks(blocks),
        tp(bmt::tensorParallelOf(cast<ModuleOp>(symbols.getOp()))) {}

  /// Bytes of a value of `v`'s width over this rank's tokens (1 / T of
  /// them when it is split along the sequence).
  int64_t bytesOf(const ValueInfo &v) const {
    return v.width * (v.seqSplit ? tokens / tp : tokens) * bytes;
  }

  /// Walks `f` with argument infos `args`, adding the saved activations of
  /// its ops (and its callees', blocks apart) to `acc`; returns the results' infos.
  SmallVector<ValueInfo> walk(func::FuncOp f, ArrayRef<ValueInfo> args, int64_t &acc,
                              bool insideBlock) {
    SmallVector<ValueInfo> none(f ? f.getNumResults() : 0);
    if (!f || f.getBody().empty() || !active.insert(f).second)
      return none;
    llvm::DenseMap<Value, ValueInfo> info;
    for (auto [arg, i] : llvm::zip(f.getBody().front().getArguments(), args))
      info[arg] = i;
    auto get = [&](Value v) { return info.lookup(v); };
    SmallVector<ValueInfo> results = none;
    for (Operation &op : f.getBody().front()) {
      if (auto g = dyn_cast<GetGlobalOp>(op)) {
        ValueInfo v;
        v.param = symbols.lookup<ParameterOp>(g.getGlobal());
        info[g.getResult()] = v;
      } else if (auto aten = dyn_cast<AtenOp>(op)) {
        SmallVector<ValueInfo> in;
        for (Value operand : aten.getOperands())
          in.push_back(get(operand));
        SmallVector<ValueInfo> out = atenResults(aten, in);
        bool saves = !savesNothing(aten);
        for (auto [result, v] : llvm::zip(aten.getResults(), out)) {
          if (!isa<bmt::TensorType>(result.getType()))
            continue;
          info[result] = v;
          if (saves)
            acc += bytesOf(v);
        }
        acc += materializedBytes(aten, in);
      } else if (auto fused = dyn_cast<FusedOp>(op)) {
        // A fused region: its body's widths from its inputs' by the same
        // rules. Its autograd node saves only its inputs (counted where they
        // were made), so only its results count, as an op's that saves.
        Block &body = fused.getBody().front();
        for (auto [arg, operand] : llvm::zip(body.getArguments(), fused.getInputs()))
          info[arg] = get(operand);
        for (Operation &inner : body.without_terminator()) {
          auto a = dyn_cast<AtenOp>(inner);
          if (!a)
            continue;
          SmallVector<ValueInfo> in;
          for (Value operand : a.getOperands())
            in.push_back(get(operand));
          for (auto [result, v] : llvm::zip(a.getResults(), atenResults(a, in)))
            info[result] = v;
        }
        auto yield = cast<YieldOp>(body.getTerminator());
        for (auto [result, value] : llvm::zip(fused.getResults(), yield.getValues())) {
          info[result] = get(value);
          acc += bytesOf(info[result]);
        }
      } else if (auto dispatch = dyn_cast<MoeDispatchOp>(op)) {
        // As the ATen ops it stands for: the rows as wide as the hidden
        // states, the sorted ids and the permutation as the ids, the
        // offsets not per token.
        ValueInfo rows = get(dispatch.getHidden()), ids = get(dispatch.getExpertIds());
        rows.param = nullptr;
        ids.param = nullptr;
        info[dispatch.getRows()] = rows;
        info[dispatch.getSortedIds()] = ids;
        info[dispatch.getPermutation()] = ids;
        info[dispatch.getOffsets()] = ValueInfo();
        acc += bytesOf(rows) + 2 * bytesOf(ids);
        if (Value routed = dispatch.getRoutedWeights()) {
          ValueInfo w = get(dispatch.getWeights());
          w.param = nullptr;
          info[routed] = w;
          acc += bytesOf(w);
        }
      } else if (auto combine = dyn_cast<MoeCombineOp>(op)) {
        ValueInfo v = get(combine.getRows());
        v.param = nullptr;
        info[combine.getResult()] = v;
        acc += bytesOf(v);
      } else if (auto adapter = dyn_cast<LoraAdapterOp>(op)) {
        // Saves its input (counted where it was made) and a rank-r
        // projection; its result is base, added into in place.
        info[adapter.getResult()] = get(adapter.getBase());
      } else if (isa<TpCopyOp>(op)) {
        info[op.getResult(0)] = get(op.getOperand(0)); // the input itself (a view)
      } else if (isa<TpAllReduceOp, TpAllGatherOp, TpReduceScatterOp>(op)) {
        // A new tensor: the sum, the whole sequence, or this rank's part of it.
        ValueInfo v = get(op.getOperand(0));
        if (isa<TpAllGatherOp>(op))
          v.seqSplit = false;
        else if (isa<TpReduceScatterOp>(op))
          v.seqSplit = true;
        info[op.getResult(0)] = v;
        acc += bytesOf(v);
      } else if (auto call = dyn_cast<func::CallOp>(op)) {
        SmallVector<ValueInfo> in;
        for (Value operand : call.getOperands())
          in.push_back(get(operand));
        auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
        SmallVector<ValueInfo> out;
        if (!insideBlock && call->hasAttr("bmt.block")) {
          BlockCost cost;
          cost.call = call;
          auto path = callee ? callee->getAttrOfType<StringAttr>("bmt.module_path") : nullptr;
          cost.name = path ? path.str() : call.getCallee().str();
          out = walk(callee, in, cost.activationBytes, /*insideBlock=*/true);
          for (const ValueInfo &v : in)
            if (!v.param)
              cost.inputBytes += bytesOf(v);
          blocks.push_back(cost);
        } else {
          out = walk(callee, in, acc, insideBlock);
        }
        for (auto [result, v] : llvm::zip(call.getResults(), out))
          info[result] = v;
      } else if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        results.clear();
        for (Value operand : ret.getOperands())
          results.push_back(get(operand));
      }
    }
    active.erase(f);
    return results;
  }

private:
  /// Under bmt-tensor-parallel with k/v replicated, each rank narrows the
  /// repeat of the kv heads (expand + reshape: a copy of all H heads) to
  /// its H / T query heads; the narrowed view keeps the copy alive. Its
  /// bytes, H x head dim per token on every rank; 0 for other ops.
  int64_t materializedBytes(AtenOp op, ArrayRef<ValueInfo> in) const {
    if (!isHeadNarrow(op, in))
      return 0;
    ValueInfo full = in[0];
    full.width = *getAtenArg(op, 3)->getInt() * tp * in[0].headDim;
    return bytesOf(full);
  }

  /// narrow(repeat, dim, t x H/T, H/T) of a head-shaped value: the offset
  /// from bmt.tp_rank, the length a constant number of heads.
  bool isHeadNarrow(AtenOp op, ArrayRef<ValueInfo> in) const {
    if (atenOpId(op) != AtenOpId::narrow || in.empty() || !in[0].headDim)
      return false;
    std::optional<AtenArg> start = getAtenArg(op, 2), length = getAtenArg(op, 3);
    return start && start->isOperand() && dependsOnTpRank(start->getOperand()) && length &&
           !length->isOperand() && length->getInt();
  }

  /// The parameter's shape on one TP rank (its slice under
  /// --bmt-tensor-parallel: activations are per rank too).
  static SmallVector<int64_t, 4> shapeOf(const ValueInfo &v) {
    if (!v.param)
      return {};
    auto p = const_cast<ParameterOp &>(v.param);
    auto global = cast<RankedTensorType>(p.getType()).getShape();
    SmallVector<int64_t, 4> shape(global.begin(), global.end());
    bmt::ParameterSplit split = bmt::parameterSplitOf(p);
    if (split.dim >= 0 && split.dim < static_cast<int64_t>(shape.size())) {
      int64_t padded = split.paddedSize ? split.paddedSize : shape[split.dim];
      shape[split.dim] = padded / bmt::splitRanksOf(p->getParentOfType<ModuleOp>(), split);
    }
    return shape;
  }

  /// The widest of the operands, with its head and score marks.
  static ValueInfo widest(ArrayRef<ValueInfo> in) {
    ValueInfo out;
    for (const ValueInfo &v : in) {
      if (v.param || v.width < out.width)
        continue;
      if (v.width > out.width) {
        out = v;
      } else {
        out.score |= v.score;
        if (!out.headDim)
          out.headDim = v.headDim;
      }
    }
    out.param = nullptr;
    return out;
  }

  SmallVector<ValueInfo> atenResults(AtenOp op, ArrayRef<ValueInfo> in) {
    // The registry has one overload of each operator matched here.
    std::optional<AtenOpId> id = atenOpId(op);
    size_t n = op.getNumResults();
    // The first operand that is a parameter of rank >= 2 (a weight matrix).
    const ValueInfo *weight = nullptr;
    for (const ValueInfo &v : in)
      if (shapeOf(v).size() >= 2) {
        weight = &v;
        break;
      }
    ValueInfo out = widest(in);
    if (id == AtenOpId::linear && weight) {
      out = {};
      out.width = shapeOf(*weight)[0];
    } else if (id == AtenOpId::embedding && weight) {
      out = {};
      out.width = shapeOf(*weight)[1];
    } else if ((id == AtenOpId::addmm || id == AtenOpId::mm || id == AtenOpId::matmul ||
                id == AtenOpId::bmm) &&
               weight) {
      out = {};
      out.width = shapeOf(*weight).back();
    } else if ((id == AtenOpId::matmul || id == AtenOpId::bmm) && in.size() >= 2) {
      const ValueInfo &a = in[0], &b = in[1];
      if (a.score) { // scores x values
        out = b;
        out.score = false;
      } else if (b.score) {
        out = a;
      } else if (a.headDim && b.headDim && a.width) { // queries x keys^T
        out = {};
        out.width = std::max<int64_t>(1, a.width / a.headDim) * seqLen;
        out.score = true;
      }
      out.param = nullptr;
    } else if (id == AtenOpId::scaled_dot_product_attention && in.size() >= 3) {
      out = in[2];
      out.param = nullptr;
      out.score = false;
    } else if (id == AtenOpId::view || id == AtenOpId::reshape) {
      out = in.empty() ? ValueInfo() : in[0];
      out.param = nullptr;
      out.headDim = 0;
      // view(x, [b, s, -1, 64]): 64 is the head dim when it divides the width;
      // a last size read from a tensor (reshape(x, [b, h, s, d]) with d =
      // x.size(-1), as the repeat of GQA's kv heads writes it) keeps x's.
      std::optional<AtenArg> sizes = getAtenArg(op, 1);
      if (sizes && sizes->isList() && !sizes->getElements().empty()) {
        const AtenArg &lastSize = sizes->getElements().back();
        if (auto last = dyn_cast_or_null<IntegerAttr>(lastSize.getAttr())) {
          int64_t d = last.getInt();
          if (d > 0 && d < out.width && out.width % d == 0)
            out.headDim = d;
        } else if (lastSize.isOperand()) {
          out.headDim = in[0].headDim;
        }
      }
    } else if (id == AtenOpId::narrow && in.size() >= 2 && isHeadNarrow(op, in)) {
      // A rank's heads of the repeated kv heads (materializedBytes).
      out = in[0];
      out.param = nullptr;
      out.width = *getAtenArg(op, 3)->getInt() * in[0].headDim;
    } else if (id == AtenOpId::narrow && !in.empty()) {
      // Under sequence parallelism, narrow(e, 1, t x L, L) of a position
      // embedding: this rank's part of the sequence.
      out = in[0];
      out.param = nullptr;
      std::optional<AtenArg> start = getAtenArg(op, 2);
      if (start && start->isOperand() && dependsOnTpRank(start->getOperand()) &&
          !isHeadNarrow(op, in))
        out.seqSplit = true;
    } else if (id == AtenOpId::split_Tensor || id == AtenOpId::split_with_sizes ||
               id == AtenOpId::chunk || id == AtenOpId::unbind_int) {
      out = in.empty() ? ValueInfo() : in[0];
      out.param = nullptr;
      out.headDim = 0;
      if (n > 1)
        out.width = (out.width + n - 1) / n;
    }
    return SmallVector<ValueInfo>(n, out);
  }

  SymbolTable &symbols;
  int64_t tokens, seqLen, bytes;
  SmallVectorImpl<BlockCost> &blocks;
  int64_t tp = 1; ///< T: ranks of a tensor-parallel group
  llvm::DenseSet<Operation *> active;
};

} // namespace

int64_t stateBytesPerElement(Type type) {
  int64_t eb = elementBytes(type);
  bool master = isa<FloatType>(type) && eb < 4;
  return 2 * eb + 8 + (master ? 4 : 0);
}

int64_t MemoryModel::blockGatheredBytes() const {
  if (blocks.empty() || zeroStage == 0 || shardRanks <= 1)
    return 0;
  int64_t largest = 0, sum = 0, gradient = 0;
  for (const BlockCost &b : blocks) {
    largest = std::max(largest, b.gatheredBytes + b.frozenGatheredBytes);
    sum += b.gatheredBytes + b.frozenGatheredBytes;
    gradient = std::max(gradient, b.gatheredBytes);
  }
  if (zeroStage == 2)
    return sum + gradient;
  int64_t live = std::min<int64_t>(config.prefetchDepth + 1, blocks.size());
  return live * largest + gradient;
}

int64_t MemoryModel::activationBytes(ArrayRef<bool> recomputed) const {
  // At the end of the forward every kept block holds its activations and
  // every recomputed block its inputs. The backward then runs the blocks in
  // reverse; when it reaches block j, the blocks before j still hold what
  // they held, and block j holds all of its activations (recomputed ones
  // rebuild them now). The peak is the largest of these moments.
  auto flag = [&](size_t i) { return i < recomputed.size() && recomputed[i]; };
  int64_t held = 0, peak = 0;
  for (auto [i, b] : llvm::enumerate(blocks)) {
    if (flag(i))
      peak = std::max(peak, held + b.activationBytes);
    held += flag(i) ? b.inputBytes : b.activationBytes;
  }
  return outsideActivationBytes + std::max(peak, held);
}

int64_t MemoryModel::totalBytes(ArrayRef<bool> recomputed) const {
  return stateBytes + frozenBytes + outsideGatheredBytes + blockGatheredBytes() +
         activationBytes(recomputed);
}

SmallVector<bool> MemoryModel::currentFlags() const {
  SmallVector<bool> flags;
  for (const BlockCost &b : blocks) {
    auto flag = b.call->getAttrOfType<BoolAttr>("bmt.checkpoint");
    flags.push_back(flag && flag.getValue());
  }
  return flags;
}

MemoryModel estimateMemory(ModuleOp module, const MemoryConfig &config) {
  MemoryModel model;
  model.config = config;
  SymbolTable symbols(module);

  // Element size of activations: that of the first trainable parameter.
  for (ParameterOp p : module.getOps<ParameterOp>())
    if (p.getRequiresGrad()) {
      model.activationElementBytes =
          elementBytes(cast<RankedTensorType>(p.getType()).getElementType());
      break;
    }

  // Activations, and the blocks in execution order.
  if (auto entry = symbols.lookup<func::FuncOp>("forward")) {
    ActivationWalker walker(symbols, config.microBatch * config.seqLen, config.seqLen,
                            model.activationElementBytes, model.blocks);
    SmallVector<ValueInfo> args;
    for (Type t : entry.getArgumentTypes()) {
      ValueInfo v;
      v.width = isa<bmt::TensorType>(t) ? 1 : 0; // token ids, masks: one element per token
      args.push_back(v);
    }
    walker.walk(entry, args, model.outsideActivationBytes, /*insideBlock=*/false);
  }

  // Parameter state. Frozen parameters: their shards in frozen storage
  // groups (below), nothing else; outside groups whole on every rank.
  auto groups = module.getOps<StorageGroupOp>();
  llvm::DenseSet<StringRef> grouped;
  for (StorageGroupOp g : groups)
    for (Attribute ref : g.getParams())
      grouped.insert(cast<FlatSymbolRefAttr>(ref).getValue());
  for (ParameterOp p : module.getOps<ParameterOp>())
    if (!p.getRequiresGrad() && !grouped.contains(p.getSymName()))
      model.frozenBytes += bmt::localNumElements(p) *
          elementBytes(cast<RankedTensorType>(p.getType()).getElementType());
  if (groups.empty()) {
    for (ParameterOp p : module.getOps<ParameterOp>())
      if (p.getRequiresGrad()) {
        model.stateBytes += bmt::localNumElements(p) *
            stateBytesPerElement(cast<RankedTensorType>(p.getType()).getElementType());
        model.outsideParameters += bmt::localNumElements(p);
      }
    return model;
  }
  model.zeroStage = 3;
  int64_t groupSize = 0;
  if (auto zero = module->getAttrOfType<DictionaryAttr>("bmt.zero")) {
    if (auto stage = zero.getAs<IntegerAttr>("stage"))
      model.zeroStage = stage.getInt();
    if (auto g = zero.getAs<IntegerAttr>("shard_group_size"))
      groupSize = g.getInt();
  }
  // With tensor parallelism ZeRO shards over the N / T ranks of one TP
  // rank, and the groups hold that rank's slices (bmt-zero sizes them).
  int64_t dataParallel = std::max<int64_t>(1, config.worldSize / bmt::tensorParallelOf(module));
  model.shardRanks = std::max<int64_t>(
      1, groupSize > 0 ? std::min(groupSize, dataParallel) : dataParallel);
  std::map<std::pair<std::string, int64_t>, size_t> blockIndex;
  for (auto [i, b] : llvm::enumerate(model.blocks))
    blockIndex[{b.call->getAttrOfType<FlatSymbolRefAttr>("bmt.block").getValue().str(),
                b.call->getAttrOfType<IntegerAttr>("bmt.block_index").getInt()}] = i;
  for (StorageGroupOp g : groups) {
    Type element = g.getElementType();
    int64_t parameters = 0;
    bool experts = false;
    for (Attribute ref : g.getParams())
      if (auto p = symbols.lookup<ParameterOp>(cast<FlatSymbolRefAttr>(ref).getValue())) {
        parameters += bmt::localNumElements(p);
        experts = experts || bmt::parameterSplitOf(p).isExpertSplit();
      }
    // A group of expert slices (bmt-zero keeps them apart) is sharded over
    // the N / E ranks that hold the same experts.
    int64_t ranks = model.shardRanks;
    if (experts) {
      ranks = std::max<int64_t>(
          1, std::min(model.shardRanks, dataParallel / bmt::expertParallelOf(module)));
      model.expertShardRanks = ranks;
    }
    int64_t shard = (g.getSize() + ranks - 1) / ranks;
    int64_t full = g.getSize() * elementBytes(element);
    auto block = g.getBlockAttr();
    auto it = block ? blockIndex.find({block.getValue().str(), *g.getBlockIndex()})
                    : blockIndex.end();
    if (g.getFrozen()) {
      // The shard in its dtype, gathered like the block's other groups; no
      // gradient, master or optimizer state.
      model.frozenBytes += shard * elementBytes(element);
      if (it != blockIndex.end())
        model.blocks[it->second].frozenGatheredBytes += full;
      else if (ranks > 1)
        model.outsideGatheredBytes += full; // gathered for the whole step
      continue;
    }
    model.stateBytes += shard * stateBytesPerElement(element);
    if (it != blockIndex.end()) {
      model.blocks[it->second].gatheredBytes += full;
      model.blocks[it->second].parameters += parameters;
    } else {
      if (ranks > 1)
        model.outsideGatheredBytes += 2 * full; // gathered parameters and full gradient
      model.outsideParameters += parameters;
    }
  }
  return model;
}

std::string formatBytes(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  std::string out;
  llvm::raw_string_ostream os(out);
  os << llvm::format(unit ? "%.1f %s" : "%.0f %s", value, units[unit]);
  return out;
}

} // namespace bmt
