//===- Optimizers.h - SGD, Lion, Adafactor and the optimizer choice -*- C++ -*-===//
//
// The optimizers bmt-run trains with (--optimizer), each with the update of
// its torch.optim namesake (docs/runtime/optimizers.md):
//   - sgd:       torch.optim.SGD (momentum, dampening, Nesterov, coupled L2
//                decay), ATen's fused kernel at::_fused_sgd_ as
//                SGD(fused=True);
//   - adam:      torch.optim.Adam, at::_fused_adam_ (AdamW.h);
//   - adamw:     torch.optim.AdamW, at::_fused_adamw_ (AdamW.h);
//   - lion:      Lion (Chen et al. 2023, "Symbolic Discovery of
//                Optimization Algorithms", Algorithm 2) with foreach ops;
//   - adafactor: torch.optim.Adafactor (Shazeer & Stern 2018, as torch 2.5+
//                defines it: relative step min(lr, 1/sqrt(t)), beta2_t =
//                t^beta2_decay, eps pair, update clipping threshold d).
// Every one updates float32/float64 tensors in place from their .grad(),
// takes the clip factor and the found-inf flag of StepInputs on the device
// (a step with foundInf != 0 changes nothing, without a host
// synchronisation), and applies weight decay per member piece
// (ParameterLayout, WeightDecayParams).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OPTIM_OPTIMIZERS_H
#define BMT_RUNTIME_OPTIM_OPTIMIZERS_H

#include "bmt/Runtime/optim/AdamW.h"
#include "bmt/Runtime/optim/Optimizer.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace bmt::runtime {

class Comm;

enum class OptimizerKind { SGD, Adam, AdamW, Lion, Adafactor };

/// "sgd", "adam", "adamw", "lion", "adafactor" (bmt-run's --optimizer and
/// checkpoint.json's optimizer.kind); none for another name.
std::optional<OptimizerKind> parseOptimizerKind(const std::string &name);
const char *optimizerKindName(OptimizerKind kind);

/// bmt-run's optimizer settings. Unset optionals take torch.optim's
/// default for the kind.
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  /// Default: 0.01 for AdamW, 0 for the others (torch.optim's defaults).
  std::optional<double> weightDecay;
  WeightDecayParams decayParams = WeightDecayParams::Matrices;
  /// Adam/AdamW: (0.9, 0.999); Lion: (0.9, 0.99).
  std::optional<double> beta1, beta2;
  double eps = 1e-8; ///< Adam/AdamW
  // SGD.
  double momentum = 0, dampening = 0;
  bool nesterov = false;
  // Adafactor.
  double beta2Decay = -0.8;
  std::optional<double> eps1; ///< default: the parameters' dtype's machine epsilon
  double eps2 = 1e-3;
  double clipThreshold = 1.0; ///< torch's d

  double weightDecayValue() const;
  double beta1Value() const;
  double beta2Value() const;
};

/// Throws std::invalid_argument naming the setting for hyperparameters the
/// kind's torch.optim class refuses (betas outside [0, 1), negative eps,
/// decay or momentum; Nesterov without momentum or with dampening;
/// beta2_decay > 0 for Adafactor ...), and for settings of another kind
/// (momentum with adamw, ...).
void checkOptimizerConfig(const OptimizerConfig &config);

/// The AdamWConfig of an adam/adamw config.
AdamWConfig adamWConfig(const OptimizerConfig &config);

/// The device optimizer of `config.kind` over `params` (one layout each).
/// `shardComm`: the communicator of the ranks that hold the other shards
/// of the split layouts (Adafactor sums its statistics over it; null when
/// no layout is split); `tensorComm`: the TP group's, where members are
/// split over it (ParameterLayout::Member::tpDim; null without tensor
/// parallelism). Throws as checkOptimizerConfig and the constructors.
std::unique_ptr<Optimizer> makeDeviceOptimizer(std::vector<at::Tensor> params,
                                               std::vector<ParameterLayout> layouts,
                                               const OptimizerConfig &config, Comm *shardComm,
                                               Comm *tensorComm = nullptr);

struct SGDConfig {
  double momentum = 0, dampening = 0, weightDecay = 0;
  bool nesterov = false;
  WeightDecayParams decayParams = WeightDecayParams::All;
};

