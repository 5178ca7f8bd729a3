//===- Zero.cpp - ZeRO-3/2 sharded parameters at run time -----------------===//
//
// Each group's gathered buffer lives in one c10::StorageImpl for the whole
// run; "freeing" it swaps its data pointer for an empty one and "gathering"
// allocates a new one and fills it. Every tensor that aliases the buffer
// (the member views handed to operators, and the ones autograd saved for
// backward) keeps pointing at that StorageImpl, so a buffer freed after the
// forward and gathered again before the backward is seen by the saved
// tensors without any bookkeeping. (FSDP1 frees its flat parameters the same
// way, by resizing their storage to zero.)
//
// Offloading the optimizer (--offload-optimizer), the reduce-scatter results
// are added to the gradients on a copy stream, one reduce-scatter behind the
// backward (when the next one starts), and a group's gradient is copied to
// pinned host memory as soon as it is complete, so that the copies overlap
// the backward of the blocks before it:
//
//   compute: bwd(k)  bwd(k-1)  bwd(k-2) ...            [finish] wait(copy) -> norm, ...
//   nccl:          RS(k)     RS(k-1)   ...
//   copy:                wait(RS k) acc(k) D2H(k)  wait(RS k-1) acc(k-1) D2H(k-1) ...
//
// Caching-allocator safety: a reduce-scatter's input and output are used on
// the copy stream after it waited for the collective (record_stream(copy));
// a gradient allocated on the copy stream is used by the compute stream
// afterwards (record_stream(compute)), so neither block is reused before
// the other stream is done with it. The host buffers live as long as the
// storage, whose destructor waits for the copy stream.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/parallel/Zero.h"

#include "bmt/Runtime/comm/Collectives.h"
#include "parallel/BlockRecompute.h"
#include "parallel/ShardLayout.h"
#include "exec/SavedPointer.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

