//===- LossScaler.h - dynamic loss scaling ----------------------*- C++ -*-===//
//
// The loss scale of mixed-precision (fp16) training, as BMTrain's
// OptimManager and torch.amp.GradScaler adjust it, kept on the device.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OPTIM_LOSSSCALER_H
#define BMT_RUNTIME_OPTIM_LOSSSCALER_H

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace bmt::runtime {

/// Dynamic loss scaling with BMTrain's OptimManager rules: start at
/// `initial`; a step with inf/NaN gradients divides the scale by `factor`
/// (not below `minScale`) and restarts the count of clean steps; after
/// `window` clean steps in a row the scale is multiplied by `factor`.
/// The scale and the count live in tensors on `device` and update() runs
/// there, so that a training step needs no host synchronisation for it.
/// Throws std::invalid_argument unless initial > 0, factor >= 1,
/// window >= 1 and 0 < minScale <= initial.
class LossScaler {
public:
  LossScaler(double initial, double factor = 2, int64_t window = 1024, double minScale = 1,
             c10::Device device = c10::kCPU);
  /// The current scale: a float64 tensor of one element on the device.
  const at::Tensor &scale() const { return scale_; }
  /// Records a step's outcome (`foundInf`: one element, non-zero for a step
  /// with inf/NaN gradients, any floating dtype, on the device) and moves
  /// the scale to the next step's. Asynchronous on CUDA.
  void update(const at::Tensor &foundInf);
  /// The clean steps in a row so far: a float64 tensor of one element on
  /// the device (with scale(), the scaler's state for checkpoints).
  const at::Tensor &cleanSteps() const { return clean_; }
  /// Restores a checkpoint's scale and count of clean steps.
  void setState(double scale, int64_t cleanSteps);

private:
  at::Tensor scale_, clean_;
  double factor_, minScale_;
  int64_t window_;
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OPTIM_LOSSSCALER_H
