//===- Moe.h - a mixture-of-experts layer's token permutation ---*- C++ -*-===//
//
// The plan's MoeDispatch and MoeCombine instructions (bmt.moe_dispatch,
// bmt.moe_combine; docs/passes/moe-layers.md): the ATen ops transformers'
// grouped_mm experts record around their grouped matmuls, called in the
// same order with the same arguments, so that values equal the unlowered
// program's bit for bit; the gathers of rows differentiate as permutations
// (Moe.cpp), gradients equal up to the order of a token's K-term sum.
//
// Expert parallelism (an expert group of P ranks, consecutive ranks of the
// world; rank p of the group computes experts [p*E/P, (p+1)*E/P)): the
// dispatch sorts this rank's token copies by expert as before, exchanges
// the per-expert counts (one all-to-all of E int64 and one host copy: the
// only host synchronisation, the row counts the all-to-all of rows needs),
// sends each row to the rank of its expert (allToAllTokens: in autograd,
// backward = the reverse exchange), and orders the rows it receives by
// expert (source rank order within an expert). The offsets stay [E] (zero
// rows for the experts of other ranks), so the experts' grouped matmuls
// read the whole [E, ...] weights and give the other experts no rows (and
// no gradient). The combine undoes it: back to source order, the reverse
// all-to-all, then the sum of each token's K copies in token order.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_MOE_H
#define BMT_RUNTIME_EXEC_MOE_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace bmt::runtime {
class Comm;
}

namespace bmt::runtime::moe {

/// The experts this rank computes: [first, first + count) of `total`.
struct ExpertRange {
  int64_t first = 0;
  int64_t count = 0;
  int64_t total = 0;
  /// Under expert parallelism: the experts' weights hold only this rank's
  /// `count` experts (split over the expert group), so the offsets are
  /// [count] and the sorted ids local ids (expert - first); else the
  /// offsets are [total] and the ids global.
  bool localWeights = false;
};

/// Every one of `numExperts` experts on this rank (no expert parallelism).
ExpertRange allExperts(int64_t numExperts);

/// The experts rank `rank` of an expert group of `groupSize` ranks
/// computes (E / groupSize consecutive ones). Throws std::invalid_argument
/// when groupSize does not divide numExperts.
ExpertRange expertsOfRank(int64_t numExperts, int64_t groupSize, int64_t rank);

/// Expert parallelism: how one dispatch moved rows, for its combine.
struct Exchange {
  Comm *comm = nullptr;               ///< the expert group
  std::vector<int64_t> sendCounts;    ///< rows this rank sent each group rank
  std::vector<int64_t> recvCounts;    ///< rows it received from each
  at::Tensor order;   ///< [R] int64: expert-ordered row i = received row order[i]
  at::Tensor inverse; ///< order's inverse
};

/// MoeDispatch's results: the token copies sorted by expert. Under expert
/// parallelism (an Exchange), rows, sortedIds and weights are the R rows
/// this rank's experts compute, from every rank of its group.
struct Dispatched {
  at::Tensor rows;        ///< [T*K, H]: hidden[permutation floordiv K] (EP: [R, H])
  at::Tensor sortedIds;   ///< [T*K] int64: the expert of each row (EP: [R]; local weights: local ids)
  at::Tensor offsets;     ///< [E] int32: the end of each expert's rows (local weights: [E/P])
  at::Tensor permutation; ///< [T*K] int64: the sort's indices (this rank's tokens)
  at::Tensor counts;      ///< [E] float: this rank's token copies per expert (histc)
  at::Tensor weights;     ///< [T*K] (EP: [R]): routing weights reshape(-1)[permutation], when given
  std::shared_ptr<Exchange> exchange; ///< set under expert parallelism
};

/// hidden [T, H], expertIds [T, K] int64, routing weights [T, K] or
/// undefined. `expertGroup` (not owned; null or one rank: every expert
/// local) is the expert group; `experts` must then be this rank's
/// (expertsOfRank). Throws std::invalid_argument on tensors of other ranks
/// or dtypes, or on an expert range that does not fit the group.
Dispatched dispatch(const at::Tensor &hidden, const at::Tensor &expertIds,
                    const ExpertRange &experts, Comm *expertGroup = nullptr,
                    const at::Tensor &weights = at::Tensor());

/// rows [T*K, H] in the order of `permutation` (Dispatched::permutation):
/// [T, H], each token's K rows summed (over k in order, as aten::sum over dim 1).
/// With the dispatch's `exchange`, rows are the [R, H] this rank's experts
/// computed: they go back to their ranks first.
at::Tensor combine(const at::Tensor &rows, const at::Tensor &permutation, int64_t topK,
                   const Exchange *exchange = nullptr);

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
