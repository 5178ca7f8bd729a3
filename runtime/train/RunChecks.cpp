//===- RunChecks.cpp - a run's settings against its plan and model -------===//

#include "bmt/Runtime/train/RunChecks.h"

#include "bmt/Plan/Plan.h"
#include "bmt/Runtime/exec/Model.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace bmt::runtime {

namespace {

/// What the entry function returns, for a message: "a plain tensor", or its
/// result names ("'last_hidden_state', 'pooler_output'").
std::string describeResults(const Model &model) {
  const plan::Function &entry = model.plan().functions[model.plan().entry];
  std::string names;
  for (const std::string &n : entry.resultNames)
    if (!n.empty())
      names += (names.empty() ? "'" : ", '") + n + "'";
  if (!names.empty())
    return names;
  return entry.resultNames.size() == 1
             ? "a plain tensor"
             : std::to_string(entry.resultNames.size()) + " unnamed results (a tuple)";
}

} // namespace

/// The device of this rank: "auto" is cuda:LOCAL_RANK when CUDA is
/// available, else the CPU; "cuda" without an index is cuda:LOCAL_RANK.
c10::Device chooseDevice(const std::string &name, int64_t localRank) {
  if (name == "auto")
    return at::hasCUDA() ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(localRank))
                         : at::Device("cpu");
  try {
    at::Device d(name);
    if (d.is_cuda() && !at::hasCUDA())
      throw PreflightError("--device " + name + ": CUDA is not available on this machine");
    if (d.is_cuda() && !d.has_index())
      d = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(localRank));
    return d;
  } catch (const c10::Error &) {
    throw PreflightError("--device: unknown device '" + name + "'");
  }
}

/// The options a plan compiled for tensor parallelism (T ranks per TP
/// group) refuses, and a world size T does not divide: ConfigError,
/// before any rank connects (the model-loss ones need the loaded model).
void checkTensorParallel(const std::string &archiveName, const plan::Plan &p, int64_t worldSize,
                         bool dump, bool inspect) {
  if (p.tensorParallel <= 1)
    return;
  const std::string t = std::to_string(p.tensorParallel);
  const std::string tp = archiveName + " is compiled for tensor parallelism (" + t +
                         " ranks per TP group): ";
  if (worldSize % p.tensorParallel != 0)
    throw ConfigError(tp + "it needs a world size that is a multiple of " + t + ", not " +
                               std::to_string(worldSize) + (worldSize == 1 ? " rank" : " ranks") +
                               "; run on a multiple of " + t +
                               " ranks or recompile with another --tensor-parallel");
  if (dump)
    throw ConfigError(tp + "--dump is not supported with it yet (each rank holds a part "
                               "of the logits)");
  if (inspect)
    throw ConfigError(tp + "--inspect-every is not supported with it yet (its statistics "
                               "would mix the ranks' slices)");
}

ObjectiveChoice chooseObjective(Model &model, const std::string &archiveName,
                                std::optional<Objective> requested, bool requestModelLoss,
                                bool dump) {
  const plan::Plan &p = model.plan();
  const bool encoderDecoder = model.isEncoderDecoder();
  Objective objectiveKind;
  try {
    objectiveKind = objectiveForModel(requested, encoderDecoder, p.objective);
  } catch (const std::invalid_argument &e) {
    throw PreflightError(archiveName + " (" + p.modelType + "): " + e.what());
  }
  // A forward taking labels computes its own loss: bmt-run trains on it,
  // feeding the labels of the data objective (Trainer.h modelLabels).
  const bool modelLoss = model.takesLabels();
  if (p.tensorParallel > 1) {
    const std::string tp = archiveName + " is compiled for tensor parallelism (" +
                           std::to_string(p.tensorParallel) + " ranks per TP group): ";
    if (modelLoss)
      throw ConfigError(
          tp + "its forward takes labels and computes its own loss, which is not supported with "
               "it yet (bmt cannot see how that loss reduces over the ranks' parts of the "
               "model); export the model without labels (bmt-export-hf without --labels) to "
               "train it on bmt-run's vocab-parallel cross-entropy");
    if (requestModelLoss)
      throw ConfigError(tp + "--objective model-loss is not supported with it yet, and "
                                 "its forward takes no labels anyway; leave out --objective to "
                                 "train on bmt-run's vocab-parallel cross-entropy");
  }
  if (requestModelLoss && !modelLoss)
    throw PreflightError(archiveName + ": --objective model-loss trains on the loss the model computes "
                  "from its labels, but its forward takes no 'labels' input (it was traced or "
                  "exported without them); export it with labels (bmt-export-hf --labels), or "
                  "train it with bmt-run's own cross-entropy (--objective auto)");
  const std::string objective =
      modelLoss ? std::string("model-loss (the loss its forward returns, fed ") +
                      objectiveName(objectiveKind) + " labels)"
                : std::string(objectiveName(objectiveKind));
  if (!model.hasLogits() && !modelLoss && !dump)
    throw PreflightError(archiveName + ": the model's forward returns " + describeResults(model) +
                  " and no 'logits' result (" + p.modelType + "); to train, its forward must "
                  "return a dict or ModelOutput with 'logits' [batch, seq, vocab] (a "
                  "*ForCausalLM/*ForMaskedLM/*ForConditionalGeneration model does), or take "
                  "'labels' and return its loss as 'loss' (--objective model-loss); it can be "
                  "run with --dump as it is");
  return {objectiveKind, modelLoss, objective};
}

