//===- TensorParallel.cpp - the bmt-tensor-parallel pass ------------------===//
//
// Splits the matmul chains of each transformer block over a tensor-parallel
// group of T ranks, the way Megatron-LM splits a layer (Shoeybi et al.,
// "Megatron-LM", 2019, section 3): a chain that starts at matmuls with
// parameter weights reading one replicated activation, runs through
// pointwise ops, views and per-head attention, and ends at a matmul that
// contracts the split dimension becomes column-parallel then row-parallel,
// with a bmt.tp_copy before it and one bmt.tp_all_reduce after it; with
// sequence-parallel the activations between the chains are split along the
// sequence (Korthikanti et al. 2022, section 4.2.2) and f and g become an
// all-gather and a reduce-scatter along it. The
// chains are found by following the split dimension through the program
// (docs/passes.md, "Tensor parallelism"); names are not consulted. How the
// split dimension moves through pointwise ops, reductions, transposes,
// per-head matmuls and attention is the upstream shard dialect's
// ShardingInterface (lib/Dialect/ShardingInterfaceImpl.cpp), asked on
// ranked copies of the ops; views that regroup dims are the pass's own.
// The shardings of record are decided by upstream's sharding-propagation,
// and the collectives checked against upstream's shard-partition, on a
// ranked shadow of each chain (shadow() below).
// See passes/Passes.td.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/ShardingInterfaceImpl.h"
#include "bmt/Dialect/TensorSplit.h"
#include "bmt/Passes.h"

#include "TensorParallelChains.h"
#include "TensorParallelGradients.h"
#include "TensorParallelUpstream.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Shard/Interfaces/ShardingInterface.h"
#include "mlir/Dialect/Shard/Transforms/Partition.h"
#include "mlir/Dialect/Shard/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"

#include <functional>
#include <limits>
#include <optional>
#include <string>

namespace bmt {
#define GEN_PASS_DEF_TENSORPARALLEL
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;

namespace {

using namespace bmt::tp;

struct TensorParallelPass : bmt::impl::TensorParallelBase<TensorParallelPass> {
  using TensorParallelBase::TensorParallelBase;

  void getDependentDialects(DialectRegistry &registry) const override {
    TensorParallelBase::getDependentDialects(registry);
    // The rules by which a split moves through bmt.aten and bmt.fused.
    bmt::registerShardingInterfaceExternalModels(registry);
    // What upstream's shard-partition creates in the shadows (shard and
    // tensor ops), loaded before the pass runs.
    shard::reshardingRegisterDependentDialects(registry);
  }

  ModuleOp module;
  /// The calls, parameter reads and block functions of the module.
  ProgramIndex program;
  /// Whether `p` is read only by `v`'s get_global, and `v` used once.
  bool usedOnlyHere(bmt::ParameterOp p, Value v) {
    return p && program.paramReads[p].size() == 1 && v.hasOneUse() && !p.getAliases();
  }

  std::optional<MatmulShape> matmulShape(bmt::AtenOp op) { return bmt::tp::matmulShape(program, op); }

  [[noreturn]] static void fail(Operation *op, const llvm::Twine &message, bool fatal = false) {
    throw ChainError{fatal, op, message.str()};
  }

  void checkDivides(Operation *op, StringRef what, int64_t size, int64_t by) {
    if (size <= 0 || size % by != 0)
      fail(op, llvm::Twine(what) + " " + llvm::Twine(size) + " is not divisible by --tensor-parallel " +
                   llvm::Twine(by),
           /*fatal=*/true);
  }

  /// The split of `v` in the chain being built, if any.
  llvm::DenseMap<Value, Split> splits;

  void assign(Value v, Split s, llvm::SmallVector<Value> &work) {
    auto it = splits.find(v);
    if (it != splits.end()) {
      if (it->second.dim != s.dim)
        fail(v.getDefiningOp() ? v.getDefiningOp() : v.getParentBlock()->getParentOp(),
             "reached along two different split dims");
      return;
    }
    splits[v] = std::move(s);
    work.push_back(v);
  }

  /// Normalizes a dim argument against rank `rank` (-1 unknown); none when
  /// the rank is needed and unknown.
  static std::optional<int64_t> negDim(int64_t d, int64_t rank) {
    if (d < 0)
      return d;
    if (rank < 0)
      return std::nullopt;
    return d - rank;
  }

  /// Propagates the chain from the values in `work`.
  void propagate(llvm::SmallVector<Value> &work, Chain &chain) {
    while (!work.empty()) {
      Value v = work.pop_back_val();
      Split s = splits[v];
      for (OpOperand &use : v.getUses())
        step(use, s, work, chain);
    }
  }

  void step(OpOperand &use, const Split &s, llvm::SmallVector<Value> &work, Chain &chain) {
    Operation *user = use.getOwner();
    if (auto call = dyn_cast<func::CallOp>(user)) {
      auto callee = program.symbols->lookup<func::FuncOp>(call.getCallee());
      if (!callee || program.callSites[callee].size() != 1)
        fail(user, "a split value enters a function called more than once");
      assign(callee.getArgument(use.getOperandNumber()), s, work);
      return;
    }
    if (auto ret = dyn_cast<func::ReturnOp>(user)) {
      auto f = ret->getParentOfType<func::FuncOp>();
      if (program.blockFuncs.count(f) && program.isBlockRoot(f))
        fail(user, "a split value leaves the block");
      if (!program.blockFuncs.count(f) || program.callSites[f].size() != 1)
        fail(user, "a split value leaves a function called more than once");
      assign(program.callSites[f][0].getResult(use.getOperandNumber()), s, work);
      return;
    }
    if (isa<bmt::FusedOp>(user)) {
      ++chain.ops;
      byInterface(user, s, work, "a last-dim normalization over the split dim");
      return;
    }
    auto op = dyn_cast<bmt::AtenOp>(user);
    if (!op)
      fail(user, "an op the pass does not know how to split");
    const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
    StringRef name = op.getName();
    ++chain.ops;
    if (info->kind == bmt::AtenOpKind::Metadata)
      return; // sizes read from a split value are the local sizes
    if (info->kind == bmt::AtenOpKind::Matmul) {
      matmul(op, use, s, work, chain);
      return;
    }
    // Pointwise ops, casts, dropout, detach: by their ShardingInterface
    // rule; cat, repeat and pad have none (view() follows cat).
    if (info->kind == bmt::AtenOpKind::Elementwise || info->kind == bmt::AtenOpKind::Random ||
        info->kind == bmt::AtenOpKind::Copy || name == "aten::detach" || name == "aten::alias") {
      if (info->kind != bmt::AtenOpKind::Copy || consult(user, s).rule) {
        byInterface(user, s, work, "a pointwise op that reduces");
        return;
      }
    }
    if (info->kind == bmt::AtenOpKind::Reduction) {
      reduction(op, s, work);
      return;
    }
    if (info->kind == bmt::AtenOpKind::Attention) {
      // Per head: q, k, v split alike at a batch dim (the heads); the
      // mask broadcasts.
      Propagated p = consult(user, s);
      if (!p.rule)
        fail(user, "attention the pass cannot split (no sharding rule)");
      if (p.conflict)
        fail(user, "attention inputs split along different dims");
      for (StringRef arg : {"query", "key", "value"})
        if (p.reduced || !p.operandDims[bmt::getAtenArg(op, arg)->getOperandNumber()])
          fail(user, "attention whose inputs are not split by heads");
      for (StringRef arg : {"query", "key", "value"}) {
        auto a = bmt::getAtenArg(op, arg);
        auto it = splits.find(a->getOperand());
        if (it == splits.end()) {
          if (arg != "query")
            narrowRepeat(a->getOperand(), s, work, chain);
          return; // the other inputs arrive later
        }
      }
      // Every input split: the interface says where the result is.
      p = consult(user, s);
      if (p.conflict)
        fail(user, "attention inputs split along different dims");
      if (!p.resultDims[0])
        fail(user, "attention whose inputs are not split by heads");
      Split out = s;
      out.dim = *p.resultDims[0];
      assign(op.getResult(0), out, work);
      return;
    }
    view(op, use, s, work, chain);
  }

