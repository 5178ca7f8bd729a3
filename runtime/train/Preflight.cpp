//===- Preflight.cpp - a run's checks before step 1 -----------------------===//

#include "bmt/Runtime/train/Preflight.h"
#include <ATen/ops/tensor.h>

#include "bmt/Runtime/exec/Executor.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/fusion/Prewarm.h"
#include "bmt/Runtime/train/MemoryCheck.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace bmt::runtime {

void checkPositions(const std::string &archiveName,
                    const std::vector<std::pair<std::string, std::string>> &hfFiles,
                    int64_t length, const std::string &what) {
  for (const auto &[name, content] : hfFiles) {
    if (name != "config.json")
      continue;
    nlohmann::json config = nlohmann::json::parse(content, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object())
      return;
    // (Not n_positions: T5's configs carry one its relative positions
    // ignore, and GPT-2's learned positions fail in the probe's forward.)
    auto it = config.find("max_position_embeddings");
    if (it == config.end() || !it->is_number_integer())
      return;
    const int64_t positions = it->get<int64_t>();
    if (positions > 0 && length > positions)
      throw ConfigError(what + ": sequences of " + std::to_string(length) + " tokens, but " +
                          archiveName + "'s model has " + std::to_string(positions) +
                          " positions (max_position_embeddings in its config.json); lower "
                          "--seq-len, or export the model with more positions");
    return;
  }
}

void checkMemory(Model &model, int64_t rows, int64_t length, int64_t target,
                 const std::string &shape, bool measureBytes) {
  if (length > 0 && rows > std::numeric_limits<int64_t>::max() / 4 / length)
    throw ConfigError(shape + ": " + std::to_string(rows) + " x " + std::to_string(length) +
                        " tokens a micro-batch is beyond any memory (its sizes overflow 64-bit "
                        "byte counts); lower --micro-batch or --seq-len");
  if (!measureBytes || rows <= 2)
    return;
  const at::Device device = model.device();
  const bool encoderDecoder = model.isEncoderDecoder();
  at::TensorOptions ids = at::TensorOptions().dtype(at::kLong).device(device);
  // The bytes a forward (and the loss) at r rows allocates, its graph kept
  // for the backward as a step keeps it. (Collective under ZeRO.)
  auto measure = [&](int64_t r) {
    ModelInputs in;
    in.inputIds = at::zeros({r, length}, ids);
    if (encoderDecoder)
      in.decoderInputIds = at::zeros({r, target}, ids);
    at::Tensor labels = at::zeros({r, encoderDecoder ? target : length}, ids);
    std::optional<fusion::KernelRecorder> dryRun;
    std::optional<fusion::RecordingScope> recording;
    if (model.usesFusedKernels()) { // (compiles nothing for these shapes)
      dryRun.emplace(/*dryRun=*/true);
      recording.emplace(model.fusedRegions(), &*dryRun);
    }
    return peakBytesDuring(device, [&] {
      c10::AutoGradMode grad(true);
      if (model.takesLabels()) {
        in.labels = labels;
        at::Tensor loss = model.forwardLoss(in).loss;
      } else {
        at::Tensor loss = model.loss(model.forward(in), labels);
      }
    });
  };
  int64_t one = 0, two = 0;
  try {
    measure(1); // (a first forward allocates what stays: cuBLAS workspaces, caches)
    one = measure(1);
    two = measure(2);
  } catch (const ExecutionError &) {
    return; // a program fixed to other shapes: the probe at the run's shape says so
  }
  const double perRow = static_cast<double>(std::max<int64_t>(two - one, 0));
  const double need = static_cast<double>(std::max<int64_t>(one, 0)) - perRow +
                      perRow * static_cast<double>(rows);
  AvailableMemory available = availableMemory(device);
  if (available.bytes < 0)
    return;
  // CPU ranks of one host share its memory.
  int64_t sharing = 1;
  if (device.is_cpu())
    if (const char *v = std::getenv("LOCAL_WORLD_SIZE"))
      sharing = std::max<int64_t>(std::atoll(v), 1);
  const double have = static_cast<double>(available.bytes) / static_cast<double>(sharing);
  if (need <= have)
    return;
  // (PreflightError, printed by each rank that refuses: the ranks' free memory may differ.)
  throw PreflightError(
      shape + ": a forward of this micro-batch allocates at least " + formatMemory(need) +
      " on each rank (measured at 1 and 2 rows: " + formatMemory(perRow) +
      " a row), more than the " + formatMemory(have) + " " + available.source +
      (sharing > 1 ? " shared by its " + std::to_string(sharing) + " ranks" : std::string()) +
      "; lower --micro-batch (a larger --grad-accum keeps the batch) or --seq-len, or pass "
      "--no-memory-check");
}