using c10::IValue;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace bmt::runtime {

namespace {

/// Where a group lies: the plan's group and this rank's shard of it
/// (ShardLayout.h), fixed once the storage is built.
struct GroupLayout : ShardLayout {
  int64_t index = 0;                        ///< in groups_ and shards_
  int64_t planGroup = 0;                    ///< in plan.groups
  const plan::StorageGroup *info = nullptr; ///< this TP rank's copy

  /// This rank's elements of the buffer, as plan::shardRange gives them.
  plan::ShardRange range() const {
    plan::ShardRange r;
    r.begin = begin;
    r.end = end;
    r.shardSize = shardSize;
    return r;
  }
};

/// The gathered buffer: freed (only the shard is held), its all-gather in
/// flight, or holding the gathered values.
enum class BufferState { Sharded, Gathering, Gathered };

/// Offloading: this step's gradient on its way to host memory.
struct OffloadState {
  int64_t contributions = 0;    ///< reduce-scatters added to the gradient this step
  bool onHost = false;          ///< its copy to hostGrad was started this step
  at::Tensor hostGrad;          ///< [shardSize] of gradientDtype, pinned on CUDA
  std::optional<c10::Event> hostGradReady; ///< CUDA: after the latest copy to hostGrad
};

} // namespace

struct ZeroStorage::Group {
  explicit Group(GroupLayout l)
      : layout(std::move(l)), slotFlat(layout.info->members.size(), -1) {}
  const GroupLayout layout;
  /// The ranks the shards run over: the shard group, or for a group of
  /// expert parameters split over the expert group its expert-replica
  /// group (the N/E ranks at this rank's position in their expert groups).
  Comm *comm = nullptr;
  at::Tensor shard;             ///< [shardSize] of the group's dtype: gathered from
  at::Tensor master;            ///< [shardSize] float32 master of a bf16/fp16 shard
                                ///< (what the optimizer updates), else undefined
  // The gathered buffer.
  c10::intrusive_ptr<c10::StorageImpl> storage; ///< the gathered buffer's bytes
  at::Tensor full;              ///< [padded] over `storage`
  std::vector<at::Tensor> views; ///< members over `storage`, no autograd
  BufferState state = BufferState::Sharded;
  std::shared_ptr<Work> pending; ///< the all-gather in flight (state Gathering)
  // This forward pass's state, dropped by beginForward (and the links by a
  // recompute and releaseAll).
  /// The members linked to `shard` by gatherZeroGroup; empty until the pass
  /// first reads one with autograd on.
  variable_list linked;
  /// Per member: the flat gradient its slot was given from this pass (by
  /// `flats`, the count of flat gradients made), -1 before gradientSlot.
  std::vector<int64_t> slotFlat;
  // The flat gradient of the backward under way, made by the first
  // gradientSlot() (the group's backward takes it), and how many were made.
  at::Tensor gradFlat;
  int64_t flats = 0;
  OffloadState offload;
};

namespace {

/// The layout of plan group `planGroup`, groups_[index], of which this
/// rank holds shard `shardRank` of `shardRanks`, with T = `tp`.
GroupLayout groupLayout(const plan::Plan &plan, int64_t index, int64_t planGroup,
                        int64_t shardRank, int64_t shardRanks, int64_t tp) {
  const plan::StorageGroup &info = plan.groups[planGroup];
  std::vector<ShardMember> members;
  for (size_t m = 0; m < info.members.size(); ++m) {
    const plan::TensorInfo &t = plan.tensors[info.members[m]];
    members.push_back({info.offsets[m], t.localNumel(tp, plan.expertParallel),
                       t.split.isTensorSplit(), t.split.reduceGrad});
  }
  GroupLayout l;
  static_cast<ShardLayout &>(l) = shardLayout(info.size, members, shardRank, shardRanks, tp > 1);
  l.index = index;
  l.planGroup = planGroup;
  l.info = &info;
  return l;
}

/// The ranges [begin, end) of a buffer of `size` elements that no defined
/// gradient of `grads` (one per member, at `offsets`) covers.
std::vector<std::pair<int64_t, int64_t>> uncoveredRanges(const std::vector<int64_t> &offsets,
                                                         int64_t size, const variable_list &grads) {
  std::vector<std::pair<int64_t, int64_t>> covered, gaps;
  for (size_t m = 0; m < grads.size(); ++m)
    if (grads[m].defined())
      covered.emplace_back(offsets[m], offsets[m] + grads[m].numel());
  std::sort(covered.begin(), covered.end());
  int64_t cursor = 0;
  for (const auto &[begin, end] : covered) {
    if (begin > cursor)
      gaps.emplace_back(cursor, begin);
    cursor = std::max(cursor, end);
  }
  if (cursor < size)
    gaps.emplace_back(cursor, size);
  return gaps;
}

} // namespace

std::unique_ptr<ZeroStorage>
ZeroStorage::load(plan::Archive &archive, at::Device device, Comm &world,
                  const std::function<void(int64_t, int64_t)> &progress, bool offloadOptimizer,
                  Comm *tensorComm, Comm *dataComm) {
  if (archive.plan().zeroStage != 2 && archive.plan().zeroStage != 3)
    throw plan::PlanError(archive.path() + ": the plan has no ZeRO storage groups");
  std::unique_ptr<ZeroStorage> zero(new ZeroStorage(archive.plan(), device, world,
                                                    offloadOptimizer, tensorComm, dataComm));
  int64_t total = 0, done = 0;
  auto bytes = [&](const Group &g) {
    return (g.layout.end - g.layout.begin) *
           static_cast<int64_t>(c10::elementSize(g.layout.info->dtype)) /
           zero->replicaComm_->size();
  };
  for (const auto &g : zero->groups_)
    total += bytes(*g);
  for (auto &g : zero->groups_) {
    at::Tensor shard = zero->readShard(archive, g->layout.planGroup, g->layout.range(),
                                       g->shard.options());
    zero->setShard(*g, shard);
    done += bytes(*g);
    if (progress)
      progress(done, total);
  }
  return zero;
}

void ZeroStorage::setShard(Group &g, at::Tensor shard) {
  shard.set_requires_grad(true); // gatherZeroGroup's input (its gradient stays undefined)
  g.shard = shard;
  at::Tensor trainable = shard;
  const c10::ScalarType dtype = g.layout.info->dtype;
  if ((dtype == at::kBFloat16 || dtype == at::kHalf) && !offload_) {
    // Mixed precision: the optimizer updates a float32 master of the
    // shard; the shard (what is gathered) is refreshed from it.
    // (Offloading, the master lives in host memory, in the optimizer.)
    g.master = shard.detach().to(at::kFloat);
    g.master.set_requires_grad(true);
    trainable = g.master;
  }
  shards_[g.layout.index] = trainable;
}

ZeroStorage::ZeroStorage(const plan::Plan &plan, at::Device device, Comm &world,
                         bool offloadOptimizer, Comm *tensorComm, Comm *dataComm)
    : plan_(plan), device_(device), world_(world),
      data_(dataComm ? *dataComm : world), tensor_(tensorComm), offload_(offloadOptimizer) {
  const int64_t tp = plan_.tensorParallel, tpRank = tensor_ ? tensor_->rank() : 0;
  if ((tp > 1) != (tensor_ != nullptr) || (tensor_ && (!dataComm || tensor_->size() != tp)))
    throw std::logic_error("ZeroStorage: the TP and data-parallel communicators do not match "
                           "the plan's tensor_parallel " + std::to_string(tp));
  int64_t worldSize = data_.size(), rank = data_.rank();
  int64_t shardSize = plan_.shardGroupSize > 0 ? plan_.shardGroupSize : worldSize;
  if (worldSize % shardSize != 0)
    throw CommError((tp > 1 ? "data-parallel size " : "world size ") + std::to_string(worldSize) +
                    (tp > 1 ? " (world size " + std::to_string(world.size()) + " / tensor parallel " +
                                  std::to_string(tp) + ")"
                            : std::string()) +
                    " is not a multiple of the plan's shard group size " +
                    std::to_string(shardSize) + " (hybrid sharding; recompile with "
                    "--shard-group-size dividing the number of ranks)");
  shardComm_ = data_.split(rank / shardSize, rank, "shard");
  replicaComm_ = data_.split(rank % shardSize, rank, "replica");
  // Expert parameters split over the expert group (E consecutive ranks):
  // position p = rank % E holds experts p of each, sharded over the N/E
  // ranks of that position (docs/runtime/parallel.md).
  const int64_t ep = plan_.expertParallel, epRank = rank % ep;
  if (plan_.splitsExperts()) {
    if (tp > 1 || shardSize != worldSize || worldSize % ep != 0)
      throw CommError("expert parameters split over expert groups of " + std::to_string(ep) +
                      " ranks need a world size that is a multiple of " + std::to_string(ep) +
                      (tp > 1 ? ", no tensor parallelism" : "") +
                      (shardSize != worldSize ? ", no hybrid sharding (--shard-group-size)" : "") +
                      "; got " + std::to_string(worldSize) + " ranks (recompile with "
                      "--split-expert-weights=false to store every expert on every rank)");
    expertShardComm_ = data_.split(epRank, rank, "expert-replica");
  }

  // The groups this rank holds: with T > 1 the copy of its TP rank of each,
  // with expert splits the copy of its expert-group position.
  std::vector<int64_t> copies;
  slots_.assign(plan_.groups.size(), -1);
  for (size_t i = 0; i < plan_.groups.size(); ++i)
    if (plan_.groups[i].tpRank <= 0 && plan_.groups[i].epRank <= 0) {
      slots_[i] = static_cast<int64_t>(copies.size());
      copies.push_back(plan_.epGroup(plan_.tpGroup(static_cast<int64_t>(i), tpRank), epRank));
    }
  for (size_t i = 0; i < copies.size(); ++i) {
    const plan::StorageGroup &info = plan_.groups[copies[i]];
    Comm *comm = info.epRank >= 0 ? expertShardComm_.get() : shardComm_.get();
    auto g = std::make_unique<Group>(groupLayout(plan_, static_cast<int64_t>(i), copies[i],
                                                 comm->rank(), comm->size(), tp));
    g->comm = comm;
    at::TensorOptions options = at::TensorOptions().dtype(info.dtype).device(device_);
    // Zeros until load() reads the archive (setShard).
    g->shard = at::zeros({g->layout.shardSize}, options);
    if (offload_) {
      g->offload.hostGrad =
          emptyHostTensor(g->layout.shardSize, gradientDtype(*g), device_.is_cuda());
      if (device_.is_cuda())
        g->offload.hostGradReady.emplace(device_.type());
    }

    at::Tensor holder = at::empty({g->layout.padded}, options);
    g->storage = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
        holder.storage().unsafeGetStorageImpl());
    g->full = at::empty({0}, options).set_(holder.storage(), 0, {g->layout.padded}, {1});
    for (size_t m = 0; m < info.members.size(); ++m) {
      const plan::TensorInfo &t = plan_.tensors[info.members[m]];
      const std::vector<int64_t> shape = t.localShape(tp, ep);
      std::vector<int64_t> strides(shape.size(), 1);
      for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
        strides[d] = strides[d + 1] * shape[d + 1];
      g->views.push_back(
          at::empty({0}, options).set_(holder.storage(), info.offsets[m], shape, strides));
    }
    freeBuffer(*g);
    groupOfStorage_[g->storage.get()] = g->layout.index;
    if (!info.blockList.empty())
      blocks_[{info.blockList, info.blockIndex}].push_back(g->layout.index);
    shards_.push_back(g->shard);
    shardNames_.push_back(info.name);
    groups_.push_back(std::move(g));
  }
  if (offload_ && device_.is_cuda())
    copyStream_ = c10::impl::VirtualGuardImpl(device_.type())
                      .getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
}

