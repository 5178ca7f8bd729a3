//===- TensorParallelSequence.cpp - sequence parallelism ------------------===//
//
// bmt-tensor-parallel's --sequence-parallel stage, run after the chains are
// rewritten: see sequenceParallelize in TensorParallelChains.h.
//
//
// Between the chains the activations [batch, seq, hidden] are split
// along the sequence (dim 1) over the TP group: each tp_all_reduce (g)
// becomes a reduce-scatter along it and each tp_copy (f) an all-gather.
// The sequence-split region (what the reduce-scatters' results reach
// before an all-gather) is checked op by op: only per-position ops
// (pointwise, last-dim norms and reductions) may read it; their
// parameters get reduce_grad (each rank sees its positions' gradient).
//
//===----------------------------------------------------------------------===//

#include "TensorParallelChains.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/TensorSplit.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

using namespace mlir;
using bmt::AtenOpId;
using namespace bmt::tp;

namespace {

constexpr int64_t kSeqDim = 1;

bool isSeqTransparent(Operation *op) {
  return bmt::isAten(op, {AtenOpId::view, AtenOpId::reshape, AtenOpId::slice_Tensor,
                          AtenOpId::contiguous, AtenOpId::alias});
}

/// Whether every use of `v` other than `keep` reads its metadata only.
bool othersMetadata(Value v, OpOperand *keep) {
  for (OpOperand &u : v.getUses())
    if (&u != keep && !isMetadata(u.getOwner()))
      return false;
  return true;
}

Value createGather(OpBuilder &builder, Value v, FlatSymbolRefAttr grid) {
  if (auto *def = v.getDefiningOp())
    builder.setInsertionPointAfter(def);
  else
    builder.setInsertionPointToStart(cast<BlockArgument>(v).getOwner());
  return bmt::TpAllGatherOp::create(builder, v.getLoc(), bmt::TensorType::get(builder.getContext()), v, grid,
                                    builder.getI64IntegerAttr(kSeqDim))
      .getResult();
}

/// The value a replicated operand of a pointwise op in the region is,
/// when it is a position embedding: aten::embedding of a parameter
/// (through casts and call results). Null otherwise.
bmt::AtenOp positionEmbedding(ProgramIndex &program, Value v) {
  for (int hops = 0; hops < 8; ++hops) {
    if (auto call = v.getDefiningOp<func::CallOp>()) {
      auto callee = program.symbols->lookup<func::FuncOp>(call.getCallee());
      if (!callee || program.callSites[callee].size() != 1)
        return nullptr;
      v = callee.getBody().front().getTerminator()->getOperand(cast<OpResult>(v).getResultNumber());
      continue;
    }
    auto op = v.getDefiningOp<bmt::AtenOp>();
    if (!op)
      return nullptr;
    if (bmt::atenOpId(op) == AtenOpId::embedding) {
      auto w = bmt::getAtenArg(op, "weight");
      return w && w->isOperand() && program.traceParam(w->getOperand()) ? op : nullptr;
    }
    std::optional<AtenOpId> id = bmt::atenOpId(op);
    if (bmt::atenOpBase(*id) != "to" && id != AtenOpId::contiguous && id != AtenOpId::type_as)
      return nullptr;
    v = op->getOperand(0);
  }
  return nullptr;
}

/// The rewrite of one module to sequence parallelism and the state its
/// steps hand to one another: the reduce-scatters (seeds) and all-gathers
/// made, then the sequence-split region grown from the seeds and checked.
class SequenceParallel {
public:
  SequenceParallel(ProgramIndex &program, int64_t T)
      : program(program), module(program.module), T(T), builder(module.getContext()),
        tensor(bmt::TensorType::get(module.getContext())), marker(bmt::OperandAttr::get(module.getContext())),
        grid(FlatSymbolRefAttr::get(module.getContext(), "tp")) {}

  FailureOr<std::string> run() {
    scatterSums();
    gatherCopies();
    if (failed(growRegion()) || failed(checkParameters()) || failed(narrowPositions()))
      return failure();
    globalSequenceSizes();
    return markParameters();
  }

private:
  ProgramIndex &program;
  ModuleOp module;
  int64_t T;
  OpBuilder builder;
  Type tensor;
  bmt::OperandAttr marker;
  FlatSymbolRefAttr grid;

