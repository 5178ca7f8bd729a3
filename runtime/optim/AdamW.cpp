//===- AdamW.cpp - AdamW and gradient clipping ----------------------------===//
//
// AdamW over ATen's fused kernel, grouped by (device, dtype) as
// torch.optim.AdamW(fused=True) does, or, for the masters whose
// low-precision copies it writes, over the runtime's CUDA kernel
// (kernels/Adam.cu); and clip_grad_norm_.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/optim/AdamW.h"
#include "bmt/Runtime/Env.h"

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
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#ifdef BMT_WITH_CUDA_KERNELS
#include "optim/kernels/AdamKernels.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

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

/// Test hook: BMT_DEBUG_ADAM_COPIES=aten takes offered copies on any device
/// and serves them with ATen ops (AdamW.h), so that the storage's side
/// runs where the kernel cannot (the CPU tests).
bool emulationRequested() {
  return env::debugAdamCopiesAten();
}

/// Whether the runtime's Adam kernel can update params on `device`.
bool fusedKernelAvailable(const c10::Device &device) {
#ifdef BMT_WITH_CUDA_KERNELS
  return device.is_cuda() && env::fusedAdam();
#else
  (void)device;
  return false;
#endif
}

#ifdef BMT_WITH_CUDA_KERNELS

kernels::AdamElement adamElement(at::ScalarType t) {
  switch (t) {
  case at::kBFloat16:
    return kernels::AdamElement::BFloat16;
  case at::kHalf:
    return kernels::AdamElement::Float16;
  default:
    return kernels::AdamElement::Float32;
  }
}

/// The segments of one kernel launch: one device, gradient and copy dtype.
struct KernelGroup {
  std::vector<kernels::AdamSegment> segments;
};

using KernelKey = std::tuple<c10::DeviceIndex, at::ScalarType, at::ScalarType>;

void launch(const KernelKey &key, const KernelGroup &group, double lr, const AdamWConfig &config,
            const std::optional<at::Tensor> &divisor, const std::optional<at::Tensor> &foundInf) {
  const c10::Device device(at::kCUDA, std::get<0>(key));
  c10::cuda::CUDAGuard guard(device);
  std::optional<at::Tensor> scale, inf;
  if (divisor)
    scale = divisor->to(device, at::kFloat).reshape({}).contiguous();
  if (foundInf)
    inf = foundInf->to(device, at::kFloat).reshape({}).contiguous();
  kernels::AdamHyper hyper;
  hyper.lr = static_cast<float>(lr);
  hyper.beta1 = static_cast<float>(config.beta1);
  hyper.beta2 = static_cast<float>(config.beta2);
  hyper.eps = static_cast<float>(config.eps);
  hyper.decoupled = config.decoupled;
  int err = kernels::adamStep(group.segments.data(), static_cast<int64_t>(group.segments.size()),
                              adamElement(std::get<1>(key)), adamElement(std::get<2>(key)), hyper,
                              scale ? scale->const_data_ptr<float>() : nullptr,
                              inf ? inf->const_data_ptr<float>() : nullptr,
                              c10::cuda::getCurrentCUDAStream(device.index()).stream());
  if (err != 0)
    throw std::runtime_error(std::string(config.decoupled ? "AdamW" : "Adam") +
                             ": the fused step's launch failed: " +
                             cudaGetErrorString(static_cast<cudaError_t>(err)));
}

#endif

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
  copies_.resize(params_.size());
  gradDivisors_.assign(params_.size(), 1);
}

