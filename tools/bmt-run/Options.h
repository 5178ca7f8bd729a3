//===- Options.h - bmt-run's command line -----------------------*- C++ -*-===//
//
// One table (Options.cpp) names every option with its value, section, help
// text and parser; the parser writes the run's settings directly, choices
// as enums, and --help is printed from the same table.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_TOOLS_BMTRUN_OPTIONS_H
#define BMT_TOOLS_BMTRUN_OPTIONS_H

#include "bmt/Runtime/train/Trainer.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace bmt::tools {

/// A bad command line; the message says which option and why.
class UsageError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct RunOptions {
  RunOptions();

  std::string archive; ///< sharded.pt

  // Data and the shape of a micro-batch
  std::string data, evalData, batchesFile;
  int64_t microBatch = 8, seqLen = 128;
  /// --sequences padded|packed: whole documents; none: padded for
  /// supervised data, else random windows (`windows`: --sequences windows).
  std::optional<runtime::SequenceLayout> sequences;
  bool windows = false;
  bool overlongError = false; ///< --overlong error: refuse documents longer than a row
  /// The training settings the command line gives (steps, accumulation,
  /// schedule, AdamW, clipping, masking and span-corruption rates, seed,
  /// evaluation, logging, profiling, loss-scale rules); run() completes
  /// what comes from the model and the data (vocabulary, [MASK] id,
  /// sentinels, the objective, the schedule's end). train.steps 0: not given.
  runtime::TrainConfig train;
  bool offloadOptimizer = false; ///< AdamW state in host memory (ZeRO plans only)
  bool memoryCheck = true; ///< --no-memory-check: false (tools::checkMemory)
  /// Initial loss scale: < 0 auto (65536 for a float16 model, else off), 0 off.
  double lossScale = -1;
  std::optional<at::ScalarType> reduceDtype;  ///< none: the model's dtype
  std::optional<runtime::Objective> objective; ///< none: auto (objectiveForModel)
  bool modelLoss = false; ///< --objective model-loss: the forward must take labels
  int64_t decoderStartId = -1; ///< -1: the config.json's, else the data's pad_id, else 0

  bool evalOnly = false;
  bool pipelineMicroBatchesGiven = false; ///< --micro-batches (else P)
  // Checkpoints
  runtime::CheckpointOptions checkpoints;
  std::string resume; ///< a checkpoint folder, "auto", or empty
  // Output
  std::string logFile, saveParams;
  // Debugging / parity
  std::string dumpInputs, dumpOutput;
  std::string device = "auto"; ///< cpu | cuda | cuda:N | auto
  bool help = false;
};

/// Parses argv. Throws UsageError for an unknown option, a missing or
/// malformed value, or an inconsistent combination.
RunOptions parseRunOptions(int argc, char **argv);

/// The --help text, from the option table.
std::string runUsage();

/// The --reduce-dtype spelling of a dtype ("float32", "bfloat16", "float16").
std::string dtypeFlagName(at::ScalarType dtype);

} // namespace bmt::tools

#endif // BMT_TOOLS_BMTRUN_OPTIONS_H
