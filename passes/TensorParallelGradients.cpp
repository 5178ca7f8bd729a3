//===- TensorParallelGradients.cpp - how whole parameters' gradients complete -===//
//
// See TensorParallelGradients.h. The proof follows each parameter's value
// forward (through calls, casts and the ops that compute with it) to where
// its gradient is decided:
//   - a use whose gradient a collective completes (the tp_copy of a chain's
//     input, a row bias added after the all-reduce) or a result of the
//     program: the gradient arriving there is the same on every rank;
//   - a use by an op of a chain (an op with a split operand or result): the
//     gradient arriving there is the rank's partial sum, exact only if the
//     parameter's value broadcasts along the split dim there (upstream's
//     ShardingInterface, asked with the value's shape) or is narrowed to
//     the rank's part.
// Only partial sums: reduce_grad. Only complete ones: nothing. Both, or a
// partial use the proof cannot classify: refused.
//
//===----------------------------------------------------------------------===//

#include "TensorParallelGradients.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/ShardingInterfaceImpl.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Shard/Interfaces/ShardingInterface.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/Support/Debug.h"

#include <string>

#define DEBUG_TYPE "bmt-tensor-parallel"

using namespace mlir;
using bmt::AtenOpId;

namespace bmt::tp {
namespace {

/// Where a whole value's gradient is decided: complete somewhere, and the
/// uses by a chain's ops (operand, chain index).
struct Flow {
  bool complete = false;
  llvm::SmallVector<std::pair<OpOperand *, unsigned>, 2> partial;
};

struct Context {
  ModuleOp module;
  llvm::ArrayRef<ChainRegion> chains;
  std::unique_ptr<SymbolTable> symbols;
  llvm::DenseMap<Operation *, llvm::SmallVector<func::CallOp, 1>> callSites;
  llvm::DenseMap<Operation *, unsigned> chainOps; // op of a chain -> chain index
  llvm::DenseSet<OpOperand *> completed;
  llvm::DenseMap<Value, Flow> flows;
  int64_t tensorParallel = 1;
};

} // namespace

static std::string describe(Operation *op) {
  std::string s;
  if (auto aten = dyn_cast<bmt::AtenOp>(op))
    s = aten.getName().str();
  else
    s = op->getName().getStringRef().str();
  if (auto f = op->getParentOfType<func::FuncOp>())
    s += " in " + f.getSymName().str();
  return s;
}

static const bmt::AtenOpInfo *infoOf(Operation *op) {
  auto aten = dyn_cast<bmt::AtenOp>(op);
  return aten ? bmt::lookupAtenOp(aten.getName()) : nullptr;
}

static bool isMetadata(Operation *op) {
  const bmt::AtenOpInfo *info = infoOf(op);
  return info && info->kind == bmt::AtenOpKind::Metadata;
}

/// type_as(x, other) reads only other's dtype.
static bool readsDtypeOnly(OpOperand &use) {
  auto aten = dyn_cast<bmt::AtenOp>(use.getOwner());
  return aten && bmt::atenOpId(aten) == AtenOpId::type_as && use.getOperandNumber() == 1;
}

/// The ops of the chains: those with a split operand (other than a size
/// read or a dtype source) or a split result, and the rows.
static void collectChainOps(Context &ctx) {
  for (auto [index, chain] : llvm::enumerate(ctx.chains)) {
    for (auto &[v, s] : chain.split) {
      if (Operation *def = v.getDefiningOp(); def && isa<bmt::AtenOp, bmt::FusedOp>(def))
        ctx.chainOps[def] = index;
      for (OpOperand &use : v.getUses()) {
        Operation *user = use.getOwner();
        if (isa<func::CallOp, func::ReturnOp>(user) || isMetadata(user) || readsDtypeOnly(use))
          continue;
        ctx.chainOps[user] = index;
      }
    }
    for (Operation *row : chain.rows)
      ctx.chainOps[row] = index;
    ctx.completed.insert(chain.completed.begin(), chain.completed.end());
  }
}

static void merge(Flow &into, const Flow &from) {
  into.complete |= from.complete;
  for (auto site : from.partial)
    if (!llvm::is_contained(into.partial, site))
      into.partial.push_back(site);
}

/// Where the gradient of whole value `v` is decided (memoized; the program
/// is acyclic, calls included).
static Flow flowOf(Context &ctx, Value v) {
  if (auto it = ctx.flows.find(v); it != ctx.flows.end())
    return it->second;
  Flow flow;
  for (OpOperand &use : v.getUses()) {
    Operation *user = use.getOwner();
    if (ctx.completed.count(&use)) {
      flow.complete = true;
      continue;
    }
    if (auto call = dyn_cast<func::CallOp>(user)) {
      auto callee = ctx.symbols->lookup<func::FuncOp>(call.getCallee());
      if (!callee || callee.isExternal()) {
        flow.complete = true; // nothing the chains split
        continue;
      }
      merge(flow, flowOf(ctx, callee.getArgument(use.getOperandNumber())));
      continue;
    }
    if (auto ret = dyn_cast<func::ReturnOp>(user)) {
      auto f = ret->getParentOfType<func::FuncOp>();
      auto &sites = ctx.callSites[f];
      if (sites.empty())
        flow.complete = true; // a result of the program
      for (func::CallOp call : sites)
        merge(flow, flowOf(ctx, call.getResult(use.getOperandNumber())));
      continue;
    }
    if (auto it = ctx.chainOps.find(user); it != ctx.chainOps.end()) {
      flow.partial.push_back({&use, it->second});
      continue;
    }
    auto aten = dyn_cast<bmt::AtenOp>(user);
    if (isMetadata(user) || (aten && bmt::atenOpId(aten) == AtenOpId::detach))
      continue; // no gradient flows back
    for (Value r : user->getResults())
      if (isa<bmt::TensorType>(r.getType()))
        merge(flow, flowOf(ctx, r));
  }
  ctx.flows[v] = flow;
  return flow;
}

/// Whether `v` is a scalar: a 0-d constant or a number made a tensor.
static bool isScalar(Value v) {
  if (v.getDefiningOp<bmt::NumToTensorOp>())
    return true;
  auto c = v.getDefiningOp<bmt::ConstantOp>();
  auto typed = c ? dyn_cast<TypedAttr>(c.getValue()) : nullptr;
  auto shaped = typed ? dyn_cast<ShapedType>(typed.getType()) : nullptr;
  return shaped && shaped.getRank() == 0;
}

/// The shape of `v`, which is `param` through calls, casts and pointwise
/// ops with scalars (Gemma's `1 + weight.float()`); on failure `stop` is
/// the op the proof does not follow.
static FailureOr<llvm::SmallVector<int64_t>> derivedShape(Context &ctx, Value v, bmt::ParameterOp param,
                                                         Operation *&stop) {
  for (int hops = 0; hops < 64; ++hops) {
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      auto f = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
      if (!f || ctx.callSites[f].size() != 1) {
        stop = arg.getOwner()->getParentOp();
        return failure();
      }
      v = ctx.callSites[f][0]->getOperand(arg.getArgNumber());
      continue;
    }
    Operation *def = v.getDefiningOp();
    stop = def;
    if (auto g = dyn_cast_or_null<bmt::GetGlobalOp>(def)) {
      if (g.getGlobal() != param.getSymName())
        return failure();
      auto shape = cast<RankedTensorType>(param.getType()).getShape();
      return llvm::SmallVector<int64_t>(shape.begin(), shape.end());
    }
    const bmt::AtenOpInfo *info = def ? infoOf(def) : nullptr;
    if (!info)
      return failure();
    AtenOpId id = info->id;
    // Casts and copies keep the shape (cat, repeat, pad, ..., also of the
    // Copy kind, do not); a dtype source is not followed.
    if (id == AtenOpId::type_as || bmt::atenOpBase(id) == "to" ||
        llvm::is_contained({AtenOpId::contiguous, AtenOpId::clone, AtenOpId::lift_fresh_copy,
                            AtenOpId::alias},
                           id)) {
      v = def->getOperand(0);
      continue;
    }
    if (info->kind != bmt::AtenOpKind::Elementwise)
      return failure();
    // One tensor operand, the others scalars.
    Value next;
    for (Value o : def->getOperands()) {
      if (!isa<bmt::TensorType>(o.getType()) || isScalar(o))
        continue;
      if (next)
        return failure();
      next = o;
    }
    if (!next)
      return failure();
    v = next;
  }
  return failure();
}

