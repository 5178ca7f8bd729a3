//===- ShardingInterfaceImpl.cpp - shard rules of bmt's ops ---------------===//
//
// ShardingInterface external models for bmt.aten (one model, whose rules
// follow the registry entry of the op: its kind, its reduced-dims argument
// and its schema's argument names) and bmt.fused. A rule is a loop nest:
// one iterator per loop, parallel or reduction, and per operand and result
// the affine map from the loops to its dims. Broadcasting aligns dims from
// the end, as PyTorch does. See include/bmt/Dialect/ShardingInterfaceImpl.h.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/ShardingInterfaceImpl.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"

#include "mlir/Dialect/Shard/Interfaces/ShardingInterface.h"
#include "mlir/Dialect/Shard/Interfaces/ShardingInterfaceImpl.h"
#include "mlir/IR/AffineMap.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/IRMapping.h"

#include <optional>

using namespace mlir;
using utils::IteratorType;

namespace {

/// A loop nest: loops[i] is the i-th loop's iterator; maps holds one map
/// per operand, then one per result.
struct Rule {
  SmallVector<IteratorType> loops;
  SmallVector<AffineMap> maps;
};

/// The map from `numLoops` loops to the dims `loops` (loop positions).
AffineMap mapTo(unsigned numLoops, ArrayRef<unsigned> loops, MLIRContext *ctx) {
  SmallVector<AffineExpr> exprs;
  for (unsigned l : loops)
    exprs.push_back(getAffineDimExpr(l, ctx));
  return AffineMap::get(numLoops, 0, exprs, ctx);
}

/// The last `rank` of `numLoops` loops (broadcasting from the end).
AffineMap trailing(unsigned numLoops, int64_t rank, MLIRContext *ctx) {
  SmallVector<unsigned> loops;
  for (int64_t i = static_cast<int64_t>(numLoops) - rank; i < static_cast<int64_t>(numLoops); ++i)
    loops.push_back(static_cast<unsigned>(i));
  return mapTo(numLoops, loops, ctx);
}

AffineMap none(unsigned numLoops, MLIRContext *ctx) { return AffineMap::get(numLoops, 0, {}, ctx); }

/// Pointwise with broadcasting over the widest operand; the operands in
/// `ignored` (read for their dtype only) and the scalars map to no dim;
/// the loops in `reduced` (counted from the end) are reductions.
std::optional<Rule> pointwise(Operation *op, ArrayRef<int64_t> ranks, ArrayRef<unsigned> ignored = {},
                              ArrayRef<int64_t> reduced = {}) {
  MLIRContext *ctx = op->getContext();
  int64_t n = -1;
  for (auto [i, r] : llvm::enumerate(ranks))
    if (!llvm::is_contained(ignored, i))
      n = std::max(n, r);
  if (n < 0)
    return std::nullopt;
  Rule rule;
  rule.loops.assign(n, IteratorType::parallel);
  for (int64_t d : reduced) {
    if (-d > n)
      return std::nullopt;
    rule.loops[n + d] = IteratorType::reduction;
  }
  for (auto [i, r] : llvm::enumerate(ranks))
    rule.maps.push_back(r < 0 || llvm::is_contained(ignored, i) ? none(n, ctx) : trailing(n, r, ctx));
  for (unsigned i = 0; i < op->getNumResults(); ++i)
    rule.maps.push_back(trailing(n, n, ctx));
  return rule;
}

/// The operand number of schema argument `name` when it is an operand.
std::optional<unsigned> operandOf(bmt::AtenOp op, StringRef name) {
  auto a = bmt::getAtenArg(op, name);
  if (!a || !a->isOperand())
    return std::nullopt;
  return a->getOperandNumber();
}

/// A reduction over `dims` of `self` (positions; the rest broadcast):
/// results keep the reduced dims (size 1) when `keep`, else drop them.
std::optional<Rule> reduction(bmt::AtenOp op, ArrayRef<int64_t> ranks, unsigned self,
                              ArrayRef<int64_t> dims, bool keep) {
  MLIRContext *ctx = op->getContext();
  int64_t n = ranks[self];
  Rule rule;
  rule.loops.assign(n, IteratorType::parallel);
  for (int64_t d : dims) {
    int64_t p = d < 0 ? d + n : d;
    if (p < 0 || p >= n)
      return std::nullopt;
    rule.loops[p] = IteratorType::reduction;
  }
  for (auto [i, r] : llvm::enumerate(ranks)) {
    if (i == self)
      rule.maps.push_back(trailing(n, n, ctx));
    else if (r < 0)
      rule.maps.push_back(none(n, ctx));
    else if (r <= n) // layer_norm's weight and bias: the normalized dims
      rule.maps.push_back(trailing(n, r, ctx));
    else
      return std::nullopt;
  }
  SmallVector<unsigned> kept;
  for (int64_t l = 0; l < n; ++l)
    if (keep || rule.loops[l] == IteratorType::parallel)
      kept.push_back(static_cast<unsigned>(l));
  for (unsigned i = 0; i < op->getNumResults(); ++i)
    rule.maps.push_back(mapTo(n, kept, ctx));
  return rule;
}

std::optional<Rule> reductionRule(bmt::AtenOp op, const bmt::AtenOpInfo &info, ArrayRef<int64_t> ranks) {
  auto self = operandOf(op, info.argNames[0]);
  if (!self || ranks[*self] < 0)
    return std::nullopt;
  int64_t n = ranks[*self];
  if (info.reducedDimsArg < 0) { // every dim
    SmallVector<int64_t> all;
    for (int64_t d = 0; d < n; ++d)
      all.push_back(d);
    return reduction(op, ranks, *self, all, /*keep=*/false);
  }
  auto arg = bmt::getAtenArg(op, info.reducedDimsArg);
  if (!arg)
    return std::nullopt;
  SmallVector<int64_t> dims;
  // mean.dim / sum.dim_IntList with dim=None or [] reduce every dim.
  const bool keepdimOp = info.argIndex("keepdim") >= 0;
  if (keepdimOp && (arg->isNone() || (arg->getInts() && arg->getInts()->empty()))) {
    for (int64_t d = 0; d < n; ++d)
      dims.push_back(d);
  } else if (info.argNames[info.reducedDimsArg] == "normalized_shape") {
    // layer_norm: the trailing len(normalized_shape) dims.
    auto shape = arg->getInts();
    if (!shape || static_cast<int64_t>(shape->size()) > n)
      return std::nullopt;
    for (int64_t i = 0; i < static_cast<int64_t>(shape->size()); ++i)
      dims.push_back(-1 - i);
  } else if (auto d = arg->getInt()) {
    dims.push_back(*d);
  } else if (auto ds = arg->getInts()) {
    dims.append(ds->begin(), ds->end());
  } else {
    return std::nullopt;
  }
  // Without a keepdim argument the result has the input's shape (softmax,
  // cumsum: the reduced dim is one the op reads whole).
  bool keep = true;
  if (info.argIndex("keepdim") >= 0) {
    auto k = bmt::getAtenArg(op, "keepdim")->getBool();
    if (!k)
      return std::nullopt;
    keep = *k;
  }
  // An op that changes the reduced dim's size (diff) has no rule.
  if (info.argIndex("n") >= 0 || info.argIndex("prepend") >= 0)
    return std::nullopt;
  return reduction(op, ranks, *self, dims, keep);
}

/// matmul / bmm / mm (self, other or mat2), addmm (self = bias, mat1,
/// mat2), linear (input, weight[out, in], bias): loops (batch..., m, n, k)
/// with k the reduction; a 1-d operand has no m (or n).
std::optional<Rule> matmulRule(bmt::AtenOp op, const bmt::AtenOpInfo &info, ArrayRef<int64_t> ranks) {
  MLIRContext *ctx = op->getContext();
  std::optional<unsigned> lhs, rhs, bias;
  bool rhsTransposed = false; // linear's weight is [n, k]
  if (info.argIndex("weight") >= 0) {
    lhs = operandOf(op, "input"), rhs = operandOf(op, "weight"), bias = operandOf(op, "bias");
    rhsTransposed = true;
  } else if (info.argIndex("mat1") >= 0) {
    lhs = operandOf(op, "mat1"), rhs = operandOf(op, "mat2"), bias = operandOf(op, "self");
  } else if (info.argIndex("other") >= 0 || info.argIndex("mat2") >= 0) {
    lhs = operandOf(op, "self");
    rhs = operandOf(op, info.argIndex("other") >= 0 ? "other" : "mat2");
  } else {
    return std::nullopt; // einsum, baddbmm
  }
  if (!lhs || !rhs)
    return std::nullopt;
  int64_t a = ranks[*lhs], b = ranks[*rhs];
  if (a < 2 || (b != 2 && (rhsTransposed || b < 2)))
    return std::nullopt;
  int64_t batch = std::max(a, b) - 2;
  // loops: [0, batch) batch, batch m, batch + 1 n, batch + 2 k
  unsigned m = batch, n = batch + 1, k = batch + 2, numLoops = batch + 3;
  Rule rule;
  rule.loops.assign(numLoops, IteratorType::parallel);
  rule.loops[k] = IteratorType::reduction;
  auto withBatch = [&](int64_t rank, std::initializer_list<unsigned> last) {
    SmallVector<unsigned> loops;
    for (int64_t i = batch - (rank - 2); i < batch; ++i)
      loops.push_back(static_cast<unsigned>(i));
    loops.append(last.begin(), last.end());
    return mapTo(numLoops, loops, ctx);
  };
  for (auto [i, r] : llvm::enumerate(ranks)) {
    if (i == *lhs)
      rule.maps.push_back(withBatch(a, {m, k}));
    else if (i == *rhs)
      rule.maps.push_back(rhsTransposed ? mapTo(numLoops, {n, k}, ctx) : withBatch(b, {k, n}));
    else if (bias && i == *bias && r == 1)
      rule.maps.push_back(mapTo(numLoops, {n}, ctx));
    else if (bias && i == *bias && r == 2 && batch == 0)
      rule.maps.push_back(mapTo(numLoops, {m, n}, ctx));
    else if (r < 0)
      rule.maps.push_back(none(numLoops, ctx));
    else
      return std::nullopt;
  }
  rule.maps.push_back(withBatch(std::max(a, b), {m, n}));
  return rule;
}

/// scaled_dot_product_attention(query [..., L, E], key [..., S, E],
/// value [..., S, Ev], attn_mask broadcasting to [..., L, S]): loops
/// (batch..., L, Ev, S, E), S and E reductions.
std::optional<Rule> attentionRule(bmt::AtenOp op, ArrayRef<int64_t> ranks) {
  MLIRContext *ctx = op->getContext();
  auto q = operandOf(op, "query"), k = operandOf(op, "key"), v = operandOf(op, "value"),
       mask = operandOf(op, "attn_mask");
  if (!q || !k || !v)
    return std::nullopt;
  int64_t r = ranks[*q];
  if (r < 2 || ranks[*k] != r || ranks[*v] != r)
    return std::nullopt;
  unsigned batch = r - 2, l = batch, ev = batch + 1, s = batch + 2, e = batch + 3, numLoops = batch + 4;
  Rule rule;
  rule.loops.assign(numLoops, IteratorType::parallel);
  rule.loops[s] = rule.loops[e] = IteratorType::reduction;
  auto withBatch = [&](int64_t rank, unsigned x, unsigned y) {
    SmallVector<unsigned> loops;
    for (int64_t i = static_cast<int64_t>(batch) - (rank - 2); i < static_cast<int64_t>(batch); ++i)
      loops.push_back(static_cast<unsigned>(i));
    loops.push_back(x);
    loops.push_back(y);
    return mapTo(numLoops, loops, ctx);
  };
  for (auto [i, rank] : llvm::enumerate(ranks)) {
    if (i == *q)
      rule.maps.push_back(withBatch(r, l, e));
    else if (i == *k)
      rule.maps.push_back(withBatch(r, s, e));
    else if (i == *v)
      rule.maps.push_back(withBatch(r, s, ev));
    else if (mask && i == *mask && rank >= 2 && rank <= r)
      rule.maps.push_back(withBatch(rank, l, s));
    else if (rank < 0)
      rule.maps.push_back(none(numLoops, ctx));
    else
      return std::nullopt;
  }
  rule.maps.push_back(withBatch(r, l, ev));
  return rule;
}

/// transpose / permute / t / unsqueeze: the result's dims are loops, the
/// operand's the same loops in its order.
std::optional<Rule> permutationRule(bmt::AtenOp op, ArrayRef<int64_t> ranks) {
  MLIRContext *ctx = op->getContext();
  auto self = operandOf(op, "self");
  if (!self || ranks.size() != 1 || ranks[*self] < 0)
    return std::nullopt;
  int64_t n = ranks[*self];
  auto norm = [&](int64_t d, int64_t rank) { return d < 0 ? d + rank : d; };
  StringRef name = op.getName();
  SmallVector<unsigned> operandLoops; // operand dim i is loop operandLoops[i]
  unsigned numLoops = n;
  if (name == "aten::transpose.int" || name == "aten::t" || name == "aten::numpy_T") {
    int64_t d0 = n - 2, d1 = n - 1;
    if (name == "aten::transpose.int") {
      auto a = bmt::getAtenArg(op, "dim0")->getInt(), b = bmt::getAtenArg(op, "dim1")->getInt();
      if (!a || !b)
        return std::nullopt;
      d0 = norm(*a, n), d1 = norm(*b, n);
    } else if (n != 2) {
      return std::nullopt;
    }
    if (d0 < 0 || d1 < 0 || d0 >= n || d1 >= n)
      return std::nullopt;
    for (int64_t i = 0; i < n; ++i)
      operandLoops.push_back(i == d0 ? d1 : i == d1 ? d0 : i);
  } else if (name == "aten::permute") {
    auto dims = bmt::getAtenArg(op, "dims")->getInts();
    if (!dims || static_cast<int64_t>(dims->size()) != n)
      return std::nullopt;
    operandLoops.assign(n, 0);
    for (int64_t i = 0; i < n; ++i) {
      int64_t src = norm((*dims)[i], n);
      if (src < 0 || src >= n)
        return std::nullopt;
      operandLoops[src] = i; // result dim i is operand dim src
    }
  } else if (name == "aten::unsqueeze") {
    auto d = bmt::getAtenArg(op, "dim")->getInt();
    if (!d)
      return std::nullopt;
    int64_t p = norm(*d, n + 1);
    if (p < 0 || p > n)
      return std::nullopt;
    numLoops = n + 1;
    for (int64_t i = 0; i < n; ++i)
      operandLoops.push_back(i < p ? i : i + 1);
  } else {
    return std::nullopt;
  }
  Rule rule;
  rule.loops.assign(numLoops, IteratorType::parallel);
  rule.maps.push_back(mapTo(numLoops, operandLoops, ctx));
  rule.maps.push_back(trailing(numLoops, numLoops, ctx));
  return rule;
}

/// The rule of `op` when its tensor operands have `ranks` (-1: no tensor).
std::optional<Rule> ruleFor(Operation *op, ArrayRef<int64_t> ranks) {
  if (auto fused = dyn_cast<bmt::FusedOp>(op)) {
    // rotate_half inside reads across the last dim: like a row region's
    // reduction, a split there has no rule.
    bool rotateHalf = false;
    fused.getBody().walk([&](bmt::AtenOp inner) {
      rotateHalf = rotateHalf || inner.getName() == "aten::cat";
    });
    if (fused.getKind() == "pointwise" && !rotateHalf)
      return pointwise(op, ranks);
    if (fused.getKind() == "row" || rotateHalf) // one last-dim reduction, broadcast back
      return pointwise(op, ranks, {}, {-1});
    return std::nullopt;
  }
  auto aten = dyn_cast<bmt::AtenOp>(op);
  if (!aten)
    return std::nullopt;
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(aten.getName());
  if (!info)
    return std::nullopt;
  for (Type t : op->getResultTypes())
    if (!isa<bmt::TensorType, RankedTensorType>(t))
      return std::nullopt; // sizes, scalars: not a tensor op
  auto hasArg = [&](StringRef name) { return info->argIndex(name) >= 0; };
  switch (info->kind) {
  case bmt::AtenOpKind::Elementwise:
  case bmt::AtenOpKind::Random:
    return pointwise(op, ranks);
  case bmt::AtenOpKind::Copy: {
    // cat / stack (`tensors`), repeat, pad change sizes: no rule. A tensor
    // named `other` (type_as, to.other) gives its dtype only.
    if (hasArg("tensors") || hasArg("repeats") || hasArg("pad"))
      return std::nullopt;
    SmallVector<unsigned> ignored;
    if (auto other = operandOf(aten, "other"))
      ignored.push_back(*other);
    return pointwise(op, ranks, ignored);
  }
  case bmt::AtenOpKind::View:
    // detach and alias: the value itself.
    if (info->argNames.size() == 1 && !info->isInPlace() &&
        (aten.getName() == "aten::detach" || aten.getName() == "aten::alias"))
      return pointwise(op, ranks);
    return permutationRule(aten, ranks);
  case bmt::AtenOpKind::Reduction:
    return reductionRule(aten, *info, ranks);
  case bmt::AtenOpKind::Matmul:
    return matmulRule(aten, *info, ranks);
  case bmt::AtenOpKind::Attention:
    return attentionRule(aten, ranks);
  default:
    return std::nullopt;
  }
}

SmallVector<int64_t> ranksOf(Operation *op) {
  SmallVector<int64_t> ranks;
  for (Type t : op->getOperandTypes()) {
    auto r = dyn_cast<RankedTensorType>(t);
    ranks.push_back(r ? r.getRank() : -1);
  }
  return ranks;
}

/// The rule of a copy made by cloneWithRankedTypes (whose results are
/// ranked); none for an op with unranked results.
std::optional<Rule> ruleOfRanked(Operation *op) {
  for (Type t : op->getResultTypes())
    if (!isa<RankedTensorType>(t))
      return std::nullopt;
  return ruleFor(op, ranksOf(op));
}

template <typename OpTy>
struct BmtShardingModel : shard::ShardingInterface::ExternalModel<BmtShardingModel<OpTy>, OpTy> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    auto rule = ruleOfRanked(op);
    return rule ? rule->loops : SmallVector<IteratorType>();
  }
  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    auto rule = ruleOfRanked(op);
    return rule ? rule->maps : SmallVector<AffineMap>();
  }
  /// The partial results of a sharded reduction loop are summed: bmt
  /// reduces with tp_all_reduce (a sum).
  SmallVector<shard::ReductionKind> getReductionLoopIteratorKinds(Operation *op) const {
    SmallVector<shard::ReductionKind> kinds;
    for (IteratorType t : getLoopIteratorTypes(op))
      if (t == IteratorType::reduction)
        kinds.push_back(shard::ReductionKind::Sum);
    return kinds;
  }
  /// shard-partition: the op on its local operands, its results of the
  /// local shapes; where it splits a loop it reduces, which only a matmul's
  /// contraction (a sum) may, each result is then summed over those grid
  /// axes by a shard.all_reduce (as upstream's linalg model does).
  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<shard::Sharding> operandShardings,
                          ArrayRef<shard::Sharding> resultShardings, IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable, OpBuilder &builder) const {
    SmallVector<IteratorType> loops = getLoopIteratorTypes(op);
    shard::ShardingArray assignment = shard::getGridAxisAssignmentForLoopIterators(
        operandShardings, resultShardings, loops, getIndexingMaps(op));
    if (!shard::isAtLeastOneReductionIteratorSharded(loops, assignment)) {
      shard::partitionTriviallyShardableOperation(*op, partitionedOperands, operandShardings,
                                                  resultShardings, partitionMap, symbolTable, builder);
      return success();
    }
    auto aten = dyn_cast<bmt::AtenOp>(op);
    const bmt::AtenOpInfo *info = aten ? bmt::lookupAtenOp(aten.getName()) : nullptr;
    if (!info || info->kind != bmt::AtenOpKind::Matmul)
      return op->emitOpError("splits a dim it reduces, and only a matmul's contraction is a sum");
    SmallVector<shard::GridAxis> axes = shard::getReductionGridAxes(loops, assignment);
    Operation *copy = builder.clone(*op, partitionMap);
    for (auto [result, local, sharding] :
         llvm::zip_equal(op->getResults(), copy->getResults(), resultShardings)) {
      shard::GridOp grid = shard::getGridOrNull(op, sharding.getGridAttr(), symbolTable);
      local.setType(shard::shardType(local.getType(), grid, sharding));
      Value sum = shard::AllReduceOp::create(builder, op->getLoc(), local, sharding.getGrid(), axes,
                                             shard::ReductionKind::Sum)
                      .getResult();
      partitionMap.map(result, sum);
    }
    return success();
  }
};

} // namespace

