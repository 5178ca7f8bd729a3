//===- Model.h - a compiled model ready to run ------------------*- C++ -*-===//
//
// Loads sharded.pt (its plan and weights) onto a device and runs its
// forward pass through the Executor; computes the training objective.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_MODEL_H
#define BMT_RUNTIME_EXEC_MODEL_H

#include "bmt/Plan/Archive.h"
#include "bmt/Runtime/comm/Comm.h"
#include "bmt/Runtime/exec/Executor.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace bmt::runtime {

class ParameterStorage;
class ZeroStorage;
class HostGradientSource;
class Optimizer;
struct OptimizerConfig;
struct ParameterLayout;

struct ModelOptions {
  /// Keep the optimizer's float32 masters and moments in host memory
  /// (bmt-run --offload-optimizer; OffloadAdam.h): the ZeRO storage keeps no
  /// master copies on the device and copies each group's gradient to host
  /// memory during the backward. Needs a plan with storage groups.
  bool offloadOptimizer = false;
};

/// What bmt-run gives a model's forward, by the names of the forward's
/// parameters (the names transformers' models use). int64 tensors on the
/// model's device.
struct ModelInputs {
  at::Tensor inputIds;      ///< "input_ids" [batch, seq]
  at::Tensor attentionMask; ///< "attention_mask" [batch, seq]; undefined: all ones
  /// "position_ids" [batch, seq] (packed documents: 0 at each document's
  /// start); undefined: 0 .. seq - 1 in every row.
  at::Tensor positionIds;
  /// "decoder_input_ids" [batch, target seq] of an encoder-decoder (T5):
  /// the target shifted right (Corruption.h shiftRight). A forward that
  /// also takes "decoder_attention_mask" gets all ones of this shape.
  at::Tensor decoderInputIds;
  /// "labels" of a forward that computes its own loss (Model::forwardLoss):
  /// [batch, seq] (an encoder-decoder's: [batch, target seq]) as
  /// transformers' models take them, -100 where a token is no target.
  at::Tensor labels;
};

/// What a forward that takes labels returns (Model::forwardLoss).
struct ModelLoss {
  at::Tensor loss;   ///< the scalar the model computed (its own reduction)
  at::Tensor logits; ///< the result named "logits"; undefined when there is none
};

/// One flat buffer of trainable values as a checkpoint saves it
/// (Checkpoint.h): a ZeRO storage group, sharded over the shard group, or
/// one replicated trainable tensor (one shard).
struct ParameterSpace {
  std::string name;             ///< the group's name, or the tensor's
  c10::ScalarType dtype = c10::ScalarType::Float; ///< the parameters' dtype
  int64_t size = 0;             ///< elements of the whole buffer
  std::vector<int64_t> members; ///< plan tensor indices
  std::vector<int64_t> offsets; ///< their element offsets in the buffer
  int64_t numShards = 1, shardIndex = 0;
  int64_t shardSize = 0;        ///< ceil(size / numShards)
  bool writer = true;           ///< this rank saves the shard (its first replica)
  /// This rank's shard, [shardSize] of `dtype` (a flat view of a
  /// replicated tensor), live.
  at::Tensor value;
  /// Its index in parameters() (and the optimizer's): that tensor is a
  /// float32 master of `value` when their dtypes differ, else `value`'s.
  size_t parameter = 0;
};

/// What crosses between pipeline stages (Model::pipelineChannel).
enum class PipelineTransfer { Activations = 0, Gradients = 1 };

class Model {
public:
  /// Loads `archive` onto `device` for this rank of `world` (null: a single
  /// process). A plan with storage groups (ZeRO-2/3) becomes a ZeroStorage:
  /// this rank reads only its shard of each group; tensors outside groups
  /// are read whole by every rank. Without groups every rank holds every
  /// parameter and gradients are all-reduced (plain data parallelism).
  /// Trainable parameters become autograd leaves. `progress(done, total)`
  /// is called with this rank's bytes read so far.
  /// Tensor parallelism (plan tensorParallel T > 1): the world is split
  /// into TP groups of T consecutive ranks (tensorParallel()) and the
  /// data-parallel ranks of each TP rank (dataParallel()); this rank holds
  /// the slices of its TP rank (group copies, tensors outside groups sliced
  /// at load) and ZeRO shards over the data-parallel ranks.
  /// Collective when world has several ranks. Throws plan::PlanError for a
  /// bad archive, ExecutionError for a plan that cannot run (or offloading
  /// the optimizer without storage groups; under T > 1: a world size that
  /// is not a multiple of T, naming both, a plan without ZeRO storage
  /// groups or with trainable tensors outside them, offloading), CommError.
  Model(plan::Archive &archive, at::Device device, Comm *world = nullptr,
        const std::function<void(int64_t, int64_t)> &progress = nullptr,
        const ModelOptions &options = {});
  ~Model();