/// Whether the whole value at `use` (of `param`, shape `shape`) broadcasts
/// along the split dim of the chain op that reads it, by the op's
/// ShardingInterface asked with the chain's splits; `why` says why not.
static LogicalResult broadcasts(Context &ctx, OpOperand &use, const ChainRegion &chain,
                                llvm::ArrayRef<int64_t> shape, std::string &why) {
  Operation *op = use.getOwner();
  MLIRContext *context = op->getContext();
  FlatSymbolRefAttr grid = FlatSymbolRefAttr::get(context, "tp");
  // The rank of the split values, for operands whose rank the chain does
  // not know (at least 4: dims count from the end, as broadcasting aligns).
  int64_t base = 4;
  for (Value v : llvm::concat<Value>(op->getOperands(), op->getResults()))
    if (auto it = chain.split.find(v); it != chain.split.end())
      base = std::max(base, it->second.rank >= 0 ? it->second.rank : -it->second.dim);
  auto shardingOf = [&](Value v, int64_t rank) -> shard::Sharding {
    auto it = chain.split.find(v);
    if (it == chain.split.end() || rank + it->second.dim < 0)
      return shard::Sharding();
    llvm::SmallVector<shard::GridAxesAttr> axes(rank, shard::GridAxesAttr::get(context, {}));
    axes[rank + it->second.dim] = shard::GridAxesAttr::get(context, {0});
    return shard::Sharding::get(grid, axes);
  };
  llvm::SmallVector<int64_t> ranks;
  for (OpOperand &o : op->getOpOperands()) {
    Value v = o.get();
    if (!isa<bmt::TensorType>(v.getType()))
      ranks.push_back(-1);
    else if (&o == &use)
      ranks.push_back(shape.size());
    else if (auto it = chain.split.find(v); it != chain.split.end() && it->second.rank >= 0)
      ranks.push_back(it->second.rank);
    else
      ranks.push_back(base);
  }
  OwningOpRef<ModuleOp> scratch = ModuleOp::create(op->getLoc());
  Operation *copy = bmt::cloneWithRankedTypes(*scratch->getBody(), op, ranks);
  auto iface = copy ? dyn_cast<shard::ShardingInterface>(copy) : nullptr;
  if (!iface) {
    why = "the op has no sharding rule at these ranks";
    return failure();
  }
  std::vector<shard::Sharding> operandShardings, resultShardings;
  for (auto [o, rank] : llvm::zip_equal(op->getOperands(), ranks))
    operandShardings.push_back(rank < 0 ? shard::Sharding() : shardingOf(o, rank));
  for (auto [r, c] : llvm::zip_equal(op->getResults(), copy->getResults())) {
    auto type = dyn_cast<RankedTensorType>(c.getType());
    resultShardings.push_back(type ? shardingOf(r, type.getRank()) : shard::Sharding());
  }
  ScopedDiagnosticHandler quiet(context, [](Diagnostic &) { return success(); });
  FailureOr<shard::ShardingOption> option = iface.getShardingOption(operandShardings, resultShardings);
  if (failed(option)) {
    why = "the op's operands are split along different dims";
    return failure();
  }
  if (!option->grid)
    option->grid = grid;
  FailureOr<std::vector<shard::Sharding>> annotations = iface.getShardingAnnotations(*option);
  if (failed(annotations)) {
    why = "the op's sharding rule gives no annotation for it";
    return failure();
  }
  const shard::Sharding &mine = (*annotations)[use.getOperandNumber()];
  int64_t rank = shape.size();
  if (!mine)
    return success();
  for (auto [d, axes] : llvm::enumerate(mine.getSplitAxes())) {
    if (axes.empty() || shape[d] == 1)
      continue; // a dim of size 1 broadcasts
    why = "its dim " + std::to_string(static_cast<int64_t>(d) - rank) + " (size " + std::to_string(shape[d]) +
          ") lies along the split dim: each rank would need its own part of it";
    return failure();
  }
  return success();
}

