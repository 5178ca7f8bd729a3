//===- Checkpoint.cpp - the bmt-checkpoint pass ---------------------------===//
//
// Flags every block call with bmt.checkpoint (recompute in backward or
// not): all, none, or, under a memory budget, as few as fit. See
// passes/Passes.td for the contract and docs/passes/memory-estimate.md for the
// estimate.
//
//===----------------------------------------------------------------------===//

#include "MemoryEstimate.h"

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>

namespace bmt {
#define GEN_PASS_DEF_CHECKPOINT
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(double bytes) { return bmt::formatBytes(static_cast<int64_t>(bytes)); }

struct CheckpointPass : bmt::impl::CheckpointBase<CheckpointPass> {
  using CheckpointBase::CheckpointBase;

  LogicalResult checkOptions(ModuleOp module) {
    if (mode != "all" && mode != "none" && mode != "auto")
      return module.emitError("bmt-checkpoint: mode must be all, none or auto, got '")
             << mode << "'";
    if (!(budgetGib >= 0) || !std::isfinite(budgetGib))
      return module.emitError("bmt-checkpoint: budget-gib must be a positive number of GiB, got ")
             << budgetGib;
    if (mode == "auto" && budgetGib <= 0)
      return module.emitError(
          "bmt-checkpoint: mode=auto needs a per-rank memory budget: budget-gib=N (GiB, > 0)");
    if (microBatch <= 0)
      return module.emitError("bmt-checkpoint: micro-batch must be positive, got ")
             << static_cast<int64_t>(microBatch);
    if (seqLen <= 0)
      return module.emitError("bmt-checkpoint: seq-len must be positive, got ")
             << static_cast<int64_t>(seqLen);
    if (worldSize <= 0)
      return module.emitError("bmt-checkpoint: world-size must be positive, got ")
             << static_cast<int64_t>(worldSize);
    if (prefetchDepth < 0)
      return module.emitError("bmt-checkpoint: prefetch-depth must be 0 or positive, got ")
             << static_cast<int64_t>(prefetchDepth);
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(checkOptions(module)))
      return signalPassFailure();

    bmt::MemoryConfig config;
    config.worldSize = worldSize;
    config.microBatch = microBatch;
    config.seqLen = seqLen;
    config.prefetchDepth = prefetchDepth;
    if (auto overlap = module->getAttrOfType<DictionaryAttr>("bmt.overlap"))
      if (auto depth = overlap.getAs<IntegerAttr>("prefetch_depth"))
        config.prefetchDepth = depth.getInt();
    bmt::MemoryModel model = bmt::estimateMemory(module, config);

    OpBuilder builder(module.getContext());
    SmallVector<NamedAttribute> plan = {
        builder.getNamedAttr("mode", builder.getStringAttr(mode)),
        builder.getNamedAttr("micro_batch", builder.getI64IntegerAttr(microBatch)),
        builder.getNamedAttr("seq_len", builder.getI64IntegerAttr(seqLen)),
        builder.getNamedAttr("world_size", builder.getI64IntegerAttr(worldSize))};
    if (mode == "auto")
      plan.push_back(builder.getNamedAttr("budget_gib", builder.getF64FloatAttr(budgetGib)));
    module->setAttr("bmt.checkpoint_plan", builder.getDictionaryAttr(plan));

    size_t n = model.blocks.size();
    if (n == 0) {
      emitRemark(module.getLoc()) << "bmt-checkpoint: no blocks (run --bmt-find-blocks "
                                     "first, or the model has no repeated layers); "
                                     "nothing to recompute";
      return;
    }

    SmallVector<bool> recompute(n, mode != "none");
    std::string budgetText;
    if (mode == "auto") {
      double budget = budgetGib * kGiB;
      // Keep the activations of the last k blocks, k as large as fits.
      size_t kept = 0;
      for (size_t k = n + 1; k-- > 0;) {
        SmallVector<bool> flags(n, true);
        for (size_t i = n - k; i < n; ++i)
          flags[i] = false;
        if (static_cast<double>(model.totalBytes(flags)) <= budget) {
          kept = k;
          recompute = flags;
          break;
        }
        if (k == 0) { // nothing fits: recompute everything
          recompute = flags;
          kept = 0;
          emitWarning(module.getLoc())
              << "bmt-checkpoint: the estimate with every block recomputed, "
              << bmt::formatBytes(model.totalBytes(flags)) << " per rank ("
              << model.totalBytes(flags) << " bytes), exceeds the budget of "
              << gib(budget) << "; recomputing every block (try a larger world size, "
              << "a smaller micro-batch or sequence length)";
        }
      }
      (void)kept;
      budgetText = " of " + gib(budget) + " budget";
    }

    size_t recomputed = 0;
    for (auto [cost, flag] : llvm::zip(model.blocks, recompute)) {
      cost.call->setAttr("bmt.checkpoint", builder.getBoolAttr(flag));
      recomputed += flag;
    }
    int64_t estimate = model.totalBytes(recompute);
    InFlightDiagnostic remark = emitRemark(module.getLoc());
    remark << "bmt-checkpoint: " << recomputed << " of " << n << " blocks recomputed (";
    if (mode != "auto")
      remark << "mode=" << mode << "; ";
    remark << "estimate " << bmt::formatBytes(estimate) << " per rank" << budgetText;
    remark << " at world size " << static_cast<int64_t>(worldSize) << ", micro-batch "
           << static_cast<int64_t>(microBatch) << ", seq-len "
           << static_cast<int64_t>(seqLen) << ")";
  }
};

} // namespace
