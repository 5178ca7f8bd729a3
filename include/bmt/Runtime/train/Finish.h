//===- Finish.h - the end of a training run ---------------------*- C++ -*-===//
//
// What a run does after its steps (docs/runtime/failures.md):
// the exit status of a run stopped by a signal, --save-params, and the
// error that names the trained state a failed last save lost.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_FINISH_H
#define BMT_RUNTIME_TRAIN_FINISH_H

#include "bmt/Runtime/train/Trainer.h"

#include <stdexcept>
#include <string>

namespace bmt::runtime {

class Model;

/// A failure every rank throws alike, having agreed on it by a collective
/// (a save some rank could not write): print it once (rank 0).
struct AgreedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// After train(): a run stopped by a signal returns 128 + the signal (143
/// SIGTERM, 130 SIGINT) without saving `saveParams`; otherwise it writes
/// `saveParams` (unless empty; saveParameters, collective) and returns 0.
/// A last checkpoint that could not be written, or parameters that could
/// not be saved, is an AgreedError naming the state lost and where the
/// newest complete checkpoint in `checkpointDir` is.
int finishRun(Model &model, const TrainOutcome &outcome, const std::string &checkpointDir,
              const std::string &saveParams);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_FINISH_H
