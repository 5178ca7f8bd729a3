//===- Linear.cpp - linear layers whose weight gradient goes to its slot --===//

#include "exec/Linear.h"
#include "exec/Recompute.h"
#include "exec/SavedPointer.h"

#include "bmt/Runtime/exec/ColumnSum.h"

#include <ATen/ExpandUtils.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace bmt::runtime {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearFunction : torch::autograd::Function<LinearFunction> {
  // The tensors as a TensorList (x, W and, where there is one, b): autograd
  // tracks each, and no undefined tensor is an input.
  static at::Tensor forward(AutogradContext *ctx, at::TensorList tensors, int64_t layout,
                            ExecutorHooks *hooks, bool computeValue) {
    const at::Tensor &x = tensors[0], &weight = tensors[1];
    const at::Tensor bias = tensors.size() > 2 ? tensors[2] : at::Tensor();
    const bool inOut = layout == static_cast<int64_t>(LinearLayout::InOut);
    at::Tensor y;
    if (computeValue) {
      y = inOut ? (bias.defined() ? at::addmm(bias, x, weight) : at::mm(x, weight))
                : at::linear(x, weight, bias);
    } else {
      // [tokens, out] (addmm) or [..., out] (linear), uninitialised.
      std::vector<int64_t> shape = x.sizes().vec();
      shape.back() = weight.size(inOut ? 1 : 0);
      y = placeholder(shape, x.options());
    }
    // A frozen weight's backward reads only the weight (and x's shape).
    ctx->save_for_backward({weight.requires_grad() ? x : at::Tensor(), weight});
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["layout"] = layout;
    savePointer(ctx, "hooks", hooks);
    if (bias.defined())
      ctx->saved_data["bias_sizes"] = bias.sizes().vec();
    return y;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const bool inOut = ctx->saved_data["layout"].toInt() == static_cast<int64_t>(LinearLayout::InOut);
    auto *hooks = savedPointer<ExecutorHooks>(ctx, "hooks");
    const bool hasBias = ctx->saved_data.count("bias_sizes") > 0;
    variable_list out(hasBias ? 6 : 5); // x, W, (b,) layout, hooks, computeValue
    const at::Tensor &g = grads[0];
    if (!g.defined())
      return out;
    // ATen flattens x to [tokens, in] (linear: a 3-D contiguous input with
    // a bias through addmm, without one through matmul's fold), so the
    // matmuls see g as [tokens, out].
    const at::Tensor g2 = g.dim() == 2 ? g : g.reshape({-1, g.size(-1)});
    if (ctx->needs_input_grad(0)) {
      // mm_mat1_backward: g . mat2^T, mat2 = W (addmm) or W^T (linear).
      at::Tensor dx = at::mm(g2, inOut ? weight.t() : weight);
      const std::vector<int64_t> xSizes = ctx->saved_data["x_sizes"].toIntVector();
      out[0] = xSizes.size() == 2 ? dx : dx.view(xSizes);
    }
    const at::Tensor x2 = !x.defined() || x.dim() == 2 ? x : x.view({-1, x.size(-1)});
    if (ctx->needs_input_grad(1)) {
      // mm_mat2_backward: mat1^T . g for a row-major mat2 (addmm's W),
      // (g^T . mat1)^T for a column-major one (linear's W^T): either way
      // one matmul whose result has W's layout, written into its slot.
      at::Tensor slot = hooks->gradientSlot(weight);
      if (slot.defined())
        out[1] = inOut ? at::mm_out(slot, x2.t(), g2) : at::mm_out(slot, g2.t(), x2);
      else
        out[1] = inOut ? at::mm(x2.t(), g2) : at::mm(g2.t(), x2);
    }
    if (hasBias && ctx->needs_input_grad(2)) {
      // addmm's self gradient is g (beta = 1), reduced to the bias's shape
      // as autograd reduces the gradient of a broadcast input.
      // One pass over g on CUDA (exec/ColumnSum.h's columnSum) for the usual [out] bias.
      const std::vector<int64_t> sizes = ctx->saved_data["bias_sizes"].toIntVector();
      out[2] = sizes.size() == 1 && sizes[0] == g2.size(1) ? columnSum(g2, g2.scalar_type())
                                                           : at::sum_to(g2, sizes);
    }
    return out;
  }
};

bool isOne(const c10::IValue &v) {
  return (v.isInt() && v.toInt() == 1) || (v.isDouble() && v.toDouble() == 1.0);
}

} // namespace

std::optional<at::Tensor> linearWithGradientSlot(ExecutorHooks &hooks, LinearLayout layout,
                                                 const std::vector<c10::IValue> &stack,
                                                 bool computeValue) {
  if (!c10::GradMode::is_enabled())
    return std::nullopt;
  const bool inOut = layout == LinearLayout::InOut;
  const bool mm = inOut && stack.size() == 2; // aten::mm(x, W)
  if (!mm && stack.size() != (inOut ? 5u : 3u))
    return std::nullopt;
  static const c10::IValue none;
  const c10::IValue &xv = stack[mm ? 0 : inOut ? 1 : 0], &wv = stack[mm ? 1 : inOut ? 2 : 1],
                    &bv = mm ? none : stack[inOut ? 0 : 2];
  if (!xv.isTensor() || !wv.isTensor() || !(bv.isTensor() || bv.isNone()))
    return std::nullopt;
  if (inOut && !mm && (!isOne(stack[3]) || !isOne(stack[4])))
    return std::nullopt;
  const at::Tensor &x = xv.toTensor(), &weight = wv.toTensor();
  const at::Tensor bias = bv.isTensor() ? bv.toTensor() : at::Tensor();
  // A frozen weight: only where the matmul is not run (else ATen's
  // operator, which saves no input for it, is as good).
  if ((!weight.requires_grad() && computeValue) || weight.dim() != 2 || !weight.is_contiguous() ||
      !x.is_contiguous() || x.dim() < 2 || x.dim() > 3 || (inOut && x.dim() != 2) ||
      x.is_complex() || (inOut && !mm && !bias.defined()))
    return std::nullopt;
  std::vector<at::Tensor> tensors{x, weight};
  if (bias.defined())
    tensors.push_back(bias);
  return LinearFunction::apply(at::TensorList(tensors), static_cast<int64_t>(layout), &hooks,
                               computeValue);
}

} // namespace bmt::runtime
