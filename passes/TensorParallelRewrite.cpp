//===- TensorParallelRewrite.cpp - rewriting the chains found -------------===//
//
// bmt-tensor-parallel's rewrite stage: see rewriteChains in
// TensorParallelChains.h. Parameter splits are written through
// bmt::setParameterSplit (TensorSplit.h).
//
//===----------------------------------------------------------------------===//

#include "TensorParallelChains.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/TensorSplit.h"

#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"

using namespace mlir;
using bmt::AtenOpId;
using namespace bmt::tp;

namespace {

/// Marks each op whose result a chain splits with the sharding of its
/// results over the grid, in the upstream shard dialect's terms:
/// `bmt.sharding = {grid = @tp, split_axes = [<per result>]}`, each
/// result's split axes a `#shard.axisarray` with grid axis 0 at the split
/// dim. Where the pass does not know a value's rank, the axes list its
/// trailing dims only (down to the split one), as broadcasting aligns them.
/// The values are the `!bmt.tensor`s themselves (unranked), so the
/// annotation is an attribute, not a `shard.shard` op.
void annotate(MLIRContext *context, llvm::ArrayRef<Chain> chains, FlatSymbolRefAttr grid) {
  llvm::MapVector<Operation *, llvm::SmallVector<Attribute>> byOp;
  for (const Chain &chain : chains)
    for (auto &[v, s] : chain.values) {
      auto r = dyn_cast<OpResult>(v);
      if (!r || !isa<bmt::AtenOp, bmt::FusedOp>(r.getOwner()))
        continue;
      auto &results = byOp[r.getOwner()];
      if (results.empty())
        results.assign(r.getOwner()->getNumResults(), shard::GridAxesArrayAttr::get(context, {}));
      // Upstream's decision where it made one (shadow() checked that it
      // is the split the pass follows), else the pass's own rule's.
      int64_t dim = s.dim;
      if (auto it = chain.upstream.find(v); it != chain.upstream.end() && it->second)
        dim = *it->second;
      int64_t rank = s.rankKnown() ? s.rank() : -dim;
      llvm::SmallVector<shard::GridAxesAttr> axes(rank, shard::GridAxesAttr::get(context, {}));
      axes[rank + dim] = shard::GridAxesAttr::get(context, {0});
      results[r.getResultNumber()] = shard::GridAxesArrayAttr::get(context, axes);
    }
  for (auto &[op, results] : byOp)
    op->setAttr("bmt.sharding",
                DictionaryAttr::get(context, {NamedAttribute(StringAttr::get(context, "grid"), grid),
                                              NamedAttribute(StringAttr::get(context, "split_axes"),
                                                             ArrayAttr::get(context, results))}));
}

} // namespace

