//===- Linear.h - a linear layer whose bias gradient comes from the GEMM -*- C++ -*-===//
//
// A linear layer with a bias, y = x W^T + b (aten::linear) or y = b + x W
// (aten::addmm, GPT-2's Conv1D), as an autograd function whose backward
// computes the weight gradient and the bias gradient in one cuBLASLt GEMM:
// the bias gradient (the column sum of dy over the tokens) is the GEMM's
// BGRADA / BGRADB epilogue, so dy is not read a second time by a separate
// reduction (ATen's AddmmBackward sums it with aten::sum). The forward is
// ATen's addmm. See docs/runtime.md, "Linear layers on CUDA".
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OPS_LINEAR_H
#define BMT_RUNTIME_OPS_LINEAR_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace bmt::runtime::ops {

/// How the weight is laid out: aten::linear's [out, in] or aten::addmm's
/// mat2 [in, out].
enum class WeightLayout { OutIn, InOut };

/// y = x W^T + b (OutIn) or x W + b (InOut), with autograd to x, W and b.
/// x: [..., in], W: [out, in] or [in, out], b: [out], all contiguous, of
/// one dtype. Returns std::nullopt, computing nothing, where the GEMM
/// epilogue does not apply: not CUDA, not bfloat16 / float16, no gradient
/// wanted for b, other shapes or layouts, a build without cuBLASLt, or
/// BMT_LINEAR_BIAS_GRAD=0 in the environment; the caller then runs the
/// ATen operator. Where cuBLASLt finds no algorithm for the
/// epilogue, the backward falls back to aten::mm and aten::sum (counted in
/// linearStats()). Errors of ATen's addmm propagate as c10::Error.
std::optional<at::Tensor> linearWithBias(const at::Tensor &x, const at::Tensor &weight,
                                         const at::Tensor &bias, WeightLayout layout);

/// Backward passes since the process started: weight and bias gradients
/// from one GEMM, and those that fell back to aten::mm + aten::sum.
struct LinearStats {
  int64_t epilogue = 0, fallback = 0;
};
LinearStats linearStats();

} // namespace bmt::runtime::ops

#endif // BMT_RUNTIME_OPS_LINEAR_H
