//===- LoraAdapter.cpp - a LoRA adapter as one autograd function ----------===//

#include "exec/LoraAdapter.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/native_dropout.h>
#include <ATen/ops/native_dropout_backward.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <tuple>

#include "exec/SavedPointer.h"

namespace bmt::runtime {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Which part of its input's last dim a rank holds: `part` of `parts`.
struct InputPart {
  int64_t parts = 1, part = 0;
};

/// dropout(x2) of x2 [tokens, in] and its mask, as aten::native_dropout
/// draws them. With `split.parts` > 1, x2 is part `split.part` of an input
/// [tokens, in * parts] split along its last dim: the mask is that part of
/// the mask drawn for the whole input (so the generator moves as for it).
std::tuple<at::Tensor, at::Tensor> drawDropout(const at::Tensor &x2, double p, InputPart split) {
  if (split.parts == 1)
    return at::native_dropout(x2, p, true);
  const int64_t in = x2.size(1);
  at::Tensor whole =
      std::get<1>(at::native_dropout(at::empty({x2.size(0), in * split.parts}, x2.options()), p, true));
  at::Tensor mask = whole.narrow(1, split.part * in, in).contiguous();
  return {at::native_dropout_backward(x2, mask, 1.0 / (1.0 - p)), mask};
}

/// drawDropout under generator state `state` (the generator's own state is
/// put back after): the same (output, mask) as the draw that started there.
std::tuple<at::Tensor, at::Tensor> dropoutFrom(const at::Tensor &state, const at::Tensor &x2,
                                               double p, InputPart split) {
  at::Generator generator = at::globalContext().defaultGenerator(x2.device());
  at::Tensor current;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    current = generator.get_state();
    generator.set_state(state);
  }
  auto result = drawDropout(x2, p, split);
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(current);
  }
  return result;
}

/// The gradient `grad` of `weight` (m x k = left^T . right) written into
/// its slot where the hooks give one.
at::Tensor weightGradient(ExecutorHooks *hooks, const at::Tensor &weight, const at::Tensor &left,
                          const at::Tensor &right) {
  at::Tensor slot = hooks ? hooks->gradientSlot(weight) : at::Tensor();
  return slot.defined() ? at::mm_out(slot, left.t(), right) : at::mm(left.t(), right);
}

struct LoraAdapterFunction : torch::autograd::Function<LoraAdapterFunction> {
  static at::Tensor forward(AutogradContext *ctx, at::Tensor base, const at::Tensor &x,
                            const at::Tensor &a, const at::Tensor &b, double scale, double p,
                            int64_t parts, int64_t part, ExecutorHooks *hooks, bool computeValue) {
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    at::Tensor dropped = x2;
    if (p > 0) {
      at::Generator generator = at::globalContext().defaultGenerator(x.device());
      {
        std::lock_guard<std::mutex> lock(generator.mutex());
        ctx->saved_data["rng"] = generator.get_state();
      }
      dropped = std::get<0>(drawDropout(x2, p, {parts, part}));
    }
    at::Tensor h = at::mm(dropped, a.t()); // [tokens, r]
    dropped = at::Tensor();
    ctx->save_for_backward({x, a, b, h});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["p"] = p;
    ctx->saved_data["parts"] = parts;
    ctx->saved_data["part"] = part;
    savePointer(ctx, "hooks", hooks);
    if (!computeValue)
      return base;
    if (base.is_contiguous() && !base.is_view()) {
      // base += scale * h . B^T, in the matmul's epilogue (beta = 1).
      base.view({-1, base.size(-1)}).addmm_(h, b.t(), 1.0, scale);
      ctx->mark_dirty({base});
      return base;
    }
    return at::addmm(base.reshape({-1, base.size(-1)}), h, b.t(), 1.0, scale).view(base.sizes());
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list out(10); // base, x, A, B, scale, p, parts, part, hooks, computeValue
    const at::Tensor &g = grads[0];
    if (!g.defined())
      return out;
    std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &a = saved[1], &b = saved[2], &h = saved[3];
    const double scale = ctx->saved_data["scale"].toDouble();
    const double p = ctx->saved_data["p"].toDouble();
    auto *hooks = savedPointer<ExecutorHooks>(ctx, "hooks");
    const at::Tensor g2 = g.reshape({-1, g.size(-1)});
    if (ctx->needs_input_grad(0))
      out[0] = g;
    if (ctx->needs_input_grad(3)) // dB = scale g^T h
      out[3] = weightGradient(hooks, b, g2, h.mul(scale));
    if (!ctx->needs_input_grad(1) && !ctx->needs_input_grad(2))
      return out;
    at::Tensor dh = at::mm(g2, b).mul_(scale); // [tokens, r]
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    at::Tensor dropped = x2, mask;
    if (p > 0)
      std::tie(dropped, mask) =
          dropoutFrom(ctx->saved_data["rng"].toTensor(), x2, p,
                      {ctx->saved_data["parts"].toInt(), ctx->saved_data["part"].toInt()});
    if (ctx->needs_input_grad(2)) // dA = dh^T dropout(x)
      out[2] = weightGradient(hooks, a, dh, dropped);
    dropped = at::Tensor();
    if (ctx->needs_input_grad(1)) {
      at::Tensor dx = at::mm(dh, a);
      if (p > 0) // native_dropout's backward, as derivatives.yaml gives it
        dx = at::native_dropout_backward(dx, mask, 1.0 / (1.0 - p));
      out[1] = dx.view(x.sizes());
    }
    return out;
  }
};

} // namespace

at::Tensor loraAdapter(ExecutorHooks *hooks, const at::Tensor &base, const at::Tensor &x,
                       const at::Tensor &a, const at::Tensor &b, double scale, double p,
                       int64_t inputParts, int64_t inputPart, bool computeValue) {
  return LoraAdapterFunction::apply(base, x, a, b, scale, p, inputParts, inputPart, hooks,
                                    computeValue);
}

} // namespace bmt::runtime
