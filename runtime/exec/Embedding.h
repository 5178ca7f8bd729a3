//===- Embedding.h - embeddings whose weight gradient goes to its slot -*- C++ -*-===//
//
// aten::embedding(W, indices, padding_idx, false, false) as one autograd
// function, for parameters the executor's hooks hold: the forward is the
// ATen operator, the backward adds each row of the output gradient into
// the row of W's gradient its index names (index_put_ with accumulate,
// as ATen's embedding_dense_backward sums them; the padding index's rows
// add nothing) straight into ZeRO's flat gradient:
//   - where W's only other reader is a linear layer (a tied LM head, so the
//     executor says: `tied`), into the slot that layer's matmul wrote in this
//     backward (ExecutorHooks::givenGradientSlot), and W gets no separate
//     gradient: no [vocab, hidden] tensor, sum or copy;
//   - else into a new slot (ExecutorHooks::gradientSlot), zeroed first.
// Without a slot it is ATen's embedding_dense_backward. See docs/runtime/parallel.md.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_EMBEDDING_H
#define BMT_RUNTIME_EXEC_EMBEDDING_H

#include "bmt/Runtime/exec/Executor.h"

#include <ATen/core/ivalue.h>

#include <optional>
#include <vector>

namespace bmt::runtime {

/// `stack`: aten::embedding's arguments (weight [V, H], indices (int64 or
/// int32, any shape), padding_idx, scale_grad_by_freq, sparse). Returns the
/// result ([*indices.shape, H], with autograd), or std::nullopt where the
/// function does not take them (then the caller runs the operator): grad
/// mode off, a weight that needs no gradient or is not 2-D and contiguous,
/// indices that require grad, scale_grad_by_freq or sparse set. `tied`:
/// the weight's one other reader is a linear layer whose backward returns
/// its slot as its gradient (only then is adding into that slot the sum
/// autograd would make). `hooks` (not owned) must outlive the backward.
std::optional<at::Tensor> embeddingWithGradientSlot(ExecutorHooks &hooks,
                                                    const std::vector<c10::IValue> &stack,
                                                    bool tied);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_EXEC_EMBEDDING_H
