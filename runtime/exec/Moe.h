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
#include <optional>
#include <utility>
#include <vector>

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
  at::Tensor counts;      ///< [E] float: the rows of each expert (histc)
};

/// hidden [T, H], expertIds [T, K] int64. Throws std::invalid_argument on
/// tensors of other ranks or dtypes, or on an expert range that is not all
/// of them (expert parallelism is not built yet).
Dispatched dispatch(const at::Tensor &hidden, const at::Tensor &expertIds,
                    const ExpertRange &experts);

/// rows [T*K, H] in the order of `permutation` (Dispatched::permutation):
/// [T, H], each token's K rows summed (over k in order, as aten::sum over dim 1).
at::Tensor combine(const at::Tensor &rows, const at::Tensor &permutation, int64_t topK);

/// Tokens per expert of every MoE layer over the forward passes of one
/// optimizer step, kept on the device (no host synchronisation). The
/// trainer owns one and hands it to the Executor (Executor::setExpertLoad),
/// which adds each MoeDispatch's counts to the layer of that instruction
/// (each MoE layer is its own plan function: the importers make one per
/// module), but not those of a checkpointed block's recompute in the
/// backward (the same tokens again).
class ExpertLoad {
public:
  /// Forgets the counts: a new step.
  void beginStep() { layers_.clear(); }
  /// Adds `counts` ([E], any dtype) to those of layer `layer` (any key:
  /// the executor gives the dispatch instruction's place in the plan);
  /// `routerBias` is that layer's router score-correction bias ([E] float,
  /// the live buffer), undefined when its router has none.
  void add(int64_t layer, const at::Tensor &counts, const at::Tensor &routerBias = {});
  /// Every layer's counts one after the other, in the order they first
  /// dispatched ([sum of E] float64 on the device), undefined when no
  /// layer dispatched since beginStep().
  at::Tensor flat() const;
  /// Whether a layer dispatched since beginStep().
  bool empty() const { return layers_.empty(); }
  /// Moves each layer's router bias b, where it has one, in place by
  /// `rate` x sign(mean(c) - c) (cast to b's dtype; DeepSeek-V3's
  /// auxiliary-loss-free balancing, arXiv:2412.19437 sec. 2.1.2), c its
  /// tokens per expert: the layer's slice of `counts` (flat()'s layout,
  /// summed over the ranks as the step's log counts them). With `skip` (a
  /// one-element tensor, 1: the step's update is skipped) b moves by
  /// nothing then. On the device, no host synchronisation.
  void moveRouterBiases(const at::Tensor &counts, double rate,
                        const std::optional<at::Tensor> &skip) const;

private:
  struct Layer {
    int64_t key = 0;
    at::Tensor counts; ///< [E] float64
    at::Tensor bias;   ///< the router's score-correction bias, or undefined
  };
  std::vector<Layer> layers_;
};

} // namespace bmt::runtime::moe

#endif // BMT_RUNTIME_EXEC_MOE_H