  /// Runs forward on `inputs`. Returns the logits, float [batch, seq,
  /// vocab] (the result named "logits", else the first result; for an
  /// encoder-decoder seq is the decoder's length). Collective under ZeRO.
  /// Throws ExecutionError when the forward takes an input that `inputs`
  /// lacks (decoder_input_ids, labels) or that bmt-run never provides,
  /// naming it.
  at::Tensor forward(const ModelInputs &inputs);
  /// forward({inputIds, attentionMask}) of a model without a decoder.
  at::Tensor forward(const at::Tensor &inputIds, const at::Tensor &attentionMask) {
    ModelInputs inputs;
    inputs.inputIds = inputIds;
    inputs.attentionMask = attentionMask;
    return forward(inputs);
  }

  /// Runs forward and returns every result with its name ("logits",
  /// "last_hidden_state", ...; "result<i>" where the program names none).
  std::vector<std::pair<std::string, c10::IValue>> forwardAll(const ModelInputs &inputs);

  /// Whether the forward takes decoder_input_ids (an encoder-decoder such
  /// as T5, trained with span corruption).
  bool isEncoderDecoder() const;
  /// Whether the forward takes the input `name` ("attention_mask",
  /// "position_ids", ...).
  bool takesInput(const std::string &name) const;

  /// Whether the forward has a result named "logits" (a language-model head).
  bool hasLogits() const { return hasLogits_; }

  /// Whether the forward takes "labels": the model computes its loss itself
  /// (transformers' forward(labels=...), or a user's module traced with them).
  bool takesLabels() const;
  /// Runs forward on `inputs` (with inputs.labels) and returns the model's
  /// loss: the result named "loss", else the first one, which must be a
  /// floating-point tensor of one element (its gradient flows back through
  /// the program). Collective under ZeRO. Throws ExecutionError, naming the
  /// result, when it is not such a scalar, and as forward().
  ModelLoss forwardLoss(const ModelInputs &inputs);
  /// The loss (and logits) among forwardAll()'s results, checked as
  /// forwardLoss() does.
  ModelLoss lossOf(const std::vector<std::pair<std::string, c10::IValue>> &results) const;

  /// What the optimizer updates: the distinct trainable parameters (tied
  /// ones once) in plan order, or under ZeRO this rank's shard of each
  /// storage group ([shard size], one per group).
  const std::vector<at::Tensor> &parameters() const { return parameters_; }
  /// Their names (the plan's symbol names, or the groups' names), same order.
  const std::vector<std::string> &parameterNames() const { return parameterNames_; }

  /// Makes every rank's gradients the average over ranks: under ZeRO waits
  /// for the reduce-scatters the backward started and adds them to the
  /// shards' gradients; without ZeRO all-reduces every gradient. Call after
  /// the last backward of a step. Collective.
  void synchronizeGradients();
  /// Global L2 norm of the gradients over all ranks (a float64 tensor of
  /// one element on the model's device, computed without a host
  /// synchronisation). The optimizers apply the clipping (AdamW::step).
  /// Collective.
  at::Tensor gradNorm();
  /// After an optimizer step: copies the float32 masters of low-precision
  /// ZeRO shards into the shards; gathered ZeRO buffers are stale; free them.
  void afterOptimizerStep();

