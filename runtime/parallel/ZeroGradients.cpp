//===- ZeroGradients.cpp - ZeRO gradients: reduce-scatters, norm ---------===//
//
// The backward half of ZeroStorage (Zero.h): a group's members' gradients
// laid out flat and reduce-scattered into the shard's gradient, the
// offloaded gradients' copies to host memory, and the global norm.
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

#include "parallel/ZeroGroup.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

using torch::autograd::variable_list;

namespace bmt::runtime {

using zero::BufferState;

namespace {

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
  if (!keepOutsideGathered_ || !g.layout.info->blockList.empty())
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
  // The backward is over: no block needs its frozen parameters any more
  // (those outside blocks stay gathered until the step, as trainable ones).
  for (auto &g : frozen_)
    if (!g->layout.info->blockList.empty())
      freeBuffer(*g);
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

at::Tensor ZeroStorage::gradSquares(const std::function<bool(size_t)> &counts) {
  c10::NoGradGuard noGrad;
  // Sum of squares of this rank's shards (foreach norms, float64 across
  // shards and ranks); no host sync.
  // Gradients the optimizer divides itself (letOptimizerWriteShards) are
  // sums over the data-parallel ranks: their squares count 1 / ranks^2.
  // Tensor parallelism: split members count on every TP rank, replicated
  // ones once (1/T of them on each of the T ranks, which hold the same).
  NormTerms averaged, summed, averagedReplicated, summedReplicated;
  for (const auto &g : groups_) {
    const at::Tensor &grad = shards_[g->layout.index].grad();
    if (!grad.defined() || (counts && !counts(g->layout.index)))
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
  }
  return sumSquares;
}

at::Tensor ZeroStorage::gradNorm() {
  // This rank's squares, all-reduced over the TP group and the shard group.
  at::Tensor sumSquares = gradSquares();
  if (tensor_)
    tensor_->allReduce(sumSquares)->wait();
  shardComm_->allReduce(sumSquares)->wait();
  return sumSquares.sqrt();
}

} // namespace bmt::runtime