at::Tensor ZeroStorage::readShard(plan::Archive &archive, int64_t planGroup,
                                  const plan::ShardRange &range,
                                  const at::TensorOptions &options) {
  at::Tensor shard = at::zeros({range.shardSize}, options);
  if (replicaComm_->size() == 1) {
    at::Tensor local = archive.readGroupRange(planGroup, range.begin, range.end);
    shard.narrow(0, 0, local.numel()).copy_(local);
  } else {
    // Hybrid sharding: the R replicas of a shard each read 1/R of it and
    // all-gather the rest, so that every rank reads 1/N of the weights.
    int64_t replicas = replicaComm_->size();
    plan::ShardRange piece =
        plan::shardRange(range.shardSize, replicaComm_->rank(), replicas);
    int64_t begin = std::min(range.end, range.begin + piece.begin);
    int64_t end = std::min(range.end, range.begin + piece.end);
    at::Tensor mine = at::zeros({piece.shardSize}, options);
    at::Tensor local = archive.readGroupRange(planGroup, begin, end);
    mine.narrow(0, 0, local.numel()).copy_(local);
    at::Tensor gathered = at::empty({piece.shardSize * replicas}, options);
    replicaComm_->allGather(gathered, mine)->wait();
    shard.copy_(gathered.narrow(0, 0, range.shardSize));
  }
  return shard;
}

