//===- LRScheduleTest.cpp - BMTrain's learning-rate schedules -------------===//
//
// Values written out by hand from bmtrain/lr_scheduler/*.py's formulas
// (get_lr at num_iter = step) at the warmup boundary, mid-decay and the end.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/optim/LRSchedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace {

using bmt::runtime::learningRate;
using bmt::runtime::LRScheduleConfig;
using bmt::runtime::LRScheduleKind;
using bmt::runtime::parseLRScheduleKind;

LRScheduleConfig config(LRScheduleKind kind, int64_t warmup, int64_t total,
                        double minLR = 0.0, double gamma = 0.999) {
  LRScheduleConfig c;
  c.kind = kind;
  c.peakLR = 1e-3;
  c.warmupSteps = warmup;
  c.totalSteps = total;
  c.minLR = minLR;
  c.gamma = gamma;
  return c;
}

constexpr double kTol = 1e-15;

TEST(LRSchedule, ParsesNames) {
  EXPECT_EQ(parseLRScheduleKind("constant"), LRScheduleKind::NoDecay);
  EXPECT_EQ(parseLRScheduleKind("nodecay"), LRScheduleKind::NoDecay);
  EXPECT_EQ(parseLRScheduleKind("noam"), LRScheduleKind::Noam);
  EXPECT_EQ(parseLRScheduleKind("linear"), LRScheduleKind::Linear);
  EXPECT_EQ(parseLRScheduleKind("Cosine"), LRScheduleKind::Cosine);
  EXPECT_EQ(parseLRScheduleKind("exponential"), LRScheduleKind::Exponential);
  try {
    parseLRScheduleKind("triangle");
    FAIL() << "no exception";
  } catch (const std::invalid_argument &e) {
    std::string what = e.what();
    EXPECT_NE(what.find("triangle"), std::string::npos) << what;
    EXPECT_NE(what.find("cosine"), std::string::npos) << what;
  }
}

TEST(LRSchedule, WarmupIsLinearFromZeroToPeak) {
  // peak * step / warmup for step < warmup; the decay formula from step ==
  // warmup on, which gives exactly the peak there.
  for (LRScheduleKind kind : {LRScheduleKind::NoDecay, LRScheduleKind::Linear,
                              LRScheduleKind::Cosine, LRScheduleKind::Exponential}) {
    LRScheduleConfig c = config(kind, 10, 100);
    EXPECT_NEAR(learningRate(c, 1), 1e-4, kTol);
    EXPECT_NEAR(learningRate(c, 5), 5e-4, kTol);
    EXPECT_NEAR(learningRate(c, 9), 9e-4, kTol);
    EXPECT_NEAR(learningRate(c, 10), 1e-3, kTol);
  }
}

TEST(LRSchedule, NoDecay) {
  LRScheduleConfig c = config(LRScheduleKind::NoDecay, 10, 100);
  EXPECT_DOUBLE_EQ(learningRate(c, 11), 1e-3);
  EXPECT_DOUBLE_EQ(learningRate(c, 100), 1e-3);
  EXPECT_DOUBLE_EQ(learningRate(c, 1000), 1e-3);
  // No warmup: the peak from step 1.
  EXPECT_DOUBLE_EQ(learningRate(config(LRScheduleKind::NoDecay, 0, 100), 1), 1e-3);
}

TEST(LRSchedule, Linear) {
  LRScheduleConfig c = config(LRScheduleKind::Linear, 10, 100);
  // peak * (100 - s) / 90
  EXPECT_NEAR(learningRate(c, 55), 5e-4, kTol);
  EXPECT_NEAR(learningRate(c, 91), 1e-4, kTol);
  EXPECT_NEAR(learningRate(c, 99), 1e-3 / 90, kTol);
  EXPECT_EQ(learningRate(c, 100), 0.0);
  EXPECT_EQ(learningRate(c, 150), 0.0); // BMTrain's max(0, ...)
  // minLR floors the decay (not the warmup).
  LRScheduleConfig floor = config(LRScheduleKind::Linear, 10, 100, 2e-5);
  EXPECT_NEAR(learningRate(floor, 1), 1e-4, kTol);
  EXPECT_NEAR(learningRate(floor, 55), 5e-4, kTol);
  EXPECT_NEAR(learningRate(floor, 98), 1e-3 * 2 / 90, kTol); // 2.2e-5, above the floor
  EXPECT_DOUBLE_EQ(learningRate(floor, 99), 2e-5);
  EXPECT_DOUBLE_EQ(learningRate(floor, 100), 2e-5);
  EXPECT_DOUBLE_EQ(learningRate(floor, 500), 2e-5);
  // No warmup: step 1 is already one step into the decay.
  EXPECT_NEAR(learningRate(config(LRScheduleKind::Linear, 0, 100), 1), 0.99e-3, kTol);
  // warmup == total does not divide by zero.
  EXPECT_EQ(learningRate(config(LRScheduleKind::Linear, 10, 10), 10), 0.0);
}

