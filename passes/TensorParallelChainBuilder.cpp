//===- TensorParallelChainBuilder.cpp - finding one chain -----------------===//
//
// The chain analysis of bmt-tensor-parallel (TensorParallelChainBuilder.h):
// a chain that starts at matmuls with parameter weights reading one
// replicated activation, runs through pointwise ops, views and per-head
// attention, and ends at a matmul that contracts the split dimension. How
// the split dimension moves through pointwise ops, reductions, transposes,
// per-head matmuls and attention is the upstream shard dialect's
// ShardingInterface (lib/Dialect/ShardingInterfaceImpl.cpp), asked on
// ranked copies of the ops; views that regroup dims are the pass's own
// (TensorParallelViewRules.cpp). Each step returns LogicalResult; fail()
// records the reason.
//
//===----------------------------------------------------------------------===//

#include "TensorParallelChainBuilderImpl.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/ShardingInterfaceImpl.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Shard/Interfaces/ShardingInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringExtras.h"

#include <optional>
#include <string>

using namespace mlir;
using bmt::AtenOpId;
using namespace bmt::tp;

bool ChainBuilder::Impl::usedOnlyHere(bmt::ParameterOp p, Value v) {
  return p && program.paramReads[p].size() == 1 && v.hasOneUse() && !p.getAliases();
}

LogicalResult ChainBuilder::Impl::fail(Operation *op, const llvm::Twine &message, bool fatal) {
  error = ChainError{fatal, op, message.str()};
  return failure();
}

LogicalResult ChainBuilder::Impl::checkDivides(Operation *op, StringRef what, int64_t size, int64_t by) {
  if (size <= 0 || size % by != 0)
    return fail(op, llvm::Twine(what) + " " + llvm::Twine(size) + " is not divisible by --tensor-parallel " +
                 llvm::Twine(by),
         /*fatal=*/true);
  return success();
}

LogicalResult ChainBuilder::Impl::assign(Value v, Split s, llvm::SmallVector<Value> &work) {
  auto it = splits.find(v);
  if (it != splits.end()) {
    if (it->second.dim != s.dim)
      return fail(v.getDefiningOp() ? v.getDefiningOp() : v.getParentBlock()->getParentOp(),
           "reached along two different split dims");
    return success();
  }
  splits[v] = std::move(s);
  work.push_back(v);
  return success();
}

std::optional<int64_t> ChainBuilder::Impl::negDim(int64_t d, int64_t rank) {
  if (d < 0)
    return d;
  if (rank < 0)
    return std::nullopt;
  return d - rank;
}

LogicalResult ChainBuilder::Impl::propagate(llvm::SmallVector<Value> &work, Chain &chain) {
  while (!work.empty()) {
    Value v = work.pop_back_val();
    Split s = splits[v];
    for (OpOperand &use : v.getUses())
      if (failed(step(use, s, work, chain)))
        return failure();
  }
  return success();
}