  /// What the ShardingInterface of `op` (lib/Dialect/ShardingInterfaceImpl.cpp)
  /// says of it when its operands are split as `splits` records, `s` the
  /// split just reached: upstream's getShardingOption from the operands'
  /// shardings over @tp, then getShardingAnnotations for every operand and
  /// result. The interface reads ranks from ranked tensor types, so it is
  /// asked about a copy of `op` with ranked operands (cloneWithRankedTypes):
  /// a value's rank where the pass knows it (the views that made it, a
  /// parameter's shape), else that of `s` (or, unknown, at least 4 and at
  /// least -s.dim; dims count from the end, as broadcasting aligns them).
  struct Propagated {
    bool rule = false;     // the interface has a rule for `op` at these ranks
    bool conflict = false; // the operands' splits give no one sharding option
    bool reduced = false;  // a split dim is one `op` reduces (contracts)
    /// Per operand and result: its split dim in the annotation (from the
    /// end); none when replicated or no tensor.
    llvm::SmallVector<std::optional<int64_t>> operandDims, resultDims;
    llvm::SmallVector<int64_t> resultRanks;
  };
  Propagated consult(Operation *op, const Split &s) {
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

  /// Splits the results of `op` as its ShardingInterface rule says (a
  /// result the rule leaves replicated, like type_as's dtype source, is
  /// not split); `reduced` is the failure when the split dim is one `op`
  /// reduces.
  void byInterface(Operation *op, const Split &s, llvm::SmallVector<Value> &work,
                   const llvm::Twine &reduced) {
    Propagated p = consult(op, s);
    if (!p.rule)
      fail(op, "an op the pass does not know how to split (no sharding rule)");
    if (p.conflict)
      fail(op, "operands split along different dims");
    if (p.reduced)
      fail(op, reduced);
    for (auto [r, dim] : llvm::zip_equal(op->getResults(), p.resultDims)) {
      if (!dim)
        continue;
      Split out = s;
      out.dim = *dim;
      int64_t rank = p.resultRanks[r.getResultNumber()];
      if (s.rankKnown() && rank != s.rank())
        out.setSizes(llvm::SmallVector<int64_t>(rank, -1)); // a reduction dropped dims
      assign(r, out, work);
    }
  }

  /// Where a transpose, permute or unsqueeze moves the split dim: its
  /// ShardingInterface rule (a permutation of the loops).
  int64_t dimByInterface(bmt::AtenOp op, const Split &s) {
    Propagated p = consult(op, s);
    if (!p.rule || p.conflict || p.resultDims.empty() || !p.resultDims[0])
      fail(op, "a view the pass cannot follow (no sharding rule)");
    return *p.resultDims[0];
  }

  /// softmax, norms, mean / sum / amax: by their ShardingInterface rule,
  /// which allows no split of a dim they reduce. A reduced dim counted from
  /// the front needs the rank, which the pass may not know.
  void reduction(bmt::AtenOp op, const Split &s, llvm::SmallVector<Value> &work) {
    const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
    StringRef base = op.getName().drop_front(strlen("aten::")).split('.').first;
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
        fail(op, message);
    }
    byInterface(op, s, work, message);
  }

  void matmul(bmt::AtenOp op, OpOperand &use, const Split &s, llvm::SmallVector<Value> &work,
              Chain &chain) {
    StringRef name = op.getName();
    if (auto m = matmulShape(op); m && use.get() == m->input) {
      // The split dim is contracted: row-parallel.
      if (s.dim != -1 || s.chunks != 1 || (s.global >= 0 && s.global != m->in))
        fail(op, "a matmul whose input is split along a dim it does not contract");
      if (!usedOnlyHere(m->weight, m->weightValue))
        fail(op, "a row-parallel weight read elsewhere too");
      checkDivides(op, "the contracted size", m->in, tensorParallel);
      chain.rows.push_back({op, m->weight, m->bias, 1 - m->outDim});
      chain.paramSplits[m->weight] = {1 - m->outDim, 1};
      return;
    }
    if (name == "aten::matmul" || name == "aten::bmm") {
      // Batched over heads: both operands split at the same batch dim (the
      // interface's rule splits both operands, and no contracted dim).
      Propagated p = consult(op, s);
      if (!p.rule)
        fail(op, "a matmul the pass cannot split (no sharding rule)");
      if (p.conflict)
        fail(op, "matmul operands split along different dims");
      if (p.reduced || !p.operandDims[0] || !p.operandDims[1])
        fail(op, "a matmul of a split value that is not batched over the split dim");
      Value self = op->getOperand(0), other = op->getOperand(1);
      auto a = splits.find(self), b = splits.find(other);
      if (a == splits.end() || b == splits.end()) {
        // With replicated k/v: the other operand may be their repeat to
        // the query heads, which each rank narrows to its own heads.
        narrowRepeat(a == splits.end() ? self : other, s, work, chain);
        return; // the other operand arrives later (or never: checked at the end)
      }
      p = consult(op, s);
      if (p.conflict || !p.resultDims[0])
        fail(op, "matmul operands split along different dims");
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
      assign(op.getResult(0), out, work);
      return;
    }
    fail(op, "a matmul the pass cannot split");
  }

  /// True while a chain is built with its narrower column matmuls (GQA's
  /// k and v projections) replicated.
  bool replicateKv = false;

  /// With replicated k/v (`replicateKv`): when `v`, a replicated operand of
  /// a per-head matmul or attention whose other operand `s` is split by
  /// heads, is (through transposes) the repeat of the kv heads to the H
  /// query heads, `reshape(expand(unsqueeze(kv, 2), [b, kv, n_rep, s, d]),
  /// [b, kv * n_rep, s, d])` (Hugging Face's repeat_kv, TorchScript and
  /// torch.export alike), records that the repeat's result is narrowed to
  /// the rank's heads and propagates it as split by heads. The narrow is
  /// exact: query head h attends with repeated head h, which is kv head
  /// h / n_rep, whichever rank holds h.
  void narrowRepeat(Value v, const Split &s, llvm::SmallVector<Value> &work, Chain &chain) {
    if (!replicateKv || !s.heads || s.global <= 0)
      return;
    // Back through transposes (k^T) to the repeat; where its heads dim goes.
    llvm::SmallVector<std::pair<int64_t, int64_t>> swaps;
    Value cur = v;
    while (auto op = cur.getDefiningOp<bmt::AtenOp>()) {
      if (op.getName() == "aten::transpose.int") {
        auto d0 = bmt::getAtenArg(op, "dim0")->getInt(), d1 = bmt::getAtenArg(op, "dim1")->getInt();
        if (!d0 || !d1)
          return;
        swaps.push_back({*d0, *d1});
      } else if (op.getName() != "aten::contiguous") {
        break;
      }
      cur = op->getOperand(0);
    }
    auto repeat = cur.getDefiningOp<bmt::AtenOp>();
    if (!repeat || (repeat.getName() != "aten::reshape" && repeat.getName() != "aten::view") ||
        splits.count(cur))
      return;
    auto shape = bmt::getAtenArg(repeat, 1);
    auto expand = repeat->getOperand(0).getDefiningOp<bmt::AtenOp>();
    if (!shape || !shape->isList() || shape->getElements().size() != 4 || !expand ||
        expand.getName() != "aten::expand")
      return;
    auto sizes = bmt::getAtenArg(expand, "size")->getElements();
    if (sizes.size() != 5)
      return;
    auto nRep = sizes[2].getInt(), kv = sizes[1].getInt();
    auto merged = shape->getElements()[1].getInt();
    int64_t heads = s.global;
    if (!nRep || *nRep < 2 || heads % *nRep != 0 || (kv && *kv * *nRep != heads) ||
        (merged && *merged != heads))
      fail(repeat, "a repeat of the kv heads to other than the " + std::to_string(heads) +
                       " query heads");
    // The heads dim (1 of 4) through the transposes to the matmul.
    int64_t pos = 1;
    for (auto it = swaps.rbegin(); it != swaps.rend(); ++it) {
      int64_t a = it->first < 0 ? it->first + 4 : it->first, b = it->second < 0 ? it->second + 4 : it->second;
      pos = pos == a ? b : pos == b ? a : pos;
    }
    if (pos - 4 != s.dim)
      fail(repeat, "a repeat of the kv heads that does not meet the query heads");
    int64_t kvHeads = heads / *nRep;
    if (chain.replicatedKvHeads && chain.replicatedKvHeads != kvHeads)
      fail(repeat, "k and v repeated from different numbers of heads");
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
      fail(repeat, "a repeat of the kv heads whose head dim is not the query heads'");
    out.setSizes(outSizes);
    ++chain.ops;
    assign(cur, out, work);
  }