void bmt::registerShardingInterfaceExternalModels(DialectRegistry &registry) {
  registry.addExtension(+[](MLIRContext *ctx, bmt::BmtDialect *) {
    // bmt-opt and the passes that consult the rules both register them.
    auto aten = RegisteredOperationName::lookup(bmt::AtenOp::getOperationName(), ctx);
    if (aten && aten->hasInterface<shard::ShardingInterface>())
      return;
    bmt::AtenOp::attachInterface<BmtShardingModel<bmt::AtenOp>>(*ctx);
    bmt::FusedOp::attachInterface<BmtShardingModel<bmt::FusedOp>>(*ctx);
  });
}

Operation *bmt::cloneWithOperands(OpBuilder &builder, Operation *op, ValueRange operands) {
  SmallVector<int64_t> ranks;
  for (Value v : operands) {
    auto r = dyn_cast<RankedTensorType>(v.getType());
    ranks.push_back(r ? r.getRank() : -1);
  }
  auto rule = ruleFor(op, ranks);
  if (!rule)
    return nullptr;
  IRMapping mapping;
  for (auto [operand, copy] : llvm::zip_equal(op->getOperands(), operands))
    mapping.map(operand, copy);
  Operation *copy = builder.clone(*op, mapping);
  Type f32 = Float32Type::get(op->getContext());
  unsigned numOperands = op->getNumOperands();
  for (OpResult r : copy->getResults())
    r.setType(RankedTensorType::get(
        SmallVector<int64_t>(rule->maps[numOperands + r.getResultNumber()].getNumResults(),
                             ShapedType::kDynamic),
        f32));
  return copy;
}

Operation *bmt::cloneWithRankedTypes(Block &scratch, Operation *op, ArrayRef<int64_t> operandRanks) {
  if (!ruleFor(op, operandRanks))
    return nullptr;
  MLIRContext *ctx = op->getContext();
  Type f32 = Float32Type::get(ctx);
  SmallVector<Value> operands;
  for (auto [operand, rank] : llvm::zip_equal(op->getOperands(), operandRanks))
    operands.push_back(scratch.addArgument(
        rank < 0 ? Type(IntegerType::get(ctx, 64))
                 : Type(RankedTensorType::get(SmallVector<int64_t>(rank, ShapedType::kDynamic), f32)),
        operand.getLoc()));
  OpBuilder builder = OpBuilder::atBlockEnd(&scratch);
  return cloneWithOperands(builder, op, operands);
}

bool bmt::hasShardingRule(Operation *op) { return isa<shard::ShardingInterface>(op) && ruleOfRanked(op); }
