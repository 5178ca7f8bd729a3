//===- Embedding.cpp - embeddings whose weight gradient goes to its slot --===//

#include "exec/Embedding.h"
#include "exec/SavedPointer.h"

#include <ATen/ops/embedding.h>
#include <ATen/ops/embedding_dense_backward.h>
#include <ATen/ops/index_put.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace bmt::runtime {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct EmbeddingFunction : torch::autograd::Function<EmbeddingFunction> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &weight,
                            const at::Tensor &indices, int64_t paddingIdx, ExecutorHooks *hooks,
                            bool tied) {
    ctx->saved_data["tied"] = tied;
    ctx->save_for_backward({indices});
    ctx->saved_data["rows"] = weight.size(0);
    ctx->saved_data["padding_idx"] = paddingIdx;
    savePointer(ctx, "hooks", hooks);
    ctx->saved_data["weight"] = weight.detach(); // to find its slot (a view of the gathered buffer)
    return at::embedding(weight, indices, paddingIdx, false, false);
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list out(5); // weight, indices, padding_idx, hooks, tied
    const at::Tensor &g = grads[0];
    if (!g.defined() || !ctx->needs_input_grad(0))
      return out;
    const at::Tensor indices = ctx->get_saved_variables()[0];
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();
    const int64_t paddingIdx = ctx->saved_data["padding_idx"].toInt();
    auto *hooks = savedPointer<ExecutorHooks>(ctx, "hooks");
    const int64_t hidden = g.size(-1);
    auto addRows = [&](at::Tensor &into) {
      at::Tensor rows = g.reshape({-1, hidden}), index = indices.reshape({-1});
      if (paddingIdx >= 0)
        rows = rows.masked_fill(index.eq(paddingIdx).unsqueeze(1), 0);
      into.index_put_({index}, rows.to(into.scalar_type()), /*accumulate=*/true);
    };
    at::Tensor given =
        ctx->saved_data["tied"].toBool() ? hooks->givenGradientSlot(weight) : at::Tensor();
    if (given.defined()) {
      addRows(given); // W's other use returned this slot as its gradient
      return out;
    }
    if (at::Tensor slot = hooks->gradientSlot(weight); slot.defined()) {
      slot.zero_();
      addRows(slot);
      out[0] = slot;
      return out;
    }
    out[0] = at::embedding_dense_backward(g, indices, ctx->saved_data["rows"].toInt(), paddingIdx,
                                          false);
    return out;
  }
};

} // namespace

std::optional<at::Tensor> embeddingWithGradientSlot(ExecutorHooks &hooks,
                                                    const std::vector<c10::IValue> &stack,
                                                    bool tied) {
  if (!c10::GradMode::is_enabled() || stack.size() != 5 || !stack[0].isTensor() ||
      !stack[1].isTensor() || !stack[2].isInt() || !stack[3].isBool() || !stack[4].isBool() ||
      stack[3].toBool() || stack[4].toBool())
    return std::nullopt;
  const at::Tensor &weight = stack[0].toTensor(), &indices = stack[1].toTensor();
  if (!weight.requires_grad() || weight.dim() != 2 || !weight.is_contiguous() ||
      indices.requires_grad())
    return std::nullopt;
  return EmbeddingFunction::apply(weight, indices, stack[2].toInt(), &hooks,
                                  tied);
}

} // namespace bmt::runtime
