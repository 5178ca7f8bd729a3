//===- TensorParallelUpstream.cpp - running upstream on a shadow ----------===//
//
// See TensorParallelUpstream.h.
//
//===----------------------------------------------------------------------===//

#include "TensorParallelUpstream.h"

#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Shard/Interfaces/ShardingInterface.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/CrashRecoveryContext.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "bmt-tensor-parallel"

using namespace mlir;

namespace bmt::tp {

void detachUnmappedOperands(Block &body, Operation *copy) {
  auto iface = dyn_cast<shard::ShardingInterface>(copy);
  if (!iface)
    return;
  SmallVector<AffineMap> maps = iface.getIndexingMaps();
  for (OpOperand &o : copy->getOpOperands()) {
    auto type = dyn_cast<RankedTensorType>(o.get().getType());
    unsigned i = o.getOperandNumber();
    if (!type || type.getRank() == 0 || i >= maps.size() || maps[i].getNumResults() != 0)
      continue;
    LLVM_DEBUG(llvm::dbgs() << "shadow: operand " << i << " of " << *copy
                            << " maps to no dim: a fresh argument\n");
    o.set(body.addArgument(type, o.get().getLoc()));
  }
}

/// The tensor operands' and results' maps of `op` against their ranks.
static LogicalResult verifyMaps(shard::ShardingInterface iface, std::string &why) {
  Operation *op = iface.getOperation();
  if (failed(iface.verifyShardingInterfaceImpl())) {
    why = "an invalid sharding rule";
    return failure();
  }
  SmallVector<AffineMap> maps = iface.getIndexingMaps();
  if (maps.size() != op->getNumOperands() + op->getNumResults()) {
    why = "a sharding rule with " + std::to_string(maps.size()) + " maps for " +
          std::to_string(op->getNumOperands() + op->getNumResults()) + " operands and results";
    return failure();
  }
  for (auto [i, v] : llvm::enumerate(llvm::concat<Value>(op->getOperands(), op->getResults()))) {
    auto type = dyn_cast<RankedTensorType>(v.getType());
    if (!type || maps[i].getNumResults() == static_cast<unsigned>(type.getRank()))
      continue;
    // An operand mapped to no dim (a dtype source) only as an unannotated
    // argument (detachUnmappedOperands).
    if (maps[i].getNumResults() == 0 && i < op->getNumOperands() && isa<BlockArgument>(v))
      continue;
    why = "a sharding rule that maps a tensor of rank " + std::to_string(type.getRank()) + " to " +
          std::to_string(maps[i].getNumResults()) + " dims";
    return failure();
  }
  return success();
}

LogicalResult verifyShadow(ModuleOp shadow, std::string &why) {
  WalkResult walk = shadow.walk<WalkOrder::PreOrder>([&](Operation *op) {
    if (isa<shard::ShardDialect>(op->getDialect())) {
      if (failed(mlir::verify(op, /*verifyRecursively=*/false))) {
        why = op->getName().getStringRef().str() + " does not verify";
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    }
    auto iface = dyn_cast<shard::ShardingInterface>(op);
    if (!iface)
      return WalkResult::advance();
    if (failed(verifyMaps(iface, why))) {
      std::string name = op->getName().getStringRef().str();
      if (auto callee = op->getAttrOfType<StringAttr>("name"))
        name += " " + callee.getValue().str();
      why = name + ": " + why;
      return WalkResult::interrupt();
    }
    return WalkResult::skip(); // bmt.fused bodies are the op's own
  });
  return failure(walk.wasInterrupted());
}

LogicalResult runOnShadow(PassManager &pm, OwningOpRef<ModuleOp> &shadow, bool &crashed) {
  llvm::CrashRecoveryContext::Enable();
  llvm::CrashRecoveryContext recovery;
  LogicalResult result = failure();
  crashed = !recovery.RunSafely([&] { result = pm.run(*shadow); });
  if (crashed) {
    LLVM_DEBUG(llvm::dbgs() << "shadow: upstream crashed\n");
    (void)shadow.release(); // half-rewritten: not destroyed
    return failure();
  }
  return result;
}

} // namespace bmt::tp
