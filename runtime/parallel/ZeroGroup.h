//===- ZeroGroup.h - a ZeRO storage group's state (private) ----*- C++ -*-===//
//
// ZeroStorage::Group and its parts, shared by parallel/Zero.cpp (layout,
// gathers, frees, the forward and backward hooks) and
// parallel/ZeroGradients.cpp (reduce-scatters, offloading, the norm).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_PARALLEL_ZEROGROUP_H
#define BMT_RUNTIME_PARALLEL_ZEROGROUP_H

#include "bmt/Runtime/parallel/Zero.h"
#include "parallel/ShardLayout.h"

#include <c10/core/Event.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/variable.h>

#include <optional>
#include <vector>

namespace bmt::runtime {

namespace zero {

/// Where a group lies: the plan's group and this rank's shard of it
/// (ShardLayout.h), fixed once the storage is built.
struct GroupLayout : ShardLayout {
  int64_t index = 0;                        ///< in groups_ and shards_ (frozen: in frozen_)
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

} // namespace zero

struct ZeroStorage::Group {
  explicit Group(zero::GroupLayout l)
      : layout(std::move(l)), slotFlat(layout.info->members.size(), -1) {}
  const zero::GroupLayout layout;
  /// A group of frozen parameters: gathered and freed like the others, no
  /// autograd link to its shard, no gradient, no master.
  bool frozen() const { return layout.info->frozen; }
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
  zero::BufferState state = zero::BufferState::Sharded;
  std::shared_ptr<Work> pending; ///< the all-gather in flight (state Gathering)
  // This forward pass's state, dropped by beginForward (and the links by a
  // recompute and releaseAll).
  /// The members linked to `shard` by gatherZeroGroup; empty until the pass
  /// first reads one with autograd on.
  torch::autograd::variable_list linked;
  /// Per member: the flat gradient its slot was given from this pass (by
  /// `flats`, the count of flat gradients made), -1 before gradientSlot.
  std::vector<int64_t> slotFlat;
  // The flat gradient of the backward under way, made by the first
  // gradientSlot() (the group's backward takes it), and how many were made.
  at::Tensor gradFlat;
  int64_t flats = 0;
  zero::OffloadState offload;
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_PARALLEL_ZEROGROUP_H
