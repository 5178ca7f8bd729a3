//===- ColumnSum.cpp - sums over the rows of a matrix ---------------------===//

#include "bmt/Runtime/exec/ColumnSum.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>

#include <optional>
#include <stdexcept>
#include <string>

#ifdef BMT_WITH_CUDA_KERNELS
#include "exec/kernels/ColumnSumKernels.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace bmt::runtime {

#ifdef BMT_WITH_CUDA_KERNELS
namespace {

std::optional<kernels::SumElement> sumElement(at::ScalarType t) {
  switch (t) {
  case at::kFloat:
    return kernels::SumElement::Float32;
  case at::kBFloat16:
    return kernels::SumElement::BFloat16;
  case at::kHalf:
    return kernels::SumElement::Float16;
  default:
    return std::nullopt;
  }
}

} // namespace
#endif

at::Tensor columnSum(const at::Tensor &x, at::ScalarType dtype) {
  if (x.dim() != 2)
    throw std::runtime_error("columnSum: a 2-D input is needed, not " + std::to_string(x.dim()) +
                             "-D");
#ifdef BMT_WITH_CUDA_KERNELS
  std::optional<kernels::SumElement> in = sumElement(x.scalar_type()), out = sumElement(dtype);
  if (x.is_cuda() && x.is_contiguous() && in && out && x.size(0) > 0 && x.size(1) > 0) {
    c10::cuda::CUDAGuard guard(x.device());
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int64_t rows = x.size(0), cols = x.size(1);
    const int64_t splits = kernels::columnSumSplits(rows, cols, *in, sms);
    at::Tensor result = at::empty({cols}, x.options().dtype(dtype));
    at::Tensor workspace;
    if (splits > 1)
      workspace = at::empty({splits, cols}, x.options().dtype(at::kFloat));
    int err = kernels::columnSum(x.const_data_ptr(), *in, rows, cols, result.data_ptr(), *out,
                                 splits > 1 ? workspace.data_ptr<float>() : nullptr, splits,
                                 at::cuda::getCurrentCUDAStream(x.device().index()).stream());
    if (err != 0)
      throw std::runtime_error(std::string("columnSum: the kernel's launch failed: ") +
                               cudaGetErrorString(static_cast<cudaError_t>(err)));
    return result;
  }
#endif
  return x.sum(0).to(dtype);
}

} // namespace bmt::runtime
