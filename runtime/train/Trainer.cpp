//===- Trainer.cpp - the training and evaluation loops --------------------===//

#include "bmt/Runtime/train/Trainer.h"
#include "bmt/Runtime/Env.h"
#include "bmt/Runtime/train/Inspect.h"
#include "bmt/Runtime/optim/LossScaler.h"
#include "bmt/Runtime/optim/Optimizer.h"
#include "bmt/Runtime/train/Profile.h"
#include "bmt/Runtime/train/StopSignal.h"
#include "bmt/Support/ErrorText.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#include <ATen/Context.h>

#include <algorithm>
#include <chrono>
#include <tuple>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>

namespace bmt::runtime {

std::optional<Objective> parseObjective(const std::string &name) {
  for (Objective o : {Objective::CausalLM, Objective::MaskedLM, Objective::SpanCorruption})
    if (name == objectiveName(o))
      return o;
  return std::nullopt;
}

const char *objectiveName(Objective objective) {
  switch (objective) {
  case Objective::CausalLM:
    return "causal-lm";
  case Objective::MaskedLM:
    return "masked-lm";
  case Objective::SpanCorruption:
    return "span-corruption";
  }
  return "?";
}

at::Tensor modelLabels(Objective objective, const at::Tensor &targets) {
  if (objective != Objective::CausalLM)
    return targets;
  at::Tensor first = at::full({targets.size(0), 1}, -100, targets.options());
  return at::cat({first, targets.slice(1, 0, targets.size(1) - 1)}, 1);
}

Objective objectiveForModel(std::optional<Objective> requested, bool encoderDecoder,
                            const std::string &planObjective) {
  Objective chosen = requested               ? *requested
                     : encoderDecoder        ? Objective::SpanCorruption
                     : parseObjective(planObjective).value_or(Objective::CausalLM);
  if (encoderDecoder && chosen != Objective::SpanCorruption)
    throw std::invalid_argument(std::string("the model is an encoder-decoder (its forward takes "
                                            "decoder_input_ids); it trains with --objective "
                                            "span-corruption, not ") + objectiveName(chosen));
  if (!encoderDecoder && chosen == Objective::SpanCorruption)
    throw std::invalid_argument("--objective span-corruption trains an encoder-decoder (a "
                                "forward taking decoder_input_ids, such as T5); this model is "
                                "not one");
  return chosen;
}

Trainer::Trainer(Model &model, TrainConfig config, std::ostream &out,
                 std::ostream *jsonLog)
    : model_(model), config_(std::move(config)), out_(out),
      metrics_(out, jsonLog, config_.logEvery), rng_(config_.seed),
      lossScale_(config_.lossScale) {
  // The optimizer on the device (Optimizers.h), or, offloading
  // (--offload-optimizer), Adam/AdamW with its masters and moments in host
  // memory, fed by the gradient copies the ZeRO storage makes during the
  // backward (OffloadAdam.h).
  optimizer_ = model_.makeOptimizer(config_.optimizer, config_.gradAccum);
  // Mixed precision: AdamW/Adam on CUDA write the bf16/fp16 ZeRO shards in
  // their update, from the gradients as reduced, when nothing else reads
  // those between the backward and the step: one micro-batch a step (the
  // gradients of several are summed in float32 as before), no loss scaling
  // (unscaling rounds in the gradients' dtype), no inspection statistics.
  if (config_.gradAccum == 1 && config_.lossScale <= 0 && config_.inspectEvery == 0)
    model_.letOptimizerWriteShards(*optimizer_);
  if (config_.lossScale > 0)
    scaler_.emplace(config_.lossScale, config_.lossScaleFactor, config_.lossScaleWindow,
                    std::min(config_.minLossScale, config_.lossScale), model_.device());
}

Trainer::~Trainer() = default;

void Trainer::setCheckpoints(CheckpointOptions options, RunIdentity identity) {
  identity.optimizer = std::string(model_.offloadsOptimizer() ? "offload-" : "") +
                       optimizerKindName(config_.optimizer.kind);
  identity.lr = config_.schedule.peakLR;
  identity.optimizerConfig = config_.optimizer;
  identity.schedule = config_.schedule;
  checkpoints_.emplace(std::move(options), std::move(identity));
}

ResumeReport Trainer::resume(const std::string &folder) {
  ResumeReport report = loadCheckpoint(folder, model_, *optimizer_, scaler_ ? &*scaler_ : nullptr,
                                       &config_.optimizer);
  startStep_ = report.progress.step;
  resumePosition_ = report.progress.data;
  std::istringstream in(report.progress.objectiveGenerator);
  std::mt19937_64 rng;
  in >> rng;
  if (in.fail())
    throw CheckpointError(folder + "/checkpoint.json: objective_rng is not a generator state");
  rng_ = rng;
  if (scaler_ && report.progress.lossScale)
    lossScale_ = *report.progress.lossScale;
  return report;
}

void Trainer::reportCheckpoint(const CheckpointResult &r) {
  if (model_.world().rank() != 0) {
    // Rank 0 reports every save; a rank says why its own part failed.
    if (!r.ok)
      bmt::writeErrorLine("warning: rank " + std::to_string(model_.world().rank()) +
                          ": checkpoint step " + std::to_string(r.step) + " failed: " + r.error);
    lastSaveResult_ = r;
    return;
  }
  lastSaveResult_ = r;
  metrics_.checkpoint(r.step, r.ok, r.ok ? r.path : r.error, r.bytes, r.writeSeconds,
                      saveHeldSeconds_, r.step == lastSaveStep_);
}

namespace {

/// Multiplies every gradient of `params` by 1 / scale (`scale`: one element
/// on `device`) and returns a float32 flag of one element on `device`,
/// non-zero when any of them holds an inf or NaN on any rank of `world`
/// (all-reduce Max of the local flags; collective). No host sync.
at::Tensor unscaleAndCheckGradients(const std::vector<at::Tensor> &params,
                                    const at::Tensor &scale, Comm &world, at::Device device) {
  c10::NoGradGuard noGrad;
  at::TensorOptions options = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor found = at::zeros({1}, options);
  at::Tensor inv = scale.reciprocal().to(device, at::kFloat);
  for (const at::Tensor &p : params) {
    const at::Tensor &grad = p.grad();
    if (!grad.defined())
      continue;
    // One kernel: found |= !isfinite(grad); grad *= inv (as torch.amp's
    // GradScaler.unscale_).
    at::Tensor f = grad.device() == device ? found : at::zeros({1}, options.device(grad.device()));
    at::_amp_foreach_non_finite_check_and_unscale_({grad}, f, inv.to(grad.device()));
    if (grad.device() != device)
      found.add_(f.to(device));
  }
  if (world.size() > 1) {
    if (found.device() != world.device() && world.backend() != "local")
      found = found.to(world.device());
    world.allReduce(found, ReduceOp::Max)->wait();
    found = found.to(device);
  }
  return found;
}

/// Copies a token window to `device`: on CUDA from pinned memory without
/// blocking the host (the caching host allocator keeps the pinned buffer
/// until the copy is done).
at::Tensor toDevice(const at::Tensor &t, at::Device device) {
  if (!device.is_cuda())
    return t.to(device);
  return t.contiguous().pin_memory().to(device, /*non_blocking=*/true);
}

/// `v` as the shortest of "%g"'s forms ("1", "0.5", "65536").
std::string formatNumber(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

} // namespace

Trainer::MicroBatchLoss Trainer::microBatchLoss(const MicroBatch &micro,
                                                std::mt19937_64 &rng) {
  const at::Device device = model_.device();
  // 1. The model's inputs and the labels (-100: not a target) of the whole
  // batch. It is corrupted the same way on every rank (the same generator,
  // the same rows), then each rank takes its own rows: a row's corruption
  // does not depend on which rank trains it.
  at::Tensor inputIds, decoderInputIds, labels, attentionMask, positionIds;
  if (!micro.window.defined()) { // ready encoder-decoder pairs
    inputIds = micro.inputIds;
    labels = micro.labels;
    decoderInputIds = shiftRight(labels, config_.spanCorruption.decoderStartId,
                                 config_.spanCorruption.decoderPadId);
  } else {
    const int64_t seq = micro.window.size(1) - 1;
    switch (config_.objective) {
    case Objective::MaskedLM:
      std::tie(inputIds, labels) = maskTokens(micro.window.slice(1, 0, seq), config_.maskId,
                                              config_.vocabSize, config_.maskProb, rng);
      break;
    case Objective::SpanCorruption: {
      Seq2SeqBatch b = spanCorruption(micro.window, config_.spanCorruption, rng);
      inputIds = b.inputIds;
      labels = b.labels;
      decoderInputIds = b.decoderInputIds;
      break;
    }
    case Objective::CausalLM:
      inputIds = micro.window.slice(1, 0, seq);
      labels = micro.window.slice(1, 1, seq + 1);
      break;
    }
    // Documents (DocumentBatches): position t predicts token t + 1 only
    // where that token is a target of t's document; padding is not attended
    // (padded rows: attention_mask) or is a sequence of its own (packed
    // rows: position_ids restart at 0 at each document). A plan compiled
    // assuming attention_mask all ones gets all ones (Model's default):
    // right padding comes after every token of its row, and a causal LM's
    // output at a token depends on the tokens up to it only, so the loss on
    // the row's targets is the same as with the padding term.
    if (micro.targets.defined()) {
      labels = labels.masked_fill(micro.targets.slice(1, 1, seq + 1).logical_not(), -100);
      if (micro.positionIds.defined())
        positionIds = micro.positionIds.slice(1, 0, seq);
      else if (micro.attentionMask.defined() &&
               !model_.plan().assumes(plan::kAssumeAttentionMaskAllOnes))
        attentionMask = micro.attentionMask.slice(1, 0, seq);
    }
  }
  const bool global = micro.rowEnd >= 0;
  auto own = [&](const at::Tensor &t) {
    return global && t.defined() ? t.slice(0, micro.rowBegin, micro.rowEnd).contiguous()
                                 : t.contiguous();
  };
  // Counted on the host (the batch is still there): no synchronisation.
  // Input tokens are those that are not padding.
  auto realTokens = [&](const at::Tensor &ids, bool ownRows) -> int64_t {
    if (!micro.targets.defined() || !micro.attentionMask.defined())
      return ids.numel();
    at::Tensor m = micro.attentionMask.slice(1, 0, ids.size(1));
    return (ownRows && global ? m.slice(0, micro.rowBegin, micro.rowEnd) : m).sum().item<int64_t>();
  };
  at::Tensor ownIds = own(inputIds), ownLabels = own(labels);
  MicroBatchLoss result;
  result.predicted = ownLabels.ne(-100).sum().item<int64_t>();
  result.batchPredicted = global ? labels.ne(-100).sum().item<int64_t>() : result.predicted;
  result.inputTokens = realTokens(ownIds, true);
  result.batchInputTokens = global ? realTokens(inputIds, false) : result.inputTokens;

  // 2. The forward and the loss.
  ModelInputs inputs;
  inputs.inputIds = toDevice(ownIds, device);
  if (attentionMask.defined())
    inputs.attentionMask = toDevice(own(attentionMask), device);
  if (positionIds.defined())
    inputs.positionIds = toDevice(own(positionIds), device);
  if (decoderInputIds.defined())
    inputs.decoderInputIds = toDevice(own(decoderInputIds), device);
  if (config_.modelLoss)
    return modelMicroBatchLoss(std::move(inputs), own(modelLabels(config_.objective, labels)),
                               result);
  at::Tensor logits = model_.forward(inputs);
  if (result.predicted == 0) { // nothing to predict here; still a backward for the collectives
    result.loss = logits.sum().mul(0.0);
    return result;
  }
  result.loss = model_.loss(logits, toDevice(ownLabels, device));
  if (global) {
    // The ranks average their gradients and losses: weight this rank's mean
    // by its share of the batch's predicted tokens, so that the average is
    // the mean over all of them (as one process with the whole batch).
    // (Tensor parallelism: the ranks of a TP group share their rows.)
    const int64_t ranks = model_.dataParallel().size();
    if (result.predicted * ranks != result.batchPredicted)
      result.loss = result.loss.mul(static_cast<double>(result.predicted * ranks) /
                                    static_cast<double>(result.batchPredicted));
  }
  return result;
}

Trainer::MicroBatchLoss Trainer::modelMicroBatchLoss(ModelInputs inputs,
                                                     const at::Tensor &labels,
                                                     MicroBatchLoss counts) {
  const int64_t predicted = labels.ne(-100).sum().item<int64_t>(); // on the host
  inputs.labels = toDevice(labels, model_.device());
  ModelLoss result = model_.forwardLoss(inputs);
  // Nothing to predict in this rank's rows (transformers' mean is then
  // NaN): a zero loss, still with a backward for the collectives, through
  // the logits where the model returns them (not through the NaN; a model
  // returning its loss alone gets that loss's own gradient).
  if (predicted == 0)
    counts.loss =
        (result.logits.defined() ? result.logits.sum() : result.loss.nan_to_num()).mul(0.0);
  else // the model's reduction is its own (a token mean, a sum, extra terms):
    counts.loss = result.loss; // each rank's loss counts equally, as in a user's loop
  counts.predicted = predicted;
  return counts;
}

EvalResult Trainer::evaluate(const TokenFile &data, int64_t seqLen, int64_t microBatch,
                             int64_t maxBatches) {
  c10::NoGradGuard noGrad;
  // Token windows in order, or (TrainConfig::evalDocuments) the documents in
  // file order, micro-batch after micro-batch (the positions where each
  // micro-batch starts, found by one pass).
  std::optional<BatchSampler> sampler;
  std::optional<DocumentBatches> documents;
  std::vector<DataPosition> starts;
  int64_t n = 0;
  if (config_.evalDocuments) {
    documents.emplace(data, *config_.evalDocuments, microBatch, seqLen + 1, config_.seed,
                      /*shuffle=*/false, 0, 1);
    while (!documents->exhausted() && (maxBatches <= 0 || n < maxBatches)) {
      starts.push_back(documents->position());
      documents->next();
      ++n;
    }
  } else {
    sampler.emplace(data, microBatch, seqLen, config_.seed);
    n = sampler->numSequentialBatches();
  }
  if (maxBatches > 0)
    n = std::min(n, maxBatches);
  auto batch = [&](int64_t i) -> MicroBatch {
    if (sampler)
      return {sampler->sequential(i)};
    documents->seek(starts[i]);
    return documents->next();
  };
  // Batch i goes to rank i % W. Every rank runs the same number of
  // forwards (they are collective under ZeRO): a rank without a batch of
  // its own in the last round runs batch 0 and does not count it. (Tensor
  // parallelism: W counts data-parallel ranks; a TP group shares a batch.)
  Comm &world = model_.dataParallel();
  int64_t ranks = world.size(), rank = world.rank();
  double sum = 0;
  double tokens = 0;
  for (int64_t round = 0; round * ranks < n; ++round) {
    int64_t i = round * ranks + rank;
    bool counted = i < n;
    std::mt19937_64 rng(config_.seed + 1 + static_cast<uint64_t>(counted ? i : 0)); // masked-LM masks
    MicroBatchLoss result = microBatchLoss(batch(counted ? i : 0), rng);
    if (counted) {
      sum += result.loss.item<double>() * static_cast<double>(result.predicted);
      tokens += static_cast<double>(result.predicted);
    }
  }
  if (ranks > 1) {
    at::Tensor totals = at::tensor({sum, tokens}, at::TensorOptions().dtype(at::kDouble));
    if (world.backend() != "local")
      totals = totals.to(world.device());
    world.allReduce(totals)->wait();
    totals = totals.cpu();
    sum = totals[0].item<double>();
    tokens = totals[1].item<double>();
  }
  EvalResult r;
  r.tokens = static_cast<int64_t>(tokens);
  r.loss = tokens > 0 ? sum / tokens : std::nan("");
  r.perplexity = std::exp(r.loss);
  return r;
}

/// What a step leaves for its report: its values on the device, copied to
/// the host without blocking, and an event that says when they are there.
/// On CUDA the step is reported after the next one has been queued, so
/// that reading the loss never stalls the GPU (no host synchronisation
/// inside a step); on the CPU at once.
void Trainer::reportEvaluation(int64_t step, const EvalResult &r) {
  if (model_.world().rank() == 0)
    metrics_.evaluation(step, r);
}

struct Trainer::PendingStep {
  int64_t step = 0;
  double lr = 0;
  int64_t tokens = 0;  ///< input tokens of all ranks (without padding)
  int64_t targets = 0; ///< predicted (target) tokens of all ranks
  /// float64 [gradAccum + 7]: losses, grad norm, found inf, scale, next
  /// scale, and the requests summed over the ranks (ranks that received
  /// SIGTERM, SIGINT; rank 0's timed save)
  at::Tensor values;
  std::optional<c10::Event> ready;
  std::chrono::steady_clock::time_point queued; ///< when the host had queued all its work
  double hostSeconds = 0; ///< how long the host took to queue it (queueStep)
  std::vector<MicroBatch> batches; ///< and the generator before them: to replay a failed step
  std::mt19937_64 rng;
};

/// The environment's test and diagnostic hooks (Trainer.h), read once a run.
struct Trainer::DebugHooks {
  /// BMT_DEBUG_INJECT_INF_STEP ("k" or "k-l": steps k..l) / _RANK
  int64_t injectInfStep = 0, injectInfLast = 0, injectInfRank = 0;
  int64_t exitAfterStep = 0;                    ///< BMT_DEBUG_EXIT_AFTER_STEP
  bool syncDebug = false;                       ///< BMT_DEBUG_SYNC=1 on CUDA
};

namespace {

Trainer::DebugHooks debugHooksFromEnvironment(at::Device device) {
  Trainer::DebugHooks hooks;
  const env::InjectInf inf = env::debugInjectInf();
  hooks.injectInfStep = inf.first;
  hooks.injectInfLast = inf.last;
  hooks.injectInfRank = inf.rank;
  hooks.exitAfterStep = env::debugExitAfterStep();
  hooks.syncDebug = env::debugSync() && device.is_cuda();
  return hooks;
}

} // namespace

/// Queues one optimizer step (gradAccum micro-batches forward and backward,
/// gradient synchronisation, unscaling and the overflow check, clipping and
/// the update, the loss scale's update) without waiting for the device, and
/// returns what report() reads once it has run.
Trainer::PendingStep Trainer::queueStep(int64_t step, MicroBatchSource &source,
                                        const DebugHooks &hooks) {
  Optimizer &optimizer = *optimizer_;
  LossScaler *scaler = scaler_ ? &*scaler_ : nullptr;
  std::mt19937_64 &rng = rng_;
  const at::Device device = model_.device();
  Comm &world = model_.world();
  const at::TensorOptions doubles = at::TensorOptions().dtype(at::kDouble).device(device);
  PendingStep current;
  current.step = step;
  current.lr = learningRate(config_.schedule, step);
  std::vector<at::Tensor> losses;
  optimizer.zeroGrad();
  current.rng = rng;
  inspector_->beginStep(step);
  for (int64_t micro = 0; micro < config_.gradAccum; ++micro) {
    current.batches.push_back(source.next());
    MicroBatchLoss result = microBatchLoss(current.batches.back(), rng);
    at::Tensor loss = result.loss;
    losses.push_back(loss.detach().reshape({1}).to(at::kDouble));
    at::Tensor objective = loss.div(static_cast<double>(config_.gradAccum));
    if (scaler)
      objective = objective.mul(scaler->scale().to(objective.scalar_type()).reshape({}));
    objective.backward();
    current.tokens += result.batchInputTokens;
    current.targets += result.batchPredicted;
  }
  // A step whose global batch has no target token (supervised data whose
  // loss mask is 0 there, or cut off) has nothing to learn from: its update
  // is skipped on every rank (they all see the same global batch). Its
  // gradients are zero, and an AdamW step on them would still move the
  // weights (decay and the moments).
  const bool noTargets = current.targets == 0;
  model_.synchronizeGradients();
  if (step >= hooks.injectInfStep && step <= hooks.injectInfLast && hooks.injectInfStep > 0 &&
      world.rank() == hooks.injectInfRank)
    for (const at::Tensor &p : model_.parameters())
      if (p.grad().defined()) {
        c10::NoGradGuard noGrad;
        p.grad().view({-1})[0].fill_(std::numeric_limits<double>::infinity());
        break;
      }
  std::optional<at::Tensor> found;
  at::Tensor stepScale = at::zeros({1}, doubles);
  if (scaler) {
    stepScale = scaler->scale().clone();
    found = unscaleAndCheckGradients(model_.parameters(), stepScale, world, device);
  }
  inspector_->afterGradients(step);
  // Clipping and the update happen on the device; a step with an inf/NaN
  // gradient on any rank (fp16) is skipped by the fused kernel itself.
  // Every optimizer applies the clip factor itself, the fused ones inside their
  // fused kernel, the offloaded one on the host.
  at::Tensor gradNorm = model_.gradNorm().to(device, at::kDouble);
  // (The offloaded one gives the host copies of the gradients the same
  // unscaling and clipping.) A checkpoint's snapshot of the state must be
  // taken before the update changes it. Without loss scaling, a non-finite
  // norm stops training: that step and any queued after it leave the
  // weights as they are, for the replay that looks for the source
  // (Inspect.h).
  if (saver_)
    saveHeldSeconds_ += saver_->beforeStateChange();
  std::optional<at::Tensor> skip = scaler ? found : inspector_->haltOnNonFinite(gradNorm);
  if (noTargets)
    skip = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  optimizer.step({current.lr, skip,
                   scaler ? std::optional<at::Tensor>(stepScale) : std::nullopt, gradNorm,
                   config_.clipGrad});
  model_.afterOptimizerStep();
  if (scaler && !noTargets)
    scaler->update(*found);

  // The step's values: the micro-batch losses averaged over ranks (one
  // all-reduce, which also carries each rank's requests: a stop signal
  // received, rank 0's timed save), the grad norm, the overflow flag and
  // the loss scales.
  const int signal = stopSignal();
  double timedSave = 0;
  if (saver_ && config_.saveEveryMinutes > 0 && world.rank() == 0 &&
      std::chrono::duration<double>(std::chrono::steady_clock::now() - lastSaveMark_).count() >=
          config_.saveEveryMinutes * 60) {
    timedSave = 1;
    lastSaveMark_ = std::chrono::steady_clock::now();
  }
  at::Tensor requests =
      at::tensor({signal == SIGTERM ? 1.0 : 0.0, signal == SIGINT ? 1.0 : 0.0, timedSave},
                 at::TensorOptions().dtype(at::kDouble));
  const int64_t m = config_.gradAccum;
  at::Tensor reduced = at::cat({at::cat(losses).to(device), toDevice(requests, device)});
  if (world.size() > 1) {
    at::Tensor t = reduced;
    if (t.device() != world.device() && world.backend() != "local")
      t = t.to(world.device());
    world.allReduce(t)->wait();
    reduced = t.to(device);
  }
  at::Tensor lossValues = reduced.slice(0, 0, m);
  if (world.size() > 1)
    lossValues = lossValues.div(static_cast<double>(world.size()));
  at::Tensor values = at::cat({lossValues, gradNorm.reshape({1}),
                               found ? found->to(at::kDouble).reshape({1}) : at::zeros({1}, doubles),
                               stepScale, scaler ? scaler->scale().reshape({1}) : at::zeros({1}, doubles),
                               reduced.slice(0, m)});
  if (hooks.syncDebug)
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  if (device.is_cuda()) {
    current.values = at::empty(values.sizes(), at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
    current.values.copy_(values, /*non_blocking=*/true);
    current.ready.emplace(c10::DeviceType::CUDA);
    current.ready->record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
  } else {
    current.values = values.cpu();
  }
  return current;
}

Trainer::KernelPrewarm Trainer::prewarmFusedKernels(MicroBatchSource &source,
                                                    const fusion::PrewarmOptions &options) {
  KernelPrewarm result;
  std::vector<fusion::FusedRegion *> regions = model_.fusedRegions();
  if (regions.empty())
    return result;
  const auto start = std::chrono::steady_clock::now();
  // The step's own first micro-batch, read ahead and put back; the
  // objective's draws and the device's generator (dropout) are restored
  // after, so that the steps run as without the dry run.
  const DataPosition position = source.position();
  MicroBatch batch = source.next();
  source.seek(position);
  std::mt19937_64 rng = rng_;
  const at::Device device = model_.device();
  std::vector<at::Device> devices{at::Device(at::kCPU)};
  if (!device.is_cpu())
    devices.push_back(device);
  std::vector<std::pair<at::Generator, at::Tensor>> generators;
  for (const at::Device &d : devices) {
    at::Generator g = at::globalContext().defaultGenerator(d);
    generators.emplace_back(g, g.get_state());
  }
  fusion::KernelRecorder recorder(/*dryRun=*/true);
  {
    fusion::RecordingScope recording(regions, &recorder);
    // As queueStep runs a micro-batch: the same tensors reach the regions.
    at::Tensor objective =
        microBatchLoss(batch, rng).loss.div(static_cast<double>(config_.gradAccum));
    if (scaler_)
      objective = objective.mul(scaler_->scale().to(objective.scalar_type()).reshape({}));
    objective.backward();
  }
  model_.synchronizeGradients(); // (collective: the reduce-scatters the backward started)
  optimizer_->zeroGrad();
  for (auto &[generator, state] : generators)
    generator.set_state(state);
  result.dryRunSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.requests = recorder.requests();
  result.compiled = fusion::prewarm(result.requests, options);
  return result;
}

TrainOutcome Trainer::train(MicroBatchSource &source, const TokenFile *evalData, int64_t seqLen,
                    int64_t microBatch) {
  const bool rank0 = model_.world().rank() == 0;
  const at::Device device = model_.device();
  if (resumePosition_) {
    try {
      source.seek(*resumePosition_);
    } catch (const std::invalid_argument &e) {
      throw CheckpointError(std::string("resuming: ") + e.what());
    }
  }
  using Clock = std::chrono::steady_clock;
  // Nothing to train (resumed at or past config.steps): no saver, so no host
  // buffers and no line promising checkpoints.
  if (checkpoints_ && !saver_ && startStep_ < config_.steps) {
    const auto t0 = Clock::now();
    CheckpointOptions options = checkpoints_->first;
    options.startStep = startStep_; // no checkpoint of a later step in options.dir
    saver_ = std::make_unique<CheckpointSaver>(model_, *optimizer_, scaler_ ? &*scaler_ : nullptr,
                                               options, checkpoints_->second);
    if (rank0) {
      const CheckpointOptions &c = checkpoints_->first;
      out_ << "bmt-run: checkpoints in " << c.dir << " after "
           << (c.every > 0 ? "every " + std::to_string(c.every) + " steps and " : std::string())
           << (config_.saveEveryMinutes > 0
                   ? "every " + formatNumber(config_.saveEveryMinutes) + " minutes and "
                   : std::string())
           << "the last step" << (c.keep > 0 ? ", keeping " + std::to_string(c.keep) : "")
           << "; host buffers of " << saver_->hostBytes() << " bytes on rank 0 ("
           << std::fixed << std::setprecision(1)
           << std::chrono::duration<double>(Clock::now() - t0).count() << " s)"
           << std::defaultfloat << "\n";
      const std::vector<std::string> &dead = saver_->removedDeadSaves();
      if (!dead.empty()) {
        out_ << "bmt-run: note: removed " << dead.size() << " incomplete save"
             << (dead.size() == 1 ? "" : "s") << " of an earlier run from " << c.dir << ":";
        for (const std::string &name : dead)
          out_ << " " << name;
        out_ << "\n";
      }
    }
  }
  // The fused kernels of the steps, compiled before the first one.
  const bool fusedKernels = model_.usesFusedKernels() && startStep_ < config_.steps;
  if (fusedKernels && config_.prewarmKernels) {
    KernelPrewarm p = prewarmFusedKernels(source);
    if (rank0)
      out_ << "bmt-run: compiled " << p.compiled.kernels << " fused kernels in " << std::fixed
           << std::setprecision(1) << p.compiled.seconds << " s (" << p.compiled.cached
           << " cached; " << p.compiled.installed << " uses found by a dry run of one micro-batch in "
           << std::setprecision(2) << p.dryRunSeconds << " s)" << std::defaultfloat << "\n";
  }
  lazyKernelsAtStart_ = fusion::FusedRegion::lazyKernels();
  gradientsInPlaceAtStart_ = model_.gradientsWrittenInPlace();
  recomputeSkipsAtStart_ = model_.recomputeSkips();
  auto start = Clock::now();
  auto lastReport = start;
  double numParams = static_cast<double>(model_.numParameters());
  const DebugHooks hooks = debugHooksFromEnvironment(device);
  LossScaler *scaler = scaler_ ? &*scaler_ : nullptr;
  const double minScale = std::min(config_.minLossScale, config_.lossScale);
  int64_t minScaleSkips = 0;
  inspector_ = std::make_unique<Inspector>(model_, config_.inspectEvery);
  // A step that ran into a non-finite value: replayed to name its source.
  auto stopAt = [&](const PendingStep &p, const std::string &what,
                    const std::string &stopping = "stopping") {
    StepReplay replay{p.step, static_cast<int64_t>(p.batches.size()), p.rng,
                      [&](int64_t m, std::mt19937_64 &r) { return microBatchLoss(p.batches[m], r).loss; },
                      [&] { optimizer_->zeroGrad(); }};
    return TrainingError(what + "; " + inspector_->locateNonFinite(replay) + "; " + stopping);
  };
  auto runEval = [&](int64_t step) {
    if (!evalData)
      return;
    reportEvaluation(step, evaluate(*evalData, seqLen, microBatch, config_.evalBatches));
  };

  // Requests carried by the steps' values (a stop signal, a timed save).
  const int64_t lag = device.is_cuda() ? 1 : 0;
  std::optional<int64_t> stopAfter, timedSaveAfter;
  int stopWith = 0;
  int64_t lastSaved = -1; // the step of the newest save started
  lastSaveMark_ = Clock::now();
  lastSaveStep_ = config_.steps;
  // The state after `step` (queued, the next step not yet), snapshotted
  // before the next step changes it; first the save before it must be
  // written (a wait that counts as this save's hold on training).
  auto saveAfter = [&](int64_t step) {
    const auto waitStart = Clock::now();
    std::optional<CheckpointResult> previous = saver_->wait();
    const double waited = std::chrono::duration<double>(Clock::now() - waitStart).count();
    if (previous)
      reportCheckpoint(*previous);
    saveHeldSeconds_ = waited;
    std::ostringstream generator;
    generator << rng_;
    TrainingProgress progress;
    progress.step = step;
    progress.data = source.position();
    progress.objectiveGenerator = generator.str();
    saveHeldSeconds_ += saver_->save(progress);
    lastSaved = step;
    lastSaveMark_ = Clock::now();
  };

  // Reads a step's values (waiting for them) and prints/logs it; throws
  // TrainingError for a non-finite loss or gradient norm.
  //
  // A step is done when the host has queued it and the device has run it:
  // its time is from the previous step's end to that. The device's end is
  // known when the report has to wait for it; when it has already finished
  // the host was the slower one and the step ended when it was queued.
  auto report = [&](PendingStep &p) {
    Clock::time_point done = p.queued;
    if (p.ready && !p.ready->query()) {
      p.ready->synchronize();
      done = Clock::now();
    }
    done = std::max(done, lastReport);
    const double *v = p.values.const_data_ptr<double>();
    const int64_t m = config_.gradAccum;
    double loss = 0;
    for (int64_t micro = 0; micro < m; ++micro) {
      if (!std::isfinite(v[micro]))
        throw stopAt(p, "the loss is " + std::string(std::isnan(v[micro]) ? "NaN" : "infinite") +
                            " at step " + std::to_string(p.step) + " (micro-batch " +
                            std::to_string(micro + 1) + ")");
      loss += v[micro];
    }
    loss /= static_cast<double>(m);
    const bool noTargets = p.targets == 0;
    const bool skipped = v[m + 1] != 0 || noTargets;
    const double gradNorm = skipped ? std::nan("") : v[m];
    if (noTargets && rank0)
      bmt::writeErrorLine("warning: step " + std::to_string(p.step) +
                          ": the global batch has no target token (its documents' loss mask is 0 "
                          "or cut off by --seq-len); the update is skipped");
    if (!skipped && !std::isfinite(gradNorm))
      throw stopAt(p, "the gradient norm is not finite at step " + std::to_string(p.step));
    const double stepScale = scaler ? v[m + 2] : 0, nextScale = scaler ? v[m + 3] : 0;
    // Overflowing at the minimum scale, step after step: the gradients are
    // not finite at any scale (a diverged run); stop instead of skipping
    // forever.
    minScaleSkips = skipped && !noTargets && stepScale <= minScale ? minScaleSkips + 1 : 0;
    if (minScaleSkips >= config_.lossScaleWindow)
      throw stopAt(p, "the gradients overflowed at the minimum loss scale " +
                          formatNumber(minScale) + " in " + std::to_string(minScaleSkips) +
                          " steps in a row (steps " +
                          std::to_string(p.step - minScaleSkips + 1) + " to " +
                          std::to_string(p.step) + ")",
                   "stopping at step " + std::to_string(p.step));
    lossScale_ = nextScale;
    losses_.push_back(loss);
    double stepSeconds = std::chrono::duration<double>(done - lastReport).count();
    lastReport = done;
    double elapsed = std::chrono::duration<double>(done - start).count();
    double tokensPerSecond = static_cast<double>(p.tokens) / stepSeconds;
    double tflops = 6.0 * numParams * tokensPerSecond / 1e12;
    if (rank0) {
      StepMetrics metrics;
      metrics.step = p.step;
      metrics.steps = config_.steps;
      metrics.loss = noTargets ? std::nan("") : loss;
      metrics.lr = p.lr;
      metrics.gradNorm = gradNorm;
      metrics.skipped = skipped;
      if (noTargets)
        metrics.skipReason = "no target tokens";
      metrics.targetTokens = p.targets;
      metrics.lossScale = stepScale;
      metrics.nextLossScale = nextScale;
      metrics.tokens = p.tokens;
      metrics.tokensPerSecond = tokensPerSecond;
      metrics.tflops = tflops;
      metrics.elapsedSeconds = elapsed;
      metrics.hostSeconds = p.hostSeconds;
      metrics.peakMemoryGiB = peakMemoryGiB(device);
      metrics.fusedLazyKernels = fusion::FusedRegion::lazyKernels() - lazyKernelsAtStart_;
      metrics.gradientsInPlace = model_.gradientsWrittenInPlace() - gradientsInPlaceAtStart_;
      metrics.recomputeSkipped = model_.recomputeSkips() - recomputeSkipsAtStart_;
      metrics_.step(metrics);
    }
    inspector_->report(p.step, rank0 ? &metrics_ : nullptr);
    // The ranks' requests, the same on every rank: acted on after step
    // p.step + lag, the first step whose state is still unchanged when
    // every rank has read them (CUDA reads a step's values one step late).
    const double *requests = v + m + 4;
    if (requests[0] + requests[1] > 0 && !stopAfter) {
      stopAfter = p.step + lag;
      stopWith = requests[0] > 0 ? SIGTERM : SIGINT;
    }
    if (requests[2] > 0)
      timedSaveAfter = p.step + lag;
  };

  std::optional<PendingStep> pending;
  int64_t lastStep = std::max(startStep_, config_.steps);
  deferStopSignals(true); // a signal from here on stops the run after a step (StopSignal.h)
  StepProfiler profiler;
  const bool profiling = rank0 && config_.profileFrom > 0;
  for (int64_t step = startStep_ + 1; step <= config_.steps; ++step) {
    if (profiling && step == config_.profileFrom) {
      if (pending) { // the window starts with an idle device
        report(*pending);
        pending.reset();
      }
      profiler.start(device.is_cuda(), !config_.profileTrace.empty());
    }
    if (hooks.syncDebug && step > 1)
      c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    const auto queueStart = Clock::now();
    PendingStep current = queueStep(step, source, hooks);
    current.hostSeconds = std::chrono::duration<double>(Clock::now() - queueStart).count();
    if (saver_ && (saver_->due(step) || step == config_.steps))
      saveAfter(step);
    current.queued = Clock::now();
    if (pending)
      report(*pending);
    pending = std::move(current);
    const bool profileEnds = profiling && step == config_.profileTo;
    if (!device.is_cuda() || step == config_.steps || profileEnds ||
        (config_.evalEvery > 0 && step % config_.evalEvery == 0)) {
      report(*pending);
      pending.reset();
    }
    if (profileEnds)
      profiler.stop(out_, config_.profileTrace, config_.profileTo - config_.profileFrom + 1);
    // A stop or a timed save the ranks agreed on, due after this step.
    const bool stopping = stopAfter && step >= *stopAfter;
    if (stopping)
      lastSaveStep_ = step;
    const bool timedSave = timedSaveAfter && step >= *timedSaveAfter;
    if (timedSave)
      timedSaveAfter.reset();
    if (saver_ && lastSaved != step && (stopping || timedSave))
      saveAfter(step);
    if (stopping) {
      if (pending)
        report(*pending);
      pending.reset();
      lastStep = step;
      break;
    }
    if (saver_)
      if (std::optional<CheckpointResult> done = saver_->poll())
        reportCheckpoint(*done);
    if (step == hooks.exitAfterStep) {
      // Test hook: the run dies here (after its report and checkpoint), as
      // a killed job would, so that a resumed run can be compared with one
      // never interrupted.
      if (pending)
        report(*pending);
      if (saver_)
        if (std::optional<CheckpointResult> done = saver_->wait())
          reportCheckpoint(*done);
      // Rank 0's wait includes the commit: no rank exits before it (torchrun
      // stops the others when one exits).
      if (model_.world().size() > 1)
        model_.world().barrier();
      out_.flush();
      std::_Exit(75);
    }
    if (config_.evalEvery > 0 && step % config_.evalEvery == 0 && step != config_.steps)
      runEval(step);
  }
  if (saver_)
    if (std::optional<CheckpointResult> done = saver_->wait())
      reportCheckpoint(*done);
  return finishTraining(lastStep, stopWith, evalData ? std::function<void()>([&] {
    runEval(config_.steps);
  }) : std::function<void()>(), fusedKernels);
}

TrainOutcome Trainer::finishTraining(int64_t lastStep, int stopWith,
                                     const std::function<void()> &finalEvaluation,
                                     bool fusedKernels) {
  Comm &world = model_.world();
  const bool rank0 = world.rank() == 0;
  TrainOutcome outcome;
  outcome.lastStep = lastStep;
  // What every rank must agree on (one all-reduce): the save after the
  // last step failed on some rank; a signal arrived after the last step's
  // all-reduce (no step carried it).
  std::string myError;
  if (saver_) {
    if (!lastSaveResult_ || lastSaveResult_->step != lastStep)
      myError = "it was not written";
    else if (!lastSaveResult_->ok)
      myError = lastSaveResult_->error;
  }
  const int late = stopWith ? 0 : stopSignal();
  at::Tensor agreed = at::tensor({myError.empty() ? 0.0 : 1.0, late == SIGTERM ? 1.0 : 0.0,
                                  late == SIGINT ? 1.0 : 0.0},
                                 at::TensorOptions().dtype(at::kDouble));
  if (world.size() > 1) {
    at::Tensor t = world.backend() == "local" ? agreed : agreed.to(world.device());
    world.allReduce(t)->wait();
    agreed = t.cpu();
  }
  const double *a = agreed.const_data_ptr<double>();
  if (!stopWith && a[1] + a[2] > 0)
    stopWith = a[1] > 0 ? SIGTERM : SIGINT;
  deferStopSignals(false);
  outcome.stopSignal = stopWith;
  if (a[0] > 0)
    outcome.lastSaveError = myError.empty() ? "another rank could not write its part" : myError;
  else if (saver_ && lastSaveResult_)
    outcome.lastSavePath = lastSaveResult_->path;
  if (stopWith) {
    if (rank0) {
      out_ << "bmt-run: stopped by " << stopSignalName(stopWith) << " after step " << lastStep
           << " of " << config_.steps << "; ";
      if (!saver_)
        out_ << "no --checkpoint-dir: the state after step " << lastStep << " is not saved";
      else if (outcome.lastSaveError.empty())
        out_ << "checkpoint step " << lastStep << " saved in " << outcome.lastSavePath
             << " (continue with --resume auto)";
      else
        out_ << "its checkpoint failed";
      out_ << "\n";
      out_.flush();
    }
    return outcome;
  }
  if (finalEvaluation)
    finalEvaluation();
  if (fusedKernels && rank0)
    out_ << "bmt-run: fused kernels compiled during training: "
         << fusion::FusedRegion::lazyKernels() - lazyKernelsAtStart_
         << (config_.prewarmKernels ? "" : " (--no-prewarm-kernels)") << "\n";
  return outcome;
}

} // namespace bmt::runtime
