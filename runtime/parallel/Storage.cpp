//===- Storage.cpp - replicated parameter storage -------------------------===//

#include "bmt/Runtime/parallel/Storage.h"
#include "bmt/Runtime/optim/AdamW.h"

#include <ATen/ops/zeros_like.h>

namespace bmt::runtime {

ParameterStorage::~ParameterStorage() = default;

ReplicatedStorage::ReplicatedStorage(std::vector<at::Tensor> params, Comm &world)
    : params_(std::move(params)), world_(world) {}

void ReplicatedStorage::synchronizeGradients() {
  if (world_.size() == 1)
    return;
  for (at::Tensor &p : params_) {
    if (!p.grad().defined())
      p.mutable_grad() = at::zeros_like(p);
    world_.allReduce(p.mutable_grad())->wait();
    p.mutable_grad().div_(static_cast<double>(world_.size()));
  }
}

at::Tensor ReplicatedStorage::gradNorm() {
  return clipGradNorm(params_, /*maxNorm=*/0.0); // the norm only
}

} // namespace bmt::runtime