  /// Whether the optimizer's state lives in host memory
  /// (ModelOptions::offloadOptimizer). Then parameters() are the ZeRO
  /// shards on the device in their own dtype (bf16/fp16 ones with float32
  /// gradients) and the optimizer is an OffloadAdamW over them fed by
  /// hostGradients().
  bool offloadsOptimizer() const;
  /// Offloading: the host copies of the gradients of parameters(), and the
  /// number of backward passes (micro-batches) per optimizer step, after
  /// which a group's gradient is complete and copied to the host.
  HostGradientSource &hostGradients(int64_t microBatchesPerStep);
  /// The optimizer of parameters() (Optimizers.h), with their layouts
  /// (parameterLayouts()) for the weight-decay groups and Adafactor's
  /// factors, and under ZeRO the shard group's communicator: an
  /// OffloadAdamW (Adam/AdamW) fed by hostGradients(microBatchesPerStep)
  /// when offloadsOptimizer(), else the device optimizer of config.kind.
  /// Throws std::invalid_argument for bad hyperparameters and for
  /// offloading an optimizer other than Adam/AdamW (naming it), else as
  /// the constructors and hostGradients().
  std::unique_ptr<Optimizer> makeOptimizer(const OptimizerConfig &config,
                                           int64_t microBatchesPerStep);
  /// Mixed precision without separate casts: offers `optimizer` (of
  /// parameters(), from makeOptimizer) the bf16/fp16 ZeRO shards of the
  /// float32 masters to write in its update, their gradients as reduced
  /// (Optimizer::writeLowPrecisionCopies, ZeroStorage::
  /// letOptimizerWriteShards). Returns whether it took them (AdamW/Adam on
  /// CUDA with the runtime's kernels; never offloading, nor without ZeRO
  /// masters); if not, nothing changes. Then the masters' gradients are
  /// sums in the reduce dtype between synchronizeGradients() and the step:
  /// call it only when nothing but gradNorm() and the optimizer reads them
  /// (no loss scaling, no inspection statistics) and one backward makes a
  /// step's gradient (the Trainer's rule).
  bool letOptimizerWriteShards(Optimizer &optimizer);
  /// Whether letOptimizerWriteShards took effect.
  bool optimizerWritesShards() const;
  /// What each of parameters() holds (same order): a ZeRO shard's members
  /// (plan shapes, offsets in the group's buffer, the shard's first
  /// element), or a replicated parameter as one member.
  std::vector<ParameterLayout> parameterLayouts() const;

  /// Mixed precision: the dtype of the model's floating-point parameters
  /// (the first one in plan order; float32 when there is none).
  at::ScalarType parameterDtype() const;
  /// The dtype ZeRO reduce-scatters gradients in (nullopt: each storage
  /// group's own dtype). Without ZeRO storage groups this does nothing.
  void setReduceDtype(std::optional<at::ScalarType> dtype);

  /// The trainable parameters (plan tensor indices, tied ones once) in the
  /// order forEachFullParameter visits them: each storage group's members
  /// in the group's order, groups in plan order, then the parameters
  /// outside groups in plan order.
  std::vector<int64_t> fullParameterOrder() const;
  /// Calls `visit(index, value)` on every rank for every trainable
  /// parameter in fullParameterOrder(): `value` is its full value (under
  /// tensor parallelism the global tensor, gathered from the TP group; or
  /// gradient, with `gradients`: zeros for a grouped parameter without
  /// one; an ungrouped one without a gradient is skipped) on the model's
  /// device, valid during the call only. Under ZeRO one storage group is
  /// gathered at a time and freed before the next, so a rank holds at most
  /// its shards plus one group. Collective. Throws CommError, and what
  /// `visit` throws (then the other ranks wait in the next gather: a
  /// visitor that may fail should note the failure and return).
  void forEachFullParameter(const std::function<void(int64_t, const at::Tensor &)> &visit,
                            bool gradients = false);
  /// Every trainable parameter's full value (or gradient, with
  /// `gradients`; parameters without one are skipped) by plan name, CPU
  /// copies (forEachFullParameter, collected: the whole model on every
  /// rank; for small models and tests). Collective.
  std::vector<std::pair<std::string, at::Tensor>> fullParameters(bool gradients = false);
  /// The buffers training changes: the router score-correction biases the
  /// plan's MoeDispatch instructions name (DeepSeek-V3's
  /// e_score_correction_bias; TrainConfig::moeBiasUpdateRate moves them),
  /// by plan name in plan order, each the live tensor on the model's device
  /// (the same on every rank). Checkpoints save and restore them;
  /// --save-params writes them.
  std::vector<std::pair<std::string, at::Tensor>> routerBiases();
  /// The LoRA settings of the program it runs (checkpoint's adapterSettings;
  /// "" without adapters).
  const std::string &adapterSettings() const { return adapterSettings_; }
  /// The frozen parameters (requires_grad false: bmt-opt --freeze, or
  /// frozen in the trace; plan tensor indices in plan order), which do not
  /// train (ZeRO-sharded in frozen storage groups, or whole on every rank
  /// in a plan without them).
  std::vector<int64_t> frozenParameterOrder() const;
  /// Frozen parameter `index`'s value, whole (on the model's device; no
  /// gradient; a TP-split one put back together from the TP group's
  /// slices). Collective for a member of a frozen storage group or a
  /// TP-split one: every rank asks for the same parameters in the same
  /// order. Throws ExecutionError for one split over the expert group.
  at::Tensor frozenParameter(int64_t index);
  /// A pipeline: every frozen parameter's whole value by plan name, CPU
  /// copies collected on rank 0 from the stages that hold them (empty
  /// elsewhere but for this stage's). Collective.
  std::vector<std::pair<std::string, at::Tensor>> frozenStageParameters();

