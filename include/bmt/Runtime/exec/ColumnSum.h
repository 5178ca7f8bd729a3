//===- ColumnSum.h - sums over the rows of a matrix --------------*- C++ -*-===//
//
// A bias's gradient ([tokens, out] -> [out]) and the column partials of a
// fused row kernel ([blocks, D] -> [D]) in one pass: on CUDA (with the
// runtime's kernels) runtime/exec/kernels/ColumnSum.cu, elsewhere ATen's sum.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_COLUMNSUM_H
#define BMT_RUNTIME_EXEC_COLUMNSUM_H

#include <ATen/core/Tensor.h>

namespace bmt::runtime {

/// `x`: [rows, cols], any strides. Returns [cols] of `dtype`: the sum over
/// the rows. On CUDA, for a contiguous float32/bf16/fp16 `x` and out
/// dtype: accumulated in float32 in a fixed order (a run repeats bit for
/// bit, the order differs from ATen's) and rounded once. Otherwise
/// `x.sum(0)` (ATen's accumulation, the result in x's dtype) cast to
/// `dtype`. Throws std::runtime_error for an `x` that is not 2-D or a
/// failed launch.
at::Tensor columnSum(const at::Tensor &x, at::ScalarType dtype);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_EXEC_COLUMNSUM_H
