//===- LRSchedule.h - learning-rate schedules -------------------*- C++ -*-===//
//
// The schedules of BMTrain's bmtrain.lr_scheduler (NoDecay, Noam, Linear,
// Cosine, Exponential), each with linear warmup, as pure functions of the
// step. Step numbering: the first optimizer step is step 1.
//
// Step s gets BMTrain's get_lr() at num_iter = s, with P = peakLR (BMTrain's
// start_lr), W = warmupSteps, T = totalSteps (BMTrain's end_iter):
//   s < W (warmup):  P * s / W    (Noam: P / sqrt(W) * s / W)
//   s >= W (decay):
//     NoDecay      P
//     Noam         P / sqrt(s)
//     Linear       max(minLR, P * (T - s) / max(1, T - W))
//     Cosine       max(minLR, P * (1 + cos(pi * min(1, (s - W) / max(1, T - W)))) / 2)
//     Exponential  P * gamma^(s - W)
// So step 1 gets P/W, step W gets P (Noam: P/sqrt(W)), step T gets minLR
// for Linear and Cosine. (BMTrain's OptimManager steps its scheduler after
// the optimizer, starting from num_iter = 0, so its k-th optimizer step uses
// num_iter = k - 1 and its first step has lr 0 under warmup; here step k
// uses num_iter = k: the same curve, one step earlier, no wasted step.)
// Differences from BMTrain: minLR is a floor for Linear and Cosine (BMTrain
// floors at 0); Cosine holds its floor after T (BMTrain's cosine rises again
// past end_iter); Linear with T == W does not divide by zero.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OPTIM_LRSCHEDULE_H
#define BMT_RUNTIME_OPTIM_LRSCHEDULE_H

#include <cstdint>
#include <stdexcept>
#include <string>

namespace bmt::runtime {

enum class LRScheduleKind { NoDecay, Noam, Linear, Cosine, Exponential };

struct LRScheduleConfig {
  LRScheduleKind kind = LRScheduleKind::NoDecay;
  double peakLR = 1e-3;     ///< the learning rate reached at the end of warmup
                            ///< (Noam: peakLR / sqrt(warmupSteps), as BMTrain)
  int64_t warmupSteps = 0;  ///< steps of linear warmup from 0 to peakLR
  int64_t totalSteps = 1;   ///< end of decay for Linear and Cosine
  double minLR = 0.0;       ///< floor of Linear and Cosine decay
  double gamma = 0.999;     ///< per-step factor of Exponential decay
};

/// The name of `k` as --schedule takes it: "constant", "noam", "linear",
/// "cosine" or "exponential".
std::string scheduleKindName(LRScheduleKind k);

/// Parses "constant"/"nodecay"/"no_decay", "noam", "linear", "cosine",
/// "exponential" (any case).
/// Throws std::invalid_argument naming the accepted names otherwise.
LRScheduleKind parseLRScheduleKind(const std::string &name);

/// The learning rate at `step` (>= 1). Throws std::invalid_argument for a
/// config with negative steps or rates, or totalSteps < 1.
double learningRate(const LRScheduleConfig &config, int64_t step);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OPTIM_LRSCHEDULE_H