LogicalResult ChainBuilder::Impl::step(OpOperand &use, const Split &s, llvm::SmallVector<Value> &work, Chain &chain) {
  Operation *user = use.getOwner();
  if (auto call = dyn_cast<func::CallOp>(user)) {
    auto callee = program.symbols->lookup<func::FuncOp>(call.getCallee());
    if (!callee || program.callSites[callee].size() != 1)
      return fail(user, "a split value enters a function called more than once");
    if (failed(assign(callee.getArgument(use.getOperandNumber()), s, work)))
      return failure();
    return success();
  }
  if (auto ret = dyn_cast<func::ReturnOp>(user)) {
    auto f = ret->getParentOfType<func::FuncOp>();
    if (program.blockFuncs.count(f) && program.isBlockRoot(f))
      return fail(user, "a split value leaves the block");
    if (!program.blockFuncs.count(f) || program.callSites[f].size() != 1)
      return fail(user, "a split value leaves a function called more than once");
    if (failed(assign(program.callSites[f][0].getResult(use.getOperandNumber()), s, work)))
      return failure();
    return success();
  }
  if (isa<bmt::FusedOp>(user)) {
    ++chain.ops;
    if (failed(byInterface(user, s, work, "a last-dim normalization over the split dim")))
      return failure();
    return success();
  }
  auto op = dyn_cast<bmt::AtenOp>(user);
  if (!op)
    return fail(user, "an op the pass does not know how to split");
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
  std::optional<AtenOpId> id = bmt::atenOpId(op);
  ++chain.ops;
  if (info->kind == bmt::AtenOpKind::Metadata)
    return success(); // sizes read from a split value are the local sizes
  if (info->kind == bmt::AtenOpKind::Matmul) {
    if (failed(matmul(op, use, s, work, chain)))
      return failure();
    return success();
  }
  // Pointwise ops, casts, dropout, detach: by their ShardingInterface
  // rule; cat, repeat and pad have none (view() follows cat).
  if (info->kind == bmt::AtenOpKind::Elementwise || info->kind == bmt::AtenOpKind::Random ||
      info->kind == bmt::AtenOpKind::Copy || id == AtenOpId::detach || id == AtenOpId::alias) {
    if (info->kind != bmt::AtenOpKind::Copy || consult(user, s).rule) {
      if (failed(byInterface(user, s, work, "a pointwise op that reduces")))
        return failure();
      return success();
    }
  }
  if (info->kind == bmt::AtenOpKind::Reduction) {
    if (failed(reduction(op, s, work)))
      return failure();
    return success();
  }
  if (info->kind == bmt::AtenOpKind::Attention) {
    // Per head: q, k, v split alike at a batch dim (the heads); the
    // mask broadcasts.
    Propagated p = consult(user, s);
    if (!p.rule)
      return fail(user, "attention the pass cannot split (no sharding rule)");
    if (p.conflict)
      return fail(user, "attention inputs split along different dims");
    for (StringRef arg : {"query", "key", "value"})
      if (p.reduced || !p.operandDims[bmt::getAtenArg(op, arg)->getOperandNumber()])
        return fail(user, "attention whose inputs are not split by heads");
    for (StringRef arg : {"query", "key", "value"}) {
      auto a = bmt::getAtenArg(op, arg);
      auto it = splits.find(a->getOperand());
      if (it == splits.end()) {
        if (arg != "query")
          if (failed(narrowRepeat(a->getOperand(), s, work, chain)))
            return failure();
        return success(); // the other inputs arrive later
      }
    }
    // Every input split: the interface says where the result is.
    p = consult(user, s);
    if (p.conflict)
      return fail(user, "attention inputs split along different dims");
    if (!p.resultDims[0])
      return fail(user, "attention whose inputs are not split by heads");
    Split out = s;
    out.dim = *p.resultDims[0];
    if (failed(assign(op.getResult(0), out, work)))
      return failure();
    return success();
  }
  if (failed(view(op, use, s, work, chain)))
    return failure();
  return success();
}