  /// The buffers parameters() hold, for checkpoints: one a parameter, in
  /// the same order.
  std::vector<ParameterSpace> parameterSpaces() const;
  /// After a checkpoint's values were copied into parameters() (and the
  /// spaces' values): refreshes every low-precision ZeRO shard from its
  /// master (also those an optimizer writes) and frees gathered buffers.
  void parametersChanged();

  /// Reports the executor's block results (and instructions) to `observer`
  /// (train/Inspect.h; not owned, null: none).
  void setObserver(ExecutorObserver *observer) { executor_->setObserver(observer); }
  /// Counts the MoE layers' tokens per expert into `load` (Executor::
  /// setExpertLoad; not owned, null: none).
  void setExpertLoad(moe::ExpertLoad *load) { executor_->setExpertLoad(load); }
  /// LoRA dropout on (training) or off (evaluation): Executor::setAdapterDropout.
  void setAdapterDropout(bool on) { executor_->setAdapterDropout(on); }
  /// Whether the forward has a result named "aux_loss" (a mixture of
  /// experts' router load-balancing loss, as transformers names it).
  bool hasAuxLoss() const { return auxLossIndex_ >= 0; }
  /// The last forward's aux_loss, detached (undefined without one, or when
  /// it is not a tensor).
  const at::Tensor &lastAuxLoss() const { return lastAuxLoss_; }
  /// The program's fused regions (Executor::fusedRegions).
  std::vector<fusion::FusedRegion *> fusedRegions() const { return executor_->fusedRegions(); }
  /// Whether the program has fused regions and they run generated CUDA
  /// kernels on this device (fusion::FusedRegion::usesKernels).
  bool usesFusedKernels() const;
  /// Weight gradients that their matmuls wrote straight into ZeRO's flat
  /// gradient, not copied there, on this rank since construction
  /// (ZeroStorage::gradientsWrittenInPlace; 0 without ZeRO).
  int64_t gradientsWrittenInPlace() const;
  /// Operators of recomputed (checkpointed) blocks whose values were not
  /// computed, only their backward recorded, since construction
  /// (Executor::recomputeSkips).
  int64_t recomputeSkips() const;

  /// Elements in all distinct trainable parameters (of the whole model).
  int64_t numParameters() const;
  /// ZeroStorage::gatheredParameters (0 without ZeRO storage).
  int64_t gatheredParameters() const;
  /// Bytes of frozen parameters this rank holds between gathers: its shards
  /// of the frozen storage groups, plus frozen parameters outside them.
  int64_t frozenBytesPerRank() const;
  const plan::Plan &plan() const { return plan_; }
  at::Device device() const { return device_; }
  /// The communicator of all ranks (a local one for a single process).
  Comm &world() { return *world_; }
  /// The ranks that train on other rows of the batch and average their
  /// gradients: world() without tensor parallelism, else the N/T ranks of
  /// this rank's TP rank (data-parallel rank = world rank / T).
  /// Pipeline parallelism: the D ranks of this rank's stage (and TP rank).
  Comm &dataParallel() { return dataComm_ ? *dataComm_ : stageComm_ ? *stageComm_ : *world_; }

