//===- Trainer.h - the training and evaluation loops ------------*- C++ -*-===//

#ifndef BMT_RUNTIME_TRAIN_TRAINER_H
#define BMT_RUNTIME_TRAIN_TRAINER_H

#include "bmt/Runtime/checkpoint/Checkpoint.h"
#include "bmt/Runtime/data/Batches.h"
#include "bmt/Runtime/objectives/Corruption.h"
#include "bmt/Runtime/optim/LossScaler.h"
#include "bmt/Runtime/train/Metrics.h"
#include "bmt/Runtime/optim/LRSchedule.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/optim/Optimizers.h"
#include "bmt/Runtime/data/TokenData.h"
#include "bmt/Runtime/fusion/Prewarm.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace bmt::runtime {

class Inspector;
class Optimizer;

/// Training must stop: a NaN/inf loss, a bad batch. The message names the step.
class TrainingError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// What a model is trained to predict from a token window.
enum class Objective {
  CausalLM,       ///< each next token (decoder-only models)
  MaskedLM,       ///< BERT's masked tokens (maskTokens)
  SpanCorruption, ///< T5's corrupted spans, by an encoder-decoder (spanCorruption)
};

/// The objective named as the plan and --objective spell it ("causal-lm",
/// "masked-lm", "span-corruption"); none for another name.
std::optional<Objective> parseObjective(const std::string &name);
/// The plan's / --objective's spelling of `objective`.
const char *objectiveName(Objective objective);

/// The labels a model that computes its own loss gets for `objective`,
/// from the labels bmt's loss uses (`targets` [batch, seq]: the token
/// position t's logits predict, -100 where none): transformers' convention.
/// Causal LM: the model shifts, so labels[:, t] = targets[:, t - 1] (the
/// input token t where it is a target, i.e. input_ids) and labels[:, 0] =
/// -100 (no position predicts token 0); masked LM and span corruption
/// (the decoder's target): `targets` unchanged. int64, on targets' device.
at::Tensor modelLabels(Objective objective, const at::Tensor &targets);

/// The objective a model trains with: `requested` when given, else
/// span corruption for an encoder-decoder (a forward taking
/// decoder_input_ids), else the plan's (`planObjective`, from
/// plan::objectiveFor; older plans say "causal-lm" for encoder-decoders).
/// Throws std::invalid_argument when the request does not fit the model (an
/// encoder-decoder trains only with span corruption, and only it does).
Objective objectiveForModel(std::optional<Objective> requested, bool encoderDecoder,
                            const std::string &planObjective);

struct TrainConfig {
  int64_t steps = 1;
  int64_t gradAccum = 1;   ///< micro-batches per optimizer step
  /// Pipeline parallelism (a plan cut into P > 1 stages; bmt-run
  /// --micro-batches M): each of the gradAccum micro-batches is split into
  /// M (its rows, M dividing them), and the step's gradAccum x M run in
  /// the 1F1B order (PipelineSchedule.h); the loss is their mean, as
  /// gradient accumulation over gradAccum x M micro-batches. Ignored
  /// without stages.
  int64_t pipelineMicroBatches = 1;
  LRScheduleConfig schedule;
  OptimizerConfig optimizer; ///< --optimizer and its hyperparameters (Optimizers.h)
  double clipGrad = 1.0;   ///< max global grad norm; 0 = no clipping
  /// Auxiliary-loss-free load balancing (DeepSeek-V3, arXiv:2412.19437
  /// sec. 2.1.2): after each step every router score-correction bias b
  /// (Model::routerBiases) moves by this times sign(mean(c) - c), c the
  /// step's tokens per expert of its layer over all ranks; 0 = off, as
  /// transformers trains (bmt-run --moe-bias-update-rate).
  double moeBiasUpdateRate = 0;
  Objective objective = Objective::CausalLM;
  /// Train on the loss the model computes itself (a forward taking labels;
  /// Model::forwardLoss): `objective` then only says which labels it gets
  /// (modelLabels). Each rank's micro-batch loss counts equally in the
  /// average over ranks (docs/runtime/objectives.md).
  bool modelLoss = false;
  int64_t maskId = -1;     ///< masked-LM: the [MASK] token id
  int64_t vocabSize = 0;   ///< masked-LM: random replacements are drawn from [0, vocabSize)
  double maskProb = 0.15;
  SpanCorruptionConfig spanCorruption; ///< span corruption: density, span length, token ids
  uint64_t seed = 0;
  int64_t evalEvery = 0;   ///< evaluate every N steps; 0 = after the last only
  int64_t evalBatches = 0; ///< batches per evaluation; 0 = the whole file
  /// Evaluate on whole documents of the (version-2) evaluation data in this
  /// layout, in file order, with their loss mask (DocumentBatches without
  /// shuffle); none: sequential token windows.
  std::optional<SequenceLayout> evalDocuments;
  int64_t logEvery = 1;    ///< human line every N steps (JSON: every step)
  /// Profile steps profileFrom..profileTo (0: off) on rank 0 and print the
  /// per-op table (Profile.h); write the Chrome trace to profileTrace when set.
  int64_t profileFrom = 0, profileTo = 0;
  std::string profileTrace;
  // Dynamic loss scaling (BMTrain's OptimManager): the loss is multiplied
  // by the scale before backward; a step whose gradients hold an inf/NaN on
  // any rank is skipped on every rank and the scale divided by the factor
  // (not below minLossScale); after lossScaleWindow clean steps in a row it
  // is multiplied by the factor. 0 = off (no scaling, a non-finite gradient
  // norm stops training).
  double lossScale = 0;
  double lossScaleFactor = 2;
  int64_t lossScaleWindow = 1024;
  double minLossScale = 1;
  /// Per-block statistics of parameters, gradients and outputs every N
  /// steps as JSON lines (Inspect.h; bmt-run --inspect-every); 0 = off.
  int64_t inspectEvery = 0;
  /// Compile the fused regions' CUDA kernels before the first step
  /// (Trainer::prewarmFusedKernels; bmt-run --no-prewarm-kernels: false,
  /// they are compiled at their first call).
  bool prewarmKernels = true;
  /// With checkpoints: also save when this many minutes have passed since
  /// the last save (or the first step) on rank 0's clock; 0 = off
  /// (bmt-run --checkpoint-every-minutes). Every rank saves the same step.
  double saveEveryMinutes = 0;
};