  llvm::SmallVector<Value> seeds;                // the reduce-scatters' results
  llvm::SmallVector<bmt::TpAllGatherOp> gathers; // the all-gathers made of the tp_copys
  // The region: what the scattered values reach before a gather.
  llvm::DenseSet<Value> region;
  llvm::SmallVector<Value> work;
  llvm::DenseSet<Operation *> regionOps;
  llvm::SmallVector<bmt::AtenOp> seqSizes;
  llvm::SetVector<Operation *> reduceGrad; // parameters read in the region
  llvm::SmallVector<std::pair<OpOperand *, Value>> positions; // operand, a region value beside it
  // Ops whose other operands are checked once the region is complete (an
  // operand may join it later): {the region value read, pointwise}.
  llvm::MapVector<Operation *, std::pair<Value, bool>> pending;

  /// The one error line of this stage; returns failure.
  LogicalResult fail(Operation *op, const llvm::Twine &message) {
    InFlightDiagnostic d = op->emitError("bmt-tensor-parallel: cannot split the sequence (--sequence-parallel) at ");
    d << describe(op) << ": " << message.str();
    return failure();
  }

  Value aten(Location loc, AtenOpId id, ArrayRef<Attribute> args, ValueRange operands, Type result) {
    return bmt::AtenOp::create(builder, loc, TypeRange{result}, builder.getStringAttr(bmt::atenOpName(id)),
                               builder.getArrayAttr(args), operands)
        .getResult(0);
  }

  void add(Value v) {
    if (isa<bmt::TensorType>(v.getType()) && region.insert(v).second)
      work.push_back(v);
  }

  // g -> reduce-scatter. A Conv1D's [batch * seq, out] result (GPT-2:
  // mm, all-reduce, + bias, view to [batch, seq, out]) is viewed back
  // first, so that the scatter splits the sequence, and its bias added
  // after the scatter (view(mm + b) = view(mm) + b: the view keeps the
  // last dim).
  void scatterSums() {
    llvm::SmallVector<bmt::TpAllReduceOp> sums;
    module.walk([&](bmt::TpAllReduceOp op) { sums.push_back(op); });
    for (bmt::TpAllReduceOp sum : sums) {
      Value partial = sum.getInput();
      Value result = sum.getResult();
      bmt::AtenOp add, view;
      if (result.hasOneUse())
        add = dyn_cast<bmt::AtenOp>(*result.getUsers().begin());
      if (add && bmt::atenOpId(add) == AtenOpId::add_Tensor && add->getOperand(0) == result &&
          program.traceParam(add->getOperand(1)) && add.getResult(0).hasOneUse())
        view = dyn_cast<bmt::AtenOp>(*add.getResult(0).getUsers().begin());
      if (view && (bmt::atenOpId(view) == AtenOpId::view || bmt::atenOpId(view) == AtenOpId::reshape) &&
          view->getOperand(0) == add.getResult(0)) {
        view->setOperand(0, partial);
        builder.setInsertionPointAfter(view);
        Value scattered = bmt::TpReduceScatterOp::create(builder, sum.getLoc(), tensor, view.getResult(0), grid,
                                                         builder.getI64IntegerAttr(kSeqDim))
                              .getResult();
        Value biased = aten(add.getLoc(), AtenOpId::add_Tensor, {marker, marker, builder.getI64IntegerAttr(1)},
                            {scattered, add->getOperand(1)}, tensor);
        view.getResult(0).replaceAllUsesExcept(biased, scattered.getDefiningOp());
        add->erase();
        sum->erase();
        seeds.push_back(scattered);
        continue;
      }
      builder.setInsertionPoint(sum);
      Value scattered = bmt::TpReduceScatterOp::create(builder, sum.getLoc(), tensor, partial, grid,
                                                       builder.getI64IntegerAttr(kSeqDim))
                            .getResult();
      result.replaceAllUsesWith(scattered);
      sum->erase();
      seeds.push_back(scattered);
    }
  }

