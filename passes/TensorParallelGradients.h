//===- TensorParallelGradients.h - how whole parameters' gradients complete -===//
//
// A stage of bmt-tensor-parallel (TensorParallel.cpp;
// docs/passes/tensor-parallel.md, "Gradient completion"): for every trainable parameter that the chains
// leave whole (replicated over the TP group), proves from the chains'
// shardings how its gradient is completed on every TP rank, or refuses:
//
//   Identical  no use of it sees a split value: every rank computes the
//              same gradient, nothing to do;
//   Summed     every use meets split values, and broadcasts along their
//              split dim (a per-head norm weight on head-split activations)
//              or is narrowed to the rank's part (a replicated k/v
//              projection's repeat): each rank's gradient is the partial sum
//              over its part, and their sum over the group (`reduce_grad`)
//              is the unsplit one;
//   refused    anything else (read both beside split values and elsewhere, a
//              dim along the split one, a derivation the proof does not
//              follow): one error naming the parameter, the op and why.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_TENSORPARALLELGRADIENTS_H
#define BMT_PASSES_TENSORPARALLELGRADIENTS_H

#include "bmt/Dialect/BmtDialect.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Value.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

namespace bmt::tp {

/// A value a chain splits: the split dim counted from the end, the value's
/// rank (-1 unknown).
struct SplitValue {
  int64_t dim;
  int64_t rank;
};

/// One chain as found, before the rewrite.
struct ChainRegion {
  /// Every value the chain splits.
  llvm::DenseMap<mlir::Value, SplitValue> split;
  /// Operands whose gradient a collective of the rewrite completes: the
  /// uses of the chain's input that read it through its tp_copy, the row
  /// biases (added after the all-reduce).
  llvm::DenseSet<mlir::OpOperand *> completed;
  /// Ops whose whole operand each rank narrows to its own part (the repeat
  /// of replicated kv heads to the query heads).
  llvm::DenseSet<mlir::Operation *> narrowing;
  /// The row-parallel matmuls.
  llvm::DenseSet<mlir::Operation *> rows;
};

enum class Completion { Identical, Summed };

struct ParameterGradient {
  bmt::ParameterOp param;
  Completion completion;
  /// Summed: an op where it meets a split value.
  mlir::Operation *site = nullptr;
};

/// The proof for every trainable parameter of `module` that is not in
/// `splitParams`; emits one error (at the op where the proof fails, naming
/// the parameter) and fails when a parameter's gradient cannot be completed.
mlir::FailureOr<llvm::SmallVector<ParameterGradient>>
proveGradientCompletion(mlir::ModuleOp module, llvm::ArrayRef<ChainRegion> chains,
                        const llvm::DenseSet<mlir::Operation *> &splitParams, int64_t tensorParallel);

} // namespace bmt::tp

#endif // BMT_PASSES_TENSORPARALLELGRADIENTS_H