ChainBuilder::Impl::Propagated ChainBuilder::Impl::consult(Operation *op, const Split &s) {
  Propagated p;
  MLIRContext *context = op->getContext();
  int64_t base = s.rankKnown() ? s.rank() : std::max<int64_t>(4, -s.dim);
  llvm::SmallVector<int64_t> ranks;
  std::vector<shard::Sharding> operandShardings;
  FlatSymbolRefAttr grid = FlatSymbolRefAttr::get(context, "tp");
  for (Value v : op->getOperands()) {
    if (!isa<bmt::TensorType>(v.getType())) {
      ranks.push_back(-1);
      operandShardings.emplace_back();
      continue;
    }
    auto it = splits.find(v);
    int64_t rank = base;
    if (it != splits.end())
      rank = it->second.rankKnown() ? it->second.rank() : std::max(base, -it->second.dim);
    else if (auto param = program.paramOf(v))
      rank = shapeOf(param).size();
    ranks.push_back(rank);
    if (it == splits.end()) {
      operandShardings.emplace_back(); // replicated, broadcast over the split
      continue;
    }
    if (rank + it->second.dim < 0)
      return p; // a split dim the rank does not have: no rule
    llvm::SmallVector<shard::GridAxesAttr> axes(rank, shard::GridAxesAttr::get(context, {}));
    axes[rank + it->second.dim] = shard::GridAxesAttr::get(context, {0});
    operandShardings.push_back(shard::Sharding::get(grid, axes));
  }
  OwningOpRef<ModuleOp> scratch = ModuleOp::create(op->getLoc());
  Operation *copy = bmt::cloneWithRankedTypes(*scratch->getBody(), op, ranks);
  auto iface = copy ? dyn_cast<shard::ShardingInterface>(copy) : nullptr;
  if (!iface)
    return p;
  p.rule = true;
  // Upstream reports a conflict as an error on the op; here it is an
  // answer (the chain stays replicated, or the pass says why it fails).
  ScopedDiagnosticHandler quiet(context, [](Diagnostic &) { return success(); });
  std::vector<shard::Sharding> resultShardings(copy->getNumResults());
  FailureOr<shard::ShardingOption> option = iface.getShardingOption(operandShardings, resultShardings);
  if (failed(option)) {
    p.conflict = true;
    return p;
  }
  // A split only of operands the rule ignores (type_as's dtype source)
  // leaves the option without its grid: nothing is split then.
  if (!option->grid)
    option->grid = grid;
  auto loops = iface.getLoopIteratorTypes();
  for (auto [i, axes] : llvm::enumerate(option->shardingArray))
    if (!axes.empty() && loops[i] == utils::IteratorType::reduction)
      p.reduced = true;
  FailureOr<std::vector<shard::Sharding>> annotations = iface.getShardingAnnotations(*option);
  if (failed(annotations)) {
    p.conflict = true;
    return p;
  }
  auto dimOf = [](const shard::Sharding &sharding, Type type) -> std::optional<int64_t> {
    auto ranked = dyn_cast<RankedTensorType>(type);
    if (!sharding || !ranked)
      return std::nullopt;
    for (auto [d, axes] : llvm::enumerate(sharding.getSplitAxes()))
      if (!axes.empty())
        return static_cast<int64_t>(d) - ranked.getRank();
    return std::nullopt;
  };
  unsigned numOperands = copy->getNumOperands();
  for (unsigned i = 0; i < numOperands; ++i)
    p.operandDims.push_back(dimOf((*annotations)[i], copy->getOperand(i).getType()));
  for (OpResult r : copy->getResults()) {
    p.resultDims.push_back(dimOf((*annotations)[numOperands + r.getResultNumber()], r.getType()));
    p.resultRanks.push_back(cast<RankedTensorType>(r.getType()).getRank());
  }
  return p;
}

LogicalResult ChainBuilder::Impl::byInterface(Operation *op, const Split &s, llvm::SmallVector<Value> &work,
                                              const llvm::Twine &reduced) {
  Propagated p = consult(op, s);
  if (!p.rule)
    return fail(op, "an op the pass does not know how to split (no sharding rule)");
  if (p.conflict)
    return fail(op, "operands split along different dims");
  if (p.reduced)
    return fail(op, reduced);
  for (auto [r, dim] : llvm::zip_equal(op->getResults(), p.resultDims)) {
    if (!dim)
      continue;
    Split out = s;
    out.dim = *dim;
    int64_t rank = p.resultRanks[r.getResultNumber()];
    if (s.rankKnown() && rank != s.rank())
      out.setSizes(llvm::SmallVector<int64_t>(rank, -1)); // a reduction dropped dims
    if (failed(assign(r, out, work)))
      return failure();
  }
  return success();
}

