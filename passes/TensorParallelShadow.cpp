//===- TensorParallelShadow.cpp - upstream's passes on a ranked shadow ----===//
//
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
//
// A failure or a crash inside upstream's code (TensorParallelUpstream.h)
// becomes a fatal ChainError: one error line, never a stack dump.
//
//===----------------------------------------------------------------------===//

#include "TensorParallelChainBuilder.h"
#include "TensorParallelUpstream.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/ShardingInterfaceImpl.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Shard/Interfaces/ShardingInterface.h"
#include "mlir/Dialect/Shard/Transforms/Passes.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/raw_ostream.h"

#include <functional>
#include <optional>
#include <string>

using namespace mlir;
using bmt::AtenOpId;
using namespace bmt::tp;

namespace {

struct ShadowCheck {
  ProgramIndex &program;
  const llvm::DenseMap<Value, Split> &splits;
  int64_t tensorParallel;
  bool printShadow;
  ChainError &error;

  LogicalResult fail(Operation *op, const llvm::Twine &message, bool fatal = false) {
    error = ChainError{fatal, op, message.str()};
    return failure();
  }
  std::optional<MatmulShape> matmulShape(bmt::AtenOp op) { return bmt::tp::matmulShape(program, op); }

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
    return bmt::isAten(op, {AtenOpId::view, AtenOpId::reshape, AtenOpId::slice_Tensor,
                            AtenOpId::narrow, AtenOpId::select_int, AtenOpId::split_Tensor,
                            AtenOpId::chunk, AtenOpId::cat, AtenOpId::expand});
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

  LogicalResult check(Chain &chain) {
    MLIRContext *context = program.module.getContext();
    Location loc = program.module.getLoc();
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
    std::function<LogicalResult(Operation *)> emit = [&](Operation *op) -> LogicalResult {
      if (!emitted.insert(op).second)
        return success();
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
        return success();
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
        if (def && ops.count(def) && failed(emit(def)))
          return failure();
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
                         : aten && bmt::atenOpId(aten) == AtenOpId::addmm ? 2
                         : aten && bmt::atenOpId(aten) == AtenOpId::linear ? 3
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
        return fail(op, "internal error: no sharding rule at the ranks of the shadow of its chain", true);
      bmt::tp::detachUnmappedOperands(*body, copy);
      // A name per copy, for upstream's diagnostics.
      copy->setLoc(NameLoc::get(builder.getStringAttr("shadow." + std::to_string(clones.size())), op->getLoc()));
      clones.push_back({op, copy});
      for (auto [r, c] : llvm::zip_equal(op->getResults(), copy->getResults()))
        copies[r] = c;
      return success();
    };
    // In program order (the copies of an op's operands come first).
    llvm::SmallVector<Operation *> ordered;
    program.module.walk([&](Operation *op) {
      if (ops.count(op))
        ordered.push_back(op);
    });
    for (Operation *op : ordered)
      if (failed(emit(op)))
        return failure();
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
      return fail(chain.columns.front().op, "internal error: the shadow of the chain is no valid input for upstream's "
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
        return fail(chain.columns.front().op, "internal error: upstream's sharding-propagation crashed on the shadow of "
                                       "the chain",
             true);
      if (failed(ran))
        return fail(blamed ? blamed : chain.columns.front().op.getOperation(),
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
                      std::optional<int64_t> own) -> LogicalResult {
      if (upstream != own)
        return fail(op, "internal error: upstream's sharding-propagation has " + what + " " +
                     dimText(upstream) + ", the pass " + dimText(own),
             true);
      return success();
    };
    for (auto [op, copy] : clones) {
      // Results: the split the pass follows.
      for (auto [r, c] : llvm::zip_equal(op->getResults(), copy->getResults())) {
        std::optional<shard::Sharding> d = decided(c);
        std::optional<int64_t> dim = d ? splitOf(*d, rankOf(c)) : std::nullopt;
        auto it = splits.find(r);
        std::optional<int64_t> own = it == splits.end() ? std::nullopt : std::optional<int64_t>(it->second.dim);
        if (!d && own)
          return fail(op, "internal error: upstream's sharding-propagation does not reach result " +
                       std::to_string(r.getResultNumber()) + ", which the pass splits",
               true);
        if (failed(expect(op, "result " + std::to_string(r.getResultNumber()), dim, own)))
          return failure();
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
            return fail(op, "upstream's sharding-propagation reshards operand " +
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
            return fail(op, "upstream's sharding-propagation splits parameter " + name + " along dim " +
                         std::to_string(*dim) + ", which the pass keeps whole: the chain has no one sharding",
                 true);
          if (dim != own)
            return fail(op, "internal error: upstream's sharding-propagation has parameter " + name + " " +
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
        if (failed(expect(op, "operand " + std::to_string(o.getOperandNumber()),
                          d ? splitOf(*d, rankOf(root)) : std::nullopt, it->second.dim)))
          return failure();
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
        return fail(chain.columns.front().op, "internal error: upstream's shard-partition crashed on the shadow of the chain",
             true);
      if (failed(ran))
        return fail(blamed ? blamed : chain.columns.front().op.getOperation(),
             "upstream's shard-partition cannot partition the chain here (" + diagnostics + ")", true);
    }
    if (printShadow)
      llvm::errs() << "// bmt-tensor-parallel: the shadow of the chain of " << describe(chain.columns.front().op)
                   << " after shard-partition\n"
                   << shadowText(*scratch) << "\n";
    llvm::DenseMap<Operation *, int> reduced; // row -> all-reduces after it
    WalkResult walked = scratch->walk([&](Operation *op) {
      if (!isa<shard::ShardDialect>(op->getDialect()) || isa<shard::GridOp, shard::ShardingOp, shard::ShardOp>(op))
        return WalkResult::advance();
      Operation *after = op->getNumOperands() ? op->getOperand(0).getDefiningOp() : nullptr;
      Operation *at = after ? shadowOp(after->getLoc()) : nullptr;
      bool isRow = at && llvm::any_of(chain.rows, [&](auto &r) { return r.op.getOperation() == at; });
      if (isa<shard::AllReduceOp>(op) && isRow) {
        ++reduced[at];
        return WalkResult::advance();
      }
      (void)fail(at ? at : chain.columns.front().op.getOperation(),
           "internal error: upstream's shard-partition inserts a " + op->getName().getStringRef().str() +
               " after it, where the pass inserts " + (isRow ? "one bmt.tp_all_reduce" : "none"),
           true);
      return WalkResult::interrupt();
    });
    if (walked.wasInterrupted())
      return failure();
    for (const MatmulSite &row : chain.rows)
      if (reduced.lookup(row.op) != 1)
        return fail(row.op, "internal error: upstream's shard-partition inserts " +
                         std::to_string(reduced.lookup(row.op)) +
                         " all-reduces after this row-parallel matmul, the pass one bmt.tp_all_reduce",
             true);
    return success();
  }
};

} // namespace

LogicalResult bmt::tp::checkShadow(ProgramIndex &program, const llvm::DenseMap<Value, Split> &splits,
                                   Chain &chain, int64_t tensorParallel, bool print, ChainError &error) {
  return ShadowCheck{program, splits, tensorParallel, print, error}.check(chain);
}