  // f -> all-gather, placed as far up as views, whole slices and calls
  // carry the value to it (GPT-2's Conv1D views [batch, seq, hidden] to
  // [batch * seq, hidden] first: the gather must see the sequence dim).
  // Between the gather and the column matmuls the value is replicated
  // and read by nothing else, so the gradient's sum (the gather's
  // backward) may sit above those ops.
  void gatherCopies() {
    llvm::SmallVector<bmt::TpCopyOp> copies;
    module.walk([&](bmt::TpCopyOp op) { copies.push_back(op); });
    for (bmt::TpCopyOp copy : copies) {
      Value w = copy.getInput();
      OpOperand *keep = &copy->getOpOperand(0);
      while (true) {
        OpOperand *next = nullptr;
        if (auto arg = dyn_cast<BlockArgument>(w)) {
          auto f = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
          if (!f || program.isBlockRoot(f) || f.getSymName() == "forward" || program.callSites[f].size() != 1)
            break;
          next = &program.callSites[f][0]->getOpOperand(arg.getArgNumber());
        } else if (auto call = w.getDefiningOp<func::CallOp>()) {
          auto callee = program.symbols->lookup<func::FuncOp>(call.getCallee());
          if (!callee || program.callSites[callee].size() != 1)
            break;
          Operation *ret = callee.getBody().front().getTerminator();
          OpOperand &r = ret->getOpOperand(cast<OpResult>(w).getResultNumber());
          if (!isSeqTransparent(r.get().getDefiningOp()))
            break; // stays at the call (not inside a norm's function)
          next = &r;
        } else if (isSeqTransparent(w.getDefiningOp())) {
          next = &w.getDefiningOp()->getOpOperand(0);
        } else {
          break;
        }
        if (!othersMetadata(next->get(), next) || !othersMetadata(w, keep))
          break;
        keep = next;
        w = next->get();
      }
      Value gathered = createGather(builder, w, grid);
      if (keep == &copy->getOpOperand(0)) {
        copy.getResult().replaceAllUsesWith(gathered);
      } else {
        // The path and the metadata reads of w read the whole sequence.
        keep->set(gathered);
        w.replaceUsesWithIf(gathered, [&](OpOperand &u) {
          return u.getOwner() != gathered.getDefiningOp() && isMetadata(u.getOwner());
        });
        copy.getResult().replaceAllUsesWith(copy.getInput());
      }
      copy->erase();
      gathers.push_back(cast<bmt::TpAllGatherOp>(gathered.getDefiningOp()));
    }
  }

  /// Grows the region from the seeds use by use, then checks the other
  /// operands of the per-position ops it reached.
  LogicalResult growRegion() {
    work.assign(seeds.begin(), seeds.end());
    for (Value v : seeds)
      region.insert(v);
    while (!work.empty()) {
      Value v = work.pop_back_val();
      for (OpOperand &use : llvm::make_early_inc_range(v.getUses()))
        if (failed(visitUse(use, v)))
          return failure();
    }
    for (auto &[op, args] : pending)
      if (failed(checkOperands(op, args.first, args.second)))
        return failure();
    return success();
  }

