//===- Adam.cu - the fused Adam/AdamW step --------------------------------===//
//
// One pass over a float32 master, its two moments and its gradient (float32,
// bf16 or fp16) that also writes the master's bf16/fp16 copy: 28 bytes an
// element for a bf16 gradient and copy, where a cast of the gradient to
// float32, ATen's fused AdamW and a copy of the master into the shard move
// about 44. The arithmetic is that of torch's fused Adam
// (aten/src/ATen/native/cuda/fused_adam_utils.cuh, adam_math): the same
// float32 operations, the same explicit fmas, the same order.
//
// Launches cover up to kMaxSegments segments (the metadata is a kernel
// argument); a block updates one chunk of kChunk elements of one segment,
// four elements a thread with 16-byte loads of the float32 arrays where the
// segment's pointers allow it (after a scalar head of up to three elements
// that brings them to a 16-byte boundary), scalar otherwise.
//
//===----------------------------------------------------------------------===//

#include "AdamKernels.h"
#include "kernels/Convert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace bmt::runtime::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;                       ///< elements a thread per iteration
constexpr int64_t kChunk = kThreads * kVec * 16; ///< elements a block
constexpr int kMaxSegments = 36;              ///< a Batch stays under 4 KiB

/// A segment as the kernel sees it.
struct Segment {
  float *param;
  const void *grad;
  float *expAvg, *expAvgSq;
  void *copy;
  const float *step;
  int64_t numel;
  float weightDecay, gradMultiplier;
  int32_t head;    ///< scalar elements before the 16-byte aligned body
  int32_t vector;  ///< 1: the body takes vector loads
};

struct Batch {
  Segment segments[kMaxSegments];
  /// Segment s is updated by blocks [firstBlock[s], firstBlock[s + 1]).
  int32_t firstBlock[kMaxSegments + 1];
  int32_t count;
};
static_assert(sizeof(Batch) < 4000, "kernel arguments are limited to 4 KiB");

template <typename T> struct alignas(kVec * sizeof(T)) Vec {
  T v[kVec];
};

/// The per-tensor constants of torch's kernel, in float32.
struct Constants {
  float lr, beta1, beta2, weightDecay, eps;
  float biasCorrection1, biasCorrection2Sqrt;
  float gradMultiplier;
  float gradScale;
  bool scaled;
};

/// One element: torch's adam_math for one index (its comments' order).
template <bool Decoupled>
__device__ __forceinline__ void update(float &param, float grad, float &expAvg, float &expAvgSq,
                                       const Constants &c) {
  // ZeRO's average, rounded on its own as ATen's x * (1.0f / ranks) is
  // (__fmul_rn: never contracted into a later add).
  grad = __fmul_rn(grad, c.gradMultiplier);
  if (c.scaled)
    grad /= c.gradScale;
  if (c.weightDecay != 0) {
    if constexpr (Decoupled)
      param -= c.lr * c.weightDecay * param;
    else
      grad += param * c.weightDecay;
  }
  expAvg = fmaf(c.beta1, expAvg, fmaf(-c.beta1, grad, grad));
  expAvgSq = fmaf(c.beta2, expAvgSq, fmaf(-c.beta2, grad * grad, grad * grad));
  const float stepSize = c.lr / c.biasCorrection1;
  const float denom = (sqrtf(expAvgSq) / c.biasCorrection2Sqrt) + c.eps;
  param -= stepSize * expAvg / denom;
}

template <typename G, typename C, bool Decoupled>
__device__ __forceinline__ void scalarAt(const Segment &s, int64_t i, const Constants &c) {
  float p = s.param[i], m = s.expAvg[i], v = s.expAvgSq[i];
  update<Decoupled>(p, toFloat(static_cast<const G *>(s.grad)[i]), m, v, c);
  s.param[i] = p;
  s.expAvg[i] = m;
  s.expAvgSq[i] = v;
  if (s.copy)
    static_cast<C *>(s.copy)[i] = fromFloat<C>(p);
}

/// Elements [i, i + kVec), i aligned (the segment's vector flag).
template <typename G, typename C, bool Decoupled>
__device__ __forceinline__ void vectorAt(const Segment &s, int64_t i, const Constants &c) {
  Vec<float> p = *reinterpret_cast<const Vec<float> *>(s.param + i);
  Vec<float> m = *reinterpret_cast<const Vec<float> *>(s.expAvg + i);
  Vec<float> v = *reinterpret_cast<const Vec<float> *>(s.expAvgSq + i);
  const Vec<G> g = *reinterpret_cast<const Vec<G> *>(static_cast<const G *>(s.grad) + i);
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    update<Decoupled>(p.v[k], toFloat(g.v[k]), m.v[k], v.v[k], c);
  *reinterpret_cast<Vec<float> *>(s.param + i) = p;
  *reinterpret_cast<Vec<float> *>(s.expAvg + i) = m;
  *reinterpret_cast<Vec<float> *>(s.expAvgSq + i) = v;
  if (s.copy) {
    Vec<C> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      out.v[k] = fromFloat<C>(p.v[k]);
    *reinterpret_cast<Vec<C> *>(static_cast<C *>(s.copy) + i) = out;
  }
}

