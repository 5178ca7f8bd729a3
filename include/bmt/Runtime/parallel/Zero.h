//===- Zero.h - ZeRO-3/2 sharded parameters at run time ---------*- C++ -*-===//
//
// Holds each storage group of the plan (Plan.h) as this rank's 1/N shard and
// drives the plan's schedule, as BMTrain's DistributedParameter /
// CheckpointBlock / TransformerBlockList do by hand:
//
//   - loading: rank r reads only its contiguous range of each group's record
//     (Archive::readGroupRange); tensors outside groups are read whole;
//   - forward: `bmt.all_gather` starts gathering a group's flat buffer
//     (asynchronously; the prefetch), a parameter's first use waits for it,
//     `bmt.release` frees the buffer (ZeRO-3);
//   - backward: a released block is gathered again before its backward runs
//     and the `prefetch depth` blocks before it are prefetched; when a
//     group's gradient is complete its reduce-scatter starts (overlapping the
//     backward of the blocks before it) and the gathered buffer is freed;
//     finishGradients() adds the results (all-reduced across replicas under
//     hybrid sharding) to the shards' gradients;
//   - checkpointed blocks run without autograd in forward and are recomputed
//     (same RNG state) in backward, as torch.utils.checkpoint's reentrant
//     variant;
//   - the optimizer updates the shards (bf16/fp16 ones through float32
//     masters, which are copied into the shards after the step, or which
//     the optimizer writes into them itself from the gradients as reduced:
//     letOptimizerWriteShards); clipping uses the global norm.
//   - with the optimizer offloaded (OffloadAdam.h), each group's gradient
//     is copied to host memory as soon as its last reduce-scatter of the
//     step has finished, on a copy stream, while the backward of the blocks
//     before it runs; there are no float32 master copies on the device.
//
// Frozen parameters (plan groups marked frozen) are sharded, gathered,
// prefetched and freed the same way, but are never linked to autograd: no
// gradient, no reduce-scatter, no master, not among shards(). A block's
// frozen groups are freed once its backward is done (after the recompute's
// backward of a checkpointed block, else when the block before it starts
// its backward), the others at finishGradients / releaseAll.
//
// Gradients are averaged over all ranks (each rank runs its own slice of
// the global batch), so N ranks with micro-batch b train exactly as one
// process with micro-batch N*b.
//
// Rank layout (hybrid sharding with shard group size G, world size W):
// shard group s = ranks [s*G, (s+1)*G), shard rank = rank % G; replica group
// of shard rank k = ranks {k, k+G, ...}. G = 0 means G = W.
//
// Tensor parallelism (plan tensor_parallel T > 1): the storage shards over
// the data-parallel communicator (the N/T ranks of one TP rank t; the
// layout above with W = N/T, ranks counted in it), holds the group copies
// of tp_rank t (local slices), averages gradients over the data-parallel
// ranks only, sums the gradients of reduce_grad members over the TP group,
// and computes the gradient norm over the whole model (split members on
// every TP rank, replicated ones once).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_PARALLEL_ZERO_H
#define BMT_RUNTIME_PARALLEL_ZERO_H

#include "bmt/Plan/Archive.h"
#include "bmt/Runtime/comm/Comm.h"
#include "bmt/Runtime/exec/Executor.h"
#include "bmt/Runtime/optim/HostGradients.h"
#include "bmt/Runtime/optim/Optimizer.h"
#include "bmt/Runtime/parallel/Storage.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <deque>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace bmt::runtime {