ZeroStorage::~ZeroStorage() {
  for (PendingGradient &p : pendingGradients_) {
    try {
      p.work->wait();
    } catch (...) {
    }
  }
  for (auto &g : groups_)
    if (g->pending) {
      try {
        g->pending->wait();
      } catch (...) {
      }
    }
  if (copyStream_) {
    try {
      copyStream_->synchronize(); // the copies into the host buffers freed here
    } catch (...) {
    }
  }
}

void ZeroStorage::startGather(Group &g) {
  if (g.state != BufferState::Sharded)
    return;
  size_t nbytes = static_cast<size_t>(g.layout.padded) * c10::elementSize(g.layout.info->dtype);
  if (g.comm->size() == 1 && g.layout.shardSize == g.layout.padded) {
    // One rank holds the whole group: the "gathered" buffer is the shard
    // itself (a non-owning pointer; freeBuffer drops it), no copy.
    g.storage->set_data_ptr_noswap(at::DataPtr(g.shard.data_ptr(), device_));
    g.storage->set_nbytes(nbytes);
    g.state = BufferState::Gathered;
    return;
  }
  if (g.storage->nbytes() != nbytes) {
    g.storage->set_data_ptr_noswap(g.storage->allocator()->allocate(nbytes));
    g.storage->set_nbytes(nbytes);
  }
  g.pending = g.comm->allGather(g.full, g.shard.detach());
  g.state = BufferState::Gathering;
}

void ZeroStorage::ensureGathered(Group &g) {
  if (g.state == BufferState::Gathered)
    return;
  startGather(g);
  if (g.state == BufferState::Gathered) // one rank: the shard itself, nothing to wait for
    return;
  std::shared_ptr<Work> work = std::move(g.pending);
  g.pending.reset();
  work->wait();
  g.state = BufferState::Gathered;
}

void ZeroStorage::freeBuffer(Group &g) {
  if (g.pending) {
    std::shared_ptr<Work> work = std::move(g.pending);
    g.pending.reset();
    work->wait();
  }
  g.storage->set_data_ptr_noswap(at::DataPtr(nullptr, device_));
  g.storage->set_nbytes(0);
  g.state = BufferState::Sharded;
}

std::vector<at::Tensor> ZeroStorage::memberViews(Group &g) {
  // Fresh tensor objects over the same storage (autograd gives each output
  // of a custom function its own history).
  std::vector<at::Tensor> out;
  for (const at::Tensor &v : g.views)
    out.push_back(at::empty({0}, v.options()).set_(v.storage(), v.storage_offset(), v.sizes(),
                                                    v.strides()));
  return out;
}

std::vector<at::Tensor> ZeroStorage::gatheredMembers(int64_t group) {
  Group &g = *groups_[group];
  ensureGathered(g);
  return memberViews(g);
}

