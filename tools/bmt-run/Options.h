//===- Options.h - bmt-run's command line -----------------------*- C++ -*-===//

#ifndef BMT_TOOLS_BMTRUN_OPTIONS_H
#define BMT_TOOLS_BMTRUN_OPTIONS_H

#include <cstdint>
#include <stdexcept>
#include <string>

namespace bmt::tools {

/// A bad command line; the message says which option and why.
class UsageError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct RunOptions {
  std::string archive; ///< sharded.pt

  // Data
  std::string data, evalData, batchesFile;
  // Shape of a step
  int64_t steps = 0, microBatch = 8, seqLen = 128, gradAccum = 1;
  // Optimizer and schedule
  double lr = 3e-4, minLR = 0.0, lrGamma = 0.999;
  int64_t warmup = 0;
  std::string schedule = "cosine";
  double weightDecay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, clipGrad = 1.0;
  bool offloadOptimizer = false; ///< AdamW state in host memory (ZeRO plans only)
  // Mixed precision: loss scaling (lossScale < 0: auto, 65536 for a float16
  // model, else off; 0: off) and the gradient reduction dtype ("": the model's)
  double lossScale = -1, lossScaleFactor = 2, minLossScale = 1;
  int64_t lossScaleWindow = 1024;
  std::string reduceDtype;
  // Objective
  std::string objective = "auto";
  double maskProb = 0.15;
  double noiseDensity = 0.15, meanSpanLength = 3.0; ///< span corruption (T5)
  int64_t decoderStartId = -1; ///< -1: the data's pad_id, else 0

  // Evaluation
  int64_t evalEvery = 0, evalBatches = 0;
  bool evalOnly = false;
  // Output
  std::string logFile, saveParams;
  int64_t logEvery = 1;
  int64_t profileFrom = 0, profileTo = 0; ///< --profile A:B (0: off)
  std::string profileTrace;
  // Debugging / parity
  std::string dumpInputs, dumpOutput;
  // Misc
  uint64_t seed = 0;
  std::string device = "auto";
  bool help = false;
};

/// Parses argv. Throws UsageError for an unknown option, a missing or
/// malformed value, or an inconsistent combination.
RunOptions parseRunOptions(int argc, char **argv);

/// The --help text.
std::string runUsage();

} // namespace bmt::tools

#endif // BMT_TOOLS_BMTRUN_OPTIONS_H