void checkOffload(const std::string &archiveName, const plan::Plan &p, bool offload) {
  if (offload && p.groups.empty())
    throw ConfigError("--offload-optimizer keeps each rank's shard of the optimizer state "
                      "in host memory and needs a plan with ZeRO storage groups; " +
                      archiveName + " has none (compile it with bmt-opt's default pipeline "
                      "or --bmt-zero)");
}

void checkPipeline(const std::string &archiveName, const plan::Plan &p,
                   const PipelineRequest &r) {
  const int64_t stages = p.pipelineStages;
  if (stages <= 1) {
    if (r.microBatches > 0)
      throw ConfigError("--micro-batches splits micro-batches for a pipeline, and " +
                        archiveName + " is not cut into stages (bmt-opt --pipeline-parallel); "
                        "use --grad-accum");
    return;
  }
  const std::string what = archiveName + " is cut into " + std::to_string(stages) +
                           " pipeline stages, ";
  auto refuse = [&](const std::string &option) {
    throw ConfigError(what + "which this bmt-run does not run with " + option);
  };
  if (p.expertParallel > 1)
    refuse("expert parallelism (compile with --pipeline-parallel or --expert-parallel)");
  for (const plan::Function &f : p.functions)
    for (const plan::Instruction &inst : f.body)
      if (inst.kind == plan::Instruction::Kind::MoeDispatch)
        refuse("mixture-of-experts layers (their token counts are not gathered over the stages "
               "yet)");
  // Ranks: T x D per stage (TP innermost, then data-parallel, stages
  // outermost; docs/runtime/pipeline.md).
  const int64_t per = stages * std::max<int64_t>(p.tensorParallel, 1);
  if (r.worldSize % per != 0)
    throw ConfigError(what + "which need a world size that is a multiple of " +
                      (per == stages ? std::to_string(stages)
                                     : std::to_string(per) + " (" + std::to_string(stages) +
                                           " x tensor-parallel " +
                                           std::to_string(p.tensorParallel) + ")") +
                      ", not " + std::to_string(r.worldSize));
  if (r.microBatches > 0 && r.microBatches < stages)
    throw ConfigError("--micro-batches " + std::to_string(r.microBatches) + " is fewer than the " +
                      std::to_string(stages) + " pipeline stages of " + archiveName +
                      " (1F1B needs at least one micro-batch per stage)");
  const int64_t pieces = r.microBatches > 0 ? r.microBatches : stages;
  if (r.evalRows > 0 && r.evalRows % pieces != 0)
    throw ConfigError("--micro-batches " + std::to_string(pieces) + " does not divide the " +
                      std::to_string(r.evalRows) + " rows of an evaluation micro-batch "
                      "(--micro-batch), which a pipeline evaluates in pieces as it trains");
  if (p.pipelineVirtualStages > 1 && r.microBatches > 0 && r.microBatches % stages != 0)
    throw ConfigError("--micro-batches " + std::to_string(r.microBatches) +
                      " is not a multiple of the " + std::to_string(stages) +
                      " pipeline stages of " + archiveName + ", which interleaved 1F1B (its " +
                      std::to_string(p.pipelineVirtualStages) +
                      " virtual stages) needs: micro-batches go through each chunk in rounds "
                      "of one per stage");
  if (r.dump)
    refuse("--dump");
  if (r.inspect)
    refuse("--inspect-every");
  if (r.offload)
    refuse("--offload-optimizer");
  if (r.profile)
    refuse("--profile");
}

void checkVocabularyKnown(const std::string &archiveName, int64_t vocab, Objective objective) {
  if (vocab == std::numeric_limits<int64_t>::max() && objective != Objective::CausalLM)
    throw PreflightError(archiveName + ": the model returns its loss but no 'logits', so bmt-run "
                         "does not know its vocabulary, which " + objectiveName(objective) +
                         " needs (random replacement tokens, sentinels); return the logits as "
                         "well");
}

} // namespace bmt::runtime
