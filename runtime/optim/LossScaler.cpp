//===- LossScaler.cpp - dynamic loss scaling ------------------------------===//

#include "bmt/Runtime/optim/LossScaler.h"

#include <ATen/ops/full.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <stdexcept>

namespace bmt::runtime {

LossScaler::LossScaler(double initial, double factor, int64_t window, double minScale,
                       c10::Device device)
    : factor_(factor), minScale_(minScale), window_(window) {
  if (!(initial > 0) || !std::isfinite(initial) || !(factor >= 1) || window < 1 ||
      !(minScale > 0) || minScale > initial)
    throw std::invalid_argument("LossScaler: needs initial > 0, factor >= 1, window >= 1 and "
                                "0 < min scale <= initial");
  at::TensorOptions options = at::TensorOptions().dtype(at::kDouble).device(device);
  scale_ = at::full({1}, initial, options);
  clean_ = at::zeros({1}, options);
}

void LossScaler::update(const at::Tensor &foundInf) {
  c10::NoGradGuard noGrad;
  at::Tensor overflow = foundInf.reshape({1}).to(scale_.device(), at::kDouble).ne(0);
  at::Tensor clean = clean_.add(1);
  at::Tensor grow = clean.ge(static_cast<double>(window_));
  at::Tensor shrunk = scale_.div(factor_).clamp_min(minScale_);
  at::Tensor next = at::where(overflow, shrunk, at::where(grow, scale_.mul(factor_), scale_));
  scale_.copy_(next);
  clean_.copy_(at::where(overflow.logical_or(grow), at::zeros_like(clean), clean));
}

void LossScaler::setState(double scale, int64_t cleanSteps) {
  c10::NoGradGuard noGrad;
  scale_.fill_(scale);
  clean_.fill_(static_cast<double>(cleanSteps));
}

} // namespace bmt::runtime
