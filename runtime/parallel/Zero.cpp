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
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/parallel/Zero.h"

#include "bmt/Runtime/comm/Collectives.h"
#include "parallel/BlockRecompute.h"
#include "parallel/ShardLayout.h"
#include "parallel/ZeroGroup.h"
#include "exec/SavedPointer.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

using c10::IValue;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace bmt::runtime {

using zero::BufferState;
using zero::GroupLayout;

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

} // namespace

std::unique_ptr<ZeroStorage>
ZeroStorage::load(plan::Archive &archive, at::Device device, Comm &world,
                  const std::function<void(int64_t, int64_t)> &progress, bool offloadOptimizer,
                  Comm *tensorComm, Comm *dataComm, const std::vector<bool> *heldGroups) {
  if (archive.plan().zeroStage != 2 && archive.plan().zeroStage != 3)
    throw plan::PlanError(archive.path() + ": the plan has no ZeRO storage groups");
  std::unique_ptr<ZeroStorage> zero(new ZeroStorage(archive.plan(), device, world,
                                                    offloadOptimizer, tensorComm, dataComm,
                                                    heldGroups));
  int64_t total = 0, done = 0;
  auto bytes = [&](const Group &g) {
    return (g.layout.end - g.layout.begin) *
           static_cast<int64_t>(c10::elementSize(g.layout.info->dtype)) /
           zero->replicaComm_->size();
  };
  for (const auto *list : {&zero->groups_, &zero->frozen_})
    for (const auto &g : *list)
      total += bytes(*g);
  for (const auto *list : {&zero->groups_, &zero->frozen_})
    for (const auto &g : *list) {
      at::Tensor shard = zero->readShard(archive, g->layout.planGroup, g->layout.range(),
                                         g->shard.options());
      if (g->frozen())
        g->shard = shard; // read only: no master, no autograd leaf
      else
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
                         bool offloadOptimizer, Comm *tensorComm, Comm *dataComm,
                         const std::vector<bool> *heldGroups)
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
  // Expert parameters split over the expert group (E consecutive
  // data-parallel ranks of one TP rank): position p = rank % E holds experts
  // p of each, sharded over the D/E data-parallel ranks of that position
  // (docs/runtime/parallel.md).
  const int64_t ep = plan_.expertParallel, epRank = rank % ep;
  if (plan_.splitsExperts()) {
    if (shardSize != worldSize || worldSize % ep != 0)
      throw CommError("expert parameters split over expert groups of " + std::to_string(ep) +
                      " ranks need a data-parallel size that is a multiple of " +
                      std::to_string(ep) +
                      (shardSize != worldSize ? ", no hybrid sharding (--shard-group-size)" : "") +
                      "; got " + std::to_string(worldSize) + " ranks (recompile with "
                      "--split-expert-weights=false to store every expert on every rank)");
    expertShardComm_ = data_.split(epRank, rank, "expert-replica");
  }

  // The groups this rank holds: with T > 1 the copy of its TP rank of each,
  // with expert splits the copy of its expert-group position.
  // Trainable groups are groups_[k] (shards_[k]), frozen ones frozen_[k].
  std::vector<std::pair<int64_t, int64_t>> copies; // (plan group, its tp/ep_rank 0 copy)
  for (size_t i = 0; i < plan_.groups.size(); ++i)
    if (plan_.groups[i].tpRank <= 0 && plan_.groups[i].epRank <= 0 &&
        (!heldGroups || heldGroups->at(i)))
      copies.emplace_back(plan_.epGroup(plan_.tpGroup(static_cast<int64_t>(i), tpRank), epRank),
                          static_cast<int64_t>(i));
  byPlan_.assign(plan_.groups.size(), nullptr);
  for (const auto &[copy, first] : copies) {
    const plan::StorageGroup &info = plan_.groups[copy];
    Comm *comm = info.epRank >= 0 ? expertShardComm_.get() : shardComm_.get();
    auto &list = info.frozen ? frozen_ : groups_;
    auto g = std::make_unique<Group>(groupLayout(plan_, static_cast<int64_t>(list.size()), copy,
                                                 comm->rank(), comm->size(), tp));
    g->comm = comm;
    at::TensorOptions options = at::TensorOptions().dtype(info.dtype).device(device_);
    // Zeros until load() reads the archive (setShard).
    g->shard = at::zeros({g->layout.shardSize}, options);
    if (offload_ && !info.frozen) {
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
    byPlan_[first] = g.get();
    if (!info.blockList.empty())
      blocks_[{info.blockList, info.blockIndex}].push_back(g.get());
    if (!info.frozen) {
      groupOfStorage_[g->storage.get()] = g->layout.index;
      shards_.push_back(g->shard);
      shardNames_.push_back(info.name);
    }
    list.push_back(std::move(g));
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
  for (const auto *list : {&groups_, &frozen_})
    for (const auto &g : *list)
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


const std::vector<ZeroStorage::Group *> &ZeroStorage::blockGroups(const std::string &list,
                                                                   int64_t index) const {
  static const std::vector<Group *> none;
  auto it = blocks_.find({list, index});
  return it == blocks_.end() ? none : it->second;
}

bool ZeroStorage::blockTrains(const std::string &list, int64_t index) const {
  const std::vector<Group *> &groups = blockGroups(list, index);
  return std::any_of(groups.begin(), groups.end(), [](const Group *g) { return !g->frozen(); });
}

void ZeroStorage::prepareBackward(const std::string &list, int64_t blockIndex) {
  // The block after this one has run its backward (autograd reaches this
  // block's outputs once their gradient is complete): its frozen
  // parameters are no longer needed. (Its trainable groups were freed by
  // their own backward, reduceMemberGradients.)
  releaseFrozen(list, blockIndex + 1);
  for (int64_t d = 1; d <= plan_.prefetchDepth; ++d)
    for (Group *g : blockGroups(list, blockIndex - d))
      startGather(*g);
  for (Group *g : blockGroups(list, blockIndex))
    ensureGathered(*g);
}

void ZeroStorage::prepareRecompute(const std::string &list, int64_t blockIndex) {
  prepareBackward(list, blockIndex);
  for (Group *g : blockGroups(list, blockIndex))
    g->linked.clear(); // link anew in the recompute
}

void ZeroStorage::releaseFrozen(const std::string &list, int64_t blockIndex) {
  if (plan_.zeroStage != 3)
    return; // ZeRO-2 keeps the parameters gathered until the step
  for (Group *g : blockGroups(list, blockIndex))
    if (g->frozen())
      freeBuffer(*g);
}

ZeroStorage::Group &ZeroStorage::groupOf(int64_t group) {
  Group *g = byPlan_.at(group);
  if (!g)
    throw std::logic_error("ZeroStorage: plan group " + std::to_string(group) +
                           " is the copy of another TP rank");
  return *g;
}

at::Tensor ZeroStorage::global(int64_t index) {
  const plan::TensorInfo &info = plan_.tensors.at(index);
  Group &g = groupOf(info.group);
  size_t member = 0;
  while (g.layout.info->members[member] != index)
    ++member;
  if (c10::GradMode::is_enabled() && !g.frozen()) {
    if (g.linked.empty())
      g.linked = gatherZeroGroup(g.shard, *this, g.layout.index);
    return g.linked[member];
  }
  ensureGathered(g);
  return g.views[member];
}

at::Tensor ZeroStorage::gradientSlot(const at::Tensor &param) {
  return gradientSlots_ ? slotOf(param, false) : at::Tensor();
}

int64_t ZeroStorage::planGroupOf(size_t shard) const {
  return groups_.at(shard)->layout.planGroup;
}

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
                          blockTrains(inst.blockList, inst.blockIndex));
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
  for (auto &g : frozen_)
    freeBuffer(*g);
  frozenRead_ = nullptr;
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

at::Tensor ZeroStorage::frozenParameter(int64_t index) {
  const plan::TensorInfo &info = plan_.tensors.at(index);
  if (info.group < 0 || !groupOf(info.group).frozen())
    throw std::logic_error("ZeroStorage: " + info.name + " is not in a frozen storage group");
  Group &g = groupOf(info.group);
  size_t member = 0;
  while (g.layout.info->members[member] != index)
    ++member;
  // Gathered once for all its members (callers go through a group's
  // members in turn): the previous group's buffer is freed when another
  // is asked for.
  if (frozenRead_ && frozenRead_ != &g)
    freeBuffer(*frozenRead_);
  frozenRead_ = &g;
  ensureGathered(g);
  return g.views[member].clone();
}

int64_t ZeroStorage::frozenShardBytes() const {
  int64_t bytes = 0;
  for (const auto &g : frozen_)
    bytes += g->layout.shardSize * static_cast<int64_t>(c10::elementSize(g->layout.info->dtype));
  return bytes;
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
