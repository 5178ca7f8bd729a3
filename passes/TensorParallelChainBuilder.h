//===- TensorParallelChainBuilder.h - finding one chain ---------*- C++ -*-===//
//
// The chain analysis of bmt-tensor-parallel (docs/passes/tensor-parallel.md,
// "Chains"): from the column matmuls that read one replicated
// activation, follow the split dim through the program to the row matmuls
// that contract it (TensorParallelChainBuilder.cpp), then check the chain
// against upstream's sharding-propagation and shard-partition on a ranked
// shadow (TensorParallelShadow.cpp). Every step returns LogicalResult or
// FailureOr; the reason of a failure is the builder's error().
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_TENSORPARALLELCHAINBUILDER_H
#define BMT_PASSES_TENSORPARALLELCHAINBUILDER_H

#include "TensorParallelChains.h"

#include "mlir/Support/LogicalResult.h"

#include <memory>

namespace bmt::tp {

/// A column candidate: a matmul with a parameter weight in a block, and the
/// call operands its input passes through from the outermost function that
/// still feeds only through calls (traceInput).
struct ChainSeed {
  bmt::AtenOp op;
  llvm::SmallVector<mlir::OpOperand *> path;
};

class ChainBuilder {
public:
  ChainBuilder(ProgramIndex &program, int64_t tensorParallel, bool printShadow);
  ~ChainBuilder();

  /// One chain from the matmuls `seeds` reading `input`; with `replicate`,
  /// those narrower than the widest (GQA's k and v projections) are
  /// replicated instead of split. On failure error() says why: `fatal` for
  /// sizes that T does not divide and for upstream's disagreement (the
  /// compile fails), else the chain stays replicated.
  mlir::FailureOr<Chain> build(mlir::Value input, llvm::ArrayRef<ChainSeed> seeds, bool replicate);
  /// The reason of the last failure of build().
  const ChainError &error() const;

  /// The value `v` stands for in the outermost function that still feeds
  /// only through calls, with the call operands on the way.
  mlir::Value traceInput(mlir::Value v, llvm::SmallVector<mlir::OpOperand *> &path);
  /// How many equal fused parts (q/k/v) the output of column matmul `op` has (1: none).
  int64_t fusedChunks(bmt::AtenOp op, const MatmulShape &m);

private:
  struct Impl;
  std::unique_ptr<Impl> impl;
};

/// The ranked shadow of `chain` (its split values `splits`), run through
/// upstream's sharding-propagation and shard-partition, which must agree
/// with the pass (TensorParallelShadow.cpp); records upstream's split of
/// each result in chain.upstream. With `print`, the shadow after each pass
/// goes to stderr. A disagreement, or a failure or crash inside upstream's
/// code, fails with `error` set (fatal).
mlir::LogicalResult checkShadow(ProgramIndex &program, const llvm::DenseMap<mlir::Value, Split> &splits,
                                Chain &chain, int64_t tensorParallel, bool print, ChainError &error);

} // namespace bmt::tp

#endif // BMT_PASSES_TENSORPARALLELCHAINBUILDER_H
