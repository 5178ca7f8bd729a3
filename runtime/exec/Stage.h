//===- Stage.h - the instructions of one pipeline stage ---------*- C++ -*-===//
//
// Private to the executor: which instructions of the entry's call chain a
// pipeline stage runs and which registers cross its cuts
// (Executor::setPipelineStage, docs/runtime/pipeline.md).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_STAGE_H
#define BMT_RUNTIME_EXEC_STAGE_H

#include "bmt/Runtime/exec/Executor.h"

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace bmt::runtime {

struct Executor::StagePlan {
  int64_t stage = 0, stages = 1;
  /// Function indices from the entry (depth 0) down to the function that
  /// calls the blocks; chainCall[d]: the instruction of chain[d] that calls
  /// chain[d + 1].
  std::vector<size_t> chain, chainCall;
  /// [depth][instruction]: whether this stage runs it.
  std::vector<std::vector<char>> runs;
  /// Registers (depth, register) that enter this stage before instruction
  /// inPos of the deepest function (stage > 0), and that leave it before
  /// instruction outPos (stage < P - 1), in the order they travel.
  size_t inPos = 0, outPos = static_cast<size_t>(-1);
  std::vector<std::pair<size_t, int64_t>> in, out;
  /// The register files of the chain's frames while run() is in them.
  std::vector<std::vector<c10::IValue> *> frames;
};

/// Computes the plan of `stage` (Executor::setPipelineStage).
std::unique_ptr<Executor::StagePlan> planStage(const plan::Plan &plan, int64_t stage,
                                               const std::vector<bool> &heldGroups);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_EXEC_STAGE_H