template <typename G, typename C, bool Decoupled>
__global__ void __launch_bounds__(kThreads)
    adamKernel(const Batch batch, const AdamHyper hyper, const float *gradScale,
               const float *foundInf) {
  if (foundInf && *foundInf != 0.f)
    return;
  int s = 0;
  while (static_cast<int32_t>(blockIdx.x) >= batch.firstBlock[s + 1])
    ++s;
  const Segment &seg = batch.segments[s];
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) - batch.firstBlock[s];

  Constants c;
  c.lr = hyper.lr;
  c.beta1 = hyper.beta1;
  c.beta2 = hyper.beta2;
  c.weightDecay = seg.weightDecay;
  c.eps = hyper.eps;
  c.gradMultiplier = seg.gradMultiplier;
  c.scaled = gradScale != nullptr;
  c.gradScale = gradScale ? *gradScale : 1.f;
  // torch: 1 - pow_(beta, step) in opmath (float32), and sqrt of the second.
  const float step = *seg.step;
  c.biasCorrection1 = 1 - powf(c.beta1, step);
  c.biasCorrection2Sqrt = sqrtf(1 - powf(c.beta2, step));

  const int64_t begin = seg.head + chunk * kChunk;
  const int64_t end = begin + kChunk < seg.numel ? begin + kChunk : seg.numel;
  if (seg.vector) {
    const int64_t vectors = (end - begin) / kVec;
    for (int64_t k = threadIdx.x; k < vectors; k += blockDim.x)
      vectorAt<G, C, Decoupled>(seg, begin + k * kVec, c);
    for (int64_t i = begin + vectors * kVec + threadIdx.x; i < end; i += blockDim.x)
      scalarAt<G, C, Decoupled>(seg, i, c);
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
      scalarAt<G, C, Decoupled>(seg, i, c);
  }
  if (chunk == 0)
    for (int64_t i = threadIdx.x; i < seg.head; i += blockDim.x)
      scalarAt<G, C, Decoupled>(seg, i, c);
}

bool aligned(const void *p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

/// The kernel's view of `a`: the head that aligns the float32 arrays to 16
/// bytes, and whether every array is aligned for vector access there.
template <typename G, typename C> Segment segmentOf(const AdamSegment &a) {
  Segment s{a.param, a.grad, a.expAvg, a.expAvgSq, a.copy, a.step, a.numel,
            a.weightDecay, a.gradMultiplier, 0, 0};
  const uintptr_t misaligned = reinterpret_cast<uintptr_t>(a.param) % 16;
  if (misaligned % sizeof(float) != 0)
    return s;
  const int64_t head = std::min<int64_t>(((16 - misaligned) % 16) / sizeof(float), a.numel);
  const bool vector =
      aligned(a.param + head, 16) && aligned(a.expAvg + head, 16) &&
      aligned(a.expAvgSq + head, 16) &&
      aligned(static_cast<const G *>(a.grad) + head, kVec * sizeof(G)) &&
      (!a.copy || aligned(static_cast<C *>(a.copy) + head, kVec * sizeof(C)));
  if (vector) {
    s.head = static_cast<int32_t>(head);
    s.vector = 1;
  }
  return s;
}

template <typename G, typename C>
int launchTyped(const AdamSegment *segments, int64_t count, const AdamHyper &hyper,
                const float *gradScale, const float *foundInf, cudaStream_t stream) {
  Batch batch;
  batch.count = 0;
  batch.firstBlock[0] = 0;
  auto flush = [&]() -> int {
    if (batch.count == 0)
      return 0;
    const unsigned blocks = static_cast<unsigned>(batch.firstBlock[batch.count]);
    if (hyper.decoupled)
      adamKernel<G, C, true><<<blocks, kThreads, 0, stream>>>(batch, hyper, gradScale, foundInf);
    else
      adamKernel<G, C, false><<<blocks, kThreads, 0, stream>>>(batch, hyper, gradScale, foundInf);
    batch.count = 0;
    batch.firstBlock[0] = 0;
    return static_cast<int>(cudaGetLastError());
  };
  for (int64_t k = 0; k < count; ++k) {
    if (segments[k].numel <= 0)
      continue;
    const Segment s = segmentOf<G, C>(segments[k]);
    const int64_t body = s.numel - s.head;
    const int64_t chunks = std::max<int64_t>(1, (body + kChunk - 1) / kChunk);
    // A batch's blocks are counted in int32 (2^31 blocks of kChunk elements).
    if (batch.count == kMaxSegments ||
        batch.firstBlock[batch.count] + chunks > int64_t{INT32_MAX})
      if (int err = flush())
        return err;
    batch.segments[batch.count] = s;
    batch.firstBlock[batch.count + 1] =
        static_cast<int32_t>(batch.firstBlock[batch.count] + chunks);
    ++batch.count;
  }
  return flush();
}

template <typename G>
int launchForGrad(const AdamSegment *segments, int64_t count, AdamElement copyType,
                  const AdamHyper &hyper, const float *gradScale, const float *foundInf,
                  cudaStream_t stream) {
  switch (copyType) {
  case AdamElement::BFloat16:
    return launchTyped<G, __nv_bfloat16>(segments, count, hyper, gradScale, foundInf, stream);
  case AdamElement::Float16:
    return launchTyped<G, __half>(segments, count, hyper, gradScale, foundInf, stream);
  case AdamElement::Float32:
    break;
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

} // namespace

int adamStep(const AdamSegment *segments, int64_t count, AdamElement gradType,
             AdamElement copyType, const AdamHyper &hyper, const float *gradScale,
             const float *foundInf, cudaStream_t stream) {
  if (count < 0)
    return static_cast<int>(cudaErrorInvalidValue);
  switch (gradType) {
  case AdamElement::Float32:
    return launchForGrad<float>(segments, count, copyType, hyper, gradScale, foundInf, stream);
  case AdamElement::BFloat16:
    return launchForGrad<__nv_bfloat16>(segments, count, copyType, hyper, gradScale, foundInf,
                                        stream);
  case AdamElement::Float16:
    return launchForGrad<__half>(segments, count, copyType, hyper, gradScale, foundInf, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

} // namespace bmt::runtime::kernels
