//===- ExpertLoad.cpp - a step's tokens per expert of each MoE layer ------===//

#include "exec/Moe.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace bmt::runtime::moe {

void ExpertLoad::add(int64_t layer, const at::Tensor &counts, const at::Tensor &routerBias) {
  c10::NoGradGuard noGrad;
  at::Tensor c = counts.detach().to(at::kDouble).reshape({-1});
  for (Layer &l : layers_)
    if (l.key == layer) {
      l.counts.add_(c);
      return;
    }
  layers_.push_back({layer, c.clone(), routerBias});
}

at::Tensor ExpertLoad::flat() const {
  if (layers_.empty())
    return at::Tensor();
  std::vector<at::Tensor> parts;
  for (const Layer &l : layers_)
    parts.push_back(l.counts);
  return at::cat(parts);
}

void ExpertLoad::moveRouterBiases(const at::Tensor &counts, double rate,
                                  const std::optional<at::Tensor> &skip) const {
  c10::NoGradGuard noGrad;
  int64_t at = 0;
  for (const Layer &l : layers_) {
    const int64_t experts = l.counts.numel();
    if (l.bias.defined()) {
      at::Tensor c = counts.slice(0, at, at + experts).to(l.bias.device());
      at::Tensor move = (c.mean() - c).sign().mul(rate).to(l.bias.scalar_type());
      if (skip)
        move.mul_(skip->to(l.bias.device(), l.bias.scalar_type()).reshape({}).neg().add(1));
      l.bias.add_(move);
    }
    at += experts;
  }
}

} // namespace bmt::runtime::moe