  /// One use of the region value `v`: the region grows through it, it is
  /// a size read of the sequence, or the stage fails.
  LogicalResult visitUse(OpOperand &use, Value v) {
  Operation *user = use.getOwner();
  regionOps.insert(user);
  if (isa<bmt::TpAllGatherOp>(user))
    return success();
  if (auto call = dyn_cast<func::CallOp>(user)) {
    auto callee = program.symbols->lookup<func::FuncOp>(call.getCallee());
    if (!callee || program.callSites[callee].size() != 1)
      return fail(user, "a sequence-split value enters a function called more than once");
    add(callee.getArgument(use.getOperandNumber()));
    return success();
  }
  if (auto ret = dyn_cast<func::ReturnOp>(user)) {
    auto f = ret->getParentOfType<func::FuncOp>();
    if (f.getSymName() == "forward")
      return fail(user, "a sequence-split value is a result of the program");
    if (program.callSites[f].size() != 1)
      return fail(user, "a sequence-split value leaves a function called more than once");
    add(program.callSites[f][0].getResult(use.getOperandNumber()));
    return success();
  }
  if (auto fused = dyn_cast<bmt::FusedOp>(user)) {
    // Pointwise, or one last-dim reduction: per position.
    pending.insert({user, {v, false}});
    for (Value r : user->getResults())
      add(r);
    return success();
  }
  auto op = dyn_cast<bmt::AtenOp>(user);
  if (!op)
    return fail(user, "an op the pass cannot split along the sequence");
  std::optional<AtenOpId> id = bmt::atenOpId(op);
  const bmt::AtenOpInfo *info = id ? &bmt::getAtenOpInfo(*id) : nullptr;
  if (!info)
    return fail(op, "an op the pass does not know");
  if (info->kind == bmt::AtenOpKind::Metadata) {
    if (id == AtenOpId::dim)
      return success();
    auto d = id == AtenOpId::size_int ? bmt::getAtenArg(op, "dim")->getInt() : std::nullopt;
    if (!d)
      return fail(op, "a read of a sequence-split value's data");
    if (*d == kSeqDim || *d == kSeqDim - 3)
      seqSizes.push_back(op);
    else if (*d != 0 && *d != 2 && *d != -1 && *d != -3)
      return fail(op, "a size of a dim of a [batch, seq, hidden] activation that it does not have");
    return success();
  }
  if (id == AtenOpId::type_as && use.getOperandNumber() != 0)
    return success(); // only the dtype is read
  bool pointwise =
      info->kind == bmt::AtenOpKind::Elementwise || info->kind == bmt::AtenOpKind::Random ||
      bmt::atenOpBase(*id) == "to" || id == AtenOpId::detach || id == AtenOpId::alias ||
      id == AtenOpId::contiguous || id == AtenOpId::clone || id == AtenOpId::type_as;
  if (pointwise) {
    pending.insert({user, {v, true}});
    for (Value r : user->getResults())
      add(r);
    return success();
  }
  if (id == AtenOpId::layer_norm) {
    auto shape = bmt::getAtenArg(op, "normalized_shape")->getInts();
    if (!shape || shape->size() != 1)
      return fail(op, "a normalization over more than the hidden dim");
    pending.insert({user, {v, false}});
    add(op.getResult(0));
    return success();
  }
  if (id == AtenOpId::mean_dim || id == AtenOpId::sum_dim_IntList || id == AtenOpId::amax) {
    auto dims = bmt::getAtenArg(op, "dim")->getInts();
    auto keep = bmt::getAtenArg(op, "keepdim")->getBool();
    if (!dims || dims->size() != 1 || ((*dims)[0] != -1 && (*dims)[0] != 2) || !keep || !*keep)
      return fail(op, "a reduction over other than the hidden dim (it mixes positions)");
    add(op.getResult(0));
    return success();
  }
  if (id == AtenOpId::linear || id == AtenOpId::addmm || id == AtenOpId::matmul ||
      id == AtenOpId::mm)
    return fail(op, "a matmul outside the tensor-parallel chains (per position, but its "
             "replicated weight would see only this rank's part of the sequence in its "
             "gradient, and summing that over the TP group is not supported yet; a "
             "masked-LM head transform is one)");
  return fail(op, "an op that may mix positions (only per-position ops, last-dim norms and "
           "reductions may read the sequence-split activations)");
  }

  // The other tensor operands of a per-position op in the region: region
  // values, parameters of at most one dim (norm weights, biases:
  // broadcast over the positions), 0-d constants, position embeddings.
  LogicalResult checkOperands(Operation *op, Value from, bool pointwise) {
  for (OpOperand &o : op->getOpOperands()) {
    Value x = o.get();
    if (region.count(x) || x == from || !isa<bmt::TensorType>(x.getType()))
      continue;
    if (auto c = x.getDefiningOp<bmt::ConstantOp>()) {
      auto typed = dyn_cast<TypedAttr>(c.getValue());
      auto shaped = typed ? dyn_cast<ShapedType>(typed.getType()) : nullptr;
      if (!shaped || shaped.getRank() == 0)
        continue;
    }
    if (x.getDefiningOp<bmt::NumToTensorOp>())
      continue;
    if (bmt::ParameterOp p = program.traceParam(x)) {
      if (shapeOf(p).size() > 1)
        return fail(op, "a sequence-split value meets the parameter " + p.getSymName().str() + " of " +
                     std::to_string(shapeOf(p).size()) + " dims");
      if (p.getRequiresGrad())
        reduceGrad.insert(p);
      continue;
    }
    if (pointwise && positionEmbedding(program, x)) {
      positions.push_back({&o, from});
      continue;
    }
    return fail(op, "a sequence-split value meets a replicated tensor that is neither a parameter of one "
             "dim nor a position embedding (it may vary along the sequence)");
  }
    return success();
  }