/// How Trainer::train ended; the same on every rank (agreed by a
/// collective).
struct TrainOutcome {
  int64_t lastStep = 0; ///< the last step trained
  /// SIGTERM or SIGINT when a signal stopped the run after lastStep
  /// (StopSignal.h), else 0.
  int stopSignal = 0;
  /// With checkpoints: why the save after lastStep is not complete on
  /// every rank (rank 0: the reason; other ranks: their own, or that
  /// another rank failed), "" when it is complete. The state after
  /// lastStep then exists nowhere else.
  std::string lastSaveError;
  std::string lastSavePath; ///< rank 0: that checkpoint's folder, when complete
};

/// Runs the optimizer loop on `model` (on every rank of model.world(), each
/// with its own slice of the global batch; only rank 0 prints and logs): for each step, gradAccum micro-batches
/// from the source (token windows [batch, seq + 1]: the model reads
/// the first seq tokens; causal-LM predicts tokens 1..seq, masked-LM the
/// masked ones of the first seq; span corruption turns the whole window of
/// seq + 1 tokens into an encoder input and a target; or ready
/// encoder-decoder pairs; or whole documents, MicroBatch::targets saying
/// which tokens are predicted), the optimizer (--optimizer), the LR
/// schedule, clipping. A step whose global batch has no target token is not
/// applied (a warning names it; its JSON record says "skipped" with a null
/// loss).
/// Prints one line per logEvery steps to `out` and a JSON line per step and
/// per evaluation to `jsonLog` (when given). Evaluates on `evalData` (when
/// given) every evalEvery steps and after the last step.
/// Throws TrainingError when a loss or a gradient norm is not finite,
/// naming the step, and when the gradients overflow at the minimum loss
/// scale in lossScaleWindow steps in a row; the message names the first
/// block (and operator) that produced a non-finite value
/// (Inspector::locateNonFinite: the step is replayed; a step whose
/// gradient norm is not finite is not applied, without loss scaling, so
/// that the replay runs on the weights the step ran with).
/// With inspectEvery, writes an inspect JSON line after every N-th step's.
///
/// A step queues its work without host synchronisation (inputs copied from
/// pinned memory, clipping, loss-scale checks and the optimizer on the
/// device); on CUDA it is reported (its loss read, printed and logged) once
/// the next step has been queued, so a non-finite loss is found after its
/// update has been applied: training stops and nothing is saved.
/// Diagnostic: BMT_DEBUG_SYNC=1 makes any synchronising CUDA call inside a
/// step after the first an error (c10's sync debug mode).
///
/// Test hook: with the environment variable BMT_DEBUG_INJECT_INF_STEP=k
/// (or k-l: steps k to l; and optionally BMT_DEBUG_INJECT_INF_RANK=r,
/// default 0) rank r writes an inf into its first gradient after the
/// gradients of step k are synchronized, as an fp16 overflow would (tests of loss scaling). With
/// BMT_DEBUG_EXIT_AFTER_STEP=k every rank exits with status 75 right after
/// step k is reported and its checkpoint (if due) written, as a killed job
/// would (tests of resume).
///
/// Signals (StopSignal.h): during the steps, a SIGTERM or SIGINT received
/// by any rank is carried in the next step's loss all-reduce, so that
/// every rank stops after the same step (the step in flight on the CPU,
/// the one after it on CUDA, whose values are read one step late); that
/// step is saved as a checkpoint (with checkpoints) and train() returns
/// with TrainOutcome::stopSignal set, after printing (rank 0) "bmt-run:
/// stopped by SIGTERM after step N ...". Time-based saves
/// (config.saveEveryMinutes) travel the same way.
class Trainer {
public:
  /// Makes the optimizer (Model::makeOptimizer) and the loss scaler.
  Trainer(Model &model, TrainConfig config, std::ostream &out, std::ostream *jsonLog);
  ~Trainer();

