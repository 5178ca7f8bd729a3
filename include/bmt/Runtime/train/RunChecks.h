//===- RunChecks.h - a run's settings against its plan and model -*- C++ -*-===//
//
// bmt-run's refusals that follow from its options, the plan and the loaded
// model, made before any data is read: the device, tensor parallelism's
// limits, the objective a model can train on. Every refusal is one line:
// ConfigError (every rank alike: print it once) or PreflightError
// (Preflight.h).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_RUNCHECKS_H
#define BMT_RUNTIME_TRAIN_RUNCHECKS_H

#include "bmt/Runtime/train/Preflight.h"
#include "bmt/Runtime/train/Trainer.h"

#include <c10/core/Device.h>

#include <optional>
#include <string>

namespace bmt::plan {
struct Plan;
}

namespace bmt::runtime {

class Model;

/// The device of this rank for --device `name`: "auto" is cuda:LOCAL_RANK
/// when CUDA is available, else the CPU; "cuda" without an index is
/// cuda:`localRank`. PreflightError for an unknown device or CUDA missing.
c10::Device chooseDevice(const std::string &name, int64_t localRank);

/// For a plan compiled for tensor parallelism (T ranks per TP group): a
/// ConfigError when T does not divide `worldSize`, or with `dump`
/// (--dump) or `inspect` (--inspect-every), before any rank connects.
void checkTensorParallel(const std::string &archiveName, const plan::Plan &p, int64_t worldSize,
                         bool dump, bool inspect);

/// What a run asks of a plan cut into pipeline stages.
struct PipelineRequest {
  int64_t worldSize = 1;
  int64_t microBatches = 0; ///< --micro-batches M (0: not given)
  int64_t evalRows = 0;     ///< --micro-batch with --eval-data (0: no evaluation)
  bool dump = false, inspect = false, offload = false;
  bool adafactor = false, profile = false;
};
/// For a plan cut into P > 1 pipeline stages (bmt-opt --pipeline-parallel;
/// docs/runtime/pipeline.md): a ConfigError, before any rank connects,
/// for a world size P does not divide, M < P, evaluation rows M does not
/// divide, tensor or expert
/// parallelism, --dump, --inspect-every, --offload-optimizer,
/// --profile; for a plan without stages, a
/// ConfigError when --micro-batches is given.
void checkPipeline(const std::string &archiveName, const plan::Plan &p,
                   const PipelineRequest &request);

/// --offload-optimizer (`offload`) on a plan without ZeRO storage groups:
/// ConfigError.
void checkOffload(const std::string &archiveName, const plan::Plan &p, bool offload);

/// The objective a run trains on, and its name for bmt-run's summary.
struct ObjectiveChoice {
  Objective kind = Objective::CausalLM;
  bool modelLoss = false; ///< the forward takes labels and returns its own loss
  std::string name;       ///< "causal-lm", "model-loss (the loss its forward returns, fed ...)"
};

/// Chooses the objective for `model` (`requested`: --objective, none for
/// auto; `requestModelLoss`: --objective model-loss) and refuses what the
/// model cannot train on: an objective the plan does not fit, the model's
/// own loss under tensor parallelism (ConfigError), model-loss without a
/// labels input, and no logits nor loss unless `dump` (PreflightError).
ObjectiveChoice chooseObjective(Model &model, const std::string &archiveName,
                                std::optional<Objective> requested, bool requestModelLoss,
                                bool dump);

/// A model that returns its loss and no logits leaves the vocabulary unknown
/// (probeVocabulary's INT64_MAX), which every objective but causal LM needs:
/// PreflightError.
void checkVocabularyKnown(const std::string &archiveName, int64_t vocab, Objective objective);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_RUNCHECKS_H