  /// Pipeline parallelism (plan pipelineStages P > 1; docs/runtime/
  /// pipeline.md): rank r of N runs stage r / (T x D) (D = N / (P x T)),
  /// is its data-parallel rank (r / T) % D and TP rank r % T
  /// (dataParallel() is the stage's D ranks of its TP rank).
  /// The stage holds the storage groups its part of the program reads
  /// (Executor::stageGroups): its blocks', stage 0 the embeddings', stage
  /// P - 1 the final norm's and head's; a group both read (a tied
  /// embedding) is held by both, and synchronizeGradients sums its
  /// gradient between them. The forward runs the stage's part of the
  /// program (Executor::setPipelineStage): set the values entering it
  /// (from stage - 1) before each forward, take those leaving it after.
  /// gradNorm() is over all stages (the outside groups once);
  /// fullParameters() gives rank 0 every stage's parameters.
  int64_t pipelineStages() const { return stages_; }
  int64_t pipelineStage() const { return stage_; }
  /// Virtual stages (plan pipelineVirtualStages V > 1, interleaved 1F1B):
  /// the stage runs chunks stage, stage + P, ..., its local chunks 0..V-1,
  /// and holds the groups of all of them; selectPipelineChunk(v) picks the
  /// one the next forward runs (0 at first; std::out_of_range unless
  /// 0 <= v < V). isFirstChunk / isLastStage: the chunk selected is the
  /// pipeline's first / last (with V = 1: stage 0 / P - 1). The ranks that
  /// run the chunk before and after the selected one: the same
  /// data-parallel rank of stage s - 1 and s + 1 (mod P).
  int64_t pipelineVirtualStages() const { return virtualStages_; }
  void selectPipelineChunk(int64_t v);
  bool isFirstChunk() const { return stage_ == 0 && chunk_ == 0; }
  bool isLastStage() const { return stage_ == stages_ - 1 && chunk_ == virtualStages_ - 1; }
  int64_t pipelinePreviousRank() const;
  int64_t pipelineNextRank() const;
  /// The communicator of what world rank `from` sends to world rank `to`
  /// in a pipeline (PipelineTransfer: the values entering a chunk, or their
  /// gradients going back): one copy of the world per kind and direction
  /// (from < to, from > to). On NCCL a communicator queues the sends and
  /// receives between two ranks on one stream, where two ranks sending to
  /// each other at once (1F1B at P = 2, in every steady step) would each
  /// wait for the other's receive; apart, each communicator carries one
  /// kind one way, its k-th send of a pair matching the k-th receive.
  /// std::logic_error when the model has no stages or from == to.
  Comm &pipelineChannel(PipelineTransfer kind, int64_t from, int64_t to);
  /// The ranks of one stage, T x D (the world without stages): rank r's
  /// peer on the next stage is r + stageRanks() (the same TP and
  /// data-parallel ranks).
  int64_t stageRanks() const { return world_->size() / stages_; }
  /// Checkpoints of a pipeline: by plan storage group, the stage whose
  /// ranks save it, the first that holds it (stage 0 for a group stages 0
  /// and P - 1 share, and for one no stage reads); empty without stages.
  std::vector<int64_t> groupSavingStages() const;
  void setStageInputs(std::vector<c10::IValue> values) {
    executor_->stageInputs = std::move(values);
  }
  std::vector<c10::IValue> takeStageOutputs() { return std::move(executor_->stageOutputs); }
  /// Seeds ATen's default generators (CPU, and the run device's), which
  /// the program's random operators (dropout) draw from and which ATen
  /// seeds nondeterministically, from `seed` and the data-parallel rank:
  /// a run repeats, data-parallel ranks draw different masks, and the ranks
  /// of a TP group, which hold the same replicated activations, the same
  /// ones (Megatron-LM's second generator per TP rank, for dropout on split
  /// activations, is not here: there the TP ranks' masks are alike).
  void seedGenerators(uint64_t seed);
  /// This rank's TP group (T consecutive ranks; TP rank = world rank % T),
  /// null without tensor parallelism (T == 1).
  Comm *tensorParallel() { return tensorComm_.get(); }
  /// The training loss of `logits` against `labels` (int64 [batch, seq],
  /// -100 where no target; position t predicts label t):
  /// languageModelLoss(logits, labels, false), or with a vocab-parallel LM
  /// head (plan vocabParallel) vocabParallelCrossEntropy over the TP group
  /// of the logits [batch, seq, Vp / T] this rank holds. Collective then.
  at::Tensor loss(const at::Tensor &logits, const at::Tensor &labels);

private:
  plan::Plan plan_;
  std::string adapterSettings_;
  at::Device device_;
  std::unique_ptr<Comm> ownWorld_;
  Comm *world_ = nullptr;
  std::unique_ptr<Comm> tensorComm_, dataComm_; ///< T > 1 only
  std::unique_ptr<Comm> expertComm_;            ///< the expert group (plan expert_parallel > 1 only)
  std::unique_ptr<ParameterStorage> storage_; ///< replicated, or zero_
  ZeroStorage *zero_ = nullptr;               ///< storage_ under ZeRO, else null
  std::unique_ptr<Executor> executor_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> parameterNames_;
  size_t logitsIndex_ = 0;
  bool hasLogits_ = false;
  int64_t auxLossIndex_ = -1; ///< the result named "aux_loss", else -1
  at::Tensor lastAuxLoss_;
  size_t lossIndex_ = 0; ///< the result named "loss", else 0
  std::vector<c10::IValue> run(const ModelInputs &inputs);

