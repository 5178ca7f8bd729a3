//===- CrossEntropy.cpp - the language-model loss -------------------------===//

#include "bmt/Runtime/objectives/CrossEntropy.h"
#include "bmt/Runtime/Env.h"
#include "bmt/Runtime/comm/Comm.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
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

/// Vocab-parallel cross-entropy: saves the logits (no copy), the labels'
/// local positions, the rows' log-sum-exp and the label count.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &logits,
                            const at::Tensor &labels, Comm *comm, int64_t vocabStart,
                            int64_t vocabSize, int64_t ignoreIndex) {
    const int64_t local = logits.size(1);
    const at::ScalarType type = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor l = logits.detach().to(type);
    // Padding entries (global index >= vocabSize) do not take part.
    const int64_t real = std::clamp<int64_t>(vocabSize - vocabStart, 0, local);
    at::Tensor padding;
    if (real < local) {
      padding = at::arange(local, labels.options()).ge(real);
      l = l.masked_fill(padding, -std::numeric_limits<double>::infinity());
    }
    at::Tensor max = std::get<0>(l.max(1)).contiguous();
    comm->allReduce(max, ReduceOp::Max)->wait();
    at::Tensor shifted = l - max.unsqueeze(1);
    at::Tensor sumExp = shifted.exp().sum(1).contiguous();
    comm->allReduce(sumExp)->wait();
    // The label's logit, from the rank that holds it (zero elsewhere).
    at::Tensor valid = labels.ne(ignoreIndex);
    at::Tensor position = labels - vocabStart;
    at::Tensor mine = valid & position.ge(0) & position.lt(local);
    at::Tensor index = at::where(mine, position, at::zeros({}, position.options()));
    at::Tensor target =
        shifted.gather(1, index.unsqueeze(1)).squeeze(1).masked_fill(mine.logical_not(), 0.0)
            .contiguous();
    comm->allReduce(target)->wait();
    at::Tensor logSumExp = sumExp.log(); // of the shifted logits
    at::Tensor rowLoss = (logSumExp - target).masked_fill(valid.logical_not(), 0.0);
    at::Tensor count = valid.sum().to(type);
    ctx->save_for_backward({logits, index, mine, valid, (logSumExp + max).contiguous(), count});
    ctx->saved_data["padding"] = padding.defined() ? padding : at::Tensor();
    return rowLoss.sum().div(count);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &index = saved[1], &mine = saved[2], &valid = saved[3],
                     &lse = saved[4], &count = saved[5];
    const at::ScalarType type = lse.scalar_type();
    // d loss / d logit = (softmax - onehot(label)) * valid / count * grad.
    at::Tensor grad = (logits.detach().to(type) - lse.unsqueeze(1)).exp_();
    at::Tensor padding = ctx->saved_data["padding"].toTensor();
    if (padding.defined())
      grad.masked_fill_(padding, 0.0);
    grad.scatter_add_(1, index.unsqueeze(1), mine.to(type).neg().unsqueeze(1));
    at::Tensor scale = valid.to(type).mul(grads[0].to(type).reshape({})).div(count);
    grad.mul_(scale.unsqueeze(1));
    return {grad.to(logits.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

bool fusedDisabled() {
  return !env::fusedCrossEntropy();
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

at::Tensor vocabParallelCrossEntropy(const at::Tensor &logits, const at::Tensor &labels,
                                     Comm &tensorComm, int64_t vocabStart, int64_t vocabSize,
                                     int64_t ignoreIndex) {
  if (logits.dim() != 2 || labels.dim() != 1 || labels.size(0) != logits.size(0))
    throw std::invalid_argument(
        "vocabParallelCrossEntropy: expects logits [rows, vocab / T] and labels [rows], got " +
        std::to_string(logits.dim()) + "-d logits and " + std::to_string(labels.dim()) +
        "-d labels");
  if (!at::isFloatingType(logits.scalar_type()) || labels.scalar_type() != at::kLong)
    throw std::invalid_argument(
        "vocabParallelCrossEntropy: expects floating-point logits and int64 labels");
  if (vocabStart < 0 || vocabSize <= 0)
    throw std::invalid_argument("vocabParallelCrossEntropy: vocab start " +
                                std::to_string(vocabStart) + ", vocab size " +
                                std::to_string(vocabSize));
  if (labels.is_cpu() && labels.numel() > 0) {
    at::Tensor bad = labels.ne(ignoreIndex) & (labels.lt(0) | labels.ge(vocabSize));
    if (bad.any().item<bool>())
      throw std::invalid_argument("vocabParallelCrossEntropy: a label outside [0, " +
                                  std::to_string(vocabSize) + ")");
  }
  return VocabParallelCrossEntropy::apply(logits, labels.contiguous(), &tensorComm, vocabStart,
                                          vocabSize, ignoreIndex);
}

} // namespace bmt::runtime