void ZeroStorage::reduceMemberGradients(int64_t group, const std::vector<at::Tensor> &grads) {
  Group &g = *groups_[group];
  // The members' gradients are copied in; only what they leave (the
  // padding, alignment gaps, members without a gradient) is zeroed, in
  // place of a zero-fill of the whole buffer that writes it twice, unless
  // that would take more than a few small fills.
  std::vector<std::pair<int64_t, int64_t>> gaps =
      uncoveredRanges(g.layout.info->offsets, g.layout.padded, grads);
  // The flat gradient the members' slots are in (gradientSlot), or a new one.
  at::Tensor flat = std::move(g.gradFlat);
  g.gradFlat = at::Tensor();
  const bool slots = flat.defined(); // then a whole fill would erase them
  if (!slots)
    flat = at::empty({g.layout.padded}, g.shard.options().dtype(reduceDtype(g)));
  if (gaps.size() > 4 && !slots)
    flat.zero_();
  else
    for (const auto &[begin, end] : gaps)
      flat.narrow(0, begin, end - begin).zero_();
  // One multi-tensor copy (and cast) of every member's gradient: on CUDA
  // one launch where a copy_ per member is a launch and its host work each.
  std::vector<at::Tensor> into, from;
  for (size_t m = 0; m < grads.size(); ++m)
    if (grads[m].defined()) {
      at::Tensor slice = flat.narrow(0, g.layout.info->offsets[m], grads[m].numel());
      if (grads[m].is_contiguous() && grads[m].scalar_type() == flat.scalar_type() &&
          grads[m].data_ptr() == slice.data_ptr()) {
        ++gradientsInPlace_; // written in its slot by the op that made it
        continue;
      }
      into.push_back(slice);
      from.push_back(grads[m].reshape({-1}));
    }
  if (!into.empty())
    at::_foreach_copy_(into, from);
  // Tensor parallelism: replicated members whose gradient differs per TP
  // rank get the sum over the TP group (every TP rank runs this backward
  // in the same order).
  for (const auto &[begin, end] : g.layout.reduceGradRanges)
    tensor_->allReduce(flat.narrow(0, begin, end - begin))->wait();
  startReduceGradient(g, flat);
  freeBuffer(g);
  // The shard's gradient arrives in finishGradients(), so that this
  // reduce-scatter overlaps the backward of the blocks before this one.
}

void ZeroStorage::startReduceGradient(Group &g, const at::Tensor &flat) {
  if (offload_ && !stepOpen_) {
    // The first reduce-scatter of a step.
    stepOpen_ = true;
    hostOrder_.clear();
    for (auto &group : groups_) {
      group->offload.contributions = 0;
      group->offload.onHost = false;
    }
  }
  PendingGradient pending;
  pending.group = g.layout.index;
  pending.flat = flat;
  // One rank: the flat gradient is the shard's (the local reduce-scatter
  // sees the same memory and copies nothing).
  pending.out = g.comm->size() == 1 && g.layout.shardSize == flat.numel()
                    ? flat
                    : at::empty({g.layout.shardSize}, flat.options());
  // The sum over the group's ranks (for expert parameters the N/E of its
  // position, which hold every gradient of those experts); addGradient
  // divides by the data-parallel size, as for dense parameters.
  pending.work = g.comm->reduceScatter(pending.out, flat);
  if (copyStream_) {
    pending.issued.emplace(device_.type());
    pending.issued->record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  }
  pendingGradients_.push_back(std::move(pending));
  if (!offload_)
    return;
  // Offloading: finish the previous reduce-scatter now (on the copy stream,
  // without blocking the host on CUDA; the CPU backend blocks, but that
  // collective had the backward of a block to complete).
  while (pendingGradients_.size() > 1) {
    PendingGradient p = std::move(pendingGradients_.front());
    pendingGradients_.pop_front();
    addGradient(p);
  }
}

c10::ScalarType ZeroStorage::gradientDtype(const Group &g) const {
  c10::ScalarType t = g.layout.info->dtype;
  return t == at::kBFloat16 || t == at::kHalf ? at::kFloat : t;
}

void ZeroStorage::addGradient(PendingGradient &p) {
  Group &g = *groups_[p.group];
  at::Tensor &param = shards_[g.layout.index];
  std::optional<c10::Stream> compute;
  std::optional<c10::StreamGuard> onCopyStream;
  if (copyStream_) {
    compute = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
    onCopyStream.emplace(*copyStream_);
  }
  // The copy stream follows the compute stream up to the collective's
  // issue (`flat` was written there; the local backend copies there) and
  // the collective itself (NCCL: wait() makes the current stream wait).
  if (p.issued)
    p.issued->block(*copyStream_);
  p.work->wait();
  if (replicaComm_->size() > 1)
    replicaComm_->allReduce(p.out)->wait();
  if (optimizerWritesShards_ && g.master.defined()) {
    // The optimizer reads the gradient as reduced and divides it itself
    // (letOptimizerWriteShards); a second contribution makes a float32 sum.
    if (!param.grad().defined()) {
      param.mutable_grad() = p.out;
    } else {
      if (param.grad().scalar_type() != at::kFloat)
        param.mutable_grad() = param.grad().to(at::kFloat);
      param.mutable_grad().add_(p.out);
    }
    return;
  }
  at::Tensor out = p.out.to(gradientDtype(g)); // fp32 accumulation of a master's gradient
  if (data_.size() > 1)
    out.div_(static_cast<double>(data_.size()));
  if (param.grad().defined())
    param.mutable_grad().add_(out);
  else
    param.mutable_grad() = out;
  if (!offload_)
    return;
  if (copyStream_) {
    p.flat.record_stream(*copyStream_);
    p.out.record_stream(*copyStream_);
    param.grad().record_stream(*copyStream_);
    param.grad().record_stream(*compute);
  }
  ++g.offload.contributions;
  if (g.offload.contributions >= microBatchesPerStep_)
    copyGradientToHost(g); // complete (a later contribution copies again)
}

