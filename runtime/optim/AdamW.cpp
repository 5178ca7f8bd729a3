//===- AdamW.cpp - AdamW and gradient clipping ----------------------------===//
//
// AdamW over ATen's fused kernel, grouped by (device, dtype) as
// torch.optim.AdamW(fused=True) does, and clip_grad_norm_.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/optim/AdamW.h"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

namespace bmt::runtime {

namespace {

/// Tensors of one (device, dtype): what one fused-kernel call takes.
struct Group {
  c10::Device device;
  c10::ScalarType dtype;
  std::vector<at::Tensor> params, grads, expAvgs, expAvgSqs, steps;
};

Group &groupFor(std::vector<Group> &groups, const at::Tensor &t) {
  for (Group &g : groups)
    if (g.device == t.device() && g.dtype == t.scalar_type())
      return g;
  groups.push_back(Group{t.device(), t.scalar_type(), {}, {}, {}, {}, {}});
  return groups.back();
}

/// One Adam/AdamW update of a group with weight decay `weightDecay`.
/// `gradScale` (grads are multiplied by it, the kernel divides by it) and
/// `foundInf` (non-zero: the kernel leaves everything as it is) are for
/// mixed precision and clipping; both live on the group's device. The
/// step counts were incremented by the caller (torch.optim's order).
void fusedAdam(Group &group, double lr, const AdamWConfig &config, double weightDecay,
               const std::optional<at::Tensor> &gradScale,
               const std::optional<at::Tensor> &foundInf) {
  if (config.decoupled)
    at::_fused_adamw_(group.params, group.grads, group.expAvgs, group.expAvgSqs,
                      /*max_exp_avg_sqs=*/{}, group.steps, lr, config.beta1, config.beta2,
                      weightDecay, config.eps, /*amsgrad=*/false, /*maximize=*/false,
                      gradScale, foundInf);
  else
    at::_fused_adam_(group.params, group.grads, group.expAvgs, group.expAvgSqs,
                     /*max_exp_avg_sqs=*/{}, group.steps, lr, config.beta1, config.beta2,
                     weightDecay, config.eps, /*amsgrad=*/false, /*maximize=*/false, gradScale,
                     foundInf);
}

} // namespace

void checkAdamWConfig(const AdamWConfig &config) {
  if (!(config.beta1 >= 0.0 && config.beta1 < 1.0) ||
      !(config.beta2 >= 0.0 && config.beta2 < 1.0))
    throw std::invalid_argument("AdamW: betas must lie in [0, 1), got (" +
                                std::to_string(config.beta1) + ", " +
                                std::to_string(config.beta2) + ")");
  if (!(config.eps >= 0.0) || !(config.weightDecay >= 0.0))
    throw std::invalid_argument("AdamW: eps and weight decay must be >= 0");
}

std::vector<ParameterLayout> layoutsFor(const std::vector<at::Tensor> &params,
                                        std::vector<ParameterLayout> layouts,
                                        const std::string &who) {
  if (layouts.empty()) {
    for (const at::Tensor &p : params)
      layouts.push_back(p.defined() ? wholeLayout(p) : ParameterLayout{});
    return layouts;
  }
  if (layouts.size() != params.size())
    throw std::invalid_argument(who + ": " + std::to_string(layouts.size()) + " layouts for " +
                                std::to_string(params.size()) + " parameters");
  return layouts;
}

AdamW::AdamW(std::vector<at::Tensor> params, AdamWConfig config,
             std::vector<ParameterLayout> layouts)
    : params_(std::move(params)), config_(config) {
  checkAdamWConfig(config_);
  layouts_ = layoutsFor(params_, std::move(layouts), config_.decoupled ? "AdamW" : "Adam");
  expAvg_.reserve(params_.size());
  expAvgSq_.reserve(params_.size());
  steps_.reserve(params_.size());
  c10::NoGradGuard noGrad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor &p = params_[i];
    if (!p.defined())
      throw std::invalid_argument("AdamW: parameter " + std::to_string(i) + " is undefined");
    if (!at::isFloatingType(p.scalar_type()))
      throw std::invalid_argument("AdamW: parameter " + std::to_string(i) +
                                  " is not floating point (" +
                                  std::string(c10::toString(p.scalar_type())) + ")");
    expAvg_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    expAvgSq_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    // A float32 0-dim step count on the param's device, as torch.optim's
    // fused AdamW keeps it.
    steps_.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
  }
}