namespace {

/// The vocabulary the last stage's results show.
int64_t vocabularyOf(Model &model, std::vector<std::pair<std::string, c10::IValue>> &results) {
  int64_t vocab = 0;
  if (model.takesLabels()) {
    ModelLoss loss = model.lossOf(results);
    vocab = loss.logits.defined() ? loss.logits.size(-1) : std::numeric_limits<int64_t>::max();
  } else {
    const c10::IValue *logits = &results.at(0).second;
    for (const auto &[name, value] : results)
      if (name == "logits")
        logits = &value;
    if (!logits->isTensor())
      throw ExecutionError("the model's logits result is not a tensor");
    // (vocab-parallel: this rank's part of them)
    vocab = model.plan().vocabParallel ? model.plan().vocabSize : logits->toTensor().size(-1);
  }
  return vocab;
}

/// probeVocabulary's forward through a pipeline's stages (each receives
/// what enters it, runs its part, sends what leaves it; a stage's chunks
/// in turn); the vocabulary the last stage finds, agreed by every rank
/// (collective).
int64_t probePipelineVocabulary(Model &model, const ModelInputs &probe) {
  Comm &world = model.world();
  int64_t vocab = 0;
  for (int64_t v = 0; v < model.pipelineVirtualStages(); ++v) {
    model.selectPipelineChunk(v);
    const int64_t rank = world.rank(), previous = model.pipelinePreviousRank(),
                  next = model.pipelineNextRank();
    if (!model.isFirstChunk())
      model.setStageInputs(recvValues(
          model.pipelineChannel(PipelineTransfer::Activations, previous, rank), previous,
          model.device()));
    std::vector<std::pair<std::string, c10::IValue>> results = model.forwardAll(probe);
    if (!model.isLastStage())
      sendValues(model.pipelineChannel(PipelineTransfer::Activations, rank, next),
                 model.takeStageOutputs(), next);
    else
      vocab = vocabularyOf(model, results);
  }
  model.selectPipelineChunk(0);
  at::Tensor v = at::tensor({vocab}, at::kLong);
  if (world.backend() != "local")
    v = v.to(world.device());
  world.allReduce(v, ReduceOp::Max)->wait();
  return v.cpu().item<int64_t>();
}

/// Puts the default generators (the CPU's and the run device's) back as they
/// were: the probes' forwards draw dropout masks, and step 1 must draw the
/// first numbers of --seed's stream.
class GeneratorStatesGuard {
public:
  explicit GeneratorStatesGuard(at::Device device) {
    save(at::detail::getDefaultCPUGenerator());
    if (!device.is_cpu())
      save(at::globalContext().defaultGenerator(device));
  }
  ~GeneratorStatesGuard() {
    for (auto &[generator, state] : saved_) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state);
    }
  }

private:
  void save(at::Generator generator) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    saved_.emplace_back(generator, generator.get_state());
  }
  std::vector<std::pair<at::Generator, at::Tensor>> saved_;
};

} // namespace