void bmt::tp::rewriteChains(ProgramIndex &program, int64_t tensorParallel, llvm::ArrayRef<Chain> chains) {
  ModuleOp module = program.module;
  MLIRContext *context = module.getContext();
  OpBuilder builder(context);
  Type tensor = bmt::TensorType::get(context);
  // The TP group as a grid of the upstream shard dialect.
  builder.setInsertionPointToStart(module.getBody());
  auto grid = shard::GridOp::create(builder, module.getLoc(), "tp",
                                    ArrayRef<int64_t>{static_cast<int64_t>(tensorParallel)});
  FlatSymbolRefAttr gridRef = FlatSymbolRefAttr::get(grid.getSymNameAttr());
  module->setAttr("bmt.tensor_parallel", builder.getI64IntegerAttr(tensorParallel));
  annotate(context, chains, gridRef);

  for (const Chain &chain : chains) {
    for (IntEdit e : chain.edits) {
      llvm::SmallVector<Attribute> args(e.op.getArgs().begin(), e.op.getArgs().end());
      auto replaceConstant = [&](Attribute old) -> Attribute {
        if (isa<IntegerAttr>(old))
          return builder.getI64IntegerAttr(e.value);
        return old;
      };
      if (e.elem < 0) {
        args[e.arg] = replaceConstant(args[e.arg]);
      } else {
        llvm::SmallVector<Attribute> list(cast<ArrayAttr>(args[e.arg]).begin(),
                                          cast<ArrayAttr>(args[e.arg]).end());
        list[e.elem] = replaceConstant(list[e.elem]);
        args[e.arg] = builder.getArrayAttr(list);
      }
      e.op.setArgsAttr(builder.getArrayAttr(args));
    }
    // Constants held in bmt.constant operands (.pt2) are rewritten in place.
    for (IntEdit e : chain.edits) {
      auto arg = bmt::getAtenArg(e.op, e.arg);
      const bmt::AtenArg &a = e.elem < 0 ? *arg : arg->getElements()[e.elem];
      if (a.isOperand()) {
        builder.setInsertionPoint(e.op);
        auto c = bmt::ConstantOp::create(builder, e.op.getLoc(), builder.getI64IntegerAttr(e.value));
        e.op->setOperand(a.getOperandNumber(), c.getResult());
      }
    }
    // f: one tp_copy of the input, for every column matmul's path.
    Value in = chain.copyUses.front()->get();
    if (auto *def = in.getDefiningOp())
      builder.setInsertionPointAfter(def);
    else
      builder.setInsertionPointToStart(cast<BlockArgument>(in).getOwner());
    auto copy = bmt::TpCopyOp::create(builder, in.getLoc(), tensor, in, gridRef);
    for (OpOperand *use : chain.copyUses)
      use->set(copy.getResult());
    // g: the row matmul without its bias, the all-reduce, then the bias.
    for (const MatmulSite &row : chain.rows) {
      bmt::AtenOp op = row.op;
      builder.setInsertionPoint(op);
      auto m = *matmulShape(program, op);
      Value partial;
      if (bmt::atenOpId(op) == AtenOpId::linear) {
        auto none = bmt::NoneAttr::get(context);
        auto marker = bmt::OperandAttr::get(context);
        partial = bmt::AtenOp::create(builder, op.getLoc(), TypeRange{tensor},
                                      builder.getStringAttr(bmt::atenOpName(AtenOpId::linear)),
                                      builder.getArrayAttr({marker, marker, none}),
                                      ValueRange{m.input, m.weightValue})
                      .getResult(0);
      } else {
        auto marker = bmt::OperandAttr::get(context);
        partial = bmt::AtenOp::create(builder, op.getLoc(), TypeRange{tensor},
                                      builder.getStringAttr(bmt::atenOpName(AtenOpId::mm)),
                                      builder.getArrayAttr({marker, marker}),
                                      ValueRange{m.input, m.weightValue})
                      .getResult(0);
      }
      Value sum = bmt::TpAllReduceOp::create(builder, op.getLoc(), tensor, partial, gridRef);
      if (m.biasValue) {
        auto marker = bmt::OperandAttr::get(context);
        sum = bmt::AtenOp::create(builder, op.getLoc(), TypeRange{tensor},
                                  builder.getStringAttr(bmt::atenOpName(AtenOpId::add_Tensor)),
                                  builder.getArrayAttr({marker, marker, builder.getI64IntegerAttr(1)}),
                                  ValueRange{sum, m.biasValue})
                  .getResult(0);
      }
      op.getResult(0).replaceAllUsesWith(sum);
      op->erase();
    }
    for (auto &[param, split] : chain.paramSplits) {
      bmt::ParameterSplit s;
      s.dim = split.first;
      s.chunks = split.second;
      bmt::setParameterSplit(param, s);
    }
    // Replicated k/v. Why the gradients are exact: every rank computes
    // K and V from all kv heads, but only its own query heads read them
    // (the narrow below), so rank t's gradient of K (V) is the part that
    // its H / T heads contribute, zero on the others' heads (the narrow's
    // backward), summed over the repeats of each kv head (expand's).
    // The unsplit model's gradient is the sum of those parts over all H
    // heads, i.e. over the TP ranks; everything between x and K is
    // linear in that gradient (the matmul, RoPE's products with
    // replicated cos / sin, views), so the sum over the ranks of each
    // rank's dW_k = dK_t^T x is dW_k, which reduce_grad takes (the same
    // for biases), and the sum of its dx = dK_t W_k is the k path's part
    // of dx, which the tp_copy that q, k and v read takes along with the
    // q path's partial sums.
    for (const MatmulSite &c : chain.replicated)
      for (bmt::ParameterOp p : {c.weight, c.bias})
        if (p)
          bmt::setParameterSplit(p, bmt::reduceGradSplit());
    // Each rank's H / T of the repeated heads: narrow(r, pos, t * H/T, H/T).
    for (HeadNarrow n : chain.narrows) {
      Location loc = n.repeat.getLoc();
      builder.setInsertionPointAfter(n.repeat);
      auto marker = bmt::OperandAttr::get(context);
      int64_t local = n.heads / static_cast<int64_t>(tensorParallel);
      Value rank = bmt::TpRankOp::create(builder, loc, builder.getI64Type(), gridRef).getResult();
      Value t = bmt::NumToTensorOp::create(builder, loc, tensor, rank).getResult();
      Value offset = bmt::AtenOp::create(builder, loc, TypeRange{tensor},
                                         builder.getStringAttr(bmt::atenOpName(AtenOpId::mul_Scalar)),
                                         builder.getArrayAttr({marker, builder.getI64IntegerAttr(local)}),
                                         ValueRange{t})
                         .getResult(0);
      Value start = bmt::AtenOp::create(builder, loc, TypeRange{builder.getI64Type()},
                                        builder.getStringAttr(bmt::atenOpName(AtenOpId::Int_Tensor)),
                                        builder.getArrayAttr({marker}), ValueRange{offset})
                        .getResult(0);
      Value repeated = n.repeat.getResult(0);
      auto narrow = bmt::AtenOp::create(
          builder, loc, TypeRange{tensor}, builder.getStringAttr(bmt::atenOpName(AtenOpId::narrow)),
          builder.getArrayAttr({marker, builder.getI64IntegerAttr(n.pos), marker,
                                builder.getI64IntegerAttr(local)}),
          ValueRange{repeated, start});
      repeated.replaceAllUsesExcept(narrow.getResult(0), narrow);
    }
  }
}

