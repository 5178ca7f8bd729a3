//===- ShardingInterfaceImpl.h - shard rules of bmt's ops -------*- C++ -*-===//
//
// The upstream shard dialect's ShardingInterface
// (mlir/Dialect/Shard/Interfaces/ShardingInterface.td) for `bmt.aten` and
// `bmt.fused`: each op's loop iterators (parallel or reduction) and the
// affine maps from those loops to the dims of its tensor operands and
// results, derived from the op registry's properties (include/bmt/Dialect/
// AtenRegistry.h: kind, reduced-dims argument, schema argument names) and
// the op's constant arguments. Upstream's default getShardingOption /
// getShardingAnnotations then say how a split of one operand moves to the
// other operands and the results; --bmt-tensor-parallel asks them
// (docs/passes/tensor-parallel-upstream.md).
//
// The interface reads ranks from ranked tensor types, and `!bmt.tensor`
// has none. cloneWithRankedTypes makes the copy of an op that the
// interface can be asked about: the caller supplies the rank of each tensor
// operand (which it tracks, e.g. from the views that made the value).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_DIALECT_SHARDINGINTERFACEIMPL_H
#define BMT_DIALECT_SHARDINGINTERFACEIMPL_H

#include "mlir/IR/Block.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectRegistry.h"
#include "llvm/ADT/ArrayRef.h"

#include <cstdint>

namespace bmt {

/// Attaches the ShardingInterface models to bmt.aten and bmt.fused (as a
/// registry extension of the bmt dialect). An op the rules do not cover
/// (reshapes, slices, cat, ...) gets no loops and no maps: upstream's
/// getShardingOption then fails with "invalid sharding interface
/// implementation"; hasShardingRule says so beforehand.
void registerShardingInterfaceExternalModels(mlir::DialectRegistry &registry);

/// A copy of `op`, appended to `scratch`, whose operands are new arguments
/// of `scratch`: `tensor<?x...xf32>` of `operandRanks[i]` dims for a tensor
/// operand, i64 for the others (operandRanks[i] < 0); its results get the
/// ranked types the op's rule gives them. Null when there is no rule for
/// `op` at these ranks. `scratch` must lie in an op (a temporary module's
/// body, say), which the caller destroys, with the copy, when done.
mlir::Operation *cloneWithRankedTypes(mlir::Block &scratch, mlir::Operation *op,
                                      llvm::ArrayRef<int64_t> operandRanks);

/// A copy of `op` at `builder`'s insertion point whose operands are
/// `operands` (one per operand of `op`: ranked tensors for its tensor
/// operands, any other type for the rest); its results get the ranked
/// types (f32, dynamic sizes) the op's rule gives them at the operands'
/// ranks. Null, and nothing created, when there is no rule for `op` at
/// those ranks. --bmt-tensor-parallel builds its ranked shadow of a chain
/// with it (docs/passes/tensor-parallel-upstream.md).
mlir::Operation *cloneWithOperands(mlir::OpBuilder &builder, mlir::Operation *op,
                                   mlir::ValueRange operands);

/// Whether the rules cover `op` (a copy made by cloneWithRankedTypes).
bool hasShardingRule(mlir::Operation *op);

} // namespace bmt

#endif // BMT_DIALECT_SHARDINGINTERFACEIMPL_H
