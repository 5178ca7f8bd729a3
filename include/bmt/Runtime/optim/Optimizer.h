//===- Optimizer.h - the optimizer interface --------------------*- C++ -*-===//
//
// What the trainer calls on an optimizer, whichever it is (AdamW on the
// device, OffloadAdamW with its state in host memory): one step over the
// parameters it was built with (a rank's ZeRO shards, or the replicated
// parameters), clearing the gradients, and its state as named tensors and
// scalars, which it saves and loads itself (a checkpoint's unit, in the
// manner of torch.optim.Optimizer.state_dict / load_state_dict).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OPTIM_OPTIMIZER_H
#define BMT_RUNTIME_OPTIM_OPTIMIZER_H

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace bmt::runtime {

/// One step's inputs besides the gradients (each parameter's .grad(), or the
/// host copies an offloaded optimizer is fed). Every tensor has one element
/// and lives on the parameters' device.
struct StepInputs {
  double lr = 0;
  /// Non-zero: an inf/NaN gradient on some rank; the step changes nothing
  /// (parameters, moments, step counts), decided on the device.
  std::optional<at::Tensor> foundInf;
  /// float64: the loss scale the device gradients were unscaled by
  /// (multiplied by float(1 / scale)) since the backward. The device
  /// optimizer reads the unscaled gradients and ignores it; the offloaded
  /// one applies the same unscaling to its host copies.
  std::optional<at::Tensor> lossScale;
  /// With maxNorm > 0: the global norm of the unclipped gradients; the
  /// update clips them to maxNorm as torch.nn.utils.clip_grad_norm_.
  std::optional<at::Tensor> gradNorm;
  double maxNorm = 0;
};

/// An optimizer's state: tensors by name (e.g. "exp_avg.3": the first moment
/// of parameter 3) and scalars by name (e.g. "num_params").
struct OptimizerState {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, double> scalars;
};

class Optimizer {
public:
  virtual ~Optimizer();

  /// One update of every parameter that has a gradient this step.
  /// Throws std::invalid_argument when maxNorm > 0 without a gradNorm.
  virtual void step(const StepInputs &inputs) = 0;
  /// Sets every parameter's grad to undefined (torch.optim's set_to_none).
  virtual void zeroGrad() = 0;
  /// The tensors the optimizer updates, in the order it was given them.
  virtual const std::vector<at::Tensor> &params() const = 0;

  /// The optimizer's state (not the parameters it updates, which belong to
  /// the model). The tensors are the live state, not copies: save or clone
  /// them before the next step.
  virtual OptimizerState state() const = 0;
  /// Replaces the state by `state` (as state() returned it, from an
  /// optimizer of the same kind over parameters of the same shapes), copying
  /// each tensor into the optimizer's own (device and dtype stay the
  /// optimizer's). Throws std::invalid_argument, changing nothing, for a
  /// missing or unexpected name or a tensor of another shape.
  virtual void loadState(const OptimizerState &state) = 0;
};

/// For implementations: per-parameter state tensors, one list a name (e.g.
/// {"exp_avg", &expAvg_}), saved as "<name>.<i>".
using StateSlots = std::vector<std::pair<std::string, std::vector<at::Tensor> *>>;
using ConstStateSlots = std::vector<std::pair<std::string, const std::vector<at::Tensor> *>>;

/// For implementations: the tensors of `slots` (live, not copied) and the
/// scalar "num_params" = the size of each list.
OptimizerState stateOf(const ConstStateSlots &slots);

/// For implementations: checks that `state` holds exactly the tensors of
/// `slots`, "<name>.<i>" for i < params.size() of params[i]'s shape (0-dim
/// for the name "step"), and "num_params" = params.size(); then copies them
/// into the slots' tensors. Throws std::invalid_argument naming `who` and
/// the first mismatch before copying anything.
void loadStateInto(const OptimizerState &state, const StateSlots &slots,
                   const std::vector<at::Tensor> &params, const std::string &who);

/// For implementations: throws std::invalid_argument naming `who` when
/// inputs.maxNorm > 0 without inputs.gradNorm.
void checkStepInputs(const StepInputs &inputs, const std::string &who);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OPTIM_OPTIMIZER_H
