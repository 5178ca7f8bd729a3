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

#include "bmt/Runtime/comm/Collectives.h"
#include "bmt/Runtime/comm/Comm.h"

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

ExpertRange expertsOfRank(int64_t numExperts, int64_t groupSize, int64_t rank) {
  if (groupSize < 1 || numExperts < 1 || numExperts % groupSize != 0 || rank < 0 ||
      rank >= groupSize)
    throw std::invalid_argument("expert parallelism: " + std::to_string(numExperts) +
                                " experts do not divide over an expert group of " +
                                std::to_string(groupSize) + " ranks");
  const int64_t local = numExperts / groupSize;
  return ExpertRange{rank * local, local, numExperts};
}

namespace {

std::string rangeText(const ExpertRange &experts) {
  return "experts " + std::to_string(experts.first) + " to " +
         std::to_string(experts.first + experts.count) + " of " + std::to_string(experts.total);
}

/// Expert parallelism's half of the dispatch: d holds this rank's copies
/// sorted by expert and its counts; sends them to the ranks of their
/// experts and orders what arrives by expert.
void exchangeRows(Dispatched &d, const ExpertRange &experts, Comm &group) {
  const int64_t ranks = group.size(), local = experts.count;
  // The counts per expert, all-to-all (rank q gets the counts of its own
  // experts from every rank), then on the host once: the row counts.
  at::Tensor sendPerExpert = d.counts.to(at::kLong);
  at::Tensor recvPerExpert = at::empty_like(sendPerExpert);
  const std::vector<int64_t> perRank(static_cast<size_t>(ranks), local);
  group.allToAll(recvPerExpert, sendPerExpert, perRank, perRank)->wait();
  at::Tensor host = at::cat({sendPerExpert, recvPerExpert}).to(at::kCPU);
  auto count = host.accessor<int64_t, 1>();
  const int64_t total = experts.total;
  auto ex = std::make_shared<Exchange>();
  ex->comm = &group;
  ex->sendCounts.assign(static_cast<size_t>(ranks), 0);
  ex->recvCounts.assign(static_cast<size_t>(ranks), 0);
  int64_t received = 0;
  for (int64_t q = 0; q < ranks; ++q)
    for (int64_t j = 0; j < local; ++j) {
      ex->sendCounts[q] += count[q * local + j];
      ex->recvCounts[q] += count[total + q * local + j];
    }
  for (int64_t c : ex->recvCounts)
    received += c;
  at::Tensor rows = allToAllTokens(d.rows, group, ex->sendCounts, ex->recvCounts);
  // Arrived source-major (rank s's rows of expert j at start[s][j]); the
  // experts read them expert-major. The order is built on the device from
  // the counts there (no second host copy).
  at::Tensor c = recvPerExpert.view({ranks, local});
  at::Tensor flat = c.reshape({-1});
  at::Tensor sourceStart = (at::cumsum(flat, 0) - flat).view({ranks, local}).t().reshape({-1});
  at::Tensor lengths = c.t().reshape({-1});
  at::Tensor expertStart = at::cumsum(lengths, 0) - lengths;
  ex->order = at::repeat_interleave(sourceStart - expertStart, lengths, 0, received) +
              at::arange(received, lengths.options());
  ex->inverse = inversePermutation(ex->order);
  d.rows = PermutedRows::apply(rows, ex->order, ex->inverse, 1);
  if (d.weights.defined()) {
    at::Tensor w = allToAllTokens(d.weights.view({-1, 1}), group, ex->sendCounts, ex->recvCounts);
    d.weights = PermutedRows::apply(w, ex->order, ex->inverse, 1).view({-1});
  }
  at::Tensor localCounts = c.sum(0);
  // Weights of only this rank's experts: local ids, offsets over them.
  const int64_t firstId = experts.localWeights ? 0 : experts.first;
  d.sortedIds = at::repeat_interleave(
      at::arange(firstId, firstId + local, lengths.options()), localCounts, 0, received);
  if (experts.localWeights) {
    d.offsets = at::cumsum(localCounts, 0, at::kInt);
    d.exchange = std::move(ex);
    return;
  }
  at::Tensor all = at::zeros({total}, lengths.options());
  all.narrow(0, experts.first, local).copy_(localCounts);
  d.offsets = at::cumsum(all, 0, at::kInt);
  d.exchange = std::move(ex);
}

} // namespace

