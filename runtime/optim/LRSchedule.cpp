//===- LRSchedule.cpp - learning-rate schedules ---------------------------===//
//
// BMTrain's bmtrain.lr_scheduler formulas; see LRSchedule.h for the step
// convention and the (documented) differences.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/optim/LRSchedule.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace bmt::runtime {

std::string scheduleKindName(LRScheduleKind k) {
  switch (k) {
  case LRScheduleKind::NoDecay: return "constant";
  case LRScheduleKind::Noam: return "noam";
  case LRScheduleKind::Linear: return "linear";
  case LRScheduleKind::Cosine: return "cosine";
  case LRScheduleKind::Exponential: return "exponential";
  }
  return "?";
}

LRScheduleKind parseLRScheduleKind(const std::string &name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "constant" || lower == "nodecay" || lower == "no_decay")
    return LRScheduleKind::NoDecay;
  if (lower == "noam")
    return LRScheduleKind::Noam;
  if (lower == "linear")
    return LRScheduleKind::Linear;
  if (lower == "cosine")
    return LRScheduleKind::Cosine;
  if (lower == "exponential")
    return LRScheduleKind::Exponential;
  throw std::invalid_argument("unknown learning-rate schedule '" + name +
                              "' (expected one of: constant, nodecay, noam, linear, "
                              "cosine, exponential)");
}

namespace {

void requireNonNegative(double value, const char *what) {
  if (!(value >= 0.0) || std::isinf(value))
    throw std::invalid_argument(std::string("learning-rate schedule: ") + what +
                                " must be a finite number >= 0, got " + std::to_string(value));
}

} // namespace

double learningRate(const LRScheduleConfig &config, int64_t step) {
  requireNonNegative(config.peakLR, "peak lr");
  requireNonNegative(config.minLR, "min lr");
  requireNonNegative(config.gamma, "gamma");
  if (config.warmupSteps < 0)
    throw std::invalid_argument("learning-rate schedule: warmup steps must be >= 0, got " +
                                std::to_string(config.warmupSteps));
  if (config.totalSteps < 1)
    throw std::invalid_argument("learning-rate schedule: total steps must be >= 1, got " +
                                std::to_string(config.totalSteps));
  if (step < 1)
    throw std::invalid_argument("learning-rate schedule: step must be >= 1 (the first "
                                "optimizer step is step 1), got " + std::to_string(step));

  const double peak = config.peakLR;
  const double s = static_cast<double>(step);
  const double warmup = static_cast<double>(config.warmupSteps);
  const double total = static_cast<double>(config.totalSteps);

  if (step < config.warmupSteps) {
    if (config.kind == LRScheduleKind::Noam)
      return peak / std::sqrt(warmup) * s / warmup;
    return peak * s / warmup;
  }

  // Length of the decay period for Linear and Cosine (BMTrain's cosine uses
  // max(1, ...); linear gets the same guard against T == W).
  const double decaySteps = std::max(1.0, total - warmup);
  switch (config.kind) {
  case LRScheduleKind::NoDecay:
    return peak;
  case LRScheduleKind::Noam:
    return peak / std::sqrt(s);
  case LRScheduleKind::Linear:
    return std::max(config.minLR, peak * (total - s) / decaySteps);
  case LRScheduleKind::Cosine: {
    const double progress = std::min(1.0, (s - warmup) / decaySteps);
    return std::max(config.minLR, peak * 0.5 * (1.0 + std::cos(progress * M_PI)));
  }
  case LRScheduleKind::Exponential:
    return peak * std::pow(config.gamma, s - warmup);
  }
  throw std::invalid_argument("learning-rate schedule: unknown kind");
}

} // namespace bmt::runtime