/// One error naming the parameter, the op and why.
static LogicalResult refuse(Context &ctx, Operation *op, bmt::ParameterOp param, const llvm::Twine &why) {
  op->emitError("bmt-tensor-parallel: cannot split by --tensor-parallel ")
      << ctx.tensorParallel << ": the gradient of the whole parameter " << param.getSymName() << ", read by "
      << describe(op) << " beside values split over the group, " << why;
  return failure();
}

/// Classifies `param`'s gradient from its flow.
static FailureOr<ParameterGradient> classify(Context &ctx, bmt::ParameterOp param,
                                              llvm::ArrayRef<bmt::GetGlobalOp> reads) {
  Flow flow;
  for (bmt::GetGlobalOp g : reads)
    merge(flow, flowOf(ctx, g.getResult()));
  if (flow.partial.empty())
    return ParameterGradient{param, Completion::Identical, nullptr};
  Operation *first = flow.partial.front().first->getOwner();
  if (flow.complete)
    return refuse(ctx, first, param,
                  "cannot be completed: each rank's gradient is a partial sum there, and it is read "
                  "elsewhere too, where its gradient is already complete on every rank");
  for (auto [use, index] : flow.partial) {
    Operation *op = use->getOwner();
    const ChainRegion &chain = ctx.chains[index];
    if (chain.narrowing.count(op))
      continue; // each rank takes its own part: a partial sum
    if (chain.rows.count(op))
      return refuse(ctx, op, param, "is read whole by a row-parallel matmul");
    Operation *stop = nullptr;
    FailureOr<llvm::SmallVector<int64_t>> shape = derivedShape(ctx, use->get(), param, stop);
    if (failed(shape))
      return refuse(ctx, op, param,
                    "reaches it through " + (stop ? describe(stop) : std::string("an argument")) +
                        ", which the proof does not follow (calls, casts and pointwise ops with scalars)");
    std::string why;
    if (failed(broadcasts(ctx, *use, chain, *shape, why)))
      return refuse(ctx, op, param, "cannot be completed: " + why);
    LLVM_DEBUG(llvm::dbgs() << "gradients: " << param.getSymName() << " broadcasts along the split dim at "
                            << describe(op) << "\n");
  }
  return ParameterGradient{param, Completion::Summed, first};
}