  /// Saves checkpoints during train() (Checkpoint.h): after every
  /// options.every-th step and after the last one. `identity` describes the
  /// run (its plan fields; the optimizer's are filled in here).
  void setCheckpoints(CheckpointOptions options, RunIdentity identity);
  /// Loads the checkpoint in `folder` (Checkpoint.h loadCheckpoint): the
  /// parameters, the optimizer and loss scaler, the step, the generator of
  /// the objective, and the data position, which it gives `source` at once
  /// (without one, train() gives it its source): a checkpoint of other data
  /// is refused here, before anything says the run resumed.
  /// Throws CheckpointError.
  ResumeReport resume(const std::string &folder, MicroBatchSource *source = nullptr);
  /// Opens the checkpoint folder of setCheckpoints for this run's saves
  /// (CheckpointSaver: the folder's lock, no checkpoint of a step after
  /// the one the run starts at, a write probe, the host buffers), unless
  /// there is none or nothing is left to train; train() does it when not
  /// done. Call after resume() and before reporting the resume, so that
  /// a refusal comes first. Collective; throws CheckpointError.
  void openCheckpoints();

  /// Trains steps (the resumed step + 1) .. config.steps on micro-batches
  /// of `source` (none when resumed at or past config.steps: then no
  /// checkpoint is saved either), or fewer when a signal stops it.
  /// Collective; returns how it ended (the last save's failure is returned,
  /// not thrown, so that the caller can still save what it can).
  TrainOutcome train(MicroBatchSource &source, const TokenFile *evalData, int64_t seqLen,
             int64_t microBatch);

  /// What prewarmFusedKernels did.
  struct KernelPrewarm {
    std::vector<fusion::KernelRecorder::Request> requests; ///< what the dry run's calls asked for
    fusion::PrewarmResult compiled;
    double dryRunSeconds = 0;
  };
  /// Compiles the fused kernels the steps will launch (fusion/Prewarm.h),
  /// found by a dry run of the micro-batch `source` gives next: its forward,
  /// loss and backward as a step runs them, but with the fused regions
  /// computing nothing; its gradients are dropped, and the data position,
  /// the generators, the parameters and the optimizer stay as they were.
  /// Collective under ZeRO (every rank runs it). train() calls it before the
  /// first step when config.prewarmKernels and the model uses fused kernels,
  /// and prints (rank 0) "bmt-run: compiled N fused kernels in S s (C
  /// cached; ...)". Nothing (no dry run) for a model without fused regions.
  /// Throws as a step does, and fusion::FusionError.
  KernelPrewarm prewarmFusedKernels(MicroBatchSource &source,
                                    const fusion::PrewarmOptions &options = {});

  /// Loss of the model on `data` in sequential windows [microBatch, seqLen+1]
  /// or, with config.evalDocuments, on its documents in file order
  /// (micro-batches of microBatch rows; the mean over their target tokens)
  /// (at most maxBatches; 0 = all), without gradients; the batches are
  /// divided over the ranks and the sums all-reduced (collective).
  EvalResult evaluate(const TokenFile &data, int64_t seqLen, int64_t microBatch,
                      int64_t maxBatches);

  /// Prints (rank 0) an evaluation's line "eval  step N | val loss ... |
  /// val ppl ... | N tokens" and writes its JSON line ({"kind": "eval",
  /// "step", "val_loss", "val_ppl", "tokens"}; non-finite values as null);
  /// step 0 for an evaluation without training.
  void reportEvaluation(int64_t step, const EvalResult &result);

  /// The losses of every step so far (mean over its micro-batches).
  const std::vector<double> &losses() const { return losses_; }
  /// The current loss scale (0 when loss scaling is off).
  double lossScale() const { return lossScale_; }