  /// With replicated k/v: every value computed from the replicated
  /// projections ends in a narrowed repeat or is read for its sizes only
  /// (another reader would compute from all kv heads on every rank, and
  /// its gradient would be summed T times by reduce_grad and tp_copy).
  void checkReplicated(Chain &chain) {
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
            fail(user, "a replicated k/v value enters a function called more than once");
          work.push_back(callee.getArgument(use.getOperandNumber()));
          continue;
        }
        if (auto ret = dyn_cast<func::ReturnOp>(user)) {
          auto f = ret->getParentOfType<func::FuncOp>();
          if (!program.blockFuncs.count(f) || program.isBlockRoot(f) || program.callSites[f].size() != 1)
            fail(user, "a replicated k/v value leaves the block");
          work.push_back(program.callSites[f][0].getResult(use.getOperandNumber()));
          continue;
        }
        if (llvm::any_of(user->getResults(), [&](Value r) { return splits.count(r); }))
          fail(user, "an op that reads a replicated k/v value and a split one");
        for (Value r : user->getResults())
          if (isa<bmt::TensorType>(r.getType()))
            work.push_back(r);
      }
    }
    if (chain.narrows.empty())
      fail(chain.replicated.front().op, "no repeat of the replicated kv heads to the query heads");
  }

  void edit(Chain &chain, bmt::AtenOp op, unsigned arg, int elem, int64_t global,
            StringRef what) {
    checkDivides(op, what, global, tensorParallel);
    chain.edits.push_back({op, arg, elem, global / tensorParallel});
  }

  void view(bmt::AtenOp op, OpOperand &use, const Split &s, llvm::SmallVector<Value> &work,
            Chain &chain) {
    StringRef name = op.getName();
    int64_t rank = s.rankKnown() ? s.rank() : -1;
    auto intArg = [&](StringRef arg) { return bmt::getAtenArg(op, arg)->getInt(); };
    if (use.getOperandNumber() != 0 && name != "aten::cat")
      fail(op, "a split value used as a shape or index");
    if (name == "aten::transpose.int") {
      auto d0 = intArg("dim0"), d1 = intArg("dim1");
      if (!d0 || !d1 || rank < 0)
        fail(op, "a transpose of a value of unknown rank");
      int64_t a = *d0 < 0 ? *d0 + rank : *d0, b = *d1 < 0 ? *d1 + rank : *d1;
      Split out = s;
      out.dim = dimByInterface(op, s);
      std::swap(out.sizes[a], out.sizes[b]);
      assign(op.getResult(0), out, work);
      return;
    }
    if (name == "aten::permute") {
      auto dims = bmt::getAtenArg(op, "dims")->getInts();
      if (!dims || rank < 0 || static_cast<int64_t>(dims->size()) != rank)
        fail(op, "a permute of a value of unknown rank");
      Split out = s;
      for (int64_t i = 0; i < rank; ++i) {
        int64_t src = (*dims)[i] < 0 ? (*dims)[i] + rank : (*dims)[i];
        out.sizes[i] = s.sizes[src];
      }
      out.dim = dimByInterface(op, s);
      assign(op.getResult(0), out, work);
      return;
    }
    if (name == "aten::unsqueeze") {
      auto d = intArg("dim");
      if (!d || (*d >= 0 && rank < 0))
        fail(op, "an unsqueeze of a value of unknown rank");
      Split out = s;
      out.dim = dimByInterface(op, s);
      if (rank >= 0)
        out.sizes.insert(out.sizes.begin() + (*d < 0 ? *d + rank + 1 : *d), 1);
      assign(op.getResult(0), out, work);
      return;
    }
    if (name == "aten::slice.Tensor" || name == "aten::narrow" || name == "aten::select.int") {
      auto d = intArg("dim");
      auto nd = d ? negDim(*d, rank) : std::nullopt;
      if (name == "aten::slice.Tensor" && intArg("start") == 0 && intArg("step") == 1 &&
          intArg("end") >= std::numeric_limits<int64_t>::max() / 2) {
        assign(op.getResult(0), s, work); // the whole tensor
        return;
      }
      if (nd && *nd == s.dim && name == "aten::slice.Tensor" && s.chunks > 1) {
        // One of the equal parts of a fused projection (Phi-3's q, k, v):
        // its bounds become the rank's part of each chunk.
        fusedSlice(op, s, work, chain);
        return;
      }
      if (!nd || *nd == s.dim)
        fail(op, "indexing along the split dim");
      Split out = s;
      if (name == "aten::select.int") {
        if (rank < 0)
          fail(op, "a select of a value of unknown rank");
        int64_t k = *nd + rank;
        if (k > s.pos())
          out.dim = s.dim + 1;
        out.sizes.erase(out.sizes.begin() + k);
      } else if (rank >= 0) {
        out.sizes[*nd + rank] = -1;
      }
      assign(op.getResult(0), out, work);
      return;
    }
    if (name == "aten::split.Tensor" || name == "aten::chunk") {
      auto d = intArg("dim");
      auto nd = d ? negDim(*d, rank) : std::nullopt;
      if (!nd)
        fail(op, "a split along an unknown dim");
      int64_t n = op->getNumResults();
      Split out = s;
      if (*nd == s.dim) {
        // The chunks of a fused projection (q, k, v) taken apart.
        if (s.chunks != n || s.global < 0 || s.global % n != 0)
          fail(op, "a split along the split dim that does not follow its chunks");
        out.chunks = 1;
        out.global = s.global / n;
        if (rank >= 0)
          out.sizes[s.pos()] = out.global;
        if (name == "aten::split.Tensor") {
          auto size = intArg("split_size");
          if (!size || *size != out.global)
            fail(op, "a split along the split dim that does not follow its chunks");
          edit(chain, op, bmt::lookupAtenOp(name)->argIndex("split_size"), -1, *size,
               "the split size");
        }
      } else if (rank >= 0) {
        out.sizes[*nd + rank] = -1;
      }
      for (Value r : op->getResults())
        assign(r, out, work);
      return;
    }
    if (name == "aten::cat") {
      auto d = intArg("dim");
      auto nd = d ? negDim(*d, rank) : std::nullopt;
      if (!nd || *nd == s.dim)
        fail(op, "a concatenation along the split dim");
      auto list = bmt::getAtenArg(op, "tensors");
      for (const bmt::AtenArg &e : list->getElements())
        if (!e.isOperand() || !splits.count(e.getOperand()))
          if (e.getOperand() != use.get())
            return; // the others arrive later
      Split out = s;
      if (rank >= 0)
        out.sizes[*nd + rank] = -1;
      assign(op.getResult(0), out, work);
      return;
    }
    if (name == "aten::expand") {
      auto list = bmt::getAtenArg(op, "size");
      auto elems = list->getElements();
      int64_t n = elems.size();
      if (n < -s.dim)
        fail(op, "an expand of fewer dims than the split dim");
      const bmt::AtenArg &at = elems[n + s.dim];
      Split out = s;
      if (auto c = at.getInt(); c && *c != -1) {
        if (*c != s.global)
          fail(op, "an expand of the split dim");
        edit(chain, op, bmt::lookupAtenOp(name)->argIndex("size"), n + s.dim, *c,
             "the expanded size");
      }
      llvm::SmallVector<int64_t> sizes;
      for (int64_t i = 0; i < n; ++i) {
        auto c = elems[i].getInt();
        int64_t from = i - (n - rank);
        sizes.push_back(c && *c != -1 ? *c : rank >= 0 && from >= 0 ? s.sizes[from] : -1);
      }
      out.setSizes(sizes);
      assign(op.getResult(0), out, work);
      return;
    }
    if (name == "aten::view" || name == "aten::reshape") {
      reshape(op, s, work, chain);
      return;
    }
    fail(op, "an op the pass does not know how to split");
  }

  /// A slice [start, end) of a fused projection's output along the split
  /// dim that takes one of its `chunks` equal parts; each rank holds its
  /// 1 / T of every part, in the parts' order, so the bounds become
  /// [start / T, end / T) (an end past the width stays).
  void fusedSlice(bmt::AtenOp op, const Split &s, llvm::SmallVector<Value> &work, Chain &chain) {
    auto intArg = [&](StringRef arg) { return bmt::getAtenArg(op, arg)->getInt(); };
    auto start = intArg("start"), end = intArg("end"), step = intArg("step");
    int64_t part = s.global > 0 ? s.global / s.chunks : -1;
    bool open = end && *end >= std::numeric_limits<int64_t>::max() / 2;
    if (!start || !end || !step || *step != 1 || part <= 0 || *start % part != 0 ||
        (open ? *start != s.global - part : *end != *start + part))
      fail(op, "a slice along the split dim that does not take one part of a fused projection");
    const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
    if (*start != 0)
      edit(chain, op, info->argIndex("start"), -1, *start, "the slice's start");
    if (!open)
      edit(chain, op, info->argIndex("end"), -1, *end, "the slice's end");
    Split out = s;
    out.chunks = 1;
    out.global = part;
    if (out.rankKnown())
      out.sizes[out.pos()] = part;
    assign(op.getResult(0), out, work);
  }

  /// view/reshape: which dim of the new shape holds the split, from the
  /// entries after it (docs/passes.md lists the cases).
  void reshape(bmt::AtenOp op, const Split &s, llvm::SmallVector<Value> &work, Chain &chain) {
    unsigned argIdx = 1;
    auto list = bmt::getAtenArg(op, argIdx);
    if (!list || !list->isList())
      fail(op, "a reshape to a computed shape");
    auto elems = list->getElements();
    int64_t n = elems.size();
    int64_t rank = s.rankKnown() ? s.rank() : -1;
    llvm::SmallVector<std::optional<int64_t>> c;
    for (const bmt::AtenArg &e : elems)
      c.push_back(e.getInt());
    auto sizesOut = [&](int64_t dim, int64_t global) {
      llvm::SmallVector<int64_t> sizes;
      for (auto &x : c)
        sizes.push_back(x && *x != -1 ? *x : -1);
      sizes[n + dim] = global;
      return sizes;
    };
    Split out = s;
    int64_t trailing = 1; // global product of the dims after the split dim
    if (s.dim < -1) {
      if (rank < 0)
        fail(op, "a reshape of a value of unknown rank");
      for (int64_t i = s.pos() + 1; i < rank; ++i)
        trailing = s.sizes[i] < 0 || trailing < 0 ? -1 : trailing * s.sizes[i];
    }
    if (s.dim == -1) {
      if (c.back() && *c.back() != -1) {
        int64_t last = *c.back();
        if (last == s.global) {
          edit(chain, op, argIdx, n - 1, last, "the reshaped size");
          out.setSizes(sizesOut(-1, s.global));
        } else if (s.global > 0 && last < s.global && s.global % last == 0 && n >= 2 &&
                   s.chunks == 1) {
          // hidden -> heads x head dim
          int64_t heads = s.global / last;
          if (heads % tensorParallel != 0) {
            std::string what = "a width of " + std::to_string(s.global) + " is " +
                               std::to_string(heads) + " heads of " + std::to_string(last) +
                               ", and " + std::to_string(heads) +
                               " heads are not divisible by --tensor-parallel " +
                               std::to_string(static_cast<int64_t>(tensorParallel));
            fail(op, what, /*fatal=*/true);
          }
          if (c[n - 2] && *c[n - 2] != -1) {
            if (*c[n - 2] != heads)
              fail(op, "a reshape that does not split the hidden dim into heads");
            edit(chain, op, argIdx, n - 2, heads, "the number of heads");
          } else if (!c[n - 2] && !isLocalSize(elems[n - 2].getOperand())) {
            fail(op, "a reshape into heads with a computed head count");
          }
          out.dim = -2;
          out.global = heads;
          out.heads = true;
          out.setSizes(sizesOut(-2, heads));
          chain.headsGlobal = std::max(chain.headsGlobal, heads);
          chain.kvHeads = chain.kvHeads ? std::min(chain.kvHeads, heads) : heads;
        } else {
          fail(op, "a reshape of the split dim");
        }
      } else {
        // [..., -1] or [..., size(x, -1)]: the last dim is kept.
        out.setSizes(sizesOut(-1, s.global));
      }
    } else if (s.dim == -2 && trailing > 0) {
      if (c.back() && *c.back() == trailing && n >= 2) {
        if (c[n - 2] && *c[n - 2] != -1) {
          if (*c[n - 2] != s.global)
            fail(op, "a reshape of the split dim");
          edit(chain, op, argIdx, n - 2, s.global, "the number of heads");
        }
        out.setSizes(sizesOut(-2, s.global));
      } else if ((!c.back() || *c.back() == -1) && n == rank - 1) {
        // heads x head dim -> hidden
        out.dim = -1;
        out.global = s.global * trailing;
        out.heads = false;
        out.setSizes(sizesOut(-1, out.global));
      } else if (c.back() && *c.back() == s.global * trailing && n == rank - 1) {
        edit(chain, op, argIdx, n - 1, s.global * trailing, "the reshaped size");
        out.dim = -1;
        out.global = s.global * trailing;
        out.heads = false;
        out.setSizes(sizesOut(-1, out.global));
      } else {
        fail(op, "a reshape the pass cannot follow");
      }
    } else if (s.dim <= -3 && rank >= 0 && (n == rank || n == rank - 1)) {
      // Leading dims kept (n == rank) or the split dim merged with the one
      // after it (GQA's repeat of the kv heads).
      out.dim = n == rank ? s.dim : s.dim + 1;
      int64_t next = n == rank ? 1 : s.sizes[s.pos() + 1];
      out.global = s.global < 0 || next < 0 ? -1 : s.global * next;
      // A constant at the split dim is its global size (a .pt2's static shapes).
      if (auto at = c[n + out.dim]; at && *at != -1) {
        if (*at != out.global)
          fail(op, "a reshape with a constant size at the split dim");
        edit(chain, op, argIdx, n + out.dim, *at, "the reshaped size");
      }
      out.setSizes(sizesOut(out.dim, out.global));
      for (int64_t i = 0; i < n; ++i)
        if (n + out.dim != i) {
          int64_t from = i < n + out.dim ? i : i + (rank - n);
          out.sizes[i] = s.sizes[from];
        }
    } else {
      fail(op, "a reshape the pass cannot follow");
    }
    assign(op.getResult(0), out, work);
  }

  /// Whether `v` is aten::size.int of a value (the local size at run time).
  static bool isLocalSize(Value v) {
    auto size = v.getDefiningOp<bmt::AtenOp>();
    return size && size.getName() == "aten::size.int";
  }

  /// The value `v` stands for in the outermost function that still feeds
  /// only through calls, with the call operands on the way.
  Value traceInput(Value v, llvm::SmallVector<OpOperand *> &path) {
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
  /// aten::type_as(x, v): only v's dtype is read.
  static bool type_as_other(Operation *op, Value v) {
    auto aten = dyn_cast<bmt::AtenOp>(op);
    return aten && aten.getName() == "aten::type_as" && op->getOperand(0) != v;
  }
  /// Whether every use of `v` is a matmul's input, a metadata read, or a
  /// call (of a function called once) whose argument is such a value.
  bool feedsOnlyMatmuls(Value v) {
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

  bool isMatmulInput(OpOperand &u) {
    auto aten = dyn_cast<bmt::AtenOp>(u.getOwner());
    if (!aten)
      return false;
    auto m = matmulShape(aten);
    return m && u.get() == m->input;
  }

  //===--- The ranked shadow: upstream's sharding-propagation decides -----===//
  //
  // `!bmt.tensor` has no rank, and upstream's `sharding-propagation` and
  // `shard.shard` want ranked tensors; so each chain is copied into a
  // temporary module (a `shard.grid @tp` of T devices and one function of
  // ranked tensors, dynamic sizes except the parameters' static shapes and
  // the global sizes the pass knows), annotated with `shard.sharding` +
  // `shard.shard` on what the pass decides itself, propagated by upstream's
  // pass and then partitioned by upstream's `shard-partition` (each run by
  // a PassManager of its own). The pass decides: the column weights, split
  // along their output dim, and the results of the ops with no sharding
  // rule (views that regroup dims, slices, split/chunk, cat, expand, the
  // narrowed kv repeat), which become arguments of the shadow function
  // annotated as the pass's rule splits them; their inputs are left to
  // upstream. Upstream decides the rest: every op with a rule (pointwise,
  // reductions, transposes, per-head matmuls, attention, the column and
  // row matmuls) gets its operands' and results' shardings from it. Then:
  // each result's sharding must be the split the pass follows, each input
  // of a pass-rule op must arrive split as that rule expects, the row
  // weights and column biases as the pass splits them, no operand may need
  // a resharding, no other parameter may be split, and partition's
  // collectives must be one all-reduce after each row-parallel matmul (the
  // pass's tp_all_reduce): any difference is one error naming the op.

  /// The value `v` stands for across calls of functions called once: a
  /// callee's argument is its call's operand, a call's result the callee's
  /// returned value.
  Value resolve(Value v) {
    for (int hops = 0; hops < 64; ++hops) {
      if (auto arg = dyn_cast<BlockArgument>(v)) {
        auto f = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
        if (!f || program.callSites[f].size() != 1)
          return v;
        v = program.callSites[f][0]->getOperand(arg.getArgNumber());
        continue;
      }
      if (auto call = v.getDefiningOp<func::CallOp>()) {
        auto callee = program.symbols->lookup<func::FuncOp>(call.getCallee());
        if (!callee || callee.isExternal())
          return v;
        v = callee.getBody().back().getTerminator()->getOperand(cast<OpResult>(v).getResultNumber());
        continue;
      }
      return v;
    }
    return v;
  }

  /// The ops whose results the pass's own rule splits (no sharding rule).
  static bool ownRule(Operation *op) {
    auto aten = dyn_cast<bmt::AtenOp>(op);
    if (!aten)
      return false;
    return llvm::is_contained({"aten::view", "aten::reshape", "aten::slice.Tensor", "aten::narrow",
                               "aten::select.int", "aten::split.Tensor", "aten::chunk", "aten::cat",
                               "aten::expand"},
                              aten.getName());
  }

  /// The split dim (from the end) of `sharding` on a value of `rank`
  /// dims: none when replicated; -rank - 1 for a sharding that is not one
  /// dim split over grid axis 0 (no split of the pass looks like that).
  static std::optional<int64_t> splitOf(const shard::Sharding &sharding, int64_t rank) {
    if (!sharding)
      return std::nullopt;
    std::optional<int64_t> dim;
    for (auto [d, axes] : llvm::enumerate(sharding.getSplitAxes())) {
      if (axes.empty())
        continue;
      if (dim || axes.asArrayRef() != ArrayRef<shard::GridAxis>{0})
        return -rank - 1;
      dim = static_cast<int64_t>(d) - rank;
    }
    return dim;
  }
  static std::string dimText(std::optional<int64_t> dim) {
    return dim ? "split along dim " + std::to_string(*dim) : std::string("replicated");
  }

  /// The shadow's text, in the custom forms (the copies are bmt.aten ops
  /// of ranked tensors, which bmt's verifier would not take).
  static std::string shadowText(ModuleOp m) {
    std::string text;
    llvm::raw_string_ostream os(text);
    m->print(os, OpPrintingFlags().assumeVerified());
    return text;
  }

  void shadow(Chain &chain) {
    MLIRContext *context = &getContext();
    Location loc = module.getLoc();
    OwningOpRef<ModuleOp> scratch = ModuleOp::create(loc);
    OpBuilder builder = OpBuilder::atBlockEnd(scratch->getBody());
    shard::GridOp::create(builder, loc, "tp", ArrayRef<int64_t>{static_cast<int64_t>(tensorParallel)});
    auto func = func::FuncOp::create(builder, loc, "chain", builder.getFunctionType({}, {}));
    Block *body = func.addEntryBlock();
    builder.setInsertionPointToEnd(body);
    FlatSymbolRefAttr grid = FlatSymbolRefAttr::get(context, "tp");
    Type f32 = builder.getF32Type();
    auto dynamic = [&](int64_t rank) {
      return RankedTensorType::get(llvm::SmallVector<int64_t>(rank, ShapedType::kDynamic), f32);
    };
    // shard.sharding + shard.shard (annotate_for_users) of `v`: split at
    // `dim` (from the end), or replicated.
    auto annotate = [&](Value v, std::optional<int64_t> dim) {
      int64_t rank = cast<RankedTensorType>(v.getType()).getRank();
      llvm::SmallVector<shard::GridAxesAttr> axes;
      if (dim) {
        axes.assign(rank + *dim + 1, shard::GridAxesAttr::get(context, {}));
        axes.back() = shard::GridAxesAttr::get(context, {0});
      }
      Value sharding = shard::ShardingOp::create(builder, v.getLoc(), grid, axes).getResult();
      return shard::ShardOp::create(builder, v.getLoc(), v, sharding, /*annotate_for_users=*/true).getResult();
    };

    // The chain's ops: those whose results it splits, and the rows.
    llvm::SetVector<Operation *> ops;
    for (auto &[v, s] : splits)
      if (auto r = dyn_cast<OpResult>(v); r && isa<bmt::AtenOp, bmt::FusedOp>(r.getOwner()))
        ops.insert(r.getOwner());
    for (const MatmulSite &row : chain.rows)
      ops.insert(row.op);
    llvm::DenseSet<Operation *> columns;
    for (const MatmulSite &c : chain.columns)
      columns.insert(c.op);

    llvm::DenseMap<Value, Value> copies;          // resolved original -> shadow value
    llvm::DenseSet<Operation *> emitted;
    llvm::SmallVector<std::pair<Operation *, Operation *>> clones; // {original, copy}
    std::function<void(Operation *)> emit = [&](Operation *op) {
      if (!emitted.insert(op).second)
        return;
      if (ownRule(op)) {
        // The pass's rule decides: its split results enter as annotated
        // arguments.
        for (Value r : op->getResults()) {
          auto it = splits.find(r);
          if (it == splits.end())
            continue;
          const Split &s = it->second;
          // The global sizes the pass knows, else dynamic ones.
          RankedTensorType type = dynamic(s.rankKnown() ? s.rank() : std::max<int64_t>(4, -s.dim));
          if (s.rankKnown()) {
            llvm::SmallVector<int64_t> sizes;
            for (int64_t size : s.sizes)
              sizes.push_back(size > 0 ? size : ShapedType::kDynamic);
            type = RankedTensorType::get(sizes, f32);
          }
          Value arg = body->addArgument(type, op->getLoc());
          copies[r] = annotate(arg, s.dim);
        }
        return;
      }
      // Operands: the chain's values, else arguments.
      llvm::SmallVector<Value> operands;
      llvm::SmallVector<int> external; // operand numbers
      int64_t widest = -1;
      for (OpOperand &o : op->getOpOperands()) {
        Value v = resolve(o.get());
        if (!isa<bmt::TensorType>(o.get().getType())) {
          operands.push_back(body->addArgument(builder.getI64Type(), o.get().getLoc()));
          continue;
        }
        Operation *def = v.getDefiningOp();
        if (def && ops.count(def))
          emit(def);
        if (auto it = copies.find(v); it != copies.end()) {
          operands.push_back(it->second);
          widest = std::max(widest, cast<RankedTensorType>(it->second.getType()).getRank());
          continue;
        }
        operands.push_back(Value());
        external.push_back(o.getOperandNumber());
      }
      auto aten = dyn_cast<bmt::AtenOp>(op);
      for (int i : external) {
        Value v = resolve(op->getOperand(i));
        if (auto it = copies.find(v); it != copies.end()) {
          operands[i] = it->second;
          continue;
        }
        Value arg;
        if (auto param = program.paramOf(v)) {
          arg = body->addArgument(RankedTensorType::get(shapeOf(param), f32), v.getLoc());
        } else {
          int64_t rank = widest >= 0 ? widest
                         : aten && aten.getName() == "aten::addmm" ? 2
                         : aten && aten.getName() == "aten::linear" ? 3
                                                                     : 4;
          arg = body->addArgument(dynamic(rank), v.getLoc());
        }
        // The column weights (and their biases) as the pass splits them.
        std::optional<int64_t> seed;
        if (columns.count(op))
          if (auto param = program.paramOf(v); param && param == matmulShape(aten)->weight)
            seed = matmulShape(aten)->outDim - 2;
        copies[v] = seed ? annotate(arg, seed) : arg;
        operands[i] = copies[v];
      }
      Operation *copy = bmt::cloneWithOperands(builder, op, operands);
      if (!copy || !isa<shard::ShardingInterface>(copy))
        fail(op, "internal error: no sharding rule at the ranks of the shadow of its chain", true);
      bmt::tp::detachUnmappedOperands(*body, copy);
      // A name per copy, for upstream's diagnostics.
      copy->setLoc(NameLoc::get(builder.getStringAttr("shadow." + std::to_string(clones.size())), op->getLoc()));
      clones.push_back({op, copy});
      for (auto [r, c] : llvm::zip_equal(op->getResults(), copy->getResults()))
        copies[r] = c;
    };
    // In program order (the copies of an op's operands come first).
    llvm::SmallVector<Operation *> ordered;
    module.walk([&](Operation *op) {
      if (ops.count(op))
        ordered.push_back(op);
    });
    for (Operation *op : ordered)
      emit(op);
    // The results nothing in the shadow reads (the inputs of the pass's
    // rules, the rows' results) are returned: upstream annotates a result
    // at its uses.
    llvm::SmallVector<Value> unread;
    for (auto [op, copy] : clones)
      for (Value r : copy->getResults())
        if (r.use_empty())
          unread.push_back(r);
    func::ReturnOp::create(builder, loc, unread);
    func.setType(builder.getFunctionType(body->getArgumentTypes(), ValueRange(unread).getTypes()));

    // The original of the shadow op at `loc`.
    auto shadowOp = [&](Location loc) -> Operation * {
      auto name = dyn_cast<NameLoc>(loc);
      unsigned i = 0;
      if (!name || !name.getName().strref().starts_with("shadow.") ||
          name.getName().strref().drop_front(7).getAsInteger(10, i) || i >= clones.size())
        return nullptr;
      return clones[i].first;
    };
    // Upstream's pass, on the shadow.
    PassManager pm(context, ModuleOp::getOperationName());
    pm.enableVerifier(false); // the copies are bmt.aten ops of ranked tensors
    pm.addNestedPass<func::FuncOp>(shard::createShardingPropagation());
    std::string diagnostics;
    Operation *blamed = nullptr;
    if (std::string why; failed(bmt::tp::verifyShadow(*scratch, why)))
      fail(chain.columns.front().op, "internal error: the shadow of the chain is no valid input for upstream's "
                                     "sharding-propagation (" + why + ")",
           true);
    bool crashed = false;
    {
      ScopedDiagnosticHandler capture(context, [&](Diagnostic &d) {
        if (d.getSeverity() != DiagnosticSeverity::Error)
          return success();
        if (auto op = shadowOp(d.getLocation()); op && !blamed)
          blamed = op;
        if (diagnostics.empty())
          diagnostics = d.str();
        return success();
      });
      LogicalResult ran = bmt::tp::runOnShadow(pm, scratch, crashed);
      if (crashed)
        fail(chain.columns.front().op, "internal error: upstream's sharding-propagation crashed on the shadow of "
                                       "the chain",
             true);
      if (failed(ran))
        fail(blamed ? blamed : chain.columns.front().op.getOperation(),
             "upstream's sharding-propagation cannot shard the chain here (" + diagnostics + ")", true);
    }

    if (printShadow)
      llvm::errs() << "// bmt-tensor-parallel: the shadow of the chain of " << describe(chain.columns.front().op)
                   << " after sharding-propagation\n"
                   << shadowText(*scratch) << "\n";
    // What upstream decided for a shadow value: the sharding of its
    // shard.shard (the one for its producer, else the one for its users).
    auto decided = [](Value v) -> std::optional<shard::Sharding> {
      std::optional<shard::Sharding> users;
      for (Operation *u : v.getUsers())
        if (auto shardOp = dyn_cast<shard::ShardOp>(u)) {
          if (!shardOp.getAnnotateForUsers())
            return shard::Sharding(shardOp.getSharding());
          users = shard::Sharding(shardOp.getSharding());
        }
      return users;
    };
    // The sharding an operand arrives with, and the value it comes from.
    auto arriving = [](Value v) {
      std::optional<shard::Sharding> s;
      while (auto shardOp = v.getDefiningOp<shard::ShardOp>()) {
        if (!s)
          s = shard::Sharding(shardOp.getSharding());
        v = shardOp.getSrc();
      }
      return std::make_pair(s, v);
    };
    auto rankOf = [](Value v) { return cast<RankedTensorType>(v.getType()).getRank(); };
    auto expect = [&](Operation *op, const llvm::Twine &what, std::optional<int64_t> upstream,
                      std::optional<int64_t> own) {
      if (upstream != own)
        fail(op, "internal error: upstream's sharding-propagation has " + what + " " +
                     dimText(upstream) + ", the pass " + dimText(own),
             true);
    };
    for (auto [op, copy] : clones) {
      // Results: the split the pass follows.
      for (auto [r, c] : llvm::zip_equal(op->getResults(), copy->getResults())) {
        std::optional<shard::Sharding> d = decided(c);
        std::optional<int64_t> dim = d ? splitOf(*d, rankOf(c)) : std::nullopt;
        auto it = splits.find(r);
        std::optional<int64_t> own = it == splits.end() ? std::nullopt : std::optional<int64_t>(it->second.dim);
        if (!d && own)
          fail(op, "internal error: upstream's sharding-propagation does not reach result " +
                       std::to_string(r.getResultNumber()) + ", which the pass splits",
               true);
        expect(op, "result " + std::to_string(r.getResultNumber()), dim, own);
        chain.upstream[r] = dim;
      }
      // Operands: no resharding; parameters split only as the pass splits them.
      for (OpOperand &o : copy->getOpOperands()) {
        if (!isa<RankedTensorType>(o.get().getType()))
          continue;
        auto [sharding, root] = arriving(o.get());
        std::optional<int64_t> dim = sharding ? splitOf(*sharding, rankOf(root)) : std::nullopt;
        std::optional<shard::Sharding> produced = decided(root);
        if (produced && isa<OpResult>(root)) {
          std::optional<int64_t> from = splitOf(*produced, rankOf(root));
          if (from != dim)
            fail(op, "upstream's sharding-propagation reshards operand " +
                         std::to_string(o.getOperandNumber()) + " from " + dimText(from) + " to " +
                         dimText(dim) + ": the chain has no one sharding",
                 true);
        }
        Value original = resolve(op->getOperand(o.getOperandNumber()));
        if (auto param = program.paramOf(original)) {
          auto split = chain.paramSplits.find(param);
          std::optional<int64_t> own;
          if (split != chain.paramSplits.end())
            own = split->second.first - static_cast<int64_t>(shapeOf(param).size());
          // A dim of size 1 broadcasts: it is the same on every rank.
          int64_t rank = shapeOf(param).size();
          if (dim && !own && shapeOf(param)[rank + *dim] == 1)
            dim = std::nullopt;
          std::string name = param.getSymName().str() + " (operand " + std::to_string(o.getOperandNumber()) + ")";
          if (dim && !own)
            fail(op, "upstream's sharding-propagation splits parameter " + name + " along dim " +
                         std::to_string(*dim) + ", which the pass keeps whole: the chain has no one sharding",
                 true);
          if (dim != own)
            fail(op, "internal error: upstream's sharding-propagation has parameter " + name + " " +
                         dimText(dim) + ", the pass " + dimText(own),
                 true);
        }
      }
    }
    // The inputs of the pass's own rules arrive split as the rule expects.
    for (Operation *op : ordered) {
      if (!ownRule(op))
        continue;
      for (OpOperand &o : op->getOpOperands()) {
        auto it = splits.find(o.get());
        if (it == splits.end())
          continue;
        auto copy = copies.find(resolve(o.get()));
        if (copy == copies.end())
          continue;
        auto [sharding, root] = arriving(copy->second);
        std::optional<shard::Sharding> d = sharding ? sharding : decided(root);
        expect(op, "operand " + std::to_string(o.getOperandNumber()),
               d ? splitOf(*d, rankOf(root)) : std::nullopt, it->second.dim);
      }
    }
    // Partition, by upstream's shard-partition: the collectives it needs
    // must be the pass's, one all-reduce (a sum) after each row-parallel
    // matmul and nothing else (the tp_copy before the chain is an identity
    // forward, which partition has no op for). The returned values are
    // annotated for their user, the return, as partition wants.
    Operation *ret = func.getBody().front().getTerminator();
    builder.setInsertionPoint(ret);
    for (OpOperand &o : ret->getOpOperands())
      if (auto shardOp = o.get().getDefiningOp<shard::ShardOp>(); shardOp && !shardOp.getAnnotateForUsers())
        o.set(shard::ShardOp::create(builder, o.get().getLoc(), o.get(), shardOp.getSharding(),
                                     /*annotate_for_users=*/true)
                  .getResult());
    PassManager partition(context, ModuleOp::getOperationName());
    partition.enableVerifier(false);
    partition.addNestedPass<func::FuncOp>(shard::createPartition());
    {
      ScopedDiagnosticHandler capture(context, [&](Diagnostic &d) {
        if (d.getSeverity() == DiagnosticSeverity::Error && diagnostics.empty())
          diagnostics = d.str();
        if (auto op = shadowOp(d.getLocation()); op && !blamed)
          blamed = op;
        return success();
      });
      LogicalResult ran = bmt::tp::runOnShadow(partition, scratch, crashed);
      if (crashed)
        fail(chain.columns.front().op, "internal error: upstream's shard-partition crashed on the shadow of the chain",
             true);
      if (failed(ran))
        fail(blamed ? blamed : chain.columns.front().op.getOperation(),
             "upstream's shard-partition cannot partition the chain here (" + diagnostics + ")", true);
    }
    if (printShadow)
      llvm::errs() << "// bmt-tensor-parallel: the shadow of the chain of " << describe(chain.columns.front().op)
                   << " after shard-partition\n"
                   << shadowText(*scratch) << "\n";
    llvm::DenseMap<Operation *, int> reduced; // row -> all-reduces after it
    scratch->walk([&](Operation *op) {
      if (!isa<shard::ShardDialect>(op->getDialect()) || isa<shard::GridOp, shard::ShardingOp, shard::ShardOp>(op))
        return;
      Operation *after = op->getNumOperands() ? op->getOperand(0).getDefiningOp() : nullptr;
      Operation *at = after ? shadowOp(after->getLoc()) : nullptr;
      bool isRow = at && llvm::any_of(chain.rows, [&](auto &r) { return r.op.getOperation() == at; });
      if (isa<shard::AllReduceOp>(op) && isRow) {
        ++reduced[at];
        return;
      }
      fail(at ? at : chain.columns.front().op.getOperation(),
           "internal error: upstream's shard-partition inserts a " + op->getName().getStringRef().str() +
               " after it, where the pass inserts " + (isRow ? "one bmt.tp_all_reduce" : "none"),
           true);
    });
    for (const MatmulSite &row : chain.rows)
      if (reduced.lookup(row.op) != 1)
        fail(row.op, "internal error: upstream's shard-partition inserts " +
                         std::to_string(reduced.lookup(row.op)) +
                         " all-reduces after this row-parallel matmul, the pass one bmt.tp_all_reduce",
             true);

  }

  void runOnOperation() override {
    module = getOperation();
    if (tensorParallel < 1) {
      module.emitError("bmt-tensor-parallel: tensor-parallel must be positive, got ")
          << static_cast<int64_t>(tensorParallel);
      return signalPassFailure();
    }
    if (sequenceParallel && tensorParallel == 1) {
      module.emitError("bmt-tensor-parallel: sequence-parallel needs tensor-parallel T > 1");
      return signalPassFailure();
    }
    if (tensorParallel == 1)
      return; // nothing to split: the IR stays as it is
    if (!module.getOps<bmt::StorageGroupOp>().empty()) {
      module.emitError("bmt-tensor-parallel: runs before bmt-zero (the module has storage groups)");
      return signalPassFailure();
    }
    if (module.getOps<bmt::BlockListOp>().empty()) {
      module.emitError("bmt-tensor-parallel: needs the block lists of bmt-find-blocks");
      return signalPassFailure();
    }
    program = ProgramIndex::build(module);

    // Column candidates: matmuls with a parameter weight in the blocks,
    // grouped by the replicated activation they read.
    llvm::MapVector<Value, llvm::SmallVector<std::pair<bmt::AtenOp, llvm::SmallVector<OpOperand *>>, 2>>
        byInput;
    module.walk([&](bmt::AtenOp op) {
      if (!program.blockFuncs.count(op->getParentOfType<func::FuncOp>()))
        return;
      auto m = matmulShape(op);
      if (!m)
        return;
      llvm::SmallVector<OpOperand *> path;
      Value in = traceInput(m->input, path);
      byInput[in].push_back({op, path});
    });

    llvm::DenseSet<Operation *> taken; // matmuls already in a chain (as rows)
    std::vector<Chain> chains;
    llvm::SmallVector<ChainError> skipped;
    // One chain from the matmuls `seeds` reading `input`; with `replicate`,
    // those narrower than the widest (GQA's k and v projections) are
    // replicated instead of split. Throws a ChainError.
    auto build = [&](Value input, auto &seeds, bool replicate) {
      splits.clear();
      replicateKv = replicate;
      Chain chain;
      chain.input = input;
      int64_t widest = 0;
      for (auto &seed : seeds)
        widest = std::max(widest, matmulShape(seed.first)->out);
      llvm::SmallVector<Value> work;
      for (auto &[op, path] : seeds) {
        auto m = *matmulShape(op);
        if (!usedOnlyHere(m.weight, m.weightValue) ||
            (m.bias && !usedOnlyHere(m.bias, m.biasValue)))
          fail(op, "a column-parallel weight read elsewhere too");
        // The input goes through tp_copy: at the outermost call operand
        // of its path, or at the matmul itself (replicated k/v too: their
        // input's gradient differs per rank, like q's).
        chain.copyUses.push_back(path.empty() ? &op->getOpOperand(inputOperand(op, m)) : path.back());
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
          fail(op, what + " is not divisible by --tensor-parallel " +
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
        if (op.getName() == "aten::addmm")
          s.setSizes({-1, m.out});
        else if (sliceRank > 0)
          s.setSizes(llvm::SmallVector<int64_t>(sliceRank, -1));
        assign(op.getResult(0), s, work);
      }
      propagate(work, chain);
      if (chain.rows.empty())
        fail(seeds.front().first, "no row-parallel matmul ends the chain");
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
            fail(user, "an op that reads a split and a replicated value");
        }
      if (!chain.replicated.empty())
        checkReplicated(chain);
      shadow(chain);
      chain.values.assign(splits.begin(), splits.end());
      return chain;
    };
    auto fatalError = [&](const ChainError &f) {
      InFlightDiagnostic d = f.op->emitError("bmt-tensor-parallel: cannot split ");
      d << describe(f.op) << " by --tensor-parallel " << static_cast<int64_t>(tensorParallel)
        << ": " << f.message;
      signalPassFailure();
    };

    for (auto &[input, seeds] : byInput) {
      if (llvm::any_of(seeds, [&](auto &s) { return taken.count(s.first); }))
        continue;
      std::optional<Chain> chain;
      try {
        chain = build(input, seeds, /*replicate=*/false);
      } catch (ChainError &f) {
        // Grouped-query (or multi-query) attention whose kv heads T does
        // not divide: again with the k and v projections replicated, the
        // query heads split (docs/passes.md).
        bool narrower = false, fused = false;
        for (auto &seed : seeds) {
          auto m = *matmulShape(seed.first);
          narrower |= m.out != matmulShape(seeds.front().first)->out;
          fused |= fusedChunks(seed.first, m) > 1;
        }
        std::optional<ChainError> retry;
        if (narrower && !fused) {
          try {
            chain = build(input, seeds, /*replicate=*/true);
          } catch (ChainError &g) {
            retry = g;
          }
        }
        if (!chain) {
          if (retry && retry->fatal)
            return fatalError(*retry);
          if (retry)
            f.message += " (nor can the k/v projections be replicated: " + describe(retry->op) +
                         ": " + retry->message + ")";
          if (f.fatal)
            return fatalError(f);
          f.seed = seeds.front().first;
          skipped.push_back(f);
          continue;
        }
      }
      for (auto &r : chain->rows)
        taken.insert(r.op);
      chains.push_back(std::move(*chain));
    }
    // Seeds that turned out to end another chain were no chain of their own.
    llvm::erase_if(skipped, [&](const ChainError &f) { return taken.count(f.seed); });

    if (chains.empty()) {
      InFlightDiagnostic d = module.emitError("bmt-tensor-parallel: found no chain to split");
      if (!skipped.empty())
        d << " (" << describe(skipped.front().op) << ": " << skipped.front().message << ")";
      return signalPassFailure();
    }
    // Every parameter left whole: how its gradient is completed
    // (TensorParallelGradients.h), before anything is rewritten.
    FailureOr<llvm::SmallVector<bmt::tp::ParameterGradient>> gradients = proveGradients(chains);
    if (failed(gradients))
      return signalPassFailure();
    bmt::tp::rewriteChains(program, tensorParallel, chains);
    markSummed(*gradients);
    std::string vocab = bmt::tp::vocabParallel(program, tensorParallel);
    std::string sequence;
    if (sequenceParallel) {
      FailureOr<std::string> text = bmt::tp::sequenceParallelize(program, tensorParallel);
      if (failed(text))
        return signalPassFailure();
      sequence = *text;
    }
    std::string text = bmt::tp::chainReport(module, *program.symbols, tensorParallel, chains, skipped, vocab, sequence);
    emitRemark(module.getLoc()) << "bmt-tensor-parallel: " << static_cast<int64_t>(tensorParallel)
                                << " ranks, " << text;
    // For the plan summary (bmt-summary): what was split.
    module->setAttr("bmt.tensor_parallel_plan", StringAttr::get(&getContext(), text));
    emitRemark(module.getLoc()) << bmt::tp::gradientReport(module, *program.symbols, *gradients);
  }

  //===--- Gradient completion (TensorParallelGradients.cpp) ---------------===//

  FailureOr<llvm::SmallVector<bmt::tp::ParameterGradient>> proveGradients(llvm::ArrayRef<Chain> chains) {
    llvm::SmallVector<bmt::tp::ChainRegion> regions;
    llvm::DenseSet<Operation *> splitParams;
    for (const Chain &chain : chains) {
      bmt::tp::ChainRegion &region = regions.emplace_back();
      for (auto &[v, s] : chain.values)
        region.split[v] = {s.dim, s.rankKnown() ? s.rank() : -1};
      region.completed.insert(chain.copyUses.begin(), chain.copyUses.end());
      for (const MatmulSite &row : chain.rows) {
        region.rows.insert(row.op);
        // The row's bias is added after the all-reduce.
        if (auto m = matmulShape(row.op); m && m->biasValue)
          for (OpOperand &o : row.op->getOpOperands())
            if (o.get() == m->biasValue)
              region.completed.insert(&o);
      }
      for (const HeadNarrow &n : chain.narrows)
        region.narrowing.insert(n.repeat);
      for (auto &[param, split] : chain.paramSplits)
        splitParams.insert(param);
    }
    return bmt::tp::proveGradientCompletion(module, regions, splitParams, tensorParallel);
  }

  /// reduce_grad on the parameters whose gradient is each rank's partial
  /// sum (the replicated k/v projections already have it).
  void markSummed(llvm::ArrayRef<bmt::tp::ParameterGradient> gradients) {
    for (const bmt::tp::ParameterGradient &g : gradients)
      if (g.completion == bmt::tp::Completion::Summed && !bmt::hasParameterSplit(g.param))
        markReduceGrad(g.param);
  }

  /// `bmt.tensor_split = {dim = -1, chunks = 1, reduce_grad = true}`: whole
  /// on every TP rank, its gradient summed over the group before ZeRO's
  /// reduce-scatter (Plan's TensorSplit{dim = -1, reduceGrad}).
  static void markReduceGrad(bmt::ParameterOp p) {
    bmt::setParameterSplit(p, bmt::reduceGradSplit());
  }

  static unsigned inputOperand(bmt::AtenOp op, const MatmulShape &m) {
    for (OpOperand &o : op->getOpOperands())
      if (o.get() == m.input)
        return o.getOperandNumber();
    return 0;
  }

  /// How many chunks the output of a column matmul has: the number of
  /// results of the aten::split (or, read without a view, aten::chunk) along
  /// the last dim that takes it apart into equal parts, or of the slices
  /// that do (Phi-3's qkv_proj: [..., 0:q], [..., q:2q], [..., 2q:]), else 1.
  /// With slices along a dim counted from the front, `rank` is set to the
  /// output's rank (the sliced dim is its last).
  int64_t fusedChunks(bmt::AtenOp op, const MatmulShape &m, int64_t *rank = nullptr) {
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
      if (aten.getName() == "aten::view" || aten.getName() == "aten::reshape") {
        v = aten.getResult(0);
        viewed = true;
        continue;
      }
      if (aten.getName() == "aten::split.Tensor") {
        auto size = bmt::getAtenArg(aten, "split_size")->getInt();
        if (size && *size > 0 && m.out % *size == 0 && m.out / *size == aten->getNumResults())
          return aten->getNumResults();
      }
      if (aten.getName() == "aten::chunk" && !viewed) {
        auto n = bmt::getAtenArg(aten, "chunks")->getInt(), dim = bmt::getAtenArg(aten, "dim")->getInt();
        if (n && dim && *dim == -1 && *n > 1 && *n == aten->getNumResults() && m.out % *n == 0)
          return *n;
      }
      return 1;
    }
    return 1;
  }

  /// The number of equal parts of [0, `width`) that the uses of `v`, all
  /// aten::slice.Tensor along one dim with constant bounds and step 1,
  /// take (each one part; the last may end at the end), else 0. A dim
  /// counted from the front is taken as the last, and `rank` set.
  int64_t slicedChunks(Value v, int64_t width, int64_t *rank) {
    llvm::SmallVector<std::pair<int64_t, int64_t>> parts; // {start, end}
    std::optional<int64_t> dim;
    for (Operation *user : v.getUsers()) {
      auto slice = dyn_cast<bmt::AtenOp>(user);
      if (!slice || slice.getName() != "aten::slice.Tensor" || slice->getOperand(0) != v)
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

};

} // namespace
