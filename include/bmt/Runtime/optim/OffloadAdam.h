//===- OffloadAdam.h - AdamW with its state in host memory ------*- C++ -*-===//
//
// AdamW whose float32 master weights and moments (exp_avg, exp_avg_sq) live
// in host memory (pinned when the parameters are on a CUDA device), as
// BMTrain's CPU-offloaded Adam and DeepSpeed's ZeRO-Offload do: the device
// keeps only the parameters (the ZeRO shards that are gathered for forward
// and backward) and their gradients.
//
// One step, for parameters on a CUDA device (on the CPU the same code runs
// and every copy is a plain copy):
//   1. the step's scalars (found-inf flag, 1 / loss scale, clip factor) are
//      computed on the device and copied to the host: the step's one wait
//      for the device. It also covers the gradients: the ZeRO storage made
//      the compute stream wait for their device-to-host copies (Zero.h);
//   2. if any rank found an inf/NaN, nothing changes (no update, no upload,
//      step counts as they were);
//   3. per parameter, in the order its gradient reached the host: wait for
//      that copy (HostGradientSource), unscale the host gradient as the
//      device gradients were (the same multiplication), at::_fused_adamw_
//      on the CPU tensors with the clipping as AdamW::step applies it
//      (grad_scale = float(1 / clip factor)), so that the result is
//      bit-identical to AdamW on the device when the kernels agree; copy
//      the updated master to the device parameter on a copy stream
//      (host-to-device, non-blocking; a bf16/fp16 parameter gets the
//      float32 master staged on the device and cast there), so that the
//      upload of parameter k overlaps the CPU update of parameter k+1;
//   4. the compute stream waits for the uploads (the next forward's
//      all-gathers read the parameters).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OPTIM_OFFLOADADAM_H
#define BMT_RUNTIME_OPTIM_OFFLOADADAM_H

#include "bmt/Runtime/optim/AdamW.h"
#include "bmt/Runtime/optim/HostGradients.h"
#include "bmt/Runtime/optim/Optimizer.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace bmt::runtime {

class OffloadAdamW : public Optimizer {
public:
  /// `params`: the device tensors the optimizer keeps updated (float32,
  /// float64, bfloat16 or float16; all on one device; contiguous), e.g. a
  /// ZeroStorage's shards. Their masters are copied from them to host
  /// memory here (in masterDtype), with zero moments and step counts.
  /// `gradients` provides the host copies of their gradients each step;
  /// it must outlive the optimizer.
  /// Throws std::invalid_argument for bad betas/eps/decay (as AdamW), an
  /// undefined or non-floating parameter, or parameters on several devices.
  /// `config.decoupled` false: Adam's coupled L2 decay (at::_fused_adam_).
  /// `layouts` (one a param, or empty: each one member, whole) select the
  /// pieces that get weight decay, as for AdamW.
  OffloadAdamW(std::vector<at::Tensor> params, AdamWConfig config,
               HostGradientSource &gradients, std::vector<ParameterLayout> layouts = {});
  /// Waits for the uploads still in flight (the masters they read die here).
  ~OffloadAdamW() override;
  OffloadAdamW(const OffloadAdamW &) = delete;
  OffloadAdamW &operator=(const OffloadAdamW &) = delete;

  /// One update with learning rate `lr` of every parameter that has a host
  /// gradient this step. The host gradients are the device gradients as
  /// they were before unscaling and clipping; the arguments say what the
  /// device gradients went through since, and the step applies the same to
  /// the host copies:
  ///   - `foundInf` (one element on the device, non-zero: an inf/NaN on
  ///     some rank): the step changes nothing (masters, moments, step
  ///     counts, parameters), as AdamW::step with the flag;
  ///   - `lossScale` (one element on the device, float64): the gradients
  ///     were multiplied by float(1 / scale) (unscaled), as the trainer
  ///     does with at::_amp_foreach_non_finite_check_and_unscale_;
  ///   - `gradNorm` (one element on the device, the norm of the unclipped
  ///     gradients) and `maxNorm` > 0: the update clips as AdamW::step does,
  ///     the fused kernel dividing the gradients by float(1 / clipFactor(
  ///     gradNorm, maxNorm)); maxNorm <= 0: no clipping.
  /// On CUDA the host waits once for these values (and with them for the
  /// gradients), then the step runs on the CPU while the updated parameters
  /// are uploaded; when it returns, the compute stream is ordered after
  /// the uploads.
  void step(double lr, const std::optional<at::Tensor> &foundInf,
            const std::optional<at::Tensor> &lossScale, const at::Tensor &gradNorm,
            double maxNorm);
  /// The same step through the Optimizer interface (StepInputs' fields are
  /// the arguments above; gradNorm may be absent when maxNorm <= 0).
  void step(const StepInputs &inputs) override;

  /// Sets every device parameter's grad to undefined (as AdamW::zeroGrad).
  void zeroGrad() override;

  /// Tensors "master.<i>", "exp_avg.<i>", "exp_avg_sq.<i>" (host, shape and
  /// masterDtype of param i), "step.<i>" (float32, 0-dim), and the scalar
  /// "num_params". The masters are the optimizer's: loadState() also copies
  /// them into the device parameters (rounding bf16/fp16 ones), so that the
  /// parameters are the masters' values as after a step.
  OptimizerState state() const override;
  void loadState(const OptimizerState &state) override;

  const std::vector<at::Tensor> &params() const override { return params_; }
  /// Host state of param i (for checkpoints and tests).
  const at::Tensor &master(size_t i) const { return masters_[i]; }
  const at::Tensor &expAvg(size_t i) const { return expAvg_[i]; }
  const at::Tensor &expAvgSq(size_t i) const { return expAvgSq_[i]; }
  /// Steps taken by param i (updates that were not skipped).
  double stepCount(size_t i) const;
  /// Bytes of host memory held: masters and moments.
  int64_t hostBytes() const;

private:
  /// Copies master i into params_[i] (on the copy stream on CUDA).
  void upload(size_t i);

  std::vector<at::Tensor> params_, masters_, expAvg_, expAvgSq_, steps_;
  AdamWConfig config_;
  std::vector<ParameterLayout> layouts_;
  HostGradientSource &gradients_;
  at::Device device_{at::kCPU};
  /// CUDA: the host-to-device stream, the step's scalars in pinned memory
  /// and the events that order the streams.
  std::optional<c10::Stream> copyStream_;
  at::Tensor hostScalars_;
  std::optional<c10::Event> scalarsReady_, uploadsDone_;
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OPTIM_OFFLOADADAM_H
