//===- MemoryEstimate.h - per-rank training memory estimate -----*- C++ -*-===//
//
// The memory model shared by --bmt-checkpoint (which chooses the blocks to
// recompute under a budget) and --bmt-summary (which prints the estimate).
// The formula is documented in docs/passes/memory-estimate.md; keep the
// two in step.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_MEMORYESTIMATE_H
#define BMT_PASSES_MEMORYESTIMATE_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <string>

namespace bmt {

/// What the estimate depends on besides the IR.
struct MemoryConfig {
  int64_t worldSize = 1;     ///< ranks; parameters are sharded over min(worldSize, shard group)
  int64_t microBatch = 1;    ///< sequences per rank per forward
  int64_t seqLen = 1024;     ///< tokens per sequence
  int64_t prefetchDepth = 1; ///< blocks gathered ahead of the running one (ZeRO-3)
};

/// One block call, in execution order.
struct BlockCost {
  mlir::func::CallOp call;
  std::string name;            ///< "transformer.h.3" (the callee's module path)
  int64_t activationBytes = 0; ///< saved activations when not recomputed
  int64_t inputBytes = 0;      ///< what a recomputed (checkpointed) block keeps: its inputs
  int64_t gatheredBytes = 0;   ///< its trainable storage groups, gathered (full size)
  int64_t frozenGatheredBytes = 0; ///< its frozen storage groups, gathered (no gradient)
  int64_t parameters = 0;      ///< trainable parameter elements in its storage groups
};

/// The estimate's terms, in bytes per rank.
struct MemoryModel {
  MemoryConfig config;
  int64_t shardRanks = 1;         ///< ranks one storage group is sharded over
  /// Ranks a group of expert slices (parameters split over the expert
  /// group) is sharded over: N / E; 0 when there is none.
  int64_t expertShardRanks = 0;
  int64_t zeroStage = 0;          ///< 0: no storage groups (nothing sharded)
  int64_t stateBytes = 0;         ///< parameter, gradient and AdamW state shards
  /// Frozen parameters (requires_grad false; bmt-freeze) a rank holds, in
  /// their dtype, with no gradient or optimizer state: its shards of the
  /// frozen storage groups (1 / R of them), or whole without groups.
  int64_t frozenBytes = 0;
  int64_t outsideGatheredBytes = 0; ///< outside-block groups gathered, with their full gradient
  int64_t outsideParameters = 0;  ///< trainable elements outside the blocks
  int64_t outsideActivationBytes = 0; ///< activations of the ops outside the blocks
  int64_t activationElementBytes = 4;
  llvm::SmallVector<BlockCost> blocks;

  /// Gathered block buffers at the peak: ZeRO-3 keeps min(depth + 1, #blocks)
  /// blocks gathered (trainable and frozen groups) plus one block's full
  /// gradient (trainable groups only); ZeRO-2 keeps every block gathered
  /// (from its forward to its backward) plus one full gradient.
  int64_t blockGatheredBytes() const;
  /// Peak activations when the blocks flagged in `recomputed` (one flag per
  /// block) are recomputed in backward: the larger of the end of the forward
  /// (kept blocks' activations, recomputed blocks' inputs) and the backward
  /// of each recomputed block (the blocks before it as at the end of the
  /// forward, plus its own activations), plus the outside-block activations.
  int64_t activationBytes(llvm::ArrayRef<bool> recomputed) const;
  /// The whole estimate.
  int64_t totalBytes(llvm::ArrayRef<bool> recomputed) const;
  /// The recompute flags the IR carries now (`bmt.checkpoint` on block calls).
  llvm::SmallVector<bool> currentFlags() const;
};

/// Builds the model of `module` (after --bmt-find-blocks and, for sharding,
/// --bmt-zero; after --bmt-tensor-parallel it is per TP rank: the slices,
/// the bmt.tp_* collectives' results, replicated k/v whole, and under
/// sequence parallelism the values split along the sequence at 1 / T).
/// Never fails: what it cannot size counts as zero.
MemoryModel estimateMemory(mlir::ModuleOp module, const MemoryConfig &config);

/// Bytes per parameter element of the sharded state: the parameter and its
/// gradient in their dtype, AdamW's exp_avg and exp_avg_sq in fp32, and an
/// fp32 master copy for parameters of a narrower float type.
int64_t stateBytesPerElement(mlir::Type type);

/// "3.2 GiB", "784 B".
std::string formatBytes(int64_t bytes);

} // namespace bmt

#endif // BMT_PASSES_MEMORYESTIMATE_H
