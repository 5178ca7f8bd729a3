//===- RunReport.h - what bmt-run says about a run's setup ------*- C++ -*-===//
//
// The lines rank 0 prints before step 1: the loaded model and the bytes
// each rank read, the precision, where a resumed run continues and what it
// changes. Functions marked collective all-gather a number from every rank:
// every rank calls them.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_RUNREPORT_H
#define BMT_RUNTIME_TRAIN_RUNREPORT_H

#include "bmt/Runtime/checkpoint/Checkpoint.h"
#include "bmt/Runtime/optim/LRSchedule.h"

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bmt::plan {
class Archive;
}

namespace bmt::runtime {

class Comm;
class Model;

/// A progress bar on stderr while the weights load (on a terminal, and not
/// under torchrun); Model's load callback.
void loadProgress(int64_t done, int64_t total);

/// Rank 0 prints the model, its parameters, the bytes this rank read, the
/// `objective` and `device`; with several ranks, the layout and the bytes
/// every rank read. Collective.
void printLoadSummary(const std::string &archiveName, const plan::Archive &archive, Model &model,
                      const std::string &objective, c10::Device device);

/// Prints the parameters' dtype, the master weights, the gradient
/// reduction (`reduceDtype`, named `reduceName`) and the loss scale when
/// any is not plain float32; and the offloaded optimizer's host memory.
void printPrecision(Model &model, double lossScale, std::optional<c10::ScalarType> reduceDtype,
                    const std::string &reduceName);

/// What this run sets differently from the run that saved the checkpoint
/// (its schedule `now`, its batch: `sequencesPerStep` and `seqLen`, unless
/// `fixedBatches`), one "--flag now (saved: then)" phrase each.
std::vector<std::string> changedSettings(const ResumeReport &r, const LRScheduleConfig &now,
                                         int64_t sequencesPerStep, int64_t seqLen,
                                         bool fixedBatches);

/// Rank 0 prints where the run resumed from, the bytes each rank read and
/// `changes`; with `steps` at or below the checkpoint's step only that
/// nothing is left to train. Collective.
void printResume(const ResumeReport &r, const std::string &folder,
                 const std::vector<std::string> &changes, int64_t steps, Comm &world);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_RUNREPORT_H
