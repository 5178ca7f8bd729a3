//===- CrossEntropy.cu - fused softmax cross-entropy kernels --------------===//
//
// One thread block per row of logits. Forward: one pass over the row with
// an online maximum and sum of exponentials (Milakov & Gimelshein, "Online
// normalizer calculation for softmax", 2018), merged across the block; it
// writes only the row's log-sum-exp and loss (8 bytes), never the float32
// copy, the log-softmax or the probabilities that the unfused path writes
// ([rows, vocab] each). Backward: one pass that writes the gradient of the
// logits in their own dtype. Arithmetic in float32.
//
//===----------------------------------------------------------------------===//

#include "CrossEntropyKernels.h"
#include "kernels/Convert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

namespace bmt::runtime::kernels {

namespace {

constexpr int kThreads = 512;

/// Running (maximum, sum of exp(x - maximum)).
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  float m = fmaxf(a.max, b.max);
  if (m == -INFINITY)
    return {m, 0.f};
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ __forceinline__ MaxSum add(MaxSum a, float x) {
  if (x > a.max)
    return {x, a.sum * expf(a.max - x) + 1.f};
  return {a.max, a.sum + expf(x - a.max)};
}

/// Elements per vector load (16 bytes).
template <typename T> constexpr int vecSize() { return 16 / sizeof(T); }

template <typename T> struct alignas(16) Vec {
  T v[vecSize<T>()];
};

/// Calls f(j, x) for every element j of the row (x as float), with 16-byte
/// loads when `vectorized` (row start aligned, vocab a multiple of the width).
template <typename T, typename F>
__device__ __forceinline__ void forEach(const T *row, int64_t vocab, bool vectorized, F f) {
  constexpr int W = vecSize<T>();
  if (vectorized) {
    const Vec<T> *vrow = reinterpret_cast<const Vec<T> *>(row);
    for (int64_t k = threadIdx.x; k < vocab / W; k += blockDim.x) {
      Vec<T> v = vrow[k];
#pragma unroll
      for (int i = 0; i < W; ++i)
        f(k * W + i, toFloat(v.v[i]));
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
      f(j, toFloat(row[j]));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    forwardKernel(const T *logits, int64_t vocab, int64_t stride, const int64_t *labels,
                  int64_t ignoreIndex, bool vectorized, float *lse, float *loss) {
  const int64_t r = blockIdx.x;
  const T *row = logits + r * stride;
  MaxSum acc{-INFINITY, 0.f};
  forEach(row, vocab, vectorized, [&](int64_t, float x) { acc = add(acc, x); });
  // Merge across the warp, then across the warps.
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffff, acc.max, offset),
                 __shfl_xor_sync(0xffffffff, acc.sum, offset)};
    acc = merge(acc, other);
  }
  __shared__ MaxSum warps[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0)
    warps[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum total = warps[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
      total = merge(total, warps[w]);
    const float l = total.max + logf(total.sum);
    lse[r] = l;
    const int64_t label = labels[r];
    if (label == ignoreIndex)
      loss[r] = 0.f;
    else if (label < 0 || label >= vocab)
      loss[r] = NAN;
    else
      loss[r] = l - toFloat(row[label]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    backwardKernel(const T *logits, int64_t vocab, int64_t stride, const int64_t *labels,
                   int64_t ignoreIndex, bool vectorized, const float *lse,
                   const float *gradLoss, const float *count, T *grad) {
  const int64_t r = blockIdx.x;
  const T *row = logits + r * stride;
  T *out = grad + r * vocab;
  const int64_t label = labels[r];
  const float scale = label == ignoreIndex ? 0.f : gradLoss[0] / count[0];
  const float l = lse[r];
  constexpr int W = vecSize<T>();
  if (vectorized) {
    const Vec<T> *vrow = reinterpret_cast<const Vec<T> *>(row);
    Vec<T> *vout = reinterpret_cast<Vec<T> *>(out);
    for (int64_t k = threadIdx.x; k < vocab / W; k += blockDim.x) {
      Vec<T> v = vrow[k], g;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const int64_t j = k * W + i;
        const float p = expf(toFloat(v.v[i]) - l);
        g.v[i] = fromFloat<T>(scale * (p - (j == label ? 1.f : 0.f)));
      }
      vout[k] = g;
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      const float p = expf(toFloat(row[j]) - l);
      out[j] = fromFloat<T>(scale * (p - (j == label ? 1.f : 0.f)));
    }
  }
}

template <typename T> bool canVectorize(const void *logits, int64_t vocab, int64_t stride) {
  constexpr int W = vecSize<T>();
  return reinterpret_cast<uintptr_t>(logits) % 16 == 0 && vocab % W == 0 && stride % W == 0;
}

template <typename T>
int forwardTyped(const void *logits, int64_t rows, int64_t vocab, int64_t stride,
                 const int64_t *labels, int64_t ignoreIndex, float *lse, float *loss,
                 cudaStream_t stream) {
  if (rows == 0)
    return 0;
  forwardKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      static_cast<const T *>(logits), vocab, stride, labels, ignoreIndex,
      canVectorize<T>(logits, vocab, stride), lse, loss);
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int backwardTyped(const void *logits, int64_t rows, int64_t vocab, int64_t stride,
                  const int64_t *labels, int64_t ignoreIndex, const float *lse,
                  const float *gradLoss, const float *count, void *grad, cudaStream_t stream) {
  if (rows == 0)
    return 0;
  // The output is contiguous: vectorized when its start is aligned too.
  const bool vectorized = canVectorize<T>(logits, vocab, stride) &&
                          reinterpret_cast<uintptr_t>(grad) % 16 == 0;
  backwardKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      static_cast<const T *>(logits), vocab, stride, labels, ignoreIndex, vectorized, lse,
      gradLoss, count, static_cast<T *>(grad));
  return static_cast<int>(cudaGetLastError());
}

} // namespace

int crossEntropyForward(const void *logits, LogitType type, int64_t rows, int64_t vocab,
                        int64_t stride, const int64_t *labels, int64_t ignoreIndex, float *lse,
                        float *loss, cudaStream_t stream) {
  switch (type) {
  case LogitType::Float32:
    return forwardTyped<float>(logits, rows, vocab, stride, labels, ignoreIndex, lse, loss, stream);
  case LogitType::BFloat16:
    return forwardTyped<__nv_bfloat16>(logits, rows, vocab, stride, labels, ignoreIndex, lse,
                                       loss, stream);
  case LogitType::Float16:
    return forwardTyped<__half>(logits, rows, vocab, stride, labels, ignoreIndex, lse, loss,
                                stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int crossEntropyBackward(const void *logits, LogitType type, int64_t rows, int64_t vocab,
                         int64_t stride, const int64_t *labels, int64_t ignoreIndex,
                         const float *lse, const float *gradLoss, const float *count, void *grad,
                         cudaStream_t stream) {
  switch (type) {
  case LogitType::Float32:
    return backwardTyped<float>(logits, rows, vocab, stride, labels, ignoreIndex, lse, gradLoss,
                                count, grad, stream);
  case LogitType::BFloat16:
    return backwardTyped<__nv_bfloat16>(logits, rows, vocab, stride, labels, ignoreIndex, lse,
                                        gradLoss, count, grad, stream);
  case LogitType::Float16:
    return backwardTyped<__half>(logits, rows, vocab, stride, labels, ignoreIndex, lse, gradLoss,
                                 count, grad, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

} // namespace bmt::runtime::kernels