  /// The environment's test and diagnostic hooks above, read once a run.
  struct DebugHooks;

private:
  struct PendingStep;
  PendingStep queueStep(int64_t step, MicroBatchSource &source, const DebugHooks &hooks);
  /// After the steps: agrees over the ranks on a late signal and on the
  /// last save's outcome, prints the stop line or runs the final
  /// evaluation; see train().
  TrainOutcome finishTraining(int64_t lastStep, int stopWith,
                              const std::function<void()> &finalEvaluation, bool fusedKernels);
  /// Reports (rank 0) a save that finished: its line and JSON record.
  void reportCheckpoint(const CheckpointResult &result);
  /// Gives `source` the resumed data position, once; CheckpointError for a
  /// position it refuses (another kind, other data).
  void seekResumePosition(MicroBatchSource &source);
  /// Loss of one micro-batch window, forward only (grad mode decides
  /// autograd): the mean over its predicted tokens (a scalar on the
  /// device), their number, and the tokens the model read (the encoder's
  /// for an encoder-decoder).
  struct MicroBatchLoss {
    at::Tensor loss;
    int64_t predicted = 0, inputTokens = 0; ///< this rank's; input tokens without padding
    /// The same counts over the whole (global) micro-batch of all ranks.
    int64_t batchPredicted = 0, batchInputTokens = 0;
  };
  MicroBatchLoss microBatchLoss(const MicroBatch &batch, std::mt19937_64 &rng);
  /// Pipeline parallelism (PipelineStep.cpp): the step's micro-batches of
  /// this stage in the 1F1B order, their values and gradients exchanged
  /// with the neighbouring stages; the last stage's losses (zeros on the
  /// other stages) are appended to `losses`.
  void runPipelineMicroBatches(PendingStep &current, MicroBatchSource &source,
                               std::vector<at::Tensor> &losses);
  /// Pipeline parallelism (PipelineStep.cpp): `batch`'s forward through
  /// the stages in pieces of rows / pipelineMicroBatches, without
  /// gradients; the sum of its losses over its predicted tokens and their
  /// number, counted on the last stage's first TP rank (zeros elsewhere).
  std::pair<double, double> pipelineEvaluation(const MicroBatch &batch, std::mt19937_64 &rng);
  /// Micro-batches per step: gradAccum, times pipelineMicroBatches when
  /// the model is cut into stages.
  int64_t microBatchesPerStep() const;
  /// microBatchLoss of a model that computes its loss (config.modelLoss):
  /// `inputs` with this rank's labels (modelLabels); the loss as the model
  /// reduces it, not re-weighted across ranks; `counts`: the micro-batch's
  /// token counts, returned with the loss and this rank's predicted labels.
  MicroBatchLoss modelMicroBatchLoss(ModelInputs inputs, const at::Tensor &labels,
                                     MicroBatchLoss counts);

  Model &model_;
  TrainConfig config_;
  std::ostream &out_;
  MetricsWriter metrics_;
  std::unique_ptr<Optimizer> optimizer_;
  /// The MoE layers' tokens per expert of the step being queued.
  std::unique_ptr<moe::ExpertLoad> expertLoad_;
  std::optional<LossScaler> scaler_;
  std::mt19937_64 rng_; ///< the objective's draws (masks, spans), the same on every rank
  int64_t startStep_ = 0; ///< steps done before this run (resumed)
  std::optional<DataPosition> resumePosition_;
  std::optional<std::pair<CheckpointOptions, RunIdentity>> checkpoints_;
  std::unique_ptr<CheckpointSaver> saver_;
  double saverSeconds_ = 0; ///< the time openCheckpoints took
  double saveHeldSeconds_ = 0; ///< host time the save in flight held training
  std::optional<CheckpointResult> lastSaveResult_; ///< the newest save reported
  int64_t lastSaveStep_ = -1; ///< the step of the run's last save (config.steps, or a stop's)
  /// Rank 0's clock of config.saveEveryMinutes: the last save, or request.
  std::chrono::steady_clock::time_point lastSaveMark_;
  std::vector<double> losses_;
  double lossScale_ = 0;
  std::unique_ptr<Inspector> inspector_; ///< during train()
  /// fusion::FusedRegion::lazyKernels() when the first step began.
  int64_t lazyKernelsAtStart_ = 0;
  int64_t gradientsInPlaceAtStart_ = 0; ///< model_.gradientsWrittenInPlace() then
  int64_t recomputeSkipsAtStart_ = 0;   ///< model_.recomputeSkips() then
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_TRAINER_H