class ZeroStorage : public ExecutorHooks, public HostGradientSource, public ParameterStorage {
public:
  /// Reads this rank's shard of every storage group of `archive`'s plan
  /// (plan.zeroStage must be 2 or 3) onto `device`; the shards become
  /// autograd leaves. `world` is the communicator of all ranks; the shard
  /// and replica communicators are split from it (collective: every rank
  /// constructs its ZeroStorage at the same time). `progress(done, total)`
  /// reports bytes read of this rank's share.
  /// `offloadOptimizer`: the optimizer keeps its state in host memory
  /// (OffloadAdamW over shards(), fed by this storage as its
  /// HostGradientSource): bf16/fp16 groups get no float32 master on the
  /// device, and every group's gradient is copied to a host buffer when
  /// it is complete (see setMicroBatchesPerStep).
  /// `tensorComm` / `dataComm` (both or neither; not owned): under tensor
  /// parallelism, the TP group of this rank and the data-parallel ranks of
  /// its TP rank, split from `world` (Model does); null when T == 1.
  /// Throws plan::PlanError for a bad archive, CommError when the world
  /// (data-parallel) size is not a multiple of the plan's shard group size
  /// (naming both) or a collective fails.
  static std::unique_ptr<ZeroStorage>
  load(plan::Archive &archive, at::Device device, Comm &world,
       const std::function<void(int64_t, int64_t)> &progress = nullptr,
       bool offloadOptimizer = false, Comm *tensorComm = nullptr, Comm *dataComm = nullptr,
       const std::vector<bool> *heldGroups = nullptr);
  ~ZeroStorage() override;
  /// Pipeline parallelism: `heldGroups` (load's last argument; null: all)
  /// says which plan groups this rank holds; the others have no shard and
  /// no buffer here. The plan group of shards()[i].
  int64_t planGroupOf(size_t shard) const;
  /// Off: gradientSlot gives no slot, so every gradient is reduced from
  /// its own tensor (needed when the forwards and backwards of several
  /// micro-batches interleave, as in a pipeline's 1F1B schedule).
  void setGradientSlots(bool on) { gradientSlots_ = on; }
  /// On: the groups outside the blocks stay gathered after their gradient
  /// is reduced, until the step (a pipeline's 1F1B runs a micro-batch's
  /// backward while later forwards' graphs still read them: BERT's
  /// embedding LayerNorm; no hook gathers them again as it does a block's).
  void setKeepOutsideGathered(bool on) { keepOutsideGathered_ = on; }

  // ExecutorHooks.
  at::Tensor global(int64_t index) override;
  void gather(int64_t group) override;
  void release(int64_t group) override;
  std::vector<c10::IValue> callBlock(const plan::Instruction &inst, const Run &run,
                                     const Run &recompute,
                                     std::vector<c10::IValue> args) override;
  /// A member's slice of its group's flat gradient (the reduce-scatter's
  /// input), when the group's reduce dtype is the member's dtype: the
  /// group's backward then copies nothing for that member.
  at::Tensor gradientSlot(const at::Tensor &param) override;
  at::Tensor givenGradientSlot(const at::Tensor &param) override;
  /// Members' gradients found in their slots by the groups' backwards (not
  /// copied), since construction.
  int64_t gradientsWrittenInPlace() const { return gradientsInPlace_; }

  // ParameterStorage.
  /// Starts a new forward pass: the next use of each group under grad mode
  /// links its parameters to the shard anew.
  void beginForward() override;
  /// Without grad mode, frees the gathered buffers (releaseAll).
  void endForward(bool gradMode) override;
  /// finishGradients().
  void synchronizeGradients() override { finishGradients(); }
  /// refreshFromMasters() (but for the shards the optimizer writes, see
  /// letOptimizerWriteShards), then releaseAll() (the gathered buffers
  /// are stale).
  void afterOptimizerStep() override;
  /// refreshFromMasters() of every shard, then releaseAll(): after a
  /// checkpoint's values were copied into the masters.
  void parametersChanged() override;

  /// Waits for the gradient reduce-scatters the backward started, all-reduces
  /// them across replicas (hybrid sharding), averages over all ranks and
  /// adds them to the shards' gradients. Call after the last backward of a
  /// step, before reading the gradients. Collective.
  /// Offloading, each reduce-scatter is processed this way on the copy
  /// stream while the backward still runs (when the next one starts), and
  /// a group's gradient is copied to its host buffer after its
  /// micro-batches-per-step-th reduce-scatter of the step; this call
  /// processes the rest, copies the gradients of the groups that had fewer
  /// and makes the compute stream wait for the copy stream (the device
  /// gradients may then be modified in place: fp16 unscaling).
  void finishGradients();
  /// Offloading: the backward passes (micro-batches) of one optimizer step,
  /// so that a group's gradient goes to the host as soon as it is complete
  /// (default 1). A step "starts" at the first reduce-scatter after
  /// finishGradients().
  void setMicroBatchesPerStep(int64_t n) { microBatchesPerStep_ = n; }
  bool offloadsOptimizer() const { return offload_; }

