//===- PipelineScheduleTest.cpp - the 1F1B schedule -----------------------===//
//
// Stage schedules checked action by action against the 1F1B rule for
// small cases, and for P = 1..8, M = P..4P simulated together: every stage
// runs, no schedule deadlocks, stage s holds at most P - s micro-batches,
// and each stage's idle share of the step is the 1F1B bubble
// (P - 1) / (M + P - 1) when forward and backward cost the same on every
// stage. Interleaved 1F1B likewise for P = 2..8, V = 2..4, M = P..4P
// (multiples of P): stage s holds at most min(2 (P - 1 - s) + (V - 1) P + 1,
// V M) chunk micro-batches and idles (P - 1) / (V M + P - 1) of the step;
// every stage runs its forwards (backwards) in the same (chunk,
// micro-batch) order; the comparison orders give their own figures.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/train/PipelineSchedule.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace {

using namespace bmt::runtime;
using Kind = PipelineAction::Kind;

PipelineAction F(int64_t m, int64_t v = 0) { return {Kind::Forward, m, v}; }
PipelineAction B(int64_t m, int64_t v = 0) { return {Kind::Backward, m, v}; }

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

TEST(PipelineSchedule, InterleavedOrder) {
  // P = 2, V = 2, M = 4: rounds of 2 micro-batches through chunk 0, then
  // chunk 1; stage 0 warms up with 2 + 2 forwards, stage 1 with 2.
  EXPECT_EQ(interleavedOneForwardOneBackward(0, 2, 2, 4),
            (std::vector<PipelineAction>{F(0, 0), F(1, 0), F(0, 1), F(1, 1), F(2, 0), B(0, 1),
                                         F(3, 0), B(1, 1), F(2, 1), B(0, 0), F(3, 1), B(1, 0),
                                         B(2, 1), B(3, 1), B(2, 0), B(3, 0)}));
  EXPECT_EQ(interleavedOneForwardOneBackward(1, 2, 2, 4),
            (std::vector<PipelineAction>{F(0, 0), F(1, 0), F(0, 1), B(0, 1), F(1, 1), B(1, 1),
                                         F(2, 0), B(0, 0), F(3, 0), B(1, 0), F(2, 1), B(2, 1),
                                         F(3, 1), B(3, 1), B(2, 0), B(3, 0)}));
  // V = 1 is 1F1B.
  EXPECT_EQ(interleavedOneForwardOneBackward(1, 3, 1, 4), oneForwardOneBackward(1, 3, 4));
  EXPECT_THROW(interleavedOneForwardOneBackward(0, 2, 2, 3), std::invalid_argument);
  EXPECT_THROW(interleavedOneForwardOneBackward(0, 1, 2, 2), std::invalid_argument);
  EXPECT_THROW(interleavedOneForwardOneBackward(0, 2, 0, 2), std::invalid_argument);
  EXPECT_THROW(simulatePipeline(2, 2, 2, PipelineCosts::uniform(2, 1, 1.0, 2.0)),
               std::invalid_argument);
}

TEST(PipelineSchedule, InterleavedInFlightAndBubble) {
  for (int64_t p = 2; p <= 8; ++p)
    for (int64_t v = 2; v <= 4; ++v)
      for (int64_t m = p; m <= 4 * p; m += p) {
        std::vector<std::vector<PipelineAction>> forwards(p), backwards(p);
        for (int64_t s = 0; s < p; ++s) {
          int64_t inFlight = 0, most = 0;
          std::vector<std::vector<int>> done(v, std::vector<int>(m, 0));
          for (const PipelineAction &a : interleavedOneForwardOneBackward(s, p, v, m)) {
            const bool forward = a.kind == Kind::Forward;
            inFlight += forward ? 1 : -1;
            most = std::max(most, inFlight);
            // Each (chunk, micro-batch) forward once, its backward once after it.
            ASSERT_EQ(done[a.chunk][a.microBatch], forward ? 0 : 1);
            done[a.chunk][a.microBatch] = forward ? 1 : 2;
            (forward ? forwards : backwards)[s].push_back({a.kind, a.microBatch, a.chunk});
          }
          EXPECT_EQ(most, std::min(2 * (p - 1 - s) + (v - 1) * p + 1, v * m))
              << "P " << p << " V " << v << " M " << m << " stage " << s;
          // The order every stage sends and receives in.
          EXPECT_EQ(forwards[s], forwards[0]);
          EXPECT_EQ(backwards[s], backwards[0]);
        }
        // Each chunk a V-th of a stage, backward twice the forward.
        PipelineTimeline t =
            simulatePipeline(p, v, m, PipelineCosts::uniform(p, v, 1.0 / v, 2.0 / v));
        for (int64_t s = 0; s < p; ++s) {
          EXPECT_NEAR(t.busy[s], 3.0 * m, 1e-9);
          EXPECT_NEAR(t.idle[s] / t.makespan, pipelineBubble(p, v, m), 1e-12)
              << "P " << p << " V " << v << " M " << m << " stage " << s;
          EXPECT_EQ(t.inFlight[s], std::min(2 * (p - 1 - s) + (v - 1) * p + 1, v * m));
        }
        // Less idle than 1F1B without virtual stages at the same M.
        EXPECT_LT(pipelineBubble(p, v, m), pipelineBubble(p, 1, m));
      }
}

TEST(PipelineSchedule, ComparisonOrders) {
  // GPipe's order: the same bubble, every micro-batch in flight; one at a
  // time: (P - 1) / P idle.
  for (int64_t v : {1, 2}) {
    PipelineCosts costs = PipelineCosts::uniform(2, v, 1.0 / v, 2.0 / v);
    PipelineTimeline gpipe = simulatePipeline(2, v, 4, costs, PipelineOrder::AllForwardsFirst);
    PipelineTimeline serial = simulatePipeline(2, v, 4, costs, PipelineOrder::OneAtATime);
    for (int64_t s = 0; s < 2; ++s) {
      EXPECT_NEAR(gpipe.idle[s] / gpipe.makespan, pipelineBubble(2, v, 4), 1e-12);
      EXPECT_EQ(gpipe.inFlight[s], v * 4);
      EXPECT_NEAR(serial.idle[s] / serial.makespan, 0.5, 1e-12);
      EXPECT_EQ(serial.inFlight[s], v);
    }
  }
}

} // namespace
