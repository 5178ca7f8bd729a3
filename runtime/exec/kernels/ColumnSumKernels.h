//===- ColumnSumKernels.h - sums over the rows of a matrix on CUDA -*- C++ -*-===//
//
// Launcher of the runtime's column-sum kernel (ColumnSum.cu) on raw device
// pointers, so that the CUDA file needs no LibTorch headers; the ATen-facing
// function is bmt/Runtime/exec/ColumnSum.h's columnSum.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_KERNELS_COLUMNSUMKERNELS_H
#define BMT_RUNTIME_EXEC_KERNELS_COLUMNSUMKERNELS_H

#include <cstdint>

typedef struct CUstream_st *cudaStream_t;

namespace bmt::runtime::kernels {

enum class SumElement { Float32, BFloat16, Float16 };

/// Row splits the launch for a [rows, cols] input uses on a device of `sms`
/// multiprocessors: 1 (one kernel) or more (then `workspace` must hold
/// splits * cols floats and a second kernel adds the splits' partial sums).
int64_t columnSumSplits(int64_t rows, int64_t cols, SumElement in, int sms);

/// out[c] = sum over r of in[r * cols + c], for a row-major [rows, cols]
/// input (rows, cols >= 1), accumulated in float32 in an order fixed by
/// (rows, cols, splits), rounded once to out's type (nearest even).
/// `splits`: columnSumSplits' answer (workspace as it says). Asynchronous
/// on `stream`; returns the cudaError_t of the launches (0 = success), or
/// cudaErrorInvalidValue for empty sizes, splits < 1, or no workspace.
int columnSum(const void *in, SumElement inType, int64_t rows, int64_t cols, void *out,
              SumElement outType, float *workspace, int64_t splits, cudaStream_t stream);

} // namespace bmt::runtime::kernels

#endif // BMT_RUNTIME_EXEC_KERNELS_COLUMNSUMKERNELS_H