int64_t probeVocabulary(Model &model, const ProbeShape &s) {
  const bool encoderDecoder = model.isEncoderDecoder();
  const at::Device device = model.device();
  int64_t vocab = 0;
  c10::NoGradGuard noGrad;
  GeneratorStatesGuard generators(device);
  const int64_t rows = s.rows, length = s.length, target = s.target;
  // A --sequence-parallel plan (its tp_reduce_scatter instructions) splits
  // the sequence over the T ranks of a TP group.
  const plan::Plan &p = model.plan();
  const bool sequenceParallel =
      p.tensorParallel > 1 &&
      std::any_of(p.functions.begin(), p.functions.end(), [](const plan::Function &f) {
        for (const plan::Instruction &inst : f.body)
          if (inst.kind == plan::Instruction::Kind::TpReduceScatter)
            return true;
        return false;
      });
  if (sequenceParallel && length % p.tensorParallel != 0) {
    const std::string t = std::to_string(p.tensorParallel);
    throw ConfigError(
        s.archive + " was compiled with --sequence-parallel, which splits the sequence over the " +
        t + " ranks of a tensor-parallel group, so the sequence length must be a multiple of " +
        t + "; " +
        (s.fixedShape ? s.shape + " holds sequences of " + std::to_string(length) + " tokens"
             : "--seq-len is " + std::to_string(length)));
  }
  checkPositions(s.archive, s.hfFiles, length, s.shape);
  if (s.checkMemory && model.pipelineStages() == 1) // (a stage's forward alone cannot run)
    checkMemory(model, rows, length, target, s.shape, s.measureMemory);
  at::TensorOptions ids = at::TensorOptions().dtype(at::kLong).device(device);
  ModelInputs probe;
  probe.inputIds = at::zeros({rows, length}, ids);
  if (encoderDecoder)
    probe.decoderInputIds = at::zeros({rows, target}, ids);
  std::vector<std::pair<std::string, c10::IValue>> results;
  // Only the results' shapes are read: on a GPU the fused regions compute
  // (and compile) nothing here; their kernels are compiled before step 1.
  std::optional<fusion::KernelRecorder> dryRun;
  std::optional<fusion::RecordingScope> recording;
  if (model.usesFusedKernels()) {
    dryRun.emplace(/*dryRun=*/true);
    recording.emplace(model.fusedRegions(), &*dryRun);
  }
  if (model.takesLabels())
    probe.labels = at::zeros({rows, encoderDecoder ? target : length}, ids);
  try {
    if (model.pipelineStages() > 1)
      return probePipelineVocabulary(model, probe);
    if (model.takesLabels())
      results = model.forwardAll(probe);
    else {
      at::Tensor logits = model.forward(probe); // (vocab-parallel: this rank's part of them)
      vocab = model.plan().vocabParallel ? model.plan().vocabSize : logits.size(-1);
    }
  } catch (const ExecutionError &e) {
    std::string shape = std::to_string(rows) + " x " + std::to_string(length) +
                        (encoderDecoder ? " (decoder " + std::to_string(target) + ")" : "");
    throw PreflightError(s.runName +
                  ": the model cannot run a micro-batch of " + shape +
                  " tokens (it may have fewer positions, or be a torch.export program fixed "
                  "to other shapes): " + e.what());
  }
  // --batches with --eval-data: the evaluation's micro-batches are
  // --micro-batch x --seq-len, another shape, found here too (not after
  // the training's steps).
  if (s.evalShape && !encoderDecoder && !model.takesLabels() &&
      (s.evalShape->first != rows || s.evalShape->second != length)) {
    const int64_t microBatch = s.evalShape->first, seqLen = s.evalShape->second;
    ModelInputs eval;
    eval.inputIds = at::zeros({microBatch, seqLen}, ids);
    try {
      model.forward(eval);
    } catch (const ExecutionError &e) {
      throw PreflightError("--eval-data with --micro-batch " + std::to_string(microBatch) +
                    " --seq-len " + std::to_string(seqLen) +
                    ": the model cannot run an evaluation micro-batch of " +
                    std::to_string(microBatch) + " x " + std::to_string(seqLen) +
                    " tokens (it may have fewer positions, or be a torch.export program fixed "
                    "to other shapes; set --seq-len to the batches' " + std::to_string(length) +
                    "): " + e.what());
    }
  }
  // A model computing its own loss: its result must be a scalar (an
  // ExecutionError naming it, before any training); one that returns no
  // logits leaves the vocabulary unknown (an id outside it fails in the
  // model's embedding).
  if (model.takesLabels()) {
    ModelLoss loss = model.lossOf(results);
    return loss.logits.defined() ? loss.logits.size(-1) : std::numeric_limits<int64_t>::max();
  }
  return vocab;
}

} // namespace bmt::runtime
