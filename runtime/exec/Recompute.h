//===- Recompute.h - what a recomputed block need not compute -*- C++ -*-===//
//
// A checkpointed block is run again in backward only to rebuild its autograd
// graph: the values of its results are never read, only their gradients
// flow. So an operator whose result is needed only for its graph, and whose
// backward reads nothing that it computes, need not run: a linear layer's
// backward reads its input and weight, an add's reads nothing. In GPT-2's
// and LLaMA's blocks that is the MLP's last matmul and the residual add
// after it (torch.utils.checkpoint's non-reentrant variant skips them too:
// it stops recomputing once every saved tensor is back). RecomputePlans
// finds such instructions, across calls; the executor runs them as
// placeholders (an uninitialised result of the right shape and dtype with
// the operator's backward). Dropout passes through too: it still runs (the
// same random numbers) but its backward reads only its mask. Under tensor
// parallelism the all-reduce after a row-parallel matmul is skipped the same
// way (its backward reads only the gradient), and with it the matmul before
// it. See docs/runtime/parallel.md, "ZeRO".
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_RECOMPUTE_H
#define BMT_RUNTIME_EXEC_RECOMPUTE_H

#include "bmt/Plan/Plan.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace bmt::runtime {

/// How an instruction runs when its result is needed only for its graph.
enum class Skip : uint8_t {
  None,   ///< runs as usual
  Linear, ///< aten::linear / aten::addmm / aten::mm: the matmul is not run
  Add,    ///< aten::add.Tensor / aten::sub.Tensor: addWithoutValue
  /// A tensor-parallel all-reduce, all-gather or reduce-scatter: nothing is
  /// communicated, the result uninitialised, the backward the collective's.
  Collective,
  /// A LoRA adapter (exec/LoraAdapter.h): B's matmul and the add are not
  /// run; the rank-r projection its backward reads is.
  LoraAdapter,
};

/// One function's instructions for a run whose results' values are unused.
struct RecomputePlan {
  std::vector<Skip> skip;                    ///< per instruction
  std::vector<const RecomputePlan *> callee; ///< per instruction: a Call's plan, or null
  std::vector<bool> paramNeedsValue;         ///< per parameter: whether its value is read
  int64_t skipped = 0;                       ///< instructions skipped, callees' included
};

/// The RecomputePlans of a plan's functions, made at their first use.
class RecomputePlans {
public:
  explicit RecomputePlans(const plan::Plan &plan) : plan_(plan) {}
  /// The plan of function `function` where graphOnly[i] says whether the
  /// value of return i is unused (its gradient may still flow).
  const RecomputePlan &forResults(size_t function, const std::vector<bool> &graphOnly);

private:
  const plan::Plan &plan_;
  std::map<std::pair<size_t, std::vector<bool>>, std::unique_ptr<RecomputePlan>> plans_;
};

/// a + alpha * b as autograd records it (grad a = sum_to(g), grad b =
/// sum_to(alpha * g), cast to each input's dtype by autograd), with an
/// uninitialised result of the broadcast shape and promoted dtype: the add
/// is not computed. `a` and `b` on one device.
at::Tensor addWithoutValue(const at::Tensor &a, const at::Tensor &b, double alpha);

/// The result of an operator that is not computed: at::empty(shape,
/// options), or filled with NaN where BMT_DEBUG_RECOMPUTE_NAN=1 (tests: a
/// value read after all would show).
at::Tensor placeholder(at::IntArrayRef shape, const at::TensorOptions &options);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_EXEC_RECOMPUTE_H