TEST(LRSchedule, Cosine) {
  LRScheduleConfig c = config(LRScheduleKind::Cosine, 10, 90);
  // peak * (1 + cos(pi * (s - 10) / 80)) / 2
  EXPECT_NEAR(learningRate(c, 30), 1e-3 * 0.85355339059327373, kTol); // quarter
  EXPECT_NEAR(learningRate(c, 50), 5e-4, kTol);                        // half
  EXPECT_NEAR(learningRate(c, 70), 1e-3 * 0.14644660940672624, kTol); // three quarters
  EXPECT_NEAR(learningRate(c, 90), 0.0, kTol);
  EXPECT_NEAR(learningRate(c, 130), 0.0, kTol); // holds (BMTrain's would rise again)
  LRScheduleConfig floor = config(LRScheduleKind::Cosine, 10, 90, 1e-4);
  EXPECT_NEAR(learningRate(floor, 50), 5e-4, kTol);
  EXPECT_NEAR(learningRate(floor, 70), 1.4644660940672624e-4, kTol);
  EXPECT_DOUBLE_EQ(learningRate(floor, 80), 1e-4); // 1e-3 * 0.0380602 < floor
  EXPECT_DOUBLE_EQ(learningRate(floor, 90), 1e-4);
  EXPECT_DOUBLE_EQ(learningRate(floor, 1000), 1e-4);
}

TEST(LRSchedule, Noam) {
  // Warmup: peak / sqrt(16) * s / 16; decay: peak / sqrt(s).
  LRScheduleConfig c = config(LRScheduleKind::Noam, 16, 1000);
  EXPECT_NEAR(learningRate(c, 4), 6.25e-5, kTol);
  EXPECT_NEAR(learningRate(c, 8), 1.25e-4, kTol);
  EXPECT_NEAR(learningRate(c, 15), 2.5e-4 * 15 / 16, kTol);
  EXPECT_NEAR(learningRate(c, 16), 2.5e-4, kTol); // continuous at the boundary
  EXPECT_NEAR(learningRate(c, 64), 1.25e-4, kTol);
  EXPECT_NEAR(learningRate(c, 10000), 1e-5, kTol);
  EXPECT_NEAR(learningRate(config(LRScheduleKind::Noam, 0, 10), 4), 5e-4, kTol);
}

TEST(LRSchedule, Exponential) {
  // peak * gamma^(s - 10)
  LRScheduleConfig c = config(LRScheduleKind::Exponential, 10, 100, 0.0, 0.9);
  EXPECT_NEAR(learningRate(c, 11), 9e-4, kTol);
  EXPECT_NEAR(learningRate(c, 12), 8.1e-4, kTol);
  EXPECT_NEAR(learningRate(c, 20), 1e-3 * 0.3486784401, kTol);
  // Past totalSteps it keeps decaying; minLR does not apply.
  LRScheduleConfig floor = config(LRScheduleKind::Exponential, 0, 10, 1e-3, 0.5);
  EXPECT_NEAR(learningRate(floor, 3), 1.25e-4, kTol);
}

TEST(LRSchedule, RejectsBadConfigs) {
  LRScheduleConfig ok = config(LRScheduleKind::Linear, 10, 100);
  EXPECT_THROW(learningRate(ok, 0), std::invalid_argument);
  EXPECT_THROW(learningRate(ok, -3), std::invalid_argument);
  LRScheduleConfig c = ok;
  c.warmupSteps = -1;
  EXPECT_THROW(learningRate(c, 1), std::invalid_argument);
  c = ok;
  c.totalSteps = 0;
  EXPECT_THROW(learningRate(c, 1), std::invalid_argument);
  c = ok;
  c.peakLR = -1e-3;
  EXPECT_THROW(learningRate(c, 1), std::invalid_argument);
  c = ok;
  c.minLR = -1;
  EXPECT_THROW(learningRate(c, 1), std::invalid_argument);
  c = ok;
  c.peakLR = std::nan("");
  EXPECT_THROW(learningRate(c, 1), std::invalid_argument);
}

} // namespace