FailureOr<llvm::SmallVector<ParameterGradient>>
proveGradientCompletion(ModuleOp module, llvm::ArrayRef<ChainRegion> chains,
                        const llvm::DenseSet<Operation *> &splitParams, int64_t tensorParallel) {
  Context ctx;
  ctx.module = module;
  ctx.chains = chains;
  ctx.tensorParallel = tensorParallel;
  ctx.symbols = std::make_unique<SymbolTable>(module);
  module.walk([&](func::CallOp call) {
    if (auto f = ctx.symbols->lookup<func::FuncOp>(call.getCallee()))
      ctx.callSites[f].push_back(call);
  });
  llvm::DenseMap<Operation *, llvm::SmallVector<bmt::GetGlobalOp, 1>> reads;
  module.walk([&](bmt::GetGlobalOp g) {
    if (auto p = ctx.symbols->lookup<bmt::ParameterOp>(g.getGlobal()))
      reads[p].push_back(g);
  });
  collectChainOps(ctx);
  llvm::SmallVector<ParameterGradient> out;
  for (auto param : module.getOps<bmt::ParameterOp>()) {
    if (!param.getRequiresGrad() || splitParams.count(param))
      continue;
    FailureOr<ParameterGradient> g = classify(ctx, param, reads[param]);
    if (failed(g))
      return failure();
    out.push_back(*g);
  }
  return out;
}

} // namespace bmt::tp