FailureOr<int64_t> ChainBuilder::Impl::dimByInterface(bmt::AtenOp op, const Split &s) {
  Propagated p = consult(op, s);
  if (!p.rule || p.conflict || p.resultDims.empty() || !p.resultDims[0])
    return fail(op, "a view the pass cannot follow (no sharding rule)");
  return *p.resultDims[0];
}

LogicalResult ChainBuilder::Impl::reduction(bmt::AtenOp op, const Split &s, llvm::SmallVector<Value> &work) {
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
  StringRef base = bmt::atenOpBase(info->id);
  std::string message = ("a " + base + " over the split dim (or over an unknown dim)").str();
  if (!s.rankKnown() && info->reducedDimsArg >= 0 &&
      info->argNames[info->reducedDimsArg] != "normalized_shape") {
    auto arg = bmt::getAtenArg(op, info->reducedDimsArg);
    llvm::SmallVector<int64_t> dims;
    if (auto d = arg->getInt())
      dims.push_back(*d);
    else if (auto ds = arg->getInts())
      dims = *ds;
    if (llvm::any_of(dims, [](int64_t d) { return d >= 0; }))
      return fail(op, message);
  }
  if (failed(byInterface(op, s, work, message)))
    return failure();
  return success();
}

LogicalResult ChainBuilder::Impl::matmul(bmt::AtenOp op, OpOperand &use, const Split &s, llvm::SmallVector<Value> &work,
                                         Chain &chain) {
  std::optional<AtenOpId> id = bmt::atenOpId(op);
  if (auto m = matmulShape(op); m && use.get() == m->input) {
    // The split dim is contracted: row-parallel.
    if (s.dim != -1 || s.chunks != 1 || (s.global >= 0 && s.global != m->in))
      return fail(op, "a matmul whose input is split along a dim it does not contract");
    if (!usedOnlyHere(m->weight, m->weightValue))
      return fail(op, "a row-parallel weight read elsewhere too");
    if (failed(checkDivides(op, "the contracted size", m->in, tensorParallel)))
      return failure();
    chain.rows.push_back({op, m->weight, m->bias, 1 - m->outDim});
    chain.paramSplits[m->weight] = {1 - m->outDim, 1};
    return success();
  }
  if (id == AtenOpId::matmul || id == AtenOpId::bmm) {
    // Batched over heads: both operands split at the same batch dim (the
    // interface's rule splits both operands, and no contracted dim).
    Propagated p = consult(op, s);
    if (!p.rule)
      return fail(op, "a matmul the pass cannot split (no sharding rule)");
    if (p.conflict)
      return fail(op, "matmul operands split along different dims");
    if (p.reduced || !p.operandDims[0] || !p.operandDims[1])
      return fail(op, "a matmul of a split value that is not batched over the split dim");
    Value self = op->getOperand(0), other = op->getOperand(1);
    auto a = splits.find(self), b = splits.find(other);
    if (a == splits.end() || b == splits.end()) {
      // With replicated k/v: the other operand may be their repeat to
      // the query heads, which each rank narrows to its own heads.
      if (failed(narrowRepeat(a == splits.end() ? self : other, s, work, chain)))
        return failure();
      return success(); // the other operand arrives later (or never: checked at the end)
    }
    p = consult(op, s);
    if (p.conflict || !p.resultDims[0])
      return fail(op, "matmul operands split along different dims");
    Split out = a->second;
    out.dim = *p.resultDims[0];
    out.global = a->second.global >= 0 ? a->second.global : b->second.global;
    if (a->second.rankKnown() && b->second.rankKnown() && a->second.rank() == b->second.rank()) {
      llvm::SmallVector<int64_t> sizes = a->second.sizes;
      sizes.back() = b->second.sizes.back();
      out.setSizes(sizes);
    } else {
      out.sizes.clear();
    }
    if (failed(assign(op.getResult(0), out, work)))
      return failure();
    return success();
  }
  return fail(op, "a matmul the pass cannot split");
}

