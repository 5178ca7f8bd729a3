//===- TrainerSteps.h - what a queued step leaves (Trainer's own) -*- C++ -*-===//
//
// The Trainer's private types shared by Trainer.cpp (the loop: reports,
// checkpoints, stopping) and TrainerStep.cpp (one step's and one
// micro-batch's work, evaluation).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_TRAINERSTEPS_H
#define BMT_RUNTIME_TRAIN_TRAINERSTEPS_H

#include "bmt/Runtime/train/Trainer.h"

#include <c10/core/Event.h>

#include <chrono>
#include <optional>
#include <random>
#include <vector>

namespace bmt::runtime {

/// What a step leaves for its report: its values on the device, copied to
/// the host without blocking, and an event that says when they are there.
/// On CUDA the step is reported after the next one has been queued, so
/// that reading the loss never stalls the GPU (no host synchronisation
/// inside a step); on the CPU at once.
struct Trainer::PendingStep {
  int64_t step = 0;
  double lr = 0;
  int64_t tokens = 0;  ///< input tokens of all ranks (without padding)
  int64_t targets = 0; ///< predicted (target) tokens of all ranks
  /// float64 [gradAccum + 7]: losses, grad norm, found inf, scale, next
  /// scale, and the requests summed over the ranks (ranks that received
  /// SIGTERM, SIGINT; rank 0's timed save)
  at::Tensor values;
  /// Whether values go on with the MoE layers' tokens per expert (min and
  /// max over layers and experts, all ranks), and then with the step's
  /// mean aux_loss.
  bool expertLoad = false, auxLoss = false;
  std::optional<c10::Event> ready;
  std::chrono::steady_clock::time_point queued; ///< when the host had queued all its work
  double hostSeconds = 0; ///< how long the host took to queue it (queueStep)
  std::vector<MicroBatch> batches; ///< and the generator before them: to replay a failed step
  std::mt19937_64 rng;
  /// A pipeline, on rank 0: the step's `pipeline` metrics (PipelineStep.cpp).
  std::string pipelineJson;
};

/// The environment's test and diagnostic hooks (Trainer.h), read once a run.
struct Trainer::DebugHooks {
  /// BMT_DEBUG_INJECT_INF_STEP ("k" or "k-l": steps k..l) / _RANK
  int64_t injectInfStep = 0, injectInfLast = 0, injectInfRank = 0;
  int64_t exitAfterStep = 0;                    ///< BMT_DEBUG_EXIT_AFTER_STEP
  bool syncDebug = false;                       ///< BMT_DEBUG_SYNC=1 on CUDA
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_TRAINERSTEPS_H
