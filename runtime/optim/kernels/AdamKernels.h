//===- AdamKernels.h - the fused Adam/AdamW step on CUDA --------*- C++ -*-===//
//
// Launcher of the runtime's Adam/AdamW kernel (Adam.cu), on raw device
// pointers so that the CUDA file needs no LibTorch headers. AdamW
// (runtime/optim/AdamW.cpp) calls it for the float32 masters whose
// low-precision copies it writes (Optimizer::writeLowPrecisionCopies).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OPTIM_KERNELS_ADAMKERNELS_H
#define BMT_RUNTIME_OPTIM_KERNELS_ADAMKERNELS_H

#include <cstdint>

typedef struct CUstream_st *cudaStream_t;

namespace bmt::runtime::kernels {

/// Element type of a gradient or of a low-precision copy.
enum class AdamElement { Float32, BFloat16, Float16 };

/// A contiguous run of elements that one Adam update covers. All pointers
/// are device pointers of `numel` elements, not overlapping each other.
struct AdamSegment {
  float *param = nullptr;     ///< float32, updated in place
  const void *grad = nullptr; ///< of the launch's gradient element type
  float *expAvg = nullptr;    ///< float32, updated in place
  float *expAvgSq = nullptr;  ///< float32, updated in place
  void *copy = nullptr;       ///< of the launch's copy type, or null: none
  const float *step = nullptr; ///< the step count, already incremented
  int64_t numel = 0;
  float weightDecay = 0;
  /// The gradient is grad * gradMultiplier (ZeRO's average over ranks:
  /// 1.0f / float(ranks), the reciprocal ATen's CUDA division by a scalar
  /// multiplies by; 1: none).
  float gradMultiplier = 1;
};

struct AdamHyper {
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0;
  bool decoupled = true; ///< AdamW's decay of the param; false: Adam's L2 in the gradient
};

/// For every element i of every segment, torch's fused Adam/AdamW update
/// (at::_fused_adam_ / _fused_adamw_ on CUDA, the same float32 operations
/// in the same order):
///   g = float(grad[i]) * gradMultiplier, then g /= *gradScale (if given);
///   AdamW: p -= lr * wd * p;  Adam: g += p * wd   (when wd != 0);
///   m = fma(beta1, m, fma(-beta1, g, g));  v = the same with beta2, g * g;
///   p -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
/// and copy[i] = p rounded to nearest even (if the segment has a copy).
/// Unlike torch's kernel the gradient is never written back. Where
/// *foundInf != 0 (torch tests == 1; the flags here are 0 or 1) nothing is
/// written. gradScale, foundInf: float32 device scalars or null.
/// Asynchronous on `stream`; returns the cudaError_t of the launches
/// (0 = success), or cudaErrorInvalidValue for a float32 copy type or a
/// negative count.
int adamStep(const AdamSegment *segments, int64_t count, AdamElement gradType,
             AdamElement copyType, const AdamHyper &hyper, const float *gradScale,
             const float *foundInf, cudaStream_t stream);

} // namespace bmt::runtime::kernels

#endif // BMT_RUNTIME_OPTIM_KERNELS_ADAMKERNELS_H