  // HostGradientSource (offloading): parameter i is shards()[i].
  std::vector<size_t> hostGradientOrder() const override { return hostOrder_; }
  at::Tensor waitHostGradient(size_t i) override;
  /// Frees every gathered buffer (after an optimizer step the buffers are
  /// stale; after a forward without grad nothing needs them).
  void releaseAll();
  /// Copies every float32 master into its low-precision shard (rounding);
  /// call after the optimizer updated the masters.
  void refreshFromMasters();

  /// The bf16/fp16 shards of the float32 masters among shards(), as the
  /// optimizer may write them (Optimizer::writeLowPrecisionCopies): param
  /// = the shard's index, copy = the shard, gradDivisor = the number of
  /// data-parallel ranks. Empty offloading (no masters on the device).
  std::vector<LowPrecisionCopy> lowPrecisionCopies() const;
  /// After the optimizer took lowPrecisionCopies() over: a master's
  /// gradient stays as reduced (the reduce dtype, the sum over the
  /// data-parallel ranks: no cast to float32, no division), gradNorm()
  /// divides (accumulating in float32), gatherGroup() returns the average
  /// in float32, and afterOptimizerStep() leaves those shards to the
  /// optimizer. Meant for one backward a step: a second reduce-scatter into
  /// the same gradient before zeroGrad makes it a float32 sum (exact
  /// accumulation, then still undivided). For the rest of the run (the
  /// optimizer divides from now on). Throws std::logic_error when
  /// offloading.
  void letOptimizerWriteShards();
  bool optimizerWritesShards() const { return optimizerWritesShards_; }
  /// The dtype gradients are reduce-scattered in: `dtype`, or (nullopt,
  /// the default) each group's own dtype. float32 for bf16/fp16 groups
  /// reduces in full precision (--reduce-dtype float32).
  void setReduceDtype(std::optional<c10::ScalarType> dtype) override { reduceDtype_ = dtype; }

  /// The trainable shards, one per group: [shardSize] of the group's dtype,
  /// requires_grad; their .grad() is this rank's slice of the gradient
  /// averaged over all ranks. The padding elements stay zero. For a group
  /// of dtype bfloat16/float16 it is the shard's float32 master copy (mixed
  /// precision, as BMTrain): its gradient is float32, the optimizer updates
  /// it, and refreshFromMasters() copies it into the low-precision shard
  /// that is gathered for forward and backward; or, once the optimizer
  /// writes the shards (letOptimizerWriteShards), the gradient is in the
  /// reduce dtype and is the sum over the data-parallel ranks. Offloading, it is the shard
  /// itself for every dtype (the masters live in host memory, in the
  /// OffloadAdamW), and the gradient of a bf16/fp16 shard is float32.
  const std::vector<at::Tensor> &shards() const { return shards_; }
  /// Their names (the groups' names).
  const std::vector<std::string> &shardNames() const { return shardNames_; }
  /// Global L2 norm of the gradients over all ranks (a float64 tensor of one
  /// element on the device), without a host synchronisation. Collective.
  at::Tensor gradNorm() override;
  /// This rank's part of the squared norm behind gradNorm() (float64 [1]
  /// on the device, before any collective): the shards for which
  /// `counts(shard index)` holds (all without it), split members whole,
  /// TP-replicated ones 1/T. Summed over the TP group and the shard group
  /// (or a pipeline's world) it is the squared global norm.
  at::Tensor gradSquares(const std::function<bool(size_t)> &counts = {});
  /// Storage group `group`'s (an index of shards(); the plan's group index
  /// when T == 1) whole flat buffer [shard size x shard ranks]
  /// (a new tensor on the device; members at the plan's offsets, padding
  /// after the last shard's end), or its gradient with `gradient` (zeros
  /// when none; float32 for a bf16/fp16 group, averaged over ranks). Gathered from the shard
  /// group's shards: collective, every rank calls it for the same groups in
  /// the same order. Throws CommError.
  at::Tensor gatherGroup(int64_t group, bool gradient = false);