Dispatched dispatch(const at::Tensor &hidden, const at::Tensor &expertIds,
                    const ExpertRange &experts, Comm *expertGroup, const at::Tensor &weights) {
  const bool parallel = expertGroup && expertGroup->size() > 1;
  if (!parallel && (experts.total < 1 || experts.first != 0 || experts.count != experts.total))
    throw std::invalid_argument("moe_dispatch: " + rangeText(experts) +
                                " on this rank without an expert group");
  if (!parallel && experts.localWeights)
    throw std::invalid_argument("moe_dispatch: local expert weights without an expert group");
  if (parallel) {
    ExpertRange own = expertsOfRank(experts.total, expertGroup->size(), expertGroup->rank());
    if (own.first != experts.first || own.count != experts.count)
      throw std::invalid_argument("moe_dispatch: " + rangeText(experts) + " on rank " +
                                  std::to_string(expertGroup->rank()) +
                                  " of the expert group, which computes " + rangeText(own));
  }
  if (hidden.dim() != 2 || expertIds.dim() != 2 || expertIds.scalar_type() != at::kLong ||
      hidden.size(0) != expertIds.size(0))
    throw std::invalid_argument("moe_dispatch takes hidden [T, H] and int64 expert ids [T, K], got hidden " +
                                c10::str(hidden.sizes()) + " and " +
                                std::string(c10::toString(expertIds.scalar_type())) + " ids " +
                                c10::str(expertIds.sizes()));
  if (weights.defined() && weights.sizes() != expertIds.sizes())
    throw std::invalid_argument("moe_dispatch takes routing weights of the ids' shape " +
                                c10::str(expertIds.sizes()) + ", got " +
                                c10::str(weights.sizes()));
  const int64_t numExperts = experts.total;
  Dispatched d;
  auto [sorted, permutation] = at::sort(expertIds.reshape({-1}), -1, false);
  at::Tensor inverse = inversePermutation(permutation);
  // hidden[permutation // K]: each token's K copies, grouped by expert.
  d.rows = PermutedRows::apply(hidden, permutation, inverse, expertIds.size(-1));
  if (weights.defined())
    d.weights = PermutedRows::apply(weights.reshape({-1, 1}), permutation, inverse, 1).view({-1});
  d.counts = at::histc(sorted.to(at::kFloat), numExperts, 0, numExperts - 1);
  d.sortedIds = std::move(sorted);
  d.permutation = std::move(permutation);
  if (parallel)
    exchangeRows(d, experts, *expertGroup);
  else
    d.offsets = at::cumsum(d.counts, 0, at::kInt);
  return d;
}

at::Tensor combine(const at::Tensor &rows, const at::Tensor &permutation, int64_t topK,
                   const Exchange *exchange) {
  at::Tensor mine = rows;
  if (exchange) {
    int64_t received = 0;
    for (int64_t c : exchange->recvCounts)
      received += c;
    if (rows.dim() != 2 || rows.size(0) != received)
      throw std::invalid_argument("moe_combine takes the " + std::to_string(received) +
                                  " rows this rank's experts computed, got " +
                                  c10::str(rows.sizes()));
    // Back to the order they arrived in, and back to their ranks.
    at::Tensor arrived = PermutedRows::apply(rows, exchange->inverse, exchange->order, 1);
    mine = allToAllTokens(arrived, *exchange->comm, exchange->recvCounts, exchange->sendCounts);
  }
  if (mine.dim() != 2 || permutation.dim() != 1 || topK < 1 ||
      mine.size(0) != permutation.size(0) || permutation.size(0) % topK != 0)
    throw std::invalid_argument("moe_combine takes rows [T*K, H] and a permutation [T*K] with K = " +
                                std::to_string(topK) + ", got " + std::to_string(mine.dim()) +
                                "-d rows of " + std::to_string(mine.dim() ? mine.size(0) : 0) +
                                " and a permutation of " +
                                std::to_string(permutation.numel()));
  // rows[inverse]: back in token order (its gradient: the gather by
  // `permutation`, the inverse's inverse).
  at::Tensor unsorted = PermutedRows::apply(mine, inversePermutation(permutation), permutation, 1);
  return unsorted.view({permutation.size(0) / topK, topK, mine.size(-1)}).sum({1}, false);
}

} // namespace bmt::runtime::moe