  // Pipeline parallelism (ModelPipeline.cpp).
  int64_t stages_ = 1, stage_ = 0;
  int64_t virtualStages_ = 1, chunk_ = 0; ///< V, the local chunk selected
  std::unique_ptr<Comm> stageComm_, tieComm_;
  /// pipelineChannel's: [kind][0: to a higher rank, 1: to a lower one].
  std::unique_ptr<Comm> channels_[2][2];
  std::vector<bool> held_; ///< by plan group
  /// [local chunk][plan group]: the groups whose Gather / Release it runs.
  std::vector<std::vector<bool>> chunkHeld_;
  /// The global chunks this stage runs (V = 1: the stage).
  std::vector<int64_t> pipelineChunks() const;
  std::vector<bool> tied_; ///< by plan group: held by stages 0 and P - 1
  /// Checks the plan and the options, splits the world; returns held_.
  std::vector<bool> setUpPipeline(const std::string &path, const ModelOptions &options);
  /// The data-parallel communicator's color of world rank `rank` with
  /// T > 1: its TP rank, and with P > 1 its stage too (ranks: TP
  /// innermost, then data-parallel, stages outermost).
  int64_t dataParallelColor(int64_t rank) const;
  /// Sets each group's TP copy (tp_rank > 0) to its first copy's entry.
  void sameAsFirstCopy(std::vector<bool> &byGroup) const;
  void sumTiedGradients();
  at::Tensor pipelineGradNorm();
  void collectStageParameters(std::vector<std::pair<std::string, at::Tensor>> &out);
  /// The plan group of ZeRO shard `shard`.
  size_t shardGroup(size_t shard) const;
};

/// Pipeline parallelism: sends `values` (tensors, each on its device, and
/// plain values: ints, lists, None...) to rank `peer` of `comm`, which
/// receives them with recvValues (the k-th send matching its k-th recv).
/// With `inFlight` the sends are appended to it, not waited for (the
/// caller waits before the step ends: on NCCL a wait makes the compute
/// stream wait for the send, which must not come before the next receive
/// is posted); without, each is waited for.
/// Throws ExecutionError for a value that is neither a tensor nor
/// picklable without tensors (a list of tensors), naming its position.
void sendValues(Comm &comm, const std::vector<c10::IValue> &values, int64_t peer,
                std::vector<std::shared_ptr<Work>> *inFlight = nullptr);
/// Receives what sendValues sent from `peer`; tensors on `device`, with
/// requiresGrad[i] whether value i required grad at the sender (they do
/// not here).
std::vector<c10::IValue> recvValues(Comm &comm, int64_t peer, at::Device device,
                                    std::vector<bool> *requiresGrad = nullptr);

/// The language-modelling loss, mean over positions whose label is not -100:
/// cross-entropy of logits [batch, seq, vocab] against labels [batch, seq]
/// (int64). With `shift`, position t predicts label t+1 (causal LM, as
/// transformers' ForCausalLMLoss); without, position t predicts label t
/// (masked LM). Computed in float32 or wider (crossEntropy(): fused CUDA
/// kernels on the GPU).
at::Tensor languageModelLoss(const at::Tensor &logits, const at::Tensor &labels,
                             bool shift);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_EXEC_MODEL_H