LogicalResult ChainBuilder::Impl::narrowRepeat(Value v, const Split &s, llvm::SmallVector<Value> &work, Chain &chain) {
  if (!replicateKv || !s.heads || s.global <= 0)
    return success();
  // Back through transposes (k^T) to the repeat; where its heads dim goes.
  llvm::SmallVector<std::pair<int64_t, int64_t>> swaps;
  Value cur = v;
  while (auto op = cur.getDefiningOp<bmt::AtenOp>()) {
    if (bmt::atenOpId(op) == AtenOpId::transpose_int) {
      auto d0 = bmt::getAtenArg(op, "dim0")->getInt(), d1 = bmt::getAtenArg(op, "dim1")->getInt();
      if (!d0 || !d1)
        return success();
      swaps.push_back({*d0, *d1});
    } else if (bmt::atenOpId(op) != AtenOpId::contiguous) {
      break;
    }
    cur = op->getOperand(0);
  }
  auto repeat = cur.getDefiningOp<bmt::AtenOp>();
  if (!repeat || (bmt::atenOpId(repeat) != AtenOpId::reshape && bmt::atenOpId(repeat) != AtenOpId::view) ||
      splits.count(cur))
    return success();
  auto shape = bmt::getAtenArg(repeat, 1);
  auto expand = repeat->getOperand(0).getDefiningOp<bmt::AtenOp>();
  if (!shape || !shape->isList() || shape->getElements().size() != 4 || !expand ||
      bmt::atenOpId(expand) != AtenOpId::expand)
    return success();
  auto sizes = bmt::getAtenArg(expand, "size")->getElements();
  if (sizes.size() != 5)
    return success();
  auto nRep = sizes[2].getInt(), kv = sizes[1].getInt();
  auto merged = shape->getElements()[1].getInt();
  int64_t heads = s.global;
  if (!nRep || *nRep < 2 || heads % *nRep != 0 || (kv && *kv * *nRep != heads) ||
      (merged && *merged != heads))
    return fail(repeat, "a repeat of the kv heads to other than the " + std::to_string(heads) +
                     " query heads");
  // The heads dim (1 of 4) through the transposes to the matmul.
  int64_t pos = 1;
  for (auto it = swaps.rbegin(); it != swaps.rend(); ++it) {
    int64_t a = it->first < 0 ? it->first + 4 : it->first, b = it->second < 0 ? it->second + 4 : it->second;
    pos = pos == a ? b : pos == b ? a : pos;
  }
  if (pos - 4 != s.dim)
    return fail(repeat, "a repeat of the kv heads that does not meet the query heads");
  int64_t kvHeads = heads / *nRep;
  if (chain.replicatedKvHeads && chain.replicatedKvHeads != kvHeads)
    return fail(repeat, "k and v repeated from different numbers of heads");
  chain.replicatedKvHeads = kvHeads;
  chain.narrows.push_back({repeat, 1, heads});
  Split out;
  out.dim = -3;
  out.global = heads;
  out.heads = true;
  llvm::SmallVector<int64_t> outSizes;
  for (const bmt::AtenArg &e : shape->getElements()) {
    auto c = e.getInt();
    outSizes.push_back(c && *c != -1 ? *c : -1);
  }
  // The head dim is the query heads' (the chain's widest column / H).
  int64_t headDim = chain.widestColumn % heads == 0 ? chain.widestColumn / heads : -1;
  if (outSizes[3] == -1)
    outSizes[3] = headDim;
  else if (outSizes[3] != headDim)
    return fail(repeat, "a repeat of the kv heads whose head dim is not the query heads'");
  out.setSizes(outSizes);
  ++chain.ops;
  if (failed(assign(cur, out, work)))
    return failure();
  return success();
}

