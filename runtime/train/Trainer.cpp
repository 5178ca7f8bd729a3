//===- Trainer.cpp - the training loop: steps, reports, checkpoints, stop ----===//
//
// The loop over the steps (TrainerStep.cpp queues each one), its reports,
// the checkpoints' schedule and the stop on a signal.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/train/Trainer.h"
#include "bmt/Runtime/train/Generators.h"
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

Trainer::Trainer(Model &model, TrainConfig config, std::ostream &out,
                 std::ostream *jsonLog)
    : model_(model), config_(std::move(config)), out_(out),
      metrics_(out, jsonLog, config_.logEvery), rng_(config_.seed),
      lossScale_(config_.lossScale) {
  // The optimizer on the device (Optimizers.h), or, offloading
  // (--offload-optimizer), Adam/AdamW with its masters and moments in host
  // memory, fed by the gradient copies the ZeRO storage makes during the
  // backward (OffloadAdam.h).
  // (A pipeline stage may train nothing: every parameter it reads frozen.)
  const std::vector<plan::TensorInfo> &tensors = model_.plan().tensors;
  const bool trains = std::any_of(tensors.begin(), tensors.end(), [](const plan::TensorInfo &t) {
    return t.isParameter && t.requiresGrad;
  });
  if (model_.parameters().empty() && (model_.pipelineStages() <= 1 || !trains))
    throw TrainingError(
        "the model has no trainable parameter (every one is frozen: requires_grad false in the "
        "trace or bmt-opt --freeze), so there is nothing to train");
  optimizer_ = model_.makeOptimizer(config_.optimizer, config_.gradAccum);
  expertLoad_ = std::make_unique<moe::ExpertLoad>();
  model_.setExpertLoad(expertLoad_.get());
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

Trainer::~Trainer() { model_.setExpertLoad(nullptr); }

void Trainer::setCheckpoints(CheckpointOptions options, RunIdentity identity) {
  identity.optimizer = std::string(model_.offloadsOptimizer() ? "offload-" : "") +
                       optimizerKindName(config_.optimizer.kind);
  identity.lr = config_.schedule.peakLR;
  identity.optimizerConfig = config_.optimizer;
  identity.schedule = config_.schedule;
  checkpoints_.emplace(std::move(options), std::move(identity));
}

ResumeReport Trainer::resume(const std::string &folder, MicroBatchSource *source) {
  ResumeReport report = loadCheckpoint(folder, model_, *optimizer_, scaler_ ? &*scaler_ : nullptr,
                                       &config_.optimizer);
  startStep_ = report.progress.step;
  resumePosition_ = report.progress.data;
  // Saved generator states of other ranks (another N, T or P): a stream of
  // this step's own, not the one the run started with (whose masks the
  // steps after the resume would repeat).
  if (!report.generatorsRestored)
    seedGeneratorsAt(model_.device(), config_.seed, model_.dataParallel().rank(), startStep_);
  if (source)
    seekResumePosition(*source);
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

void Trainer::seekResumePosition(MicroBatchSource &source) {
  if (!resumePosition_)
    return;
  try {
    source.seek(*resumePosition_);
  } catch (const std::invalid_argument &e) {
    throw CheckpointError(std::string("resuming: ") + e.what());
  }
  resumePosition_.reset(); // (sought)
}

void Trainer::openCheckpoints() {
  // Nothing to train (resumed at or past config.steps): no saver, so no host
  // buffers and no line promising checkpoints.
  if (!checkpoints_ || saver_ || startStep_ >= config_.steps)
    return;
  const auto t0 = std::chrono::steady_clock::now();
  CheckpointOptions options = checkpoints_->first;
  options.startStep = startStep_; // no checkpoint of a later step in options.dir
  saver_ = std::make_unique<CheckpointSaver>(model_, *optimizer_, scaler_ ? &*scaler_ : nullptr,
                                             options, checkpoints_->second);
  saverSeconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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

/// `v` as the shortest of "%g"'s forms ("1", "0.5", "65536").
std::string formatNumber(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

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

TrainOutcome Trainer::train(MicroBatchSource &source, const TokenFile *evalData, int64_t seqLen,
                    int64_t microBatch) {
  const bool rank0 = model_.world().rank() == 0;
  const at::Device device = model_.device();
  seekResumePosition(source);
  using Clock = std::chrono::steady_clock;
  openCheckpoints();
  if (saver_) {
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
           << saverSeconds_ << " s)"
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
    if (model_.pipelineStages() > 1) // (its stages cannot replay a step alone)
      return TrainingError(what + " (a pipeline's step is not replayed to locate it); " +
                           stopping);
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
    const int64_t m = microBatchesPerStep();
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
      if (p.expertLoad) {
        metrics.expertTokensMin = v[m + 7];
        metrics.expertTokensMax = v[m + 8];
      }
      if (p.auxLoss)
        metrics.auxLoss = v[m + 7 + (p.expertLoad ? 2 : 0)];
      metrics.pipeline = p.pipelineJson;
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
