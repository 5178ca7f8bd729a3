//===- TensorParallelUpstream.h - running upstream on a shadow --*- C++ -*-===//
//
// bmt-tensor-parallel runs upstream's `sharding-propagation` and
// `shard-partition` on a ranked shadow of each chain (TensorParallel.cpp,
// docs/passes/tensor-parallel-upstream.md, "Upstream's passes on a
// ranked shadow"). These helpers make
// sure upstream gets IR it can take, and that a failure or a crash inside
// upstream's code reaches the user as one error line, not a stack dump.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_TENSORPARALLELUPSTREAM_H
#define BMT_PASSES_TENSORPARALLELUPSTREAM_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/LogicalResult.h"

#include <string>

namespace bmt::tp {

/// Points every tensor operand of `copy` (an op of a shadow) that its
/// ShardingInterface maps to no dim (type_as's dtype source) at a fresh,
/// unannotated argument of `body` of the same type. Upstream cannot
/// represent a sharding of such an operand in the op's loops (its
/// getShardingOption then returns an option without a grid, and
/// getShardingAnnotations dereferences it), and only its dtype is read, so
/// the shadow does not give it the chain's value.
void detachUnmappedOperands(mlir::Block &body, mlir::Operation *copy);

/// Checks the shadow before upstream's passes see it: the shard ops verify,
/// every op with a ShardingInterface has a valid implementation (one map per
/// operand and result) and maps each tensor operand of rank > 0 to as many
/// dims as it has. On failure `why` says what is wrong.
mlir::LogicalResult verifyShadow(mlir::ModuleOp shadow, std::string &why);

/// Runs `pm` on `shadow` inside an llvm::CrashRecoveryContext (as MLIR's
/// own pass manager does for its crash reproducers): a crash inside
/// upstream's code returns failure with `crashed` set, and the shadow,
/// whose state is then unknown, is leaked rather than destroyed.
mlir::LogicalResult runOnShadow(mlir::PassManager &pm, mlir::OwningOpRef<mlir::ModuleOp> &shadow,
                                bool &crashed);

} // namespace bmt::tp

#endif // BMT_PASSES_TENSORPARALLELUPSTREAM_H
