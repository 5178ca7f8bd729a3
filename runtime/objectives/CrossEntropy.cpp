//===- CrossEntropy.cpp - the language-model loss -------------------------===//

#include "bmt/Runtime/objectives/CrossEntropy.h"

#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#ifdef BMT_WITH_CUDA_KERNELS
#include "kernels/CrossEntropyKernels.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace bmt::runtime {

namespace {

at::Tensor atenCrossEntropy(const at::Tensor &logits, const at::Tensor &labels,
                            int64_t ignoreIndex) {
  at::Tensor l = logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat);
  return at::cross_entropy_loss(l, labels, /*weight=*/{}, at::Reduction::Mean, ignoreIndex);
}

#ifdef BMT_WITH_CUDA_KERNELS

kernels::LogitType logitType(at::ScalarType t) {
  switch (t) {
  case at::kFloat:
    return kernels::LogitType::Float32;
  case at::kBFloat16:
    return kernels::LogitType::BFloat16;
  default:
    return kernels::LogitType::Float16;
  }
}

void check(int err, const char *what) {
  if (err != 0)
    throw std::runtime_error(std::string("fused cross-entropy: ") + what + " launch failed: " +
                             cudaGetErrorString(static_cast<cudaError_t>(err)));
}

/// Autograd function over the fused kernels: saves the logits (no copy),
/// the labels, the per-row log-sum-exp and the label count.
struct FusedCrossEntropy : torch::autograd::Function<FusedCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &logits,
                            const at::Tensor &labels, int64_t ignoreIndex) {
    c10::cuda::CUDAGuard guard(logits.device());
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    at::TensorOptions floats = logits.options().dtype(at::kFloat);
    at::Tensor lse = at::empty({rows}, floats), rowLoss = at::empty({rows}, floats);
    check(kernels::crossEntropyForward(logits.const_data_ptr(), logitType(logits.scalar_type()),
                                       rows, vocab, logits.stride(0),
                                       labels.const_data_ptr<int64_t>(), ignoreIndex,
                                       lse.mutable_data_ptr<float>(),
                                       rowLoss.mutable_data_ptr<float>(),
                                       c10::cuda::getCurrentCUDAStream().stream()),
          "forward");
    at::Tensor count = labels.ne(ignoreIndex).sum().to(at::kFloat);
    ctx->save_for_backward({logits, labels, lse, count});
    ctx->saved_data["ignore"] = ignoreIndex;
    return rowLoss.sum().div(count);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &labels = saved[1], &lse = saved[2], &count = saved[3];
    c10::cuda::CUDAGuard guard(logits.device());
    at::Tensor gradLoss = grads[0].to(at::kFloat).reshape({1}).contiguous();
    at::Tensor grad = at::empty(logits.sizes(), logits.options());
    check(kernels::crossEntropyBackward(
              logits.const_data_ptr(), logitType(logits.scalar_type()), logits.size(0),
              logits.size(1), logits.stride(0), labels.const_data_ptr<int64_t>(),
              ctx->saved_data["ignore"].toInt(), lse.const_data_ptr<float>(),
              gradLoss.const_data_ptr<float>(), count.const_data_ptr<float>(),
              grad.mutable_data_ptr(), c10::cuda::getCurrentCUDAStream().stream()),
          "backward");
    return {grad, at::Tensor(), at::Tensor()};
  }
};

#endif

bool fusedDisabled() {
  const char *v = std::getenv("BMT_FUSED_CROSS_ENTROPY");
  return v && std::string(v) == "0";
}

} // namespace

bool fusedCrossEntropyApplies(const at::Tensor &logits) {
#ifdef BMT_WITH_CUDA_KERNELS
  at::ScalarType t = logits.scalar_type();
  return logits.is_cuda() && (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) &&
         !fusedDisabled();
#else
  (void)logits;
  return false;
#endif
}

at::Tensor crossEntropy(const at::Tensor &logits, const at::Tensor &labels, int64_t ignoreIndex) {
  if (logits.dim() != 2 || labels.dim() != 1 || labels.size(0) != logits.size(0))
    throw std::invalid_argument("crossEntropy: expects logits [rows, vocab] and labels [rows], got " +
                                std::to_string(logits.dim()) + "-d logits and " +
                                std::to_string(labels.dim()) + "-d labels");
  if (!at::isFloatingType(logits.scalar_type()) || labels.scalar_type() != at::kLong)
    throw std::invalid_argument("crossEntropy: expects floating-point logits and int64 labels");
#ifdef BMT_WITH_CUDA_KERNELS
  if (fusedCrossEntropyApplies(logits)) {
    at::Tensor l = logits.stride(1) == 1 ? logits : logits.contiguous();
    return FusedCrossEntropy::apply(l, labels.contiguous(), ignoreIndex);
  }
#endif
  return atenCrossEntropy(logits, labels, ignoreIndex);
}

} // namespace bmt::runtime