  /// Every all-gather reads the region, and the region's parameters are
  /// read nowhere else.
  LogicalResult checkParameters() {
    for (bmt::TpAllGatherOp g : gathers)
      if (!region.count(g.getInput()))
        return fail(g, "an all-gather of a value that is not split along the sequence (the chain's input "
                "is not reached from the embedding through per-position ops alone)");
    // Parameters read in the region: read nowhere else (a replicated
    // reader elsewhere would have its gradient summed T times).
    for (Operation *p : reduceGrad) {
      auto param = cast<bmt::ParameterOp>(p);
      llvm::SmallVector<OpOperand *> readers;
      program.readersOf(param, readers);
      for (OpOperand *r : readers)
        if (!regionOps.count(r->getOwner()))
          return fail(r->getOwner(), "the parameter " + param.getSymName().str() +
                                  " is read both between the chains and elsewhere");
    }
    return success();
  }

  // Position embeddings: each rank adds its positions' rows, narrow(e,
  // 1, t * L, L) with L the local sequence length; the table's gradient
  // is then each rank's positions' part: reduce_grad.
  LogicalResult narrowPositions() {
    for (auto [operand, beside] : positions) {
      Value e = operand->get();
      Operation *user = operand->getOwner();
      bmt::AtenOp emb = positionEmbedding(program, e);
      bmt::ParameterOp p = program.traceParam(bmt::getAtenArg(emb, "weight")->getOperand());
      llvm::SmallVector<OpOperand *> readers;
      program.readersOf(p, readers);
      if (readers.size() != 1)
        return fail(user, "the position embedding " + p.getSymName().str() + " is read elsewhere too");
      if (p.getRequiresGrad())
        reduceGrad.insert(p);
      Location loc = user->getLoc();
      builder.setInsertionPoint(user);
      Value local = aten(loc, AtenOpId::size_int, {marker, builder.getI64IntegerAttr(kSeqDim)}, {beside},
                         builder.getI64Type());
      Value t = bmt::TpRankOp::create(builder, loc, builder.getI64Type(), grid).getResult();
      Value tt = bmt::NumToTensorOp::create(builder, loc, tensor, t).getResult();
      Value off = aten(loc, AtenOpId::mul_Scalar, {marker, marker}, {tt, local}, tensor);
      Value start = aten(loc, AtenOpId::Int_Tensor, {marker}, {off}, builder.getI64Type());
      Value mine = aten(loc, AtenOpId::narrow, {marker, builder.getI64IntegerAttr(kSeqDim), marker, marker},
                        {e, start, local}, tensor);
      operand->set(mine);
    }
    return success();
  }

  // Sizes of the sequence dim read from a split value: the global one.
  void globalSequenceSizes() {
    for (bmt::AtenOp size : seqSizes) {
      Location loc = size.getLoc();
      builder.setInsertionPointAfter(size);
      Value n = bmt::NumToTensorOp::create(builder, loc, tensor, size.getResult(0)).getResult();
      Value times = aten(loc, AtenOpId::mul_Scalar, {marker, builder.getI64IntegerAttr(T)}, {n}, tensor);
      Value global = aten(loc, AtenOpId::Int_Tensor, {marker}, {times}, builder.getI64Type());
      size.getResult(0).replaceAllUsesExcept(global, n.getDefiningOp());
    }
  }

  /// reduce_grad on the region's parameters; the remark's text.
  FailureOr<std::string> markParameters() {
    llvm::SmallVector<std::string> names;
    for (Operation *p : reduceGrad) {
      auto param = cast<bmt::ParameterOp>(p);
      if (bmt::parameterSplitOf(param).dim >= 0)
        return fail(p, "the split parameter " + param.getSymName().str() + " is read between the chains");
      bmt::setParameterSplit(param, bmt::reduceGradSplit());
      names.push_back(param.getSymName().str());
    }
    module->setAttr("bmt.sequence_parallel", builder.getUnitAttr());
    return "sequence-parallel (dim 1): " + std::to_string(gathers.size()) + " all-gathers, " +
           std::to_string(seeds.size()) + " reduce-scatters, " + std::to_string(names.size()) +
           " parameters reduce_grad";
  }
};

} // namespace

FailureOr<std::string> bmt::tp::sequenceParallelize(ProgramIndex &program, int64_t tensorParallel) {
  return SequenceParallel(program, tensorParallel).run();
}
