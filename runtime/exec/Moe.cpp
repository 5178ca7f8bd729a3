//===- Moe.cpp - a mixture-of-experts layer's token permutation -----------===//
//
// The ATen calls of transformers' grouped_mm dispatch and combine (see
// Moe.h), in the order and with the arguments its trace records them.
//
//===----------------------------------------------------------------------===//

#include "exec/Moe.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace bmt::runtime::moe {

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
    throw std::invalid_argument("moe_dispatch takes hidden [T, H] and int64 expert ids [T, K], got " +
                                std::to_string(hidden.dim()) + "-d hidden and " +
                                std::to_string(expertIds.dim()) + "-d " +
                                std::string(c10::toString(expertIds.scalar_type())) + " ids");
  const int64_t numExperts = experts.total;
  Dispatched d;
  auto [sorted, permutation] = at::sort(expertIds.reshape({-1}), -1, false);
  // hidden[permutation // K], K as the trace's 0-dim tensor (NumToTensor).
  at::Tensor token = at::floor_divide(permutation, at::scalar_to_tensor(expertIds.size(-1)));
  d.rows = at::index(hidden, c10::List<std::optional<at::Tensor>>({token}));
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
  // The inverse permutation as transformers makes it.
  at::Tensor inverse = at::empty_like(permutation);
  inverse.index_put_(c10::List<std::optional<at::Tensor>>({permutation}),
                     at::arange(permutation.size(0), permutation.options()), false);
  at::Tensor unsorted = at::index(rows, c10::List<std::optional<at::Tensor>>({inverse}));
  return unsorted.view({permutation.size(0) / topK, topK, rows.size(-1)}).sum({1}, false);
}

} // namespace bmt::runtime::moe