/// torch.optim.SGD(fused=True): buf = momentum * buf + (1 - dampening) * g
/// (buf = g on the first step), g = g + nesterov ? momentum * buf : buf,
/// p -= lr * g, with g = grad + weight_decay * p first (coupled L2).
/// State: "momentum_buffer.<i>" (param-shaped, with momentum > 0) and
/// "step.<i>" (float32 0-dim: steps not skipped).
class SGD : public Optimizer {
public:
  SGD(std::vector<at::Tensor> params, SGDConfig config,
      std::vector<ParameterLayout> layouts = {});
  void step(const StepInputs &inputs) override;
  void zeroGrad() override;
  const std::vector<at::Tensor> &params() const override { return params_; }
  OptimizerState state() const override;
  void loadState(const OptimizerState &state) override;

private:
  std::vector<at::Tensor> params_, momentum_, steps_;
  SGDConfig config_;
  std::vector<ParameterLayout> layouts_;
  /// The kernel's is_first_step: no step was attempted yet (buffers zero).
  bool started_ = false;
};

struct LionConfig {
  double beta1 = 0.9, beta2 = 0.99, weightDecay = 0;
  WeightDecayParams decayParams = WeightDecayParams::All;
};

/// Lion (Chen et al. 2023, Algorithm 2): c = beta1 * m + (1 - beta1) * g;
/// p = p * (1 - lr * weight_decay) - lr * sign(c); m = beta2 * m +
/// (1 - beta2) * g. State: "exp_avg.<i>" (m, param-shaped), "step.<i>".
class Lion : public Optimizer {
public:
  Lion(std::vector<at::Tensor> params, LionConfig config,
       std::vector<ParameterLayout> layouts = {});
  void step(const StepInputs &inputs) override;
  void zeroGrad() override;
  const std::vector<at::Tensor> &params() const override { return params_; }
  OptimizerState state() const override;
  void loadState(const OptimizerState &state) override;

private:
  std::vector<at::Tensor> params_, expAvg_, steps_;
  LionConfig config_;
  std::vector<ParameterLayout> layouts_;
};

struct AdafactorConfig {
  double beta2Decay = -0.8;
  std::optional<double> eps1; ///< default: finfo(param dtype).eps
  double eps2 = 1e-3, clipThreshold = 1.0, weightDecay = 0;
  WeightDecayParams decayParams = WeightDecayParams::All;
};

/// torch.optim.Adafactor, per member tensor (ParameterLayout): members of 2
/// or more dimensions [..., R, C] keep factored second moments (row_var
/// [..., R], col_var [..., C]), others a full one (variance).
/// Under ZeRO a shard holds pieces of members; the sums over a member
/// (row and column sums of g^2, ||p||^2, ||update||^2) are all-reduced
/// over `shardComm` (two all-reduces a step, of the split parameters'
/// rows + columns + members floats and of their members floats), so N
/// ranks compute what one process does, up to the order of float sums.
/// State: "step.<i>" (float32 0-dim), "variance.<i>" (param-shaped; used
/// at the elements of members with fewer than 2 dimensions, zero
/// elsewhere), "row_var.<i>" and "col_var.<i>" (replicated slots: the
/// factors of every member of param i's layout of 2+ dimensions,
/// concatenated in member order; the same on every rank of the group).
class Adafactor : public Optimizer {
public:
  /// `params`: contiguous float32/float64 tensors. Throws
  /// std::invalid_argument for a non-contiguous one, a layout that is split
  /// without a shardComm, a member split over the TP group without a
  /// tensorComm, or one whose members do not fit the parameter. The
  /// factored statistics, ||p|| and ||update|| of a member split over the
  /// TP group are those of the whole tensor (sums over the group).
  Adafactor(std::vector<at::Tensor> params, AdafactorConfig config,
            std::vector<ParameterLayout> layouts = {}, Comm *shardComm = nullptr,
            Comm *tensorComm = nullptr);
  void step(const StepInputs &inputs) override;
  void zeroGrad() override;
  const std::vector<at::Tensor> &params() const override { return params_; }
  OptimizerState state() const override;
  void loadState(const OptimizerState &state) override;

private:
  std::vector<at::Tensor> params_, variance_, rowVar_, colVar_, steps_;
  AdafactorConfig config_;
  std::vector<ParameterLayout> layouts_;
  Comm *shardComm_ = nullptr, *tensorComm_ = nullptr;
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OPTIM_OPTIMIZERS_H
