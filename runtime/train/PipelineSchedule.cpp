//===- PipelineSchedule.cpp - the 1F1B pipeline schedule ------------------===//

#include "bmt/Runtime/train/PipelineSchedule.h"

#include <algorithm>
#include <map>
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

PipelineTimeline simulatePipeline(int64_t stages, int64_t microBatches, double forwardTime,
                                  double backwardTime) {
  using Kind = PipelineAction::Kind;
  std::vector<std::vector<PipelineAction>> plans;
  for (int64_t s = 0; s < stages; ++s)
    plans.push_back(oneForwardOneBackward(s, stages, microBatches));
  // End times of the actions done so far, by (stage, kind, micro-batch).
  std::map<std::tuple<int64_t, int, int64_t>, double> ends;
  std::vector<size_t> next(stages, 0);
  std::vector<double> free(stages, 0.0);
  PipelineTimeline t;
  t.busy.assign(stages, 0.0);
  // Repeatedly run, on every stage, the next action whose inputs are done;
  // a round without progress means the schedules deadlock.
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t s = 0; s < stages; ++s) {
      while (next[s] < plans[s].size()) {
        const PipelineAction &a = plans[s][next[s]];
        double ready = free[s];
        bool forward = a.kind == Kind::Forward;
        if (forward && s > 0) {
          auto it = ends.find({s - 1, 0, a.microBatch});
          if (it == ends.end())
            break;
          ready = std::max(ready, it->second);
        }
        if (!forward) {
          auto it = s + 1 < stages ? ends.find({s + 1, 1, a.microBatch})
                                   : ends.find({s, 0, a.microBatch});
          if (it == ends.end())
            break;
          ready = std::max(ready, it->second);
        }
        double time = forward ? forwardTime : backwardTime;
        free[s] = ready + time;
        t.busy[s] += time;
        ends[{s, forward ? 0 : 1, a.microBatch}] = free[s];
        ++next[s];
        progress = true;
      }
    }
  }
  for (int64_t s = 0; s < stages; ++s)
    if (next[s] != plans[s].size())
      throw std::logic_error("pipeline schedule: stage " + std::to_string(s) + " deadlocks");
  t.makespan = *std::max_element(free.begin(), free.end());
  for (int64_t s = 0; s < stages; ++s)
    t.idle.push_back(t.makespan - t.busy[s]);
  return t;
}

} // namespace bmt::runtime
