//===- PipelineSchedule.h - the 1F1B pipeline schedule ----------*- C++ -*-===//
//
// The order in which one pipeline stage runs the forwards and backwards of
// a step's micro-batches under 1F1B (PipeDream-Flush, Megatron-LM's
// non-interleaved schedule): stage s of P first runs min(P - 1 - s, M)
// forwards (warmup), then alternates one forward and one backward until
// every forward ran (steady state), then runs the backwards left
// (cooldown). Stage s thus holds at most P - s micro-batches' activations.
// simulatePipeline() times the schedules of all stages under their data
// dependencies, for tests and for the expected idle fraction
// (docs/runtime/pipeline.md).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_PIPELINESCHEDULE_H
#define BMT_RUNTIME_TRAIN_PIPELINESCHEDULE_H

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace bmt::runtime {

/// One step of a stage's schedule: the forward or the backward of
/// micro-batch `microBatch` (0-based).
struct PipelineAction {
  enum class Kind { Forward, Backward };
  Kind kind = Kind::Forward;
  int64_t microBatch = 0;
  bool operator==(const PipelineAction &o) const {
    return kind == o.kind && microBatch == o.microBatch;
  }
};

/// The 1F1B actions of stage `stage` of `stages` for `microBatches`
/// micro-batches: every micro-batch's forward once and its backward once,
/// forwards and backwards each in micro-batch order. std::invalid_argument
/// (naming the value) unless 0 <= stage < stages and microBatches >= 1.
std::vector<PipelineAction> oneForwardOneBackward(int64_t stage, int64_t stages,
                                                  int64_t microBatches);

/// The timeline of all stages' schedules when a forward takes
/// `forwardTime` and a backward `backwardTime` on every stage, transfers
/// take no time, and an action starts once its stage is free and its
/// inputs are there: forward (s, m) after forward (s - 1, m), backward
/// (s, m) after backward (s + 1, m) (the last stage's after its own
/// forward). `busy[s]` and `idle[s]` split stage s's time until the last
/// action of any stage ends (`makespan`).
struct PipelineTimeline {
  double makespan = 0;
  std::vector<double> busy, idle;
};
PipelineTimeline simulatePipeline(int64_t stages, int64_t microBatches, double forwardTime,
                                  double backwardTime);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_PIPELINESCHEDULE_H
