//===- CrossEntropyKernels.h - fused cross-entropy CUDA kernels -*- C++ -*-===//
//
// Launchers of the fused softmax cross-entropy kernels (CrossEntropy.cu),
// on raw device pointers so that the CUDA file needs no LibTorch headers.
// The autograd function around them is in runtime/objectives/CrossEntropy.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_KERNELS_CROSSENTROPYKERNELS_H
#define BMT_RUNTIME_KERNELS_CROSSENTROPYKERNELS_H

#include <cstdint>

typedef struct CUstream_st *cudaStream_t;

namespace bmt::runtime::kernels {

/// Element type of the logits.
enum class LogitType { Float32, BFloat16, Float16 };

/// For each row r < rows of `logits` ([rows, vocab], row stride `stride`
/// elements, any LogitType): lse[r] = log(sum_j exp(x[r, j])) in float32 and
/// loss[r] = lse[r] - x[r, labels[r]], or 0 where labels[r] == ignoreIndex.
/// labels: int64 [rows] in [0, vocab) or ignoreIndex. lse, loss: float32
/// [rows]. A label outside the range sets loss[r] to NaN. Asynchronous on
/// `stream`; returns the cudaError_t of the launch (0 = success).
int crossEntropyForward(const void *logits, LogitType type, int64_t rows, int64_t vocab,
                        int64_t stride, const int64_t *labels, int64_t ignoreIndex, float *lse,
                        float *loss, cudaStream_t stream);

/// grad[r, j] = scale * (exp(x[r, j] - lse[r]) - [j == labels[r]]) with
/// scale = gradLoss[0] / count[0] (float32 device scalars), and 0 for an
/// ignored row: the gradient of mean cross-entropy over `count` labels.
/// grad: [rows, vocab] contiguous, same LogitType as the logits.
int crossEntropyBackward(const void *logits, LogitType type, int64_t rows, int64_t vocab,
                         int64_t stride, const int64_t *labels, int64_t ignoreIndex,
                         const float *lse, const float *gradLoss, const float *count, void *grad,
                         cudaStream_t stream);

} // namespace bmt::runtime::kernels

#endif // BMT_RUNTIME_KERNELS_CROSSENTROPYKERNELS_H
