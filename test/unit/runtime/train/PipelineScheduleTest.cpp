//===- PipelineScheduleTest.cpp - the 1F1B schedule -----------------------===//
//
// Stage schedules checked action by action against the 1F1B rule for
// small cases, and for P = 1..8, M = P..4P simulated together: every stage
// runs, no schedule deadlocks, stage s holds at most P - s micro-batches,
// and each stage's idle share of the step is the 1F1B bubble
// (P - 1) / (M + P - 1) when forward and backward cost the same on every
// stage.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/train/PipelineSchedule.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace {

using namespace bmt::runtime;
using Kind = PipelineAction::Kind;

PipelineAction F(int64_t m) { return {Kind::Forward, m}; }
PipelineAction B(int64_t m) { return {Kind::Backward, m}; }

TEST(PipelineSchedule, WarmupSteadyCooldown) {
  // P = 3, M = 4: stage 0 warms up with 2 forwards, stage 1 with 1, the
  // last stage with none.
  EXPECT_EQ(oneForwardOneBackward(0, 3, 4),
            (std::vector<PipelineAction>{F(0), F(1), F(2), B(0), F(3), B(1), B(2), B(3)}));
  EXPECT_EQ(oneForwardOneBackward(1, 3, 4),
            (std::vector<PipelineAction>{F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)}));
  EXPECT_EQ(oneForwardOneBackward(2, 3, 4),
            (std::vector<PipelineAction>{F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3)}));
  // One stage: forward, backward, ... (gradient accumulation).
  EXPECT_EQ(oneForwardOneBackward(0, 1, 2), (std::vector<PipelineAction>{F(0), B(0), F(1), B(1)}));
  EXPECT_THROW(oneForwardOneBackward(3, 3, 4), std::invalid_argument);
  EXPECT_THROW(oneForwardOneBackward(0, 3, 0), std::invalid_argument);
}

TEST(PipelineSchedule, InFlightAndBubble) {
  for (int64_t p = 1; p <= 8; ++p)
    for (int64_t m = p; m <= 4 * p; ++m) {
      for (int64_t s = 0; s < p; ++s) {
        int64_t inFlight = 0, most = 0;
        for (const PipelineAction &a : oneForwardOneBackward(s, p, m)) {
          inFlight += a.kind == Kind::Forward ? 1 : -1;
          most = std::max(most, inFlight);
        }
        EXPECT_EQ(most, std::min(p - s, m)) << "P " << p << " M " << m << " stage " << s;
      }
      // Backward twice the forward, as for a transformer block.
      PipelineTimeline t = simulatePipeline(p, m, 1.0, 2.0);
      double bubble = double(p - 1) / double(m + p - 1);
      for (int64_t s = 0; s < p; ++s) {
        EXPECT_DOUBLE_EQ(t.busy[s], 3.0 * m);
        EXPECT_NEAR(t.idle[s] / t.makespan, bubble, 1e-12)
            << "P " << p << " M " << m << " stage " << s;
      }
    }
}

} // namespace