bool AdamW::writeLowPrecisionCopies(const std::vector<LowPrecisionCopy> &copies) {
  const std::string who = config_.decoupled ? "AdamW" : "Adam";
  std::set<size_t> seen;
  for (const LowPrecisionCopy &c : copies) {
    const std::string what = who + ": the low-precision copy of parameter " +
                             std::to_string(c.param);
    if (c.param >= params_.size())
      throw std::invalid_argument(what + ": there are " + std::to_string(params_.size()) +
                                  " parameters");
    if (!seen.insert(c.param).second)
      throw std::invalid_argument(what + " is given twice");
    const at::Tensor &p = params_[c.param];
    if (p.scalar_type() != at::kFloat || !p.is_contiguous())
      throw std::invalid_argument(what + ": the parameter is not a contiguous float32 tensor (" +
                                  std::string(c10::toString(p.scalar_type())) + ")");
    if (!c.copy.defined() ||
        (c.copy.scalar_type() != at::kBFloat16 && c.copy.scalar_type() != at::kHalf))
      throw std::invalid_argument(what + " is not a bfloat16/float16 tensor");
    if (c.copy.numel() != p.numel() || c.copy.device() != p.device() || !c.copy.is_contiguous())
      throw std::invalid_argument(what + " is not contiguous with the parameter's " +
                                  std::to_string(p.numel()) + " elements on " +
                                  p.device().str());
    if (c.gradDivisor < 1)
      throw std::invalid_argument(what + ": gradient divisor " + std::to_string(c.gradDivisor) +
                                  " < 1");
  }
  if (copies.empty())
    return false;
  bool kernel = true;
  for (const at::Tensor &p : params_)
    kernel = kernel && fusedKernelAvailable(p.device());
  if (!kernel && !emulationRequested())
    return false;
  emulateCopies_ = !kernel;
  copies_.assign(params_.size(), at::Tensor());
  gradDivisors_.assign(params_.size(), 1);
  for (const LowPrecisionCopy &c : copies) {
    copies_[c.param] = c.copy.detach();
    gradDivisors_[c.param] = c.gradDivisor;
  }
  return true;
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
  // Params with a low-precision copy go to the runtime's kernel (their
  // grads may be bf16/fp16 and are sums: the kernel divides), the copy
  // viewed as the param is (a placeholder where there is none).
  std::vector<at::Tensor> copySlots(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    copySlots[i] = copies_[i].defined() ? copies_[i] : params_[i].detach();
    if (!copies_[i].defined() || !grads[i].defined())
      continue;
    const at::Tensor &g = grads[i];
    const at::ScalarType t = g.scalar_type();
    if ((t != at::kFloat && t != at::kBFloat16 && t != at::kHalf) ||
        g.numel() != params_[i].numel() || g.device() != params_[i].device())
      throw std::invalid_argument(
          std::string(config_.decoupled ? "AdamW" : "Adam") + ": the gradient of parameter " +
          std::to_string(i) + " (" + std::string(c10::toString(t)) + ", " +
          std::to_string(g.numel()) + " elements on " + g.device().str() +
          ") is not a float32/bfloat16/float16 tensor of the parameter's size and device");
    if (emulateCopies_) // (the test hook) ATen's step on ZeroStorage's average
      grads[i] = g.to(at::kFloat).mul(1.0f / static_cast<float>(gradDivisors_[i]));
    else if (!g.is_contiguous())
      grads[i] = g.contiguous();
  }
  // torch.optim's order: the step counts first (taken back below where the
  // kernel skipped the update).
  at::_foreach_add_(steps, 1);
  // The kernel divides the grads by grad_scale: 1 / the clip factor.
  std::optional<at::Tensor> divisor;
  if (gradNorm && maxNorm > 0)
    divisor = clipFactor(gradNorm->reshape({1}).to(at::kDouble), maxNorm).reciprocal();
#ifdef BMT_WITH_CUDA_KERNELS
  std::map<KernelKey, KernelGroup> kernelGroups;
#endif
  // Two weight-decay groups (member pieces that decay, and the others),
  // each grouped by (device, dtype) as torch.optim(fused=True) does.
  for (bool decay : {true, false}) {
    PieceViews views = pieceViews(params_, grads, {&expAvg_, &expAvgSq_, &copySlots}, layouts_,
                                  config_.decayParams, decay);
    std::vector<Group> groups;
    for (size_t k = 0; k < views.params.size(); ++k) {
      const size_t i = views.index[k];
      if (copies_[i].defined() && !emulateCopies_) {
#ifdef BMT_WITH_CUDA_KERNELS
        kernels::AdamSegment s;
        s.param = views.params[k].mutable_data_ptr<float>();
        s.grad = views.grads[k].const_data_ptr();
        s.expAvg = views.states[0][k].mutable_data_ptr<float>();
        s.expAvgSq = views.states[1][k].mutable_data_ptr<float>();
        s.copy = views.states[2][k].mutable_data_ptr();
        s.step = steps_[i].const_data_ptr<float>();
        s.numel = views.params[k].numel();
        s.weightDecay = static_cast<float>(decay ? config_.weightDecay : 0.0);
        s.gradMultiplier = 1.0f / static_cast<float>(gradDivisors_[i]);
        KernelGroup &kg = kernelGroups[{views.params[k].device().index(),
                                        views.grads[k].scalar_type(), copies_[i].scalar_type()}];
        kg.segments.push_back(s);
#endif
        continue;
      }
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
#ifdef BMT_WITH_CUDA_KERNELS
  for (const auto &[key, group] : kernelGroups)
    launch(key, group, lr, config_, divisor, foundInf);
#endif
  if (emulateCopies_)
    for (size_t i = 0; i < params_.size(); ++i)
      if (copies_[i].defined() && grads[i].defined())
        copies_[i].copy_(params_[i].detach()); // (unchanged where the step was skipped)
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