LogicalResult ChainBuilder::Impl::checkReplicated(Chain &chain) {
  llvm::DenseSet<Operation *> narrowed;
  for (HeadNarrow n : chain.narrows)
    narrowed.insert(n.repeat);
  llvm::SmallVector<Value> work;
  llvm::DenseSet<Value> seen;
  for (MatmulSite c : chain.replicated)
    work.push_back(c.op.getResult(0));
  while (!work.empty()) {
    Value v = work.pop_back_val();
    if (!seen.insert(v).second)
      continue;
    for (OpOperand &use : v.getUses()) {
      Operation *user = use.getOwner();
      if (narrowed.count(user) || isMetadata(user))
        continue;
      if (auto call = dyn_cast<func::CallOp>(user)) {
        auto callee = program.symbols->lookup<func::FuncOp>(call.getCallee());
        if (!callee || program.callSites[callee].size() != 1)
          return fail(user, "a replicated k/v value enters a function called more than once");
        work.push_back(callee.getArgument(use.getOperandNumber()));
        continue;
      }
      if (auto ret = dyn_cast<func::ReturnOp>(user)) {
        auto f = ret->getParentOfType<func::FuncOp>();
        if (!program.blockFuncs.count(f) || program.isBlockRoot(f) || program.callSites[f].size() != 1)
          return fail(user, "a replicated k/v value leaves the block");
        work.push_back(program.callSites[f][0].getResult(use.getOperandNumber()));
        continue;
      }
      if (llvm::any_of(user->getResults(), [&](Value r) { return splits.count(r); }))
        return fail(user, "an op that reads a replicated k/v value and a split one");
      for (Value r : user->getResults())
        if (isa<bmt::TensorType>(r.getType()))
          work.push_back(r);
    }
  }
  if (chain.narrows.empty())
    return fail(chain.replicated.front().op, "no repeat of the replicated kv heads to the query heads");
  return success();
}

Value ChainBuilder::Impl::traceInput(Value v, llvm::SmallVector<OpOperand *> &path) {
  while (auto arg = dyn_cast<BlockArgument>(v)) {
    auto f = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
    if (!f || program.isBlockRoot(f) || program.callSites[f].size() != 1)
      break;
    // The argument must feed nothing else that takes a gradient, also
    // through the functions it is passed to (BERT's attention passes its
    // input to the q/k/v module and, as the residual, to the output
    // module: a tp_copy above that call would sum the residual's
    // gradient over the group).
    if (!feedsOnlyMatmuls(arg))
      return v;
    OpOperand &operand = program.callSites[f][0]->getOpOperand(arg.getArgNumber());
    path.push_back(&operand);
    v = operand.get();
  }
  return v;
}

bool ChainBuilder::Impl::type_as_other(Operation *op, Value v) {
  auto aten = dyn_cast<bmt::AtenOp>(op);
  return aten && bmt::atenOpId(aten) == AtenOpId::type_as && op->getOperand(0) != v;
}

bool ChainBuilder::Impl::feedsOnlyMatmuls(Value v) {
  for (OpOperand &u : v.getUses()) {
    Operation *user = u.getOwner();
    if (isMetadata(user) || isMatmulInput(u))
      continue;
    auto call = dyn_cast<func::CallOp>(user);
    auto callee = call ? program.symbols->lookup<func::FuncOp>(call.getCallee()) : nullptr;
    if (!callee || program.callSites[callee].size() != 1 ||
        !feedsOnlyMatmuls(callee.getArgument(u.getOperandNumber())))
      return false;
  }
  return true;
}

bool ChainBuilder::Impl::isMatmulInput(OpOperand &u) {
  auto aten = dyn_cast<bmt::AtenOp>(u.getOwner());
  if (!aten)
    return false;
  auto m = matmulShape(aten);
  return m && u.get() == m->input;
}

unsigned ChainBuilder::Impl::inputOperand(bmt::AtenOp op, const MatmulShape &m) {
  for (OpOperand &o : op->getOpOperands())
    if (o.get() == m.input)
      return o.getOperandNumber();
  return 0;
}

