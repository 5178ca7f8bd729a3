//===- AdamW.h - AdamW on the parameters ------------------------*- C++ -*-===//
//
// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization") with
// the exact update of torch.optim.AdamW, implemented with ATen's fused
// kernel at::_fused_adamw_ (CPU and CUDA), which also takes a gradient scale
// and a found-inf flag for mixed precision; and Adam (Kingma & Ba) with
// coupled L2 weight decay as torch.optim.Adam (at::_fused_adam_). Plus
// global-norm gradient clipping as torch.nn.utils.clip_grad_norm_.
//
// Mixed precision on CUDA: for the float32 masters whose bf16/fp16 copies
// it was asked to write (writeLowPrecisionCopies), the step is the
// runtime's own kernel (runtime/optim/kernels/Adam.cu), torch's fused
// Adam/AdamW arithmetic in one pass that reads the gradient as ZeRO
// reduced it (bf16, fp16 or float32, a sum over the data-parallel ranks)
// and writes the copy as it writes the master.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OPTIM_ADAMW_H
#define BMT_RUNTIME_OPTIM_ADAMW_H

#include "bmt/Runtime/optim/Optimizer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace bmt::runtime {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 0.01;
  /// true: AdamW's decoupled decay (p *= 1 - lr * decay); false: Adam's
  /// L2 penalty added to the gradient (torch.optim.Adam's weight_decay).
  bool decoupled = true;
  /// Which parameters (member tensors, see ParameterLayout) get the decay.
  WeightDecayParams decayParams = WeightDecayParams::All;
};

/// Throws std::invalid_argument unless the betas lie in [0, 1) and eps and
/// the weight decay are >= 0 (AdamW's and OffloadAdamW's check).
void checkAdamWConfig(const AdamWConfig &config);

/// `layouts` as given, or (empty) each param one member, whole. Throws
/// std::invalid_argument naming `who` when the counts differ.
std::vector<ParameterLayout> layoutsFor(const std::vector<at::Tensor> &params,
                                        std::vector<ParameterLayout> layouts,
                                        const std::string &who);

class AdamW : public Optimizer {
public:
  /// `params`: the tensors to update in place (float32/float64, any device,
  /// requires_grad leaves). The optimizer state (exp_avg, exp_avg_sq: same
  /// shape and dtype as each param; a float32 step count) is created here.
  /// `layouts` (one a param, or empty: each param is one member, whole)
  /// say which pieces of a param get weight decay (config.decayParams):
  /// the kernel runs once over the decayed pieces and once, with decay 0,
  /// over the others. Throws std::invalid_argument for a bad config, an
  /// undefined or non-floating param, or layouts of another count.
  AdamW(std::vector<at::Tensor> params, AdamWConfig config,
        std::vector<ParameterLayout> layouts = {});

  /// One update with learning rate `lr` using each param's `.grad()`.
  /// Params whose grad is undefined are skipped (as torch.optim does).
  /// `foundInf` (optional, a float32 tensor of one element on the params'
  /// device): where it is non-zero the kernel leaves params, moments and
  /// step counts as they are (a skipped mixed-precision step), decided on
  /// the device without a host synchronisation, as torch.amp's GradScaler.
  /// `gradNorm` with maxNorm > 0: the global gradient norm (one element, any
  /// floating dtype and device) of grads not yet clipped; the update uses the
  /// grads multiplied by clipFactor(gradNorm, maxNorm), i.e.
  /// clip_grad_norm_(params, maxNorm) followed by the step, with the factor
  /// applied inside the fused kernel (its grad_scale) instead of a separate
  /// pass over the grads.
  void step(double lr, const std::optional<at::Tensor> &foundInf = std::nullopt,
            const std::optional<at::Tensor> &gradNorm = std::nullopt, double maxNorm = 0);

