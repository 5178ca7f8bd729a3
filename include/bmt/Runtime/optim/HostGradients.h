//===- HostGradients.h - host memory of an offloaded optimizer --*- C++ -*-===//
//
// What the ZeRO storage and OffloadAdamW share when the optimizer is
// offloaded (--offload-optimizer): the interface through which the storage
// hands the optimizer its gradients' host copies, the dtype of the host
// masters, and exact-size pinned host buffers. (Defined in OffloadAdam.cpp.)
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OPTIM_HOSTGRADIENTS_H
#define BMT_RUNTIME_OPTIM_HOSTGRADIENTS_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace bmt::runtime {

/// Where an OffloadAdamW finds its parameters' gradients in host memory
/// (ZeroStorage with --offload-optimizer; a test double in unit tests).
class HostGradientSource {
public:
  virtual ~HostGradientSource();
  /// The parameters (indices) whose gradient of the current step has been
  /// or is being copied to host memory, in the order the copies were
  /// started. Parameters without a gradient this step are not listed.
  virtual std::vector<size_t> hostGradientOrder() const = 0;
  /// Blocks the calling thread until the host copy of parameter i's
  /// gradient is complete and returns it: a CPU tensor [numel of param i]
  /// of the master's dtype (float32; float64 for a float64 parameter),
  /// pinned when the parameters are on CUDA. The optimizer scales it in
  /// place; the next step's copy overwrites it.
  virtual at::Tensor waitHostGradient(size_t i) = 0;
};

/// The dtype of the master copy and moments of a parameter of `dtype`:
/// float32 for float32/bfloat16/float16, float64 for float64.
c10::ScalarType masterDtype(c10::ScalarType dtype);

/// An uninitialized contiguous CPU tensor [numel] of `dtype`, in page-locked
/// memory when `pinned` (cudaHostAlloc of exactly its bytes, freed with
/// cudaFreeHost when the last tensor using it goes; LibTorch's caching host
/// allocator would round every buffer up to a power of two, up to twice
/// the memory for the large, long-lived buffers of an offloaded optimizer).
/// Throws c10::Error when pinned memory cannot be allocated.
at::Tensor emptyHostTensor(int64_t numel, c10::ScalarType dtype, bool pinned);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OPTIM_HOSTGRADIENTS_H