int64_t ChainBuilder::Impl::fusedChunks(bmt::AtenOp op, const MatmulShape &m, int64_t *rank) {
  Value v = op.getResult(0);
  bool viewed = false;
  for (int hops = 0; hops < 8; ++hops) {
    if (!viewed)
      if (int64_t n = slicedChunks(v, m.out, rank))
        return n;
    if (!v.hasOneUse())
      return 1;
    Operation *user = *v.getUsers().begin();
    if (auto ret = dyn_cast<func::ReturnOp>(user)) {
      auto f = ret->getParentOfType<func::FuncOp>();
      if (program.callSites[f].size() != 1)
        return 1;
      v = program.callSites[f][0].getResult(v.getUses().begin()->getOperandNumber());
      continue;
    }
    auto aten = dyn_cast<bmt::AtenOp>(user);
    if (!aten)
      return 1;
    if (bmt::atenOpId(aten) == AtenOpId::view || bmt::atenOpId(aten) == AtenOpId::reshape) {
      v = aten.getResult(0);
      viewed = true;
      continue;
    }
    if (bmt::atenOpId(aten) == AtenOpId::split_Tensor) {
      auto size = bmt::getAtenArg(aten, "split_size")->getInt();
      if (size && *size > 0 && m.out % *size == 0 && m.out / *size == aten->getNumResults())
        return aten->getNumResults();
    }
    if (bmt::atenOpId(aten) == AtenOpId::chunk && !viewed) {
      auto n = bmt::getAtenArg(aten, "chunks")->getInt(), dim = bmt::getAtenArg(aten, "dim")->getInt();
      if (n && dim && *dim == -1 && *n > 1 && *n == aten->getNumResults() && m.out % *n == 0)
        return *n;
    }
    return 1;
  }
  return 1;
}

int64_t ChainBuilder::Impl::slicedChunks(Value v, int64_t width, int64_t *rank) {
  llvm::SmallVector<std::pair<int64_t, int64_t>> parts; // {start, end}
  std::optional<int64_t> dim;
  for (Operation *user : v.getUsers()) {
    auto slice = dyn_cast<bmt::AtenOp>(user);
    if (!slice || bmt::atenOpId(slice) != AtenOpId::slice_Tensor || slice->getOperand(0) != v)
      return 0;
    auto d = bmt::getAtenArg(slice, "dim")->getInt(), start = bmt::getAtenArg(slice, "start")->getInt(),
         end = bmt::getAtenArg(slice, "end")->getInt(), step = bmt::getAtenArg(slice, "step")->getInt();
    if (!d || !start || !end || !step || *step != 1 || (dim && *dim != *d))
      return 0;
    dim = d;
    parts.push_back({*start, std::min(*end, width)});
  }
  if (parts.size() < 2 || width % static_cast<int64_t>(parts.size()) != 0)
    return 0;
  llvm::sort(parts);
  int64_t part = width / static_cast<int64_t>(parts.size());
  for (auto [i, p] : llvm::enumerate(parts))
    if (p.first != static_cast<int64_t>(i) * part || p.second != p.first + part)
      return 0;
  if (*dim >= 0 && rank)
    *rank = *dim + 1;
  else if (*dim != -1)
    return 0;
  return parts.size();
}