  /// The same step through the Optimizer interface (inputs.lossScale is not
  /// used: the grads it reads are already unscaled).
  ///
  /// A param with a low-precision copy (writeLowPrecisionCopies) is updated
  /// by the runtime's kernel instead of the ATen one, with the same
  /// result up to the rounding of one fused multiply-add (1 float32 ulp;
  /// test/unit/runtime/optim/AdamCudaTest.cpp): its grad may be float32, bfloat16 or
  /// float16 and is divided by the copy's gradDivisor in the kernel
  /// (multiplied by 1.0f / divisor, as ATen's CUDA div_ by a scalar does),
  /// then by the clip divisor; the copy gets the new param rounded to
  /// nearest even; the grad is left as it was (the ATen kernel writes the
  /// clipped grad back). Throws std::invalid_argument, changing nothing,
  /// for such a grad of another dtype, numel or device.
  void step(const StepInputs &inputs) override;

  /// Takes over `copies` (LowPrecisionCopy, Optimizer.h) when every param
  /// is on CUDA, the runtime was built with its CUDA kernels and
  /// BMT_FUSED_ADAM is not "0"; replaces an earlier set. Returns false for
  /// an empty list. Test hook: with BMT_DEBUG_ADAM_COPIES=aten it takes
  /// them anywhere else too and serves them with ATen ops (the grad cast to
  /// float32 and multiplied by 1.0f / divisor, ATen's fused step, a copy_
  /// into the copy), so that ZeroStorage's side of the exchange runs in the
  /// CPU tests. Throws std::invalid_argument, changing nothing, for a
  /// param index out of range or repeated, a param that is not a
  /// contiguous float32 tensor, a copy that is not a contiguous
  /// bfloat16/float16 tensor of the param's numel and device, or a
  /// divisor < 1 (checked on every device).
  bool writeLowPrecisionCopies(const std::vector<LowPrecisionCopy> &copies) override;

  /// Sets every param's grad to undefined (set_to_none, as torch.optim's
  /// zero_grad default).
  void zeroGrad() override;

  /// Tensors "exp_avg.<i>", "exp_avg_sq.<i>" (shape, dtype and device of
  /// param i), "step.<i>" (float32, 0-dim, on param i's device), and the
  /// scalar "num_params".
  OptimizerState state() const override;
  void loadState(const OptimizerState &state) override;

  const std::vector<at::Tensor> &params() const override { return params_; }
  /// exp_avg / exp_avg_sq of param i (for checkpoints and tests).
  const at::Tensor &expAvg(size_t i) const { return expAvg_[i]; }
  const at::Tensor &expAvgSq(size_t i) const { return expAvgSq_[i]; }

private:
  std::vector<at::Tensor> params_, expAvg_, expAvgSq_, steps_;
  /// By param: its low-precision copy (undefined: none) and the divisor
  /// of its grad (writeLowPrecisionCopies).
  std::vector<at::Tensor> copies_;
  std::vector<int64_t> gradDivisors_;
  bool emulateCopies_ = false; ///< the test hook's ATen ops serve copies_
  AdamWConfig config_;
  std::vector<ParameterLayout> layouts_;
};

/// The global L2 norm of the grads of `params` (undefined grads count as 0)
/// as a float64 tensor of one element on the first grad's device (CPU when
/// there is none); then, if maxNorm > 0, multiplies every grad in place by
/// min(1, maxNorm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_(params,
/// maxNorm) does (with foreach kernels, without a host synchronisation).
/// The result is the norm before clipping (NaN or inf if a grad holds one;
/// then the grads become NaN or 0, as in torch: such a step is skipped or
/// stops training).
at::Tensor clipGradNorm(const std::vector<at::Tensor> &params, double maxNorm);

/// Multiplies every grad of `grads` in place by min(1, maxNorm / (norm +
/// 1e-6)) where `norm` is a one-element tensor (the global gradient norm);
/// nothing when maxNorm <= 0. The rule of clip_grad_norm_, on the device.
void clipGradsToNorm(const std::vector<at::Tensor> &grads, const at::Tensor &norm,
                     double maxNorm);

/// The factor clipGradsToNorm multiplies the grads by: min(1, maxNorm /
/// (norm + 1e-6)), computed from `norm` (one element) on its device in its
/// dtype, without a host synchronisation. maxNorm must be > 0.
at::Tensor clipFactor(const at::Tensor &norm, double maxNorm);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OPTIM_ADAMW_H
