//===- Moe.h - a mixture-of-experts layer's token permutation ---*- C++ -*-===//
//
// The plan's MoeDispatch and MoeCombine instructions (bmt.moe_dispatch,
// bmt.moe_combine; docs/passes/moe-layers.md): the ATen ops transformers'
// grouped_mm experts record around their grouped matmuls, called in the
// same order with the same arguments, so that values equal the unlowered
// program's bit for bit; the gathers of rows differentiate as permutations
// (Moe.cpp), gradients equal up to the order of a token's K-term sum.
//
// Every expert is local today. The expert range is the seam for expert
// parallelism: a rank holding experts [first, first + count) of E will send
// the rows of other experts to their ranks (an all-to-all) after the sort
// and before the counts, and receive its own; combine will send them back.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_MOE_H
#define BMT_RUNTIME_EXEC_MOE_H

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace bmt::runtime::moe {

/// The experts this rank computes: [first, first + count) of `total`.
struct ExpertRange {
  int64_t first = 0;
  int64_t count = 0;
  int64_t total = 0;
};

/// Every one of `numExperts` experts on this rank (no expert parallelism).
ExpertRange allExperts(int64_t numExperts);

/// MoeDispatch's results: the token copies sorted by expert.
struct Dispatched {
  at::Tensor rows;        ///< [T*K, H]: hidden[permutation floordiv K]
  at::Tensor sortedIds;   ///< [T*K] int64: the expert of each row
  at::Tensor offsets;     ///< [E] int32: the end of each expert's rows
  at::Tensor permutation; ///< [T*K] int64: the sort's indices
};

/// hidden [T, H], expertIds [T, K] int64. Throws std::invalid_argument on
/// tensors of other ranks or dtypes, or on an expert range that is not all
/// of them (expert parallelism is not built yet).
Dispatched dispatch(const at::Tensor &hidden, const at::Tensor &expertIds,
                    const ExpertRange &experts);

/// rows [T*K, H] in the order of `permutation` (Dispatched::permutation):
/// [T, H], each token's K rows summed (over k in order, as aten::sum over dim 1).
at::Tensor combine(const at::Tensor &rows, const at::Tensor &permutation, int64_t topK);

} // namespace bmt::runtime::moe

#endif // BMT_RUNTIME_EXEC_MOE_H
