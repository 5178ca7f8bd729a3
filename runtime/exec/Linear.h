//===- Linear.h - linear layers whose weight gradient goes to its slot -*- C++ -*-===//
//
// aten::linear(x, W, b), aten::addmm(b, x, W, 1, 1) (GPT-2's Conv1D) and
// aten::mm(x, W) (its row-parallel split under tensor parallelism) as
// one autograd function, for parameters the executor's hooks hold: the
// forward is the ATen operator itself, the backward ATen's formulas
// (derivatives.yaml's mm_mat1_backward / mm_mat2_backward for a row-major or
// column-major weight, sum_to for the bias; on CUDA the bias's sum is
// bmt/Runtime/exec/ColumnSum.h's kernel, in
// another order), but the weight's gradient is written by its matmul straight into
// ExecutorHooks::gradientSlot(W) (ZeRO: the group's flat gradient), so the
// group's backward does not copy it there. See docs/runtime/parallel.md.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_LINEAR_H
#define BMT_RUNTIME_EXEC_LINEAR_H

#include "bmt/Runtime/exec/Executor.h"

#include <ATen/core/ivalue.h>

#include <optional>
#include <vector>

namespace bmt::runtime {

/// The weight's layout: aten::linear's [out, in], aten::addmm's and aten::mm's mat2 [in, out].
enum class LinearLayout { OutIn, InOut };

/// `stack`: the operator's arguments (linear: input, weight, bias or None;
/// addmm: self = bias, mat1, mat2, beta, alpha; mm: mat1, mat2). Returns the result with
/// autograd as the ATen operator's, or std::nullopt where the function does
/// not take them (then the caller runs the operator): grad mode off, no
/// weight gradient wanted (a frozen weight) while computeValue is true, addmm with beta or alpha not 1, a None bias or
/// a mat1 that is not 2-D, an input that is not contiguous, complex, or of
/// fewer than 2 or more than 3 dimensions (ATen reduces the bias gradient
/// otherwise there), or a weight that is not 2-D and contiguous. `hooks` (not owned) must outlive the
/// backward. `computeValue` false (a recomputed block's result only for its
/// graph, exec/Recompute.h): the result is uninitialised, the matmul not
/// run (call it so only where the same call computed it before), the
/// backward the same.
std::optional<at::Tensor> linearWithGradientSlot(ExecutorHooks &hooks, LinearLayout layout,
                                                 const std::vector<c10::IValue> &stack,
                                                 bool computeValue = true);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_EXEC_LINEAR_H
