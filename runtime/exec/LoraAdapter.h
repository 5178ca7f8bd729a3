//===- LoraAdapter.h - a LoRA adapter as one autograd function -*- C++ -*-===//
//
// bmt.lora_adapter (the lora_adapter plan instruction, bmt-opt --lora):
//   y = base + scale * linear(linear(dropout(x, p), A), B)
// as peft's LoRA Linear computes it, run as one autograd function instead of
// five operators. It saves x, A, B and x's rank-r projection, not the
// dropout mask or the dropped input: backward draws the mask again from the
// generator state it saved (aten::native_dropout on the same input, so the
// same mask bit for bit). The adapter's output is added into `base` in place
// by its last matmul (beta = 1, alpha = scale), and A's and B's gradients
// are written into their ZeRO slots (ExecutorHooks::gradientSlot) as
// exec/Linear.h writes a weight's. See docs/passes/lora.md.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_LORAADAPTER_H
#define BMT_RUNTIME_EXEC_LORAADAPTER_H

#include "bmt/Runtime/exec/Executor.h"

#include <ATen/core/Tensor.h>

namespace bmt::runtime {

/// `base` [..., out]: the frozen layer's output for `x` [..., in]; `a`
/// [r, in] and `b` [out, r] the adapter (one dtype with x and base); `p` in
/// [0, 1) the dropout probability, drawn from the default generator of x's
/// device; `inputParts` > 1: x is part `inputPart` of an input split that
/// many ways along its last dim (a row-parallel layer's on a TP rank), and
/// its mask that part of the whole input's mask; `hooks` (may be null)
/// gives A's and B's gradient slots and must outlive the backward. Returns `base` with the adapter added (the
/// same tensor, changed in place, where it is a contiguous non-view tensor;
/// else a new one), with autograd to base, x, A and B. `computeValue` false
/// (a recomputed block's result only for its graph, exec/Recompute.h):
/// B's matmul and the add are not run (`base`, uninitialised, is returned)
/// and the backward is the same. Throws c10::Error on mismatched shapes or
/// dtypes (ATen's message).
at::Tensor loraAdapter(ExecutorHooks *hooks, const at::Tensor &base, const at::Tensor &x,
                       const at::Tensor &a, const at::Tensor &b, double scale, double p,
                       int64_t inputParts = 1, int64_t inputPart = 0, bool computeValue = true);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_EXEC_LORAADAPTER_H
