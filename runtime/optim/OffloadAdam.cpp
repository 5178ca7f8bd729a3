//===- OffloadAdam.cpp - AdamW with its state in host memory --------------===//
//
// Streams (CUDA): the step runs on the host between two events of the
// compute stream (the current stream of the parameters' device):
//
//   compute: ... backward, reduce-scatters, gradient norm, scalars -> host
//            [scalarsReady] ............................ wait(uploadsDone) -> next forward
//   copy:             wait(scalarsReady) H2D(k) H2D(k+1) ... [uploadsDone]
//   host:  wait(scalarsReady)  Adam(k) Adam(k+1) ...
//
// Why this is safe:
//   - the masters are read by H2D(k) of step t and written by Adam(k) of
//     step t+1 only after the host waited for scalarsReady of step t+1,
//     which the compute stream records after it waited for uploadsDone of
//     step t;
//   - the device parameters are written on the copy stream only after
//     scalarsReady: every earlier read of them (the gathers, which the
//     compute stream waited for) is done;
//   - the staging buffers of bf16/fp16 uploads are allocated while the copy
//     stream is current and used only on it, so the caching allocator's
//     stream-ordered reuse covers them; the pinned buffers live as long as
//     the optimizer, whose destructor waits for the copy stream.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/optim/OffloadAdam.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace bmt::runtime {

HostGradientSource::~HostGradientSource() = default;

c10::ScalarType masterDtype(c10::ScalarType dtype) {
  return dtype == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor emptyHostTensor(int64_t numel, c10::ScalarType dtype, bool pinned) {
  at::TensorOptions options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  if (!pinned)
    return at::empty({numel}, options);
  size_t bytes = static_cast<size_t>(std::max<int64_t>(numel, 1)) * c10::elementSize(dtype);
  void *data = nullptr;
  C10_CUDA_CHECK(cudaHostAlloc(&data, bytes, cudaHostAllocDefault));
  return at::from_blob(
      data, {numel}, [](void *p) { (void)cudaFreeHost(p); }, options);
}

OffloadAdamW::OffloadAdamW(std::vector<at::Tensor> params, AdamWConfig config,
                           HostGradientSource &gradients, std::vector<ParameterLayout> layouts)
    : params_(std::move(params)), config_(config), gradients_(gradients) {
  checkAdamWConfig(config_);
  layouts_ = layoutsFor(params_, std::move(layouts), "OffloadAdamW");
  c10::NoGradGuard noGrad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor &p = params_[i];
    std::string which = "OffloadAdamW: parameter " + std::to_string(i);
    if (!p.defined())
      throw std::invalid_argument(which + " is undefined");
    if (!at::isFloatingType(p.scalar_type()))
      throw std::invalid_argument(which + " is not floating point (" +
                                  std::string(c10::toString(p.scalar_type())) + ")");
    if (!p.is_contiguous())
      throw std::invalid_argument(which + " is not contiguous");
    if (i == 0)
      device_ = p.device();
    else if (p.device() != device_)
      throw std::invalid_argument(which + " is on " + p.device().str() + ", parameter 0 on " +
                                  device_.str());
  }
  const bool pinned = device_.is_cuda();
  for (const at::Tensor &p : params_) {
    c10::ScalarType type = masterDtype(p.scalar_type());
    at::Tensor master = emptyHostTensor(p.numel(), type, pinned).view(p.sizes());
    master.copy_(p.detach()); // a blocking copy (conversion on the host)
    masters_.push_back(master);
    expAvg_.push_back(emptyHostTensor(p.numel(), type, pinned).view(p.sizes()).zero_());
    expAvgSq_.push_back(emptyHostTensor(p.numel(), type, pinned).view(p.sizes()).zero_());
    // A float32 0-dim step count, as AdamW keeps it (on the host here).
    steps_.push_back(at::zeros({}, at::TensorOptions().dtype(at::kFloat)));
  }
  if (device_.is_cuda()) {
    c10::impl::VirtualGuardImpl impl(device_.type());
    copyStream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
    hostScalars_ = emptyHostTensor(3, at::kDouble, /*pinned=*/true);
    scalarsReady_.emplace(device_.type());
    uploadsDone_.emplace(device_.type());
  }
}

