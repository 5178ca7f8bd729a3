//===- TrainerStep.cpp - one step's and one micro-batch's work --------------===//
//
// A micro-batch's forward and loss, the queued optimizer step (gradient
// synchronisation, unscaling and the overflow check, clipping, the
// update), the fused kernels' prewarm, and evaluation.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/train/Trainer.h"
#include "train/TrainerSteps.h"
#include "exec/Moe.h"
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
    // rows: position_ids restart at 0 at each document). The rows' mask is
    // given even to a plan compiled assuming attention_mask all ones: the
    // attentions made causal no longer read it (right padding comes after
    // every token of its row, which a causal attention's earlier positions
    // never see), and whatever still reads it (an attention the pass left
    // alone, a pooling over the sequence) needs the real one.
    if (micro.targets.defined()) {
      labels = labels.masked_fill(micro.targets.slice(1, 1, seq + 1).logical_not(), -100);
      if (micro.positionIds.defined())
        positionIds = micro.positionIds.slice(1, 0, seq);
      else if (micro.attentionMask.defined())
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
  if (model_.pipelineStages() > 1 && !model_.isLastStage()) {
    model_.forwardAll(inputs); // (this stage's part; what leaves it is sent by the caller)
    return result;
  }
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
  // LoRA dropout off, as peft's model.eval(): no masks drawn, so the
  // training after an evaluation draws what it would without one.
  struct AdapterDropoutOff {
    Model &model;
    explicit AdapterDropoutOff(Model &m) : model(m) { model.setAdapterDropout(false); }
    ~AdapterDropoutOff() { model.setAdapterDropout(true); }
  } adapterDropoutOff(model_);
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
  // (A pipeline: the data-parallel ranks of a stage; the batch goes
  // through the stages, and its sums, counted on the last stage, are
  // all-reduced over the world.)
  const bool pipeline = model_.pipelineStages() > 1;
  Comm &dataRanks = model_.dataParallel();
  Comm &world = pipeline ? model_.world() : dataRanks;
  int64_t ranks = dataRanks.size(), rank = dataRanks.rank();
  double sum = 0;
  double tokens = 0;
  for (int64_t round = 0; round * ranks < n; ++round) {
    int64_t i = round * ranks + rank;
    bool counted = i < n;
    std::mt19937_64 rng(config_.seed + 1 + static_cast<uint64_t>(counted ? i : 0)); // masked-LM masks
    if (pipeline) {
      const std::pair<double, double> piece = pipelineEvaluation(batch(counted ? i : 0), rng);
      if (counted) {
        sum += piece.first;
        tokens += piece.second;
      }
      continue;
    }
    MicroBatchLoss result = microBatchLoss(batch(counted ? i : 0), rng);
    if (counted) {
      sum += result.loss.item<double>() * static_cast<double>(result.predicted);
      tokens += static_cast<double>(result.predicted);
    }
  }
  if (world.size() > 1) {
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

void Trainer::reportEvaluation(int64_t step, const EvalResult &r) {
  if (model_.world().rank() == 0)
    metrics_.evaluation(step, r);
}

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
  std::vector<at::Tensor> losses, auxLosses;
  expertLoad_->beginStep();
  optimizer.zeroGrad();
  current.rng = rng;
  inspector_->beginStep(step);
  if (model_.pipelineStages() > 1)
    runPipelineMicroBatches(current, source, losses);
  for (int64_t micro = 0; micro < config_.gradAccum && model_.pipelineStages() == 1; ++micro) {
    current.batches.push_back(source.next());
    MicroBatchLoss result = microBatchLoss(current.batches.back(), rng);
    at::Tensor loss = result.loss;
    losses.push_back(loss.detach().reshape({1}).to(at::kDouble));
    if (model_.hasAuxLoss() && model_.lastAuxLoss().defined())
      auxLosses.push_back(model_.lastAuxLoss().reshape({1}).to(at::kDouble));
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
  const int64_t m = microBatchesPerStep();
  // MoE layers: each layer's tokens per expert over the step's forward
  // passes (not the recomputes) and the mean aux_loss ride on the same
  // all-reduce.
  std::vector<at::Tensor> reduceParts{at::cat(losses).to(device), toDevice(requests, device)};
  const at::Tensor load = expertLoad_->flat();
  current.expertLoad = load.defined();
  if (current.expertLoad)
    reduceParts.push_back(load.to(device));
  current.auxLoss = auxLosses.size() == static_cast<size_t>(m) && model_.pipelineStages() == 1;
  if (current.auxLoss)
    reduceParts.push_back(at::cat(auxLosses).to(device).sum().div(static_cast<double>(m)).reshape({1}));
  at::Tensor reduced = at::cat(reduceParts);
  if (world.size() > 1) {
    at::Tensor t = reduced;
    if (t.device() != world.device() && world.backend() != "local")
      t = t.to(world.device());
    world.allReduce(t)->wait();
    reduced = t.to(device);
  }
  at::Tensor lossValues = reduced.slice(0, 0, m);
  // (A pipeline: only the last stage's T x D ranks have losses.)
  const int64_t lossRanks = model_.pipelineStages() > 1 ? model_.stageRanks() : world.size();
  if (lossRanks > 1)
    lossValues = lossValues.div(static_cast<double>(lossRanks));
  at::Tensor values = at::cat({lossValues, gradNorm.reshape({1}),
                               found ? found->to(at::kDouble).reshape({1}) : at::zeros({1}, doubles),
                               stepScale, scaler ? scaler->scale().reshape({1}) : at::zeros({1}, doubles),
                               reduced.slice(0, m, m + 3)});
  if (current.expertLoad) {
    // The ranks of a TP group count the same tokens: the sum over the
    // world is T times that over the data-parallel ranks.
    at::Tensor counts = reduced.slice(0, m + 3, m + 3 + load.numel());
    if (Comm *tp = model_.tensorParallel(); tp && tp->size() > 1)
      counts = counts.div(static_cast<double>(tp->size()));
    values = at::cat({values, counts.min().reshape({1}), counts.max().reshape({1})});
    // Auxiliary-loss-free balancing: the biases move with the step's
    // update, and not when it is skipped.
    if (config_.moeBiasUpdateRate > 0)
      expertLoad_->moveRouterBiases(counts, config_.moeBiasUpdateRate, skip);
  }
  if (current.auxLoss) {
    at::Tensor aux = reduced.slice(0, reduced.size(0) - 1);
    if (world.size() > 1)
      aux = aux.div(static_cast<double>(world.size()));
    values = at::cat({values, aux});
  }
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
  if (regions.empty() || model_.pipelineStages() > 1) // (a pipeline compiles them at first use)
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

} // namespace bmt::runtime
