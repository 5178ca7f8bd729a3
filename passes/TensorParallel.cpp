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
// (docs/passes/tensor-parallel.md); names are not consulted. How the
// split dimension moves through pointwise ops, reductions, transposes,
// per-head matmuls and attention is the upstream shard dialect's
// ShardingInterface (lib/Dialect/ShardingInterfaceImpl.cpp), asked on
// ranked copies of the ops; views that regroup dims are the pass's own.
// The shardings of record are decided by upstream's sharding-propagation,
// and the collectives checked against upstream's shard-partition, on a
// ranked shadow of each chain. The stages: the chain analysis
// (TensorParallelChainBuilder.cpp), the shadow check (TensorParallelShadow.cpp),
// the gradient proof, rewrite, vocab, sequence and report files; this file
// runs them.
// See passes/Passes.td.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/ShardingInterfaceImpl.h"
#include "bmt/Dialect/TensorSplit.h"
#include "bmt/Passes.h"

#include "TensorParallelChainBuilder.h"
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

  std::optional<MatmulShape> matmulShape(bmt::AtenOp op) { return bmt::tp::matmulShape(program, op); }

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

    ChainBuilder builder(program, tensorParallel, printShadow);

    // Column candidates: matmuls with a parameter weight in the blocks,
    // grouped by the replicated activation they read.
    llvm::MapVector<Value, llvm::SmallVector<ChainSeed, 2>> byInput;
    module.walk([&](bmt::AtenOp op) {
      if (!program.blockFuncs.count(op->getParentOfType<func::FuncOp>()))
        return;
      auto m = matmulShape(op);
      if (!m)
        return;
      llvm::SmallVector<OpOperand *> path;
      Value in = builder.traceInput(m->input, path);
      byInput[in].push_back({op, path});
    });

    llvm::DenseSet<Operation *> taken; // matmuls already in a chain (as rows)
    std::vector<Chain> chains;
    llvm::SmallVector<ChainError> skipped;
    auto fatalError = [&](const ChainError &f) {
      InFlightDiagnostic d = f.op->emitError("bmt-tensor-parallel: cannot split ");
      d << describe(f.op) << " by --tensor-parallel " << static_cast<int64_t>(tensorParallel)
        << ": " << f.message;
      signalPassFailure();
    };

    for (auto &[input, seeds] : byInput) {
      if (llvm::any_of(seeds, [&](const ChainSeed &s) { return taken.count(s.op); }))
        continue;
      FailureOr<Chain> chain = builder.build(input, seeds, /*replicate=*/false);
      if (failed(chain)) {
        ChainError f = builder.error();
        // Grouped-query (or multi-query) attention whose kv heads T does
        // not divide: again with the k and v projections replicated, the
        // query heads split (docs/passes/tensor-parallel.md).
        bool narrower = false, fused = false;
        for (const ChainSeed &seed : seeds) {
          auto m = *matmulShape(seed.op);
          narrower |= m.out != matmulShape(seeds.front().op)->out;
          fused |= builder.fusedChunks(seed.op, m) > 1;
        }
        std::optional<ChainError> retry;
        if (narrower && !fused) {
          chain = builder.build(input, seeds, /*replicate=*/true);
          if (failed(chain))
            retry = builder.error();
        }
        if (failed(chain)) {
          if (retry && retry->fatal)
            return fatalError(*retry);
          if (retry)
            f.message += " (nor can the k/v projections be replicated: " + describe(retry->op) +
                         ": " + retry->message + ")";
          if (f.fatal)
            return fatalError(f);
          f.seed = seeds.front().op;
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

  /// `bmt.tensor_split = #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>`: whole
  /// on every TP rank, its gradient summed over the group before ZeRO's
  /// reduce-scatter (Plan's TensorSplit{dim = -1, reduceGrad}).
  static void markReduceGrad(bmt::ParameterOp p) {
    bmt::setParameterSplit(p, bmt::reduceGradSplit());
  }
};

} // namespace