void AdamW::step(double lr, const std::optional<at::Tensor> &foundInf,
                  const std::optional<at::Tensor> &gradNorm, double maxNorm) {
  c10::NoGradGuard noGrad;
  std::vector<at::Tensor> grads, steps;
  for (size_t i = 0; i < params_.size(); ++i) {
    grads.push_back(params_[i].grad());
    if (grads.back().defined())
      steps.push_back(steps_[i]);
  }
  if (steps.empty())
    return;
  // torch.optim's order: the step counts first (taken back below where the
  // kernel skipped the update).
  at::_foreach_add_(steps, 1);
  // The kernel divides the grads by grad_scale: 1 / the clip factor.
  std::optional<at::Tensor> divisor;
  if (gradNorm && maxNorm > 0)
    divisor = clipFactor(gradNorm->reshape({1}).to(at::kDouble), maxNorm).reciprocal();
  // Two weight-decay groups (member pieces that decay, and the others),
  // each grouped by (device, dtype) as torch.optim(fused=True) does.
  for (bool decay : {true, false}) {
    PieceViews views = pieceViews(params_, grads, {&expAvg_, &expAvgSq_}, layouts_,
                                  config_.decayParams, decay);
    std::vector<Group> groups;
    for (size_t k = 0; k < views.params.size(); ++k) {
      Group &g = groupFor(groups, views.params[k]);
      g.params.push_back(views.params[k]);
      g.grads.push_back(views.grads[k]);
      g.expAvgs.push_back(views.states[0][k]);
      g.expAvgSqs.push_back(views.states[1][k]);
      g.steps.push_back(steps_[views.index[k]]);
    }
    for (Group &g : groups) {
      std::optional<at::Tensor> inf, scale;
      if (foundInf)
        inf = foundInf->to(g.device, at::kFloat).reshape({});
      if (divisor)
        scale = divisor->to(g.device, at::kFloat).reshape({});
      fusedAdam(g, lr, config_, decay ? config_.weightDecay : 0.0, scale, inf);
    }
  }
  if (foundInf)
    for (at::Tensor &s : steps)
      s.sub_(foundInf->to(s.device(), at::kFloat).reshape({}));
}

void AdamW::step(const StepInputs &inputs) {
  checkStepInputs(inputs, config_.decoupled ? "AdamW" : "Adam");
  step(inputs.lr, inputs.foundInf, inputs.gradNorm, inputs.maxNorm);
}

OptimizerState AdamW::state() const {
  return stateOf({{"exp_avg", &expAvg_}, {"exp_avg_sq", &expAvgSq_}, {"step", &steps_}});
}

void AdamW::loadState(const OptimizerState &state) {
  loadStateInto(state, {{"exp_avg", &expAvg_}, {"exp_avg_sq", &expAvgSq_}, {"step", &steps_}},
                params_, config_.decoupled ? "AdamW" : "Adam");
}

void AdamW::zeroGrad() {
  for (at::Tensor &p : params_)
    p.mutable_grad() = at::Tensor();
}

void clipGradsToNorm(const std::vector<at::Tensor> &grads, const at::Tensor &norm,
                     double maxNorm) {
  if (maxNorm <= 0 || grads.empty())
    return;
  c10::NoGradGuard noGrad;
  at::Tensor factor = clipFactor(norm, maxNorm);
  std::vector<Group> groups;
  for (const at::Tensor &g : grads)
    groupFor(groups, g).grads.push_back(g);
  for (Group &g : groups)
    at::_foreach_mul_(g.grads, factor.to(g.device, g.dtype).reshape({}));
}

at::Tensor clipFactor(const at::Tensor &norm, double maxNorm) {
  c10::NoGradGuard noGrad;
  // torch's rule: min(1, maxNorm / (norm + 1e-6)), computed on the device.
  return norm.add(1e-6).reciprocal().mul(maxNorm).clamp_max(1.0);
}

at::Tensor clipGradNorm(const std::vector<at::Tensor> &params, double maxNorm) {
  c10::NoGradGuard noGrad;
  // Per-(device, dtype) norms of the grads (foreach kernels), as
  // clip_grad_norm_ computes them; reduced dtypes accumulate in float32.
  std::vector<Group> groups;
  std::vector<at::Tensor> grads;
  for (const at::Tensor &p : params) {
    const at::Tensor &grad = p.grad();
    if (!grad.defined())
      continue;
    groupFor(groups, grad).grads.push_back(grad);
    grads.push_back(grad);
  }
  if (groups.empty())
    return at::zeros({1}, at::TensorOptions().dtype(at::kDouble));
  const c10::Device first = groups.front().device;
  std::vector<at::Tensor> norms;
  for (Group &g : groups) {
    std::optional<at::ScalarType> accumulate;
    if (g.dtype == at::kHalf || g.dtype == at::kBFloat16)
      accumulate = at::kFloat;
    for (at::Tensor &n : at::_foreach_norm(g.grads, 2, accumulate))
      norms.push_back(n.to(first, at::kDouble));
  }
  at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2).reshape({1});
  clipGradsToNorm(grads, total, maxNorm);
  return total;
}

} // namespace bmt::runtime
