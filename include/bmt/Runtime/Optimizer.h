//===- Optimizer.h - AdamW on the parameters --------------------*- C++ -*-===//
//
// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization") with
// the exact update of torch.optim.AdamW, implemented with ATen's fused
// kernel at::_fused_adamw_ (CPU and CUDA), which also takes a gradient scale
// and a found-inf flag for mixed precision. Plus global-norm gradient
// clipping as torch.nn.utils.clip_grad_norm_.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OPTIMIZER_H
#define BMT_RUNTIME_OPTIMIZER_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace bmt::runtime {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 0.01;
};

class AdamW {
public:
  /// `params`: the tensors to update in place (float32/float64, any device,
  /// requires_grad leaves). The optimizer state (exp_avg, exp_avg_sq: same
  /// shape and dtype as each param; a float32 step count) is created here.
  AdamW(std::vector<at::Tensor> params, AdamWConfig config);

  /// One update with learning rate `lr` using each param's `.grad()`.
  /// Params whose grad is undefined are skipped (as torch.optim does).
  void step(double lr);

  /// Sets every param's grad to undefined (set_to_none, as torch.optim's
  /// zero_grad default).
  void zeroGrad();

  const std::vector<at::Tensor> &params() const { return params_; }
  /// exp_avg / exp_avg_sq of param i (for checkpoints and tests).
  const at::Tensor &expAvg(size_t i) const { return expAvg_[i]; }
  const at::Tensor &expAvgSq(size_t i) const { return expAvgSq_[i]; }

private:
  std::vector<at::Tensor> params_, expAvg_, expAvgSq_, steps_;
  AdamWConfig config_;
};

/// Dynamic loss scaling with BMTrain's OptimManager rules: start at
/// `initial`; a step with inf/NaN gradients divides the scale by `factor`
/// (not below `minScale`) and restarts the count of clean steps; after
/// `window` clean steps in a row the scale is multiplied by `factor`.
class LossScaler {
public:
  LossScaler(double initial, double factor = 2, int64_t window = 1024, double minScale = 1);
  double scale() const { return scale_; }
  /// Records a step's outcome and returns the scale of the next step.
  double update(bool foundInf);

private:
  double scale_, factor_, minScale_;
  int64_t window_, clean_ = 0;
};

/// The global L2 norm of the grads of `params` (undefined grads count as 0),
/// as a double; then, if maxNorm > 0 and the norm exceeds it (precisely:
/// maxNorm / (norm + 1e-6) < 1), scales every grad by maxNorm / (norm + 1e-6)
/// in place, as torch.nn.utils.clip_grad_norm_(params, maxNorm) does.
/// Returns the norm before clipping (NaN or inf if a grad holds one). An inf
/// norm scales the grads by 0 (as torch); a NaN norm leaves them unchanged
/// (torch would fill them with NaN): such a step is skipped anyway.
double clipGradNorm(const std::vector<at::Tensor> &params, double maxNorm);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OPTIMIZER_H