OffloadAdamW::~OffloadAdamW() {
  if (!copyStream_)
    return;
  try {
    copyStream_->synchronize();
  } catch (...) {
  }
}

void OffloadAdamW::zeroGrad() {
  for (at::Tensor &p : params_)
    p.mutable_grad() = at::Tensor();
}

double OffloadAdamW::stepCount(size_t i) const { return steps_.at(i).item<double>(); }

int64_t OffloadAdamW::hostBytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < masters_.size(); ++i)
    n += static_cast<int64_t>(masters_[i].nbytes() + expAvg_[i].nbytes() + expAvgSq_[i].nbytes());
  return n;
}

void OffloadAdamW::upload(size_t i) {
  at::Tensor param = params_[i].detach();
  const at::Tensor &master = masters_[i];
  if (!copyStream_) {
    param.copy_(master); // same device: a plain copy (rounding to bf16/fp16)
    return;
  }
  c10::StreamGuard onCopyStream(*copyStream_);
  if (param.scalar_type() == master.scalar_type()) {
    param.copy_(master, /*non_blocking=*/true);
    return;
  }
  // Upload the float32 master as it is (4 bytes a parameter, but no extra
  // pass over it on the CPU, whose Adam is the slow part of the step; the
  // copy overlaps the next parameter's update) and round it on the device,
  // with the kernel the non-offloaded path uses (Model::afterOptimizerStep).
  at::Tensor staged = at::empty(param.sizes(), param.options().dtype(master.scalar_type()));
  staged.copy_(master, /*non_blocking=*/true);
  param.copy_(staged);
}

void OffloadAdamW::step(const StepInputs &inputs) {
  checkStepInputs(inputs, "OffloadAdamW");
  step(inputs.lr, inputs.foundInf, inputs.lossScale,
       inputs.gradNorm ? *inputs.gradNorm : at::Tensor(), inputs.maxNorm);
}

OptimizerState OffloadAdamW::state() const {
  return stateOf({{"master", &masters_},
                  {"exp_avg", &expAvg_},
                  {"exp_avg_sq", &expAvgSq_},
                  {"step", &steps_}});
}

void OffloadAdamW::loadState(const OptimizerState &state) {
  c10::NoGradGuard noGrad;
  std::optional<c10::Stream> compute;
  if (copyStream_) {
    copyStream_->synchronize(); // uploads in flight read the masters
    // The uploads below come after every queued use of the parameters.
    compute = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
    scalarsReady_->record(*compute);
    scalarsReady_->block(*copyStream_);
  }
  loadStateInto(state,
                {{"master", &masters_},
                 {"exp_avg", &expAvg_},
                 {"exp_avg_sq", &expAvgSq_},
                 {"step", &steps_}},
                params_, "OffloadAdamW");
  for (size_t i = 0; i < params_.size(); ++i)
    upload(i);
  if (copyStream_) {
    uploadsDone_->record(*copyStream_);
    uploadsDone_->block(*compute);
  }
}

