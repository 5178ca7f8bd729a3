//===- Moe.cpp - a mixture-of-experts layer's token permutation -----------===//
//
// The ATen calls of transformers' grouped_mm dispatch and combine (see
// Moe.h), in the order and with the arguments its trace records them. The
// two gathers of rows differentiate as the permutations they are: the
// gradient of a gather by a permutation is the gather by its inverse, and
// the gradient of the K copies of each token is the sum of their rows
// (ATen's index backward, an accumulating index_put_ that sorts its
// indices, took 4 % of a Qwen3-MoE step on an H100).
//
//===----------------------------------------------------------------------===//

#include "exec/Moe.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <string>

namespace bmt::runtime::moe {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// rows[j] = x[index[j] floordiv copies] for a permutation `index` of the
/// [N * copies] copies of x's N rows (copies = 1: a permutation of x's
/// rows); `inverse` is index's inverse. Backward: the gradient of x's row
/// t is the sum of its copies' rows, grad.index_select(inverse) viewed
/// [N, copies, H] summed over the copies in order.
struct PermutedRows : torch::autograd::Function<PermutedRows> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, const at::Tensor &index,
                            const at::Tensor &inverse, int64_t copies) {
    ctx->save_for_backward({inverse});
    ctx->saved_data["copies"] = copies;
    at::Tensor rows = copies == 1 ? index : at::floor_divide(index, copies);
    return at::index_select(x, 0, rows);
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list out(4); // x, index, inverse, copies
    if (!grads[0].defined() || !ctx->needs_input_grad(0))
      return out;
    const at::Tensor inverse = ctx->get_saved_variables()[0];
    const int64_t copies = ctx->saved_data["copies"].toInt();
    at::Tensor g = at::index_select(grads[0], 0, inverse);
    out[0] = copies == 1 ? g : g.view({-1, copies, g.size(-1)}).sum({1}, false);
    return out;
  }
};

/// The inverse of the permutation `p` [N] int64, as transformers makes it.
at::Tensor inversePermutation(const at::Tensor &p) {
  at::Tensor inverse = at::empty_like(p);
  inverse.index_put_(c10::List<std::optional<at::Tensor>>({p}),
                     at::arange(p.size(0), p.options()), false);
  return inverse;
}

} // namespace

ExpertRange allExperts(int64_t numExperts) { return ExpertRange{0, numExperts, numExperts}; }

Dispatched dispatch(const at::Tensor &hidden, const at::Tensor &expertIds,
                    const ExpertRange &experts) {
  if (experts.total < 1 || experts.first != 0 || experts.count != experts.total)
    throw std::invalid_argument("moe_dispatch: experts " + std::to_string(experts.first) + " to " +
                                std::to_string(experts.first + experts.count) + " of " +
                                std::to_string(experts.total) +
                                " on this rank: expert parallelism is not supported yet");
  if (hidden.dim() != 2 || expertIds.dim() != 2 || expertIds.scalar_type() != at::kLong ||
      hidden.size(0) != expertIds.size(0))
    throw std::invalid_argument("moe_dispatch takes hidden [T, H] and int64 expert ids [T, K], got hidden " +
                                c10::str(hidden.sizes()) + " and " +
                                std::string(c10::toString(expertIds.scalar_type())) + " ids " +
                                c10::str(expertIds.sizes()));
  const int64_t numExperts = experts.total;
  Dispatched d;
  auto [sorted, permutation] = at::sort(expertIds.reshape({-1}), -1, false);
  // hidden[permutation // K]: each token's K copies, grouped by expert.
  d.rows = PermutedRows::apply(hidden, permutation, inversePermutation(permutation),
                               expertIds.size(-1));
  at::Tensor counts = at::histc(sorted.to(at::kFloat), numExperts, 0, numExperts - 1);
  d.offsets = at::cumsum(counts, 0, at::kInt);
  d.counts = std::move(counts);
  d.sortedIds = std::move(sorted);
  d.permutation = std::move(permutation);
  return d;
}

at::Tensor combine(const at::Tensor &rows, const at::Tensor &permutation, int64_t topK) {
  if (rows.dim() != 2 || permutation.dim() != 1 || topK < 1 ||
      rows.size(0) != permutation.size(0) || permutation.size(0) % topK != 0)
    throw std::invalid_argument("moe_combine takes rows [T*K, H] and a permutation [T*K] with K = " +
                                std::to_string(topK) + ", got " + std::to_string(rows.dim()) +
                                "-d rows of " + std::to_string(rows.dim() ? rows.size(0) : 0) +
                                " and a permutation of " +
                                std::to_string(permutation.numel()));
  // rows[inverse]: back in token order (its gradient: the gather by
  // `permutation`, the inverse's inverse).
  at::Tensor unsorted = PermutedRows::apply(rows, inversePermutation(permutation), permutation, 1);
  return unsorted.view({permutation.size(0) / topK, topK, rows.size(-1)}).sum({1}, false);
}

} // namespace bmt::runtime::moe