  /// Group `group`'s place on this rank, for checkpoints: its shard in the
  /// group's dtype ([shardSize], not a master copy), this rank's shard
  /// index and the number of shards (the shard group's size), and whether
  /// this rank is the first replica of that shard (hybrid sharding).
  struct ShardPlace {
    at::Tensor shard;
    int64_t shardIndex = 0, numShards = 1;
    bool firstReplica = true;
  };
  ShardPlace shardPlace(int64_t group) const;

  /// Frozen parameter `index` (a plan tensor index, a member of a frozen
  /// group), whole: its group gathered (collective over the shard group:
  /// every rank asks for the same parameters in the same order; the buffer
  /// stays gathered until another group is asked for or releaseAll), and
  /// the member copied out. Throws std::logic_error for another tensor.
  at::Tensor frozenParameter(int64_t index);
  /// Bytes of this rank's shards of the frozen groups (the frozen
  /// parameters it holds between gathers).
  int64_t frozenShardBytes() const;

  /// Elements in the trainable groups' real (unpadded) buffers, counting each
  /// parameter once.
  int64_t numParameters() const;
  /// Elements of the parameters this rank's gathers materialize: every
  /// member of the groups it holds, at its local size (a TP slice, or for
  /// a split over the expert group this rank's position's experts).
  int64_t gatheredParameters() const;
  Comm &world() { return world_; }
  /// The communicator of the ranks that hold the other shards of this
  /// rank's groups (the shard group).
  Comm &shardComm() { return *shardComm_; }

private:
  struct Group;
  /// The storage of `plan` (load's arguments) with every shard zero: the
  /// communicators split, the groups laid out, their buffers freed.
  ZeroStorage(const plan::Plan &plan, at::Device device, Comm &world, bool offloadOptimizer,
              Comm *tensorComm, Comm *dataComm, const std::vector<bool> *heldGroups);
  bool gradientSlots_ = true;
  bool keepOutsideGathered_ = false;
  /// Makes `shard` group g's shard (an autograd leaf) and, for a bf16/fp16
  /// group not offloaded, its float32 master; shards() gets the trainable one.
  void setShard(Group &g, at::Tensor shard);
  // The autograd functions of comm/Collectives.cpp (gatherZeroGroup,
  // regatherInBackward) and the recompute of a checkpointed block
  // (parallel/BlockRecompute.cpp).
  friend struct GatherFunction;
  friend struct RegatherFunction;
  friend struct CheckpointFunction;

