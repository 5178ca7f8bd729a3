//===- Fused.h - run a fused region as one autograd node --------*- C++ -*-===//
//
// What the executor runs for a plan's Fused instruction: the region's
// forward as one kernel and, when an input requires grad, one autograd node
// whose backward is one kernel over the saved inputs and grad_output
// (intermediates are recomputed, never saved). On a GPU with the runtime's
// CUDA kernels built in and NVRTC loadable, the kernels are the generator's
// (compiled once per input dtypes, cached on disk, include/bmt/Runtime/
// fusion/Nvrtc.h); elsewhere (CPU, no NVRTC) the same graphs are evaluated
// with ATen ops (Region.h), which computes the same values op by op.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_FUSION_FUSED_H
#define BMT_RUNTIME_FUSION_FUSED_H

#include "bmt/Runtime/fusion/Region.h"

#include <map>
#include <memory>
#include <mutex>

namespace bmt::fusion {

class FusedRegion {
public:
  /// `name` names the kernels ("model.norm.forward.fused0" -> a C identifier).
  FusedRegion(Region region, std::string name);
  ~FusedRegion();

  /// Whether run() takes `inputs`: defined tensors of float32, bfloat16 or
  /// float16 on one device whose shapes broadcast (else the caller runs the
  /// region's ops one by one).
  bool accepts(const std::vector<at::Tensor> &inputs) const;

  /// The region's value (resultDtype, elementShape; contiguous), recorded
  /// for autograd when an input requires grad.
  at::Tensor run(const std::vector<at::Tensor> &inputs);

  const Region &region() const { return region_; }

  /// Forward and backward without autograd (the node's two halves).
  at::Tensor forward(const std::vector<at::Tensor> &inputs);
  /// `needed[i]`: whether input i's gradient is wanted (empty: every one
  /// the result depends on); the others are returned undefined.
  std::vector<at::Tensor> backward(const std::vector<at::Tensor> &inputs, const at::Tensor &gradOut,
                                   const std::vector<bool> &needed = {});

  /// Whether forward/backward use generated CUDA kernels for tensors on
  /// `device` (false: ATen evaluation).
  static bool usesKernels(const at::Device &device);

private:
  struct Kernels;
  Region region_;
  std::string name_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Kernels>> kernels_; // by dtypes, device, direction, variant
  /// The compiled forward (gradOut undefined) or backward kernel for these
  /// dtypes, the 8-wide row kernel when `rowVector` is given.
  Kernels &kernelsFor(const std::vector<at::Tensor> &inputs, const at::Tensor &gradOut,
                      const RowVector *rowVector, const std::vector<bool> &needed);
  bool gradientWanted(size_t i, const std::vector<bool> &needed) const;
};

} // namespace bmt::fusion

#endif // BMT_RUNTIME_FUSION_FUSED_H