void ZeroStorage::copyGradientToHost(Group &g) {
  const at::Tensor &grad = shards_[g.layout.index].grad();
  // Pinned host memory: asynchronous on the (current) copy stream.
  g.offload.hostGrad.copy_(grad.reshape({-1}), /*non_blocking=*/copyStream_.has_value());
  if (copyStream_)
    g.offload.hostGradReady->record(*copyStream_);
  if (!g.offload.onHost) {
    g.offload.onHost = true;
    hostOrder_.push_back(static_cast<size_t>(g.layout.index));
  }
}

at::Tensor ZeroStorage::waitHostGradient(size_t i) {
  Group &g = *groups_.at(i);
  if (!g.offload.onHost)
    throw std::logic_error("ZeroStorage: group " + g.layout.info->name +
                           " has no gradient in host memory this step");
  if (g.offload.hostGradReady)
    g.offload.hostGradReady->synchronize();
  return g.offload.hostGrad;
}

void ZeroStorage::finishGradients() {
  std::deque<PendingGradient> pending = std::move(pendingGradients_);
  pendingGradients_.clear();
  for (PendingGradient &p : pending)
    addGradient(p);
  if (!offload_)
    return;
  {
    std::optional<c10::StreamGuard> onCopyStream;
    if (copyStream_)
      onCopyStream.emplace(*copyStream_);
    for (auto &g : groups_)
      if (g->offload.contributions > 0 && !g->offload.onHost)
        copyGradientToHost(*g); // fewer micro-batches than announced
  }
  for (auto &g : groups_)
    if (g->pending) { // (none in practice) the compute stream waits for every read of a shard
      std::shared_ptr<Work> work = std::move(g->pending);
      g->pending.reset();
      work->wait();
      g->state = BufferState::Gathered;
    }
  if (copyStream_) {
    // The device gradients are complete, and no longer read by the copies
    // to the host, once the compute stream gets past this point.
    c10::Event copied(device_.type());
    copied.record(*copyStream_);
    copied.block(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  }
  stepOpen_ = false;
}

const std::vector<int64_t> &ZeroStorage::blockGroups(const std::string &list,
                                                     int64_t index) const {
  static const std::vector<int64_t> none;
  auto it = blocks_.find({list, index});
  return it == blocks_.end() ? none : it->second;
}

void ZeroStorage::prepareBackward(const std::string &list, int64_t blockIndex) {
  for (int64_t d = 1; d <= plan_.prefetchDepth; ++d)
    for (int64_t g : blockGroups(list, blockIndex - d))
      startGather(*groups_[g]);
  for (int64_t g : blockGroups(list, blockIndex))
    ensureGathered(*groups_[g]);
}

void ZeroStorage::prepareRecompute(const std::string &list, int64_t blockIndex) {
  prepareBackward(list, blockIndex);
  for (int64_t g : blockGroups(list, blockIndex))
    groups_[g]->linked.clear(); // link anew in the recompute
}

ZeroStorage::Group &ZeroStorage::groupOf(int64_t group) {
  int64_t slot = slots_.at(group);
  if (slot < 0)
    throw std::logic_error("ZeroStorage: plan group " + std::to_string(group) +
                           " is the copy of another TP rank");
  return *groups_[slot];
}

at::Tensor ZeroStorage::global(int64_t index) {
  const plan::TensorInfo &info = plan_.tensors.at(index);
  Group &g = groupOf(info.group);
  size_t member = 0;
  while (g.layout.info->members[member] != index)
    ++member;
  if (c10::GradMode::is_enabled()) {
    if (g.linked.empty())
      g.linked = gatherZeroGroup(g.shard, *this, g.layout.index);
    return g.linked[member];
  }
  ensureGathered(g);
  return g.views[member];
}

at::Tensor ZeroStorage::gradientSlot(const at::Tensor &param) { return slotOf(param, false); }

at::Tensor ZeroStorage::givenGradientSlot(const at::Tensor &param) { return slotOf(param, true); }

at::Tensor ZeroStorage::slotOf(const at::Tensor &param, bool given) {
  if (!param.defined() || !param.has_storage() || !param.is_contiguous())
    return {};
  auto it = groupOfStorage_.find(param.storage().unsafeGetStorageImpl());
  if (it == groupOfStorage_.end())
    return {};
  Group &g = *groups_[it->second];
  if (reduceDtype(g) != param.scalar_type())
    return {};
  size_t m = 0;
  while (m < g.views.size() && !(g.views[m].storage_offset() == param.storage_offset() &&
                                 g.views[m].sizes() == param.sizes()))
    ++m;
  if (m == g.views.size())
    return {};
  if ((g.slotFlat[m] != -1) != given)
    return {};
  if (given) // still the flat gradient it was given in (not yet reduced)
    return g.gradFlat.defined() && g.slotFlat[m] == g.flats
               ? g.gradFlat.narrow(0, g.layout.info->offsets[m], param.numel()).view(param.sizes())
               : at::Tensor();
  if (!g.gradFlat.defined()) {
    g.gradFlat = at::empty({g.layout.padded}, g.shard.options().dtype(reduceDtype(g)));
    ++g.flats;
  }
  g.slotFlat[m] = g.flats;
  return g.gradFlat.narrow(0, g.layout.info->offsets[m], param.numel()).view(param.sizes());
}

void ZeroStorage::gather(int64_t group) { startGather(groupOf(group)); }

void ZeroStorage::release(int64_t group) {
  Group &g = groupOf(group);
  // Under ZeRO-2 the plan has no release; a buffer still needed for a
  // backward is gathered again by regatherInBackward/callRecomputed.
  freeBuffer(g);
}

std::vector<IValue> ZeroStorage::callBlock(const plan::Instruction &inst, const Run &run,
                                           const Run &recompute, std::vector<IValue> args) {
  if (!c10::GradMode::is_enabled())
    return run(std::move(args));
  if (inst.checkpoint)
    return callRecomputed(inst, run, recompute, std::move(args), *this, device_,
                          !blockGroups(inst.blockList, inst.blockIndex).empty());
  std::vector<IValue> results = run(std::move(args));
  if (plan_.zeroStage != 3)
    return results;
  variable_list outputs;
  std::vector<size_t> positions;
  for (size_t i = 0; i < results.size(); ++i)
    if (results[i].isTensor() && results[i].toTensor().requires_grad()) {
      positions.push_back(i);
      outputs.push_back(results[i].toTensor());
    }
  if (outputs.empty())
    return results;
  variable_list gated =
      regatherInBackward(at::TensorList(outputs), *this, inst.blockList, inst.blockIndex);
  for (size_t k = 0; k < positions.size(); ++k)
    results[positions[k]] = gated[k];
  return results;
}

void ZeroStorage::beginForward() {
  for (auto &g : groups_) {
    g->linked.clear();
    std::fill(g->slotFlat.begin(), g->slotFlat.end(), -1);
  }
}

void ZeroStorage::endForward(bool gradMode) {
  if (!gradMode)
    releaseAll();
}

void ZeroStorage::afterOptimizerStep() {
  if (!optimizerWritesShards_)
    refreshFromMasters(); // (else the optimizer wrote every master's shard)
  releaseAll();
}

void ZeroStorage::parametersChanged() {
  refreshFromMasters();
  releaseAll();
}

std::vector<LowPrecisionCopy> ZeroStorage::lowPrecisionCopies() const {
  std::vector<LowPrecisionCopy> copies;
  for (const auto &g : groups_)
    if (g->master.defined())
      copies.push_back({static_cast<size_t>(g->layout.index), g->shard.detach(), data_.size()});
  return copies;
}

void ZeroStorage::letOptimizerWriteShards() {
  if (offload_)
    throw std::logic_error("ZeroStorage: offloading, the optimizer's masters are in host memory "
                           "and it writes no device shard");
  optimizerWritesShards_ = true;
}

c10::ScalarType ZeroStorage::reduceDtype(const Group &g) const {
  return reduceDtype_ ? *reduceDtype_ : g.layout.info->dtype;
}

void ZeroStorage::refreshFromMasters() {
  c10::NoGradGuard noGrad;
  for (auto &g : groups_)
    if (g->master.defined())
      g->shard.detach().copy_(g->master.detach());
}

void ZeroStorage::releaseAll() {
  for (auto &g : groups_) {
    freeBuffer(*g);
    g->linked.clear();
  }
}

namespace {

/// Gradients whose squared norms add up with one weight.
struct NormTerms {
  std::vector<at::Tensor> full, reduced; ///< float32/float64, and bf16/fp16
  void add(const at::Tensor &t) {
    (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf ? reduced : full)
        .push_back(t);
  }
  /// The sum of their squared L2 norms, float64 [1] on `device` (foreach
  /// norms; bf16/fp16 accumulate and return in float32).
  at::Tensor sumSquares(at::Device device) const {
    at::Tensor sum = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
    if (!full.empty())
      sum += at::stack(at::_foreach_norm(full, 2)).to(at::kDouble).pow(2).sum();
    if (!reduced.empty())
      sum += at::stack(at::_foreach_norm(reduced, 2, at::kFloat)).to(at::kDouble).pow(2).sum();
    return sum;
  }
};

} // namespace

at::Tensor ZeroStorage::gradNorm() {
  c10::NoGradGuard noGrad;
  // Sum of squares of this rank's shards (foreach norms, float64 across
  // shards and ranks), all-reduced over the shard group; no host sync.
  // Gradients the optimizer divides itself (letOptimizerWriteShards) are
  // sums over the data-parallel ranks: their squares count 1 / ranks^2.
  // Tensor parallelism: split members count on every TP rank, replicated
  // ones once (1/T of them on each of the T ranks, which hold the same).
  NormTerms averaged, summed, averagedReplicated, summedReplicated;
  for (const auto &g : groups_) {
    const at::Tensor &grad = shards_[g->layout.index].grad();
    if (!grad.defined())
      continue;
    const bool sum = optimizerWritesShards_ && g->master.defined();
    if (!tensor_) {
      (sum ? summed : averaged).add(grad);
      continue;
    }
    for (const auto &[begin, end] : g->layout.splitRanges)
      (sum ? summed : averaged).add(grad.narrow(0, begin, end - begin));
    for (const auto &[begin, end] : g->layout.replicatedRanges)
      (sum ? summedReplicated : averagedReplicated).add(grad.narrow(0, begin, end - begin));
  }
  const double ranks = static_cast<double>(data_.size());
  at::Tensor sumSquares = averaged.sumSquares(device_);
  if (!summed.full.empty() || !summed.reduced.empty())
    sumSquares += summed.sumSquares(device_) / (ranks * ranks);
  if (tensor_) {
    const double t = static_cast<double>(tensor_->size());
    if (!averagedReplicated.full.empty() || !averagedReplicated.reduced.empty())
      sumSquares += averagedReplicated.sumSquares(device_) / t;
    if (!summedReplicated.full.empty() || !summedReplicated.reduced.empty())
      sumSquares += summedReplicated.sumSquares(device_) / (t * ranks * ranks);
    tensor_->allReduce(sumSquares)->wait();
  }
  shardComm_->allReduce(sumSquares)->wait();
  return sumSquares.sqrt();
}

at::Tensor ZeroStorage::gatherGroup(int64_t group, bool gradient) {
  Group &g = *groups_.at(group);
  const at::Tensor &param = shards_[g.layout.index];
  at::Tensor local = gradient ? param.grad() : g.shard.detach();
  if (!local.defined())
    local = at::zeros({g.layout.shardSize}, g.shard.options().dtype(gradientDtype(g)));
  else if (gradient && optimizerWritesShards_ && g.master.defined()) {
    // A sum in the reduce dtype (letOptimizerWriteShards): the average,
    // in float32, as addGradient makes it otherwise.
    local = local.to(at::kFloat);
    if (data_.size() > 1)
      local.div_(static_cast<double>(data_.size()));
  }
  at::Tensor full = at::empty({g.layout.padded}, local.options());
  g.comm->allGather(full, local.contiguous())->wait();
  return full;
}

ZeroStorage::ShardPlace ZeroStorage::shardPlace(int64_t group) const {
  const Group &g = *groups_.at(group);
  return {g.shard.detach(), g.comm->rank(), g.comm->size(), replicaComm_->rank() == 0};
}

int64_t ZeroStorage::gatheredParameters() const {
  int64_t n = 0;
  for (const auto &g : groups_)
    for (const at::Tensor &view : g->views)
      n += view.numel();
  return n;
}

int64_t ZeroStorage::numParameters() const {
  int64_t n = 0;
  for (const auto &g : groups_)
    for (int64_t m : g->layout.info->members)
      n += plan_.tensors[m].numel();
  return n;
}

} // namespace bmt::runtime