  /// This rank's shard `range` of plan group `planGroup` ([shardSize],
  /// padding zero) read from `archive`; under hybrid sharding each replica
  /// reads 1/R of it and all-gathers the rest over the replica group.
  /// Throws plan::PlanError, CommError.
  at::Tensor readShard(plan::Archive &archive, int64_t planGroup, const plan::ShardRange &range,
                       const at::TensorOptions &options);
  void startGather(Group &g);
  void ensureGathered(Group &g);
  void freeBuffer(Group &g);
  /// gradientSlot (given false: a new slot, once a pass) and
  /// givenGradientSlot (given true: the one given already).
  at::Tensor slotOf(const at::Tensor &param, bool given);
  /// Gathers the groups of block `blockIndex` of `list` (waiting) and
  /// starts the gathers of the `prefetchDepth` blocks before it: the
  /// backward order.
  void prepareBackward(const std::string &list, int64_t blockIndex);
  /// prepareBackward, and the block's groups linked to their shards anew
  /// (global()) by the recompute of a checkpointed block.
  void prepareRecompute(const std::string &list, int64_t blockIndex);
  /// Member tensors aliasing group g's gathered buffer (no autograd).
  std::vector<at::Tensor> memberViews(Group &g);
  /// gatherZeroGroup's forward: group `group` (an index of groups_)
  /// gathered (waiting), its members' views.
  std::vector<at::Tensor> gatheredMembers(int64_t group);
  /// gatherZeroGroup's backward: the members' gradients `grads` laid out
  /// flat, the reduce_grad ranges all-reduced over the TP group, the
  /// reduce-scatter started (startReduceGradient), the buffer freed.
  void reduceMemberGradients(int64_t group, const std::vector<at::Tensor> &grads);
  /// Starts reduce-scattering the full gradient `flat` of group g
  /// (finishGradients adds the result to the shard's gradient).
  void startReduceGradient(Group &g, const at::Tensor &flat);
  struct PendingGradient;
  /// Waits for a reduce-scatter and adds its result to the gradient
  /// (offloading: on the copy stream; then the host copy when complete).
  void addGradient(PendingGradient &p);
  /// Offloading: copies group g's gradient to g.hostGrad (called on the
  /// copy stream).
  void copyGradientToHost(Group &g);
  /// The dtype of group g's gradient: float32 for bf16/fp16 (their
  /// masters'), else the group's.
  c10::ScalarType gradientDtype(const Group &g) const;
  /// The groups (trainable and frozen) of block `index` of `list`.
  const std::vector<Group *> &blockGroups(const std::string &list, int64_t index) const;
  /// Whether block `index` of `list` has a trainable group.
  bool blockTrains(const std::string &list, int64_t index) const;
  /// Frees the frozen groups of block `blockIndex` of `list` (ZeRO-3; its
  /// backward is over). CheckpointFunction calls it after the recompute.
  void releaseFrozen(const std::string &list, int64_t blockIndex);
  c10::ScalarType reduceDtype(const Group &g) const;

  /// The Group of plan group index `group` (a tp_rank 0 or -1 copy).
  Group &groupOf(int64_t group);

  const plan::Plan &plan_;
  at::Device device_;
  Comm &world_;
  Comm &data_;          ///< the ranks gradients are averaged over (world_ when T == 1)
  Comm *tensor_ = nullptr; ///< the TP group (null when T == 1)
  /// Plan group index (a tp/ep_rank 0 or -1 copy) -> the group of this
  /// rank (null for the copies of other TP / expert group positions).
  std::vector<Group *> byPlan_;
  std::unique_ptr<Comm> shardComm_, replicaComm_;
  /// With expert parameters split over the expert group: the N/E ranks at
  /// this rank's position in their expert groups (null otherwise).
  std::unique_ptr<Comm> expertShardComm_;
  std::vector<std::unique_ptr<Group>> groups_; ///< trainable, shards_ order
  std::vector<std::unique_ptr<Group>> frozen_;  ///< frozen groups
  Group *frozenRead_ = nullptr;                 ///< frozenParameter's gathered group
  std::vector<at::Tensor> shards_;
  std::vector<std::string> shardNames_;
  std::map<std::pair<std::string, int64_t>, std::vector<Group *>> blocks_;
  struct PendingGradient {
    int64_t group = 0;
    at::Tensor flat; ///< the reduce-scatter's input (kept for the copy stream's use)
    at::Tensor out;
    std::shared_ptr<Work> work;
    /// Offloading on CUDA: recorded on the compute stream after the
    /// collective was issued (the local backend copies on that stream).
    std::optional<c10::Event> issued;
  };
  std::deque<PendingGradient> pendingGradients_;
  std::optional<c10::ScalarType> reduceDtype_;
  bool optimizerWritesShards_ = false; ///< letOptimizerWriteShards
  /// gradientSlot: the group of a gathered buffer's storage; members'
  /// gradients the groups' backwards found in place.
  std::map<const c10::StorageImpl *, int64_t> groupOfStorage_;
  int64_t gradientsInPlace_ = 0;
  // Offloading (see the constructor and finishGradients).
  bool offload_ = false;
  int64_t microBatchesPerStep_ = 1;
  bool stepOpen_ = false;         ///< a reduce-scatter came after the last finishGradients
  std::vector<size_t> hostOrder_; ///< groups whose gradient went to the host this step
  std::optional<c10::Stream> copyStream_; ///< CUDA: gradient accumulation and D2H copies
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_PARALLEL_ZERO_H
