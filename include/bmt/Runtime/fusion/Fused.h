//===- Fused.h - run a fused region as one autograd node --------*- C++ -*-===//
//
// What the executor runs for a plan's Fused instruction: the region's
// forward as one kernel and, when an input requires grad, one autograd node
// whose backward is one kernel over the saved inputs and the results'
// grad_outputs (intermediates are recomputed, never saved). On a GPU with the runtime's
// CUDA kernels built in and NVRTC loadable, the kernels are the generator's
// (one per KernelSpec, cached on disk, include/bmt/Runtime/fusion/Nvrtc.h),
// compiled before the first step (Prewarm.h) or else at their first call;
// elsewhere (CPU, no NVRTC) the same graphs are evaluated with ATen ops
// (Region.h), which computes the same values op by op.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_FUSION_FUSED_H
#define BMT_RUNTIME_FUSION_FUSED_H

#include "bmt/Runtime/fusion/Region.h"

#include <c10/core/Device.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

namespace bmt::fusion {

class KernelRecorder;

/// What selects one generated kernel of a region (its CUDA source is a
/// function of this and the region): the input dtypes, forward or backward,
/// the output dtypes, the gradients computed, the 8-wide row variant.
struct KernelSpec {
  std::vector<c10::ScalarType> inputDtypes;
  bool backward = false;
  std::vector<c10::ScalarType> gradDtypes; ///< backward: each result's grad_output dtype
  std::vector<size_t> gradients; ///< backward: the inputs whose gradients it writes, in order
  /// Per output: forward, the results' dtypes; backward, the input's dtype
  /// where the input has the element shape, else float32 (summed after).
  std::vector<c10::ScalarType> outDtypes;
  std::optional<RowVector> rowVector; ///< the 8-wide row kernel (and its column sums)
  /// All of the above as text ("bwd Float,Float grad=Float out=0:Float rv=C").
  std::string key() const;
};

class FusedRegion {
public:
  /// `name` names the kernels ("model.norm.forward.fused0" -> a C identifier).
  FusedRegion(Region region, std::string name);
  ~FusedRegion();

  /// Whether run() takes `inputs`: defined tensors of float32, bfloat16 or
  /// float16 on one device whose shapes broadcast (else the caller runs the
  /// region's ops one by one).
  bool accepts(const std::vector<at::Tensor> &inputs) const;

  /// The region's results (resultDtypes, elementShape), recorded for
  /// autograd as one node when an input requires grad.
  std::vector<at::Tensor> run(const std::vector<at::Tensor> &inputs);

  const Region &region() const { return region_; }

  /// Forward and backward without autograd (the node's two halves).
  std::vector<at::Tensor> forward(const std::vector<at::Tensor> &inputs);
  /// From a grad_output per result. `needed[i]`: whether input i's
  /// gradient is wanted (empty: every one the results depend on); the
  /// others are returned undefined. Inputs whose gradients are equal (a
  /// residual sum's two operands) get one tensor.
  std::vector<at::Tensor> backward(const std::vector<at::Tensor> &inputs,
                                   const std::vector<at::Tensor> &gradOuts,
                                   const std::vector<bool> &needed = {});

  /// Whether forward/backward use generated CUDA kernels for tensors on
  /// `device` (false: ATen evaluation).
  static bool usesKernels(const at::Device &device);

  /// While set (not owned; null: none), every call tells `recorder` the
  /// kernel it launches, or would launch on a GPU; a dry-run recorder
  /// makes calls allocate their results as the kernels would and compute
  /// nothing (Prewarm.h). Set it only while no call runs.
  void setRecorder(KernelRecorder *recorder) { recorder_ = recorder; }
  /// Tests: on a device without kernels, calls take the kernels' path (the
  /// same results' layouts, kernel bookkeeping and lazyKernels()) with the
  /// values of the ATen evaluation.
  void setEmulation(bool on) { emulate_ = on; }

  /// The kernel's C name and CUDA source for `spec`.
  std::pair<std::string, std::string> kernelSource(const KernelSpec &spec) const;
  /// Makes `spec`'s kernel ready for calls on `device` from `binary` (a
  /// CUBIN of kernelSource(spec) for the device; on a device without
  /// kernels it is only noted as ready). Returns the most threads a block
  /// of it may have (1024 where nothing is loaded). Throws FusionError.
  int install(const KernelSpec &spec, const at::Device &device, const std::string &binary);
  /// Kernels that calls had to make ready themselves (compiled or loaded
  /// at the call: not installed before), in all regions since the process
  /// started.
  static int64_t lazyKernels();

private:
  struct Kernels;
  Region region_;
  std::string name_;
  KernelRecorder *recorder_ = nullptr;
  bool emulate_ = false;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Kernels>> kernels_; // by device and KernelSpec::key
  /// The kernel of `spec` on `device`, compiled (through the disk cache)
  /// and loaded at the first call that was not preceded by install().
  Kernels &kernelsFor(const KernelSpec &spec, const at::Device &device);
  /// kernelsFor(spec) where `threads` (a row kernel's block size; 0: not
  /// a row kernel) fits its register use; else the scalar kernel of the
  /// same region: spec loses its row vector, threads becomes 0 (and the
  /// recorder hears of that kernel too).
  Kernels &kernelsFitting(KernelSpec &spec, const at::Device &device, unsigned &threads);
  KernelSpec forwardSpec(const std::vector<at::Tensor> &inputs) const;
  bool gradientWanted(size_t i, const std::vector<bool> &needed) const;
  /// Whether calls take the kernels' path on `device`.
  bool kernelPath(const at::Device &device) const {
    return recorder_ || emulate_ || usesKernels(device);
  }
};

} // namespace bmt::fusion

#endif // BMT_RUNTIME_FUSION_FUSED_H
