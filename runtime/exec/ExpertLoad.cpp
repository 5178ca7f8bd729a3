//===- ExpertLoad.cpp - a step's tokens per expert of each MoE layer ------===//

#include "exec/Moe.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace bmt::runtime::moe {

void ExpertLoad::add(int64_t layer, const at::Tensor &counts) {
  c10::NoGradGuard noGrad;
  at::Tensor c = counts.detach().to(at::kDouble).reshape({-1});
  for (auto &[key, sum] : layers_)
    if (key == layer) {
      sum.add_(c);
      return;
    }
  layers_.emplace_back(layer, c.clone());
}

at::Tensor ExpertLoad::flat() const {
  if (layers_.empty())
    return at::Tensor();
  std::vector<at::Tensor> parts;
  for (const auto &layer : layers_)
    parts.push_back(layer.second);
  return at::cat(parts);
}

} // namespace bmt::runtime::moe
