//===- PipelineSchedule.cpp - the 1F1B pipeline schedules -----------------===//

#include "bmt/Runtime/train/PipelineSchedule.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <string>
#include <utility>

namespace bmt::runtime {

std::vector<PipelineAction> oneForwardOneBackward(int64_t stage, int64_t stages,
                                                  int64_t microBatches) {
  if (stages < 1 || stage < 0 || stage >= stages)
    throw std::invalid_argument("pipeline schedule: stage " + std::to_string(stage) +
                                " is not one of " + std::to_string(stages) + " stages");
  if (microBatches < 1)
    throw std::invalid_argument("pipeline schedule: " + std::to_string(microBatches) +
                                " micro-batches; at least 1 is needed");
  using Kind = PipelineAction::Kind;
  const int64_t warmup = std::min(stages - 1 - stage, microBatches);
  std::vector<PipelineAction> actions;
  int64_t forward = 0, backward = 0;
  for (; forward < warmup; ++forward)
    actions.push_back({Kind::Forward, forward});
  for (; forward < microBatches; ++forward, ++backward) {
    actions.push_back({Kind::Forward, forward});
    actions.push_back({Kind::Backward, backward});
  }
  for (; backward < microBatches; ++backward)
    actions.push_back({Kind::Backward, backward});
  return actions;
}

std::vector<PipelineAction> interleavedOneForwardOneBackward(int64_t stage, int64_t stages,
                                                             int64_t chunks, int64_t microBatches,
                                                             PipelineOrder order) {
  using Kind = PipelineAction::Kind;
  if (chunks < 1)
    throw std::invalid_argument("pipeline schedule: " + std::to_string(chunks) +
                                " chunks per stage; at least 1 is needed");
  if (chunks == 1 && order == PipelineOrder::OneFOneB)
    return oneForwardOneBackward(stage, stages, microBatches);
  oneForwardOneBackward(stage, stages, microBatches); // (checks stage and microBatches)
  if (chunks > 1 && stages < 2)
    throw std::invalid_argument("pipeline schedule: " + std::to_string(chunks) +
                                " virtual stages need at least 2 stages");
  if (chunks > 1 && microBatches % stages != 0)
    throw std::invalid_argument("pipeline schedule: interleaved 1F1B needs a number of "
                                "micro-batches that is a multiple of the " +
                                std::to_string(stages) + " stages, not " +
                                std::to_string(microBatches));
  const int64_t total = chunks * microBatches;
  // The k-th forward (backward) of every stage: rounds of P micro-batches
  // (all of them without virtual stages) through each chunk in turn, the
  // backwards through the chunks in reverse.
  const int64_t round = chunks > 1 ? stages : microBatches;
  auto action = [&](Kind kind, int64_t k) {
    const int64_t group = k / (round * chunks), inGroup = k % (round * chunks);
    int64_t chunk = inGroup / round;
    if (kind == Kind::Backward)
      chunk = chunks - 1 - chunk;
    return PipelineAction{kind, group * round + inGroup % round, chunk};
  };
  std::vector<PipelineAction> actions;
  if (order == PipelineOrder::OneAtATime) {
    for (int64_t m = 0; m < microBatches; ++m) {
      for (int64_t v = 0; v < chunks; ++v)
        actions.push_back({Kind::Forward, m, v});
      for (int64_t v = chunks - 1; v >= 0; --v)
        actions.push_back({Kind::Backward, m, v});
    }
    return actions;
  }
  const int64_t warmup =
      order == PipelineOrder::AllForwardsFirst
          ? total
          : std::min(2 * (stages - 1 - stage) + (chunks - 1) * stages, total);
  int64_t forward = 0, backward = 0;
  for (; forward < warmup; ++forward)
    actions.push_back(action(Kind::Forward, forward));
  for (; forward < total; ++forward, ++backward) {
    actions.push_back(action(Kind::Forward, forward));
    actions.push_back(action(Kind::Backward, backward));
  }
  for (; backward < total; ++backward)
    actions.push_back(action(Kind::Backward, backward));
  return actions;
}

PipelineCosts PipelineCosts::uniform(int64_t stages, int64_t chunks, double forwardTime,
                                     double backwardTime) {
  PipelineCosts c;
  c.forward.assign(stages, std::vector<double>(chunks, forwardTime));
  c.backward.assign(stages, std::vector<double>(chunks, backwardTime));
  return c;
}

PipelineTimeline simulatePipeline(int64_t stages, int64_t microBatches, double forwardTime,
                                  double backwardTime) {
  return simulatePipeline(stages, 1, microBatches,
                          PipelineCosts::uniform(stages, 1, forwardTime, backwardTime));
}

PipelineTimeline simulatePipeline(int64_t stages, int64_t chunks, int64_t microBatches,
                                  const PipelineCosts &costs, PipelineOrder order) {
  using Kind = PipelineAction::Kind;
  auto sized = [&](const std::vector<std::vector<double>> &t) {
    if (static_cast<int64_t>(t.size()) != stages)
      return false;
    for (const std::vector<double> &row : t)
      if (static_cast<int64_t>(row.size()) != chunks)
        return false;
    return true;
  };
  if (!sized(costs.forward) || !sized(costs.backward))
    throw std::invalid_argument("pipeline simulation: the costs are not " +
                                std::to_string(stages) + " stages x " + std::to_string(chunks) +
                                " chunks");
  std::vector<std::vector<PipelineAction>> plans;
  for (int64_t s = 0; s < stages; ++s)
    plans.push_back(interleavedOneForwardOneBackward(s, stages, chunks, microBatches, order));
  const int64_t last = stages * chunks - 1;
  // End times of the actions done so far, by (global chunk, kind, micro-batch).
  std::map<std::tuple<int64_t, int, int64_t>, double> ends;
  std::vector<size_t> next(stages, 0);
  std::vector<double> free(stages, 0.0);
  std::vector<int64_t> held(stages, 0);
  PipelineTimeline t;
  t.busy.assign(stages, 0.0);
  t.inFlight.assign(stages, 0);
  // Repeatedly run, on every stage, the next action whose inputs are done;
  // a round without progress means the schedules deadlock.
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t s = 0; s < stages; ++s) {
      while (next[s] < plans[s].size()) {
        const PipelineAction &a = plans[s][next[s]];
        const int64_t c = a.chunk * stages + s;
        double ready = free[s];
        bool forward = a.kind == Kind::Forward;
        if (forward && c > 0) {
          auto it = ends.find({c - 1, 0, a.microBatch});
          if (it == ends.end())
            break;
          ready = std::max(ready, it->second);
        }
        if (!forward) {
          auto it = c < last ? ends.find({c + 1, 1, a.microBatch})
                             : ends.find({c, 0, a.microBatch});
          if (it == ends.end())
            break;
          ready = std::max(ready, it->second);
        }
        double time = forward ? costs.forward[s][a.chunk] : costs.backward[s][a.chunk];
        free[s] = ready + time;
        t.busy[s] += time;
        held[s] += forward ? 1 : -1;
        t.inFlight[s] = std::max(t.inFlight[s], held[s]);
        ends[{c, forward ? 0 : 1, a.microBatch}] = free[s];
        ++next[s];
        progress = true;
      }
    }
  }
  for (int64_t s = 0; s < stages; ++s)
    if (next[s] != plans[s].size())
      throw std::logic_error("pipeline schedule: stage " + std::to_string(s) + " deadlocks");
  t.makespan = *std::max_element(free.begin(), free.end());
  t.end = free;
  for (int64_t s = 0; s < stages; ++s)
    t.idle.push_back(t.makespan - t.busy[s]);
  return t;
}

double pipelineBubble(int64_t stages, int64_t chunks, int64_t microBatches) {
  return double(stages - 1) / double(chunks * microBatches + stages - 1);
}

} // namespace bmt::runtime
