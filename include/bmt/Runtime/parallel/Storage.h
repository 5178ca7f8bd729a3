//===- Storage.h - how a model's parameters live across ranks ---*- C++ -*-===//
//
// What a Model asks of its parameters' storage around a training step,
// whichever it is: replicated (every rank holds every parameter; gradients
// are all-reduced, as torch DistributedDataParallel) or ZeRO-3 (ZeroStorage,
// Zero.h: each rank holds a shard of each storage group).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_PARALLEL_STORAGE_H
#define BMT_RUNTIME_PARALLEL_STORAGE_H

#include "bmt/Runtime/comm/Comm.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace bmt::runtime {

class ParameterStorage {
public:
  virtual ~ParameterStorage();
  /// Before a forward pass.
  virtual void beginForward() {}
  /// After a forward pass; `gradMode`: whether it ran under grad mode (a
  /// backward may follow).
  virtual void endForward(bool /*gradMode*/) {}
  /// After the last backward of a step: makes every rank's gradients the
  /// average over ranks. Collective.
  virtual void synchronizeGradients() = 0;
  /// Global L2 norm of the gradients over all ranks: a float64 tensor of
  /// one element on the parameters' device, without a host
  /// synchronisation. Collective.
  virtual at::Tensor gradNorm() = 0;
  /// After an optimizer step updated the parameters.
  virtual void afterOptimizerStep() {}
  /// After a checkpoint's values were copied into the parameters (whatever
  /// an optimizer step leaves to the optimizer is redone here too).
  virtual void parametersChanged() { afterOptimizerStep(); }
  /// The dtype gradients are reduced in (nullopt: their own); a storage
  /// that reduces in the parameters' dtype ignores it.
  virtual void setReduceDtype(std::optional<c10::ScalarType> /*dtype*/) {}
};

/// Every rank holds all of `params` (autograd leaves). synchronizeGradients
/// all-reduces each gradient (a zero one where a rank has none) and divides
/// it by the world size (nothing on one rank); gradNorm is clipGradNorm's
/// norm (AdamW.h) of the local, synchronised gradients. `world` must
/// outlive the storage.
class ReplicatedStorage : public ParameterStorage {
public:
  ReplicatedStorage(std::vector<at::Tensor> params, Comm &world);
  void synchronizeGradients() override;
  at::Tensor gradNorm() override;

private:
  std::vector<at::Tensor> params_;
  Comm &world_;
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_PARALLEL_STORAGE_H