void OffloadAdamW::step(double lr, const std::optional<at::Tensor> &foundInf,
                        const std::optional<at::Tensor> &lossScale, const at::Tensor &gradNorm,
                        double maxNorm) {
  c10::NoGradGuard noGrad;
  if (params_.empty())
    return;
  // The step's scalars, computed on the device as the device path computes
  // them: [found inf, float(1 / loss scale), clip factor (float64)].
  at::TensorOptions doubles = at::TensorOptions().dtype(at::kDouble).device(device_);
  at::Tensor found = foundInf ? foundInf->reshape({1}).to(device_, at::kDouble)
                              : at::zeros({1}, doubles);
  at::Tensor inverse = lossScale ? lossScale->reshape({1})
                                       .to(device_, at::kDouble)
                                       .reciprocal()
                                       .to(at::kFloat)
                                       .to(at::kDouble)
                                 : at::ones({1}, doubles);
  at::Tensor factor = maxNorm > 0
                          ? clipFactor(gradNorm.reshape({1}).to(device_, at::kDouble), maxNorm)
                          : at::ones({1}, doubles);
  at::Tensor scalars = at::cat({found, inverse, factor});
  double values[3];
  if (device_.is_cuda()) {
    // The one wait of the step: the compute stream reaches this point after
    // the gradient norm, which needs every gradient, and after it waited for
    // the gradients' device-to-host copies (ZeroStorage::finishGradients).
    c10::Stream compute = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
    hostScalars_.copy_(scalars, /*non_blocking=*/true);
    scalarsReady_->record(compute);
    scalarsReady_->synchronize();
    for (int k = 0; k < 3; ++k)
      values[k] = hostScalars_.const_data_ptr<double>()[k];
  } else {
    at::Tensor host = scalars.contiguous();
    for (int k = 0; k < 3; ++k)
      values[k] = host.const_data_ptr<double>()[k];
  }
  if (values[0] != 0)
    return; // an inf/NaN on some rank: skip the step everywhere (as the fused kernel does)

  if (copyStream_)
    scalarsReady_->block(*copyStream_); // uploads after every queued read of the parameters
  at::TensorOptions floats = at::TensorOptions().dtype(at::kFloat);
  at::Tensor inverseHost = at::full({1}, values[1], floats);
  at::Tensor unusedFound = at::zeros({1}, floats);
  at::Tensor divisorHost = at::scalar_tensor(static_cast<float>(1.0 / values[2]), floats);
  for (size_t i : gradients_.hostGradientOrder()) {
    at::Tensor grad = gradients_.waitHostGradient(i);
    const at::Tensor &master = masters_.at(i);
    if (grad.scalar_type() != master.scalar_type() || grad.numel() != master.numel())
      throw std::logic_error("OffloadAdamW: the host gradient of parameter " + std::to_string(i) +
                             " does not match its master");
    grad = grad.view(master.sizes());
    const std::vector<at::Tensor> expAvgOne{expAvg_[i]}, expAvgSqOne{expAvgSq_[i]};
    // The unscaling the device gradients went through, in the same dtype
    // (x * 1 == x: skipped).
    if (lossScale && values[1] != 1.0)
      at::_amp_foreach_non_finite_check_and_unscale_({grad}, unusedFound, inverseHost);
    // Clipping as AdamW::step applies it: the kernel divides by grad_scale
    // = float32(1 / clip factor).
    std::optional<at::Tensor> gradScale;
    if (maxNorm > 0)
      gradScale = divisorHost;
    steps_[i].add_(1);
    // The weight-decay groups as AdamW::step forms them: the decayed
    // member pieces of this parameter, then the others.
    for (bool decay : {true, false}) {
      PieceViews v = pieceViews({master}, {grad}, {&expAvgOne, &expAvgSqOne}, {layouts_[i]},
                                config_.decayParams, decay);
      if (v.params.empty())
        continue;
      const double weightDecay = decay ? config_.weightDecay : 0.0;
      std::vector<at::Tensor> steps(v.params.size(), steps_[i]);
      if (config_.decoupled)
        at::_fused_adamw_(v.params, v.grads, v.states[0], v.states[1], /*max_exp_avg_sqs=*/{},
                          steps, lr, config_.beta1, config_.beta2, weightDecay, config_.eps,
                          /*amsgrad=*/false, /*maximize=*/false, gradScale,
                          /*found_inf=*/std::nullopt);
      else
        at::_fused_adam_(v.params, v.grads, v.states[0], v.states[1], /*max_exp_avg_sqs=*/{},
                         steps, lr, config_.beta1, config_.beta2, weightDecay, config_.eps,
                         /*amsgrad=*/false, /*maximize=*/false, gradScale,
                         /*found_inf=*/std::nullopt);
    }
    upload(i);
  }
  if (copyStream_) {
    c10::Stream compute = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
    uploadsDone_->record(*copyStream_);
    uploadsDone_->block(compute); // the next forward's gathers read the parameters
  }
}

} // namespace bmt::runtime