FailureOr<Chain> ChainBuilder::Impl::build(Value input, llvm::ArrayRef<ChainSeed> seeds, bool replicate) {
  splits.clear();
  replicateKv = replicate;
  Chain chain;
  chain.input = input;
  int64_t widest = 0;
  for (const ChainSeed &seed : seeds)
    widest = std::max(widest, matmulShape(seed.op)->out);
  llvm::SmallVector<Value> work;
  for (const ChainSeed &seed : seeds) {
    bmt::AtenOp op = seed.op;
    auto m = *matmulShape(op);
    if (!usedOnlyHere(m.weight, m.weightValue) ||
        (m.bias && !usedOnlyHere(m.bias, m.biasValue)))
      return fail(op, "a column-parallel weight read elsewhere too");
    // The input goes through tp_copy: at the outermost call operand
    // of its path, or at the matmul itself (replicated k/v too: their
    // input's gradient differs per rank, like q's).
    chain.copyUses.push_back(seed.path.empty() ? &op->getOpOperand(inputOperand(op, m)) : seed.path.back());
    if (replicate && m.out < widest) {
      chain.replicated.push_back({op, m.weight, m.bias, -1});
      continue;
    }
    // A fused projection: q, k, v (3 chunks) split apart later.
    int64_t sliceRank = 0;
    int64_t chunks = fusedChunks(op, m, &sliceRank);
    if (m.out % (chunks * tensorParallel) != 0) {
      std::string what = "the output size " + std::to_string(m.out);
      if (chunks > 1)
        what = "each of the output's " + std::to_string(chunks) + " fused parts (" +
               std::to_string(m.out) + " = " + std::to_string(chunks) + " x " +
               std::to_string(m.out / chunks) + "), of size " +
               std::to_string(m.out / chunks) + ",";
      return fail(op, what + " is not divisible by --tensor-parallel " +
                          std::to_string(static_cast<int64_t>(tensorParallel)),
                  /*fatal=*/true);
    }
    chain.fused |= chunks > 1;
    chain.columns.push_back({op, m.weight, m.bias, m.outDim});
    chain.paramSplits[m.weight] = {m.outDim, chunks};
    if (m.bias)
      chain.paramSplits[m.bias] = {0, chunks};
    if (!chain.columnWidth)
      chain.columnWidth = m.out;
    chain.widestColumn = std::max(chain.widestColumn, m.out / chunks);
    Split s;
    s.dim = -1;
    s.global = m.out;
    s.chunks = chunks;
    if (bmt::atenOpId(op) == AtenOpId::addmm)
      s.setSizes({-1, m.out});
    else if (sliceRank > 0)
      s.setSizes(llvm::SmallVector<int64_t>(sliceRank, -1));
    if (failed(assign(op.getResult(0), s, work)))
      return failure();
  }
  if (failed(propagate(work, chain)))
    return failure();
  if (chain.rows.empty())
    return fail(seeds.front().op, "no row-parallel matmul ends the chain");
  // Every op reading a split value is split too (or ends the chain):
  // an op that met a split and a replicated operand it cannot
  // broadcast never got a split result.
  for (auto &[v, s] : splits)
    for (Operation *user : v.getUsers()) {
      if (isa<func::CallOp, func::ReturnOp>(user) || isMetadata(user))
        continue;
      if (llvm::any_of(chain.rows, [&](auto &r) { return r.op.getOperation() == user; }))
        continue;
      if (type_as_other(user, v))
        continue;
      if (!llvm::any_of(user->getResults(), [&](Value r) { return splits.count(r); }))
        return fail(user, "an op that reads a split and a replicated value");
    }
  if (!chain.replicated.empty() && failed(checkReplicated(chain)))
    return failure();
  if (failed(checkShadow(program, splits, chain, tensorParallel, printShadow, error)))
    return failure();
  chain.values.assign(splits.begin(), splits.end());
  return chain;
}

ChainBuilder::ChainBuilder(ProgramIndex &program, int64_t tensorParallel, bool printShadow)
    : impl(std::make_unique<Impl>(program, tensorParallel, printShadow)) {}
ChainBuilder::~ChainBuilder() = default;

FailureOr<Chain> ChainBuilder::build(Value input, llvm::ArrayRef<ChainSeed> seeds, bool replicate) {
  return impl->build(input, seeds, replicate);
}

const ChainError &ChainBuilder::error() const { return impl->error; }

Value ChainBuilder::traceInput(Value v, llvm::SmallVector<OpOperand *> &path) {
  return impl->traceInput(v, path);
}

int64_t ChainBuilder::fusedChunks(bmt::AtenOp op, const MatmulShape &m) { return impl->fusedChunks(op, m); }
