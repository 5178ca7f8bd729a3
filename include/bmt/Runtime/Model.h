//===- Model.h - a compiled model ready to run ------------------*- C++ -*-===//
//
// Loads sharded.pt (its plan and weights) onto a device and runs its
// forward pass through the Executor; computes the training objective.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_MODEL_H
#define BMT_RUNTIME_MODEL_H

#include "bmt/Plan/Archive.h"
#include "bmt/Runtime/Executor.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace bmt::runtime {

class Model {
public:
  /// Reads every tensor of `archive` onto `device`; parameters become
  /// autograd leaves (requires_grad as the plan says). `progress(done,
  /// total)` is called after each tensor with bytes read so far.
  /// Throws plan::PlanError for a bad archive, ExecutionError for a plan
  /// that cannot run.
  Model(plan::Archive &archive, at::Device device,
        const std::function<void(int64_t, int64_t)> &progress = nullptr);

  /// Runs forward. inputIds, attentionMask: int64 [batch, seq] on the
  /// model's device. Returns the logits, float [batch, seq, vocab] (the
  /// result named "logits", else the first result).
  at::Tensor forward(const at::Tensor &inputIds, const at::Tensor &attentionMask);

  /// Runs forward and returns every result with its name ("logits",
  /// "last_hidden_state", ...; "result<i>" where the program names none).
  std::vector<std::pair<std::string, c10::IValue>>
  forwardAll(const at::Tensor &inputIds, const at::Tensor &attentionMask);

  /// Whether the forward has a result named "logits" (a language-model head).
  bool hasLogits() const { return hasLogits_; }

  /// The distinct trainable parameters (tied ones once), in plan order.
  const std::vector<at::Tensor> &parameters() const { return parameters_; }
  /// Their names (the plan's symbol names), same order.
  const std::vector<std::string> &parameterNames() const { return parameterNames_; }
  /// Elements in all distinct parameters.
  int64_t numParameters() const;
  const plan::Plan &plan() const { return plan_; }
  at::Device device() const { return device_; }

private:
  plan::Plan plan_;
  at::Device device_;
  std::unique_ptr<Executor> executor_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> parameterNames_;
  size_t logitsIndex_ = 0;
  bool hasLogits_ = false;
  std::vector<c10::IValue> run(const at::Tensor &inputIds, const at::Tensor &attentionMask);
};

/// The language-modelling loss, mean over positions whose label is not -100:
/// cross-entropy of logits [batch, seq, vocab] against labels [batch, seq]
/// (int64). With `shift`, position t predicts label t+1 (causal LM, as
/// transformers' ForCausalLMLoss); without, position t predicts label t
/// (masked LM). Computed in float32 or wider.
at::Tensor languageModelLoss(const at::Tensor &logits, const at::Tensor &labels,
                             bool shift);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_MODEL_H
