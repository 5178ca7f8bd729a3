//===- Finish.cpp - the end of a training run -----------------------------===//

#include "bmt/Runtime/train/Finish.h"

#include "bmt/Runtime/checkpoint/Checkpoint.h"
#include "bmt/Runtime/checkpoint/SaveParameters.h"
#include "bmt/Runtime/train/StopSignal.h"

#include <optional>

namespace bmt::runtime {

int finishRun(Model &model, const TrainOutcome &outcome, const std::string &checkpointDir,
              const std::string &saveParams) {
  std::string lost;
  if (!outcome.lastSaveError.empty()) {
    std::optional<std::string> newest = latestCheckpoint(checkpointDir);
    lost = std::string(outcome.stopSignal
                           ? std::string("stopped by ") + stopSignalName(outcome.stopSignal) +
                                 " after step " + std::to_string(outcome.lastStep) + ", but the"
                           : std::string("the")) +
           " checkpoint of step " + std::to_string(outcome.lastStep) + " (the last) could not be "
           "written: " + outcome.lastSaveError + "; the trained state after step " +
           std::to_string(outcome.lastStep) + " is lost (" +
           (newest ? "the newest complete checkpoint is " + *newest
                   : "there is no complete checkpoint in " + checkpointDir) + ")";
  }
  if (outcome.stopSignal) {
    if (!lost.empty())
      throw AgreedError(lost);
    return 128 + outcome.stopSignal;
  }
  if (!saveParams.empty()) {
    try {
      saveParameters(model, saveParams);
    } catch (const SaveParametersError &e) {
      if (lost.empty())
        throw AgreedError(std::string(e.what()) + "; the trained parameters of step " +
                                   std::to_string(outcome.lastStep) + " are lost" +
                                   (outcome.lastSavePath.empty()
                                        ? std::string()
                                        : " (the checkpoint " + outcome.lastSavePath +
                                              " holds them: bmt-to-hf exports it)"));
      lost += std::string("; --save-params failed too: ") + e.what();
    }
    if (lost.empty())
      return 0;
    lost += "; --save-params " + saveParams + " holds the parameters (not the optimizer state)";
  }
  if (!lost.empty())
    throw AgreedError(lost);
  return 0;
}

} // namespace bmt::runtime
