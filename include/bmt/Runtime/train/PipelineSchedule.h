//===- PipelineSchedule.h - the 1F1B pipeline schedules ---------*- C++ -*-===//
//
// The order in which one pipeline stage runs the forwards and backwards of
// a step's micro-batches under 1F1B (PipeDream-Flush, Megatron-LM's
// non-interleaved schedule): stage s of P first runs min(P - 1 - s, M)
// forwards (warmup), then alternates one forward and one backward until
// every forward ran (steady state), then runs the backwards left
// (cooldown). Stage s thus holds at most P - s micro-batches' activations.
//
// Interleaved 1F1B (virtual stages, Megatron-LM's interleaved schedule):
// the blocks are cut into P x V chunks and stage s holds chunks s, s + P,
// ..., s + (V - 1) P (its local chunks 0..V-1). The V x M forwards of a
// stage go in rounds of P micro-batches: micro-batches 0..P-1 through local
// chunk 0, then through chunk 1, ..., then micro-batches P..2P-1 through
// chunk 0, ...; the backwards in the same order with the chunks reversed.
// Stage s warms up with min(2 (P - 1 - s) + (V - 1) P, V M) forwards, then
// alternates, then cools down. Every stage runs its forwards (and its
// backwards) in the same (chunk, micro-batch) order, so the values sent
// from one stage to another arrive in the order the receiver asks for them.
// With forward and backward times the same in every chunk, each stage is
// idle (P - 1) / (V M + P - 1) of the step instead of (P - 1) / (M + P - 1).
//
// simulatePipeline() times the schedules of all stages under their data
// dependencies, for tests and for the expected idle fraction that bmt-run
// reports next to the measured one (docs/runtime/pipeline.md).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_PIPELINESCHEDULE_H
#define BMT_RUNTIME_TRAIN_PIPELINESCHEDULE_H

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace bmt::runtime {

/// One step of a stage's schedule: the forward or the backward of
/// micro-batch `microBatch` (0-based) through the stage's local chunk
/// `chunk` (0 without virtual stages; global chunk chunk x P + stage).
struct PipelineAction {
  enum class Kind { Forward, Backward };
  Kind kind = Kind::Forward;
  int64_t microBatch = 0;
  int64_t chunk = 0;
  bool operator==(const PipelineAction &o) const {
    return kind == o.kind && microBatch == o.microBatch && chunk == o.chunk;
  }
};

/// The 1F1B actions of stage `stage` of `stages` for `microBatches`
/// micro-batches: every micro-batch's forward once and its backward once,
/// forwards and backwards each in micro-batch order. std::invalid_argument
/// (naming the value) unless 0 <= stage < stages and microBatches >= 1.
std::vector<PipelineAction> oneForwardOneBackward(int64_t stage, int64_t stages,
                                                  int64_t microBatches);

/// How the forwards and backwards of a stage are ordered. OneFOneB is what
/// bmt-run runs; the others are for comparisons (and for the test that the
/// measured idle time tells them apart, BMT_DEBUG_PIPELINE_ORDER):
/// AllForwardsFirst runs every forward, then every backward (GPipe; the
/// same bubble, V x M micro-batches in flight), OneAtATime runs each
/// micro-batch's forwards and backwards before the next one's (no
/// pipelining: each stage idle (P - 1) / P of the step).
enum class PipelineOrder { OneFOneB, AllForwardsFirst, OneAtATime };

/// The actions of stage `stage` of `stages` for `microBatches`
/// micro-batches through `chunks` (V) chunks per stage: every (chunk,
/// micro-batch) forward once and its backward once. V = 1 with OneFOneB is
/// oneForwardOneBackward. std::invalid_argument (naming the value) unless
/// 0 <= stage < stages, microBatches >= 1, chunks >= 1, and, with V > 1,
/// stages >= 2 and microBatches a multiple of stages.
std::vector<PipelineAction> interleavedOneForwardOneBackward(
    int64_t stage, int64_t stages, int64_t chunks, int64_t microBatches,
    PipelineOrder order = PipelineOrder::OneFOneB);

/// Forward and backward time of each of a stage's chunks:
/// [stage][local chunk].
struct PipelineCosts {
  std::vector<std::vector<double>> forward, backward;
  /// Every chunk of every stage alike.
  static PipelineCosts uniform(int64_t stages, int64_t chunks, double forwardTime,
                               double backwardTime);
};

/// The timeline of all stages' schedules when a forward of local chunk v
/// on stage s takes costs.forward[s][v] (backward likewise), transfers take
/// no time, and an action starts once its stage is free and its inputs are
/// there: the forward of global chunk c (= v P + s) of micro-batch m after
/// that of chunk c - 1, its backward after the backward of chunk c + 1 (the
/// last chunk's after its own forward). `busy[s]` and `idle[s]` split
/// stage s's time until the last action of any stage ends (`makespan`);
/// `end[s]`: when stage s's last action ends; `inFlight[s]`: the most
/// (chunk, micro-batch) forwards stage s held at once before their
/// backward. std::logic_error naming a stage if the schedules deadlock;
/// std::invalid_argument as interleavedOneForwardOneBackward or when the
/// costs are not [stages][chunks].
struct PipelineTimeline {
  double makespan = 0;
  std::vector<double> busy, idle, end;
  std::vector<int64_t> inFlight;
};
PipelineTimeline simulatePipeline(int64_t stages, int64_t microBatches, double forwardTime,
                                  double backwardTime);
PipelineTimeline simulatePipeline(int64_t stages, int64_t chunks, int64_t microBatches,
                                  const PipelineCosts &costs,
                                  PipelineOrder order = PipelineOrder::OneFOneB);

/// The closed-form idle share of a step of each stage under interleaved
/// 1F1B with the same times in every chunk: (P - 1) / (V M + P - 1).
double pipelineBubble(int64_t stages, int64_t chunks, int64_t microBatches);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_PIPELINESCHEDULE_H
