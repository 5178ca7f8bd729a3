//===- BlockRecompute.cpp - a checkpointed block, recomputed in backward --===//

#include "parallel/BlockRecompute.h"

#include "bmt/Runtime/parallel/Zero.h"
#include "exec/SavedPointer.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

using c10::IValue;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace bmt::runtime {

namespace {

/// What a checkpointed block call needs again in backward.
struct CheckpointState : torch::CustomClassHolder {
  const plan::Instruction *inst = nullptr;
  ExecutorHooks::Run run;
  ExecutorHooks::Run recompute; ///< run for the graph only (backward)
  std::vector<IValue> args;           ///< non-tensor arguments in place, tensors undefined
  std::vector<size_t> tensorArgs;     ///< positions of the tensor arguments
  /// An input of no value that requires grad follows the arguments' tensors
  /// (callRecomputed's `trainable` with no argument requiring grad).
  bool anchored = false;
  std::vector<IValue> results;        ///< non-tensor results in place
  std::vector<size_t> tensorResults;  ///< positions of the tensor results
  at::Tensor rngState;
  at::Device device{at::kCPU};
};

/// A block run without autograd in forward and recomputed in backward
/// (torch.utils.checkpoint, reentrant variant): forward keeps only the
/// inputs; backward gathers the block, restores the RNG state, runs it again
/// with autograd (the `recompute` run: what only the results' values need,
/// such as the last matmul, is not computed, exec/Recompute.h) and
/// back-propagates through it, which reduce-scatters its parameters'
/// gradients on the way (gatherZeroGroup).
} // namespace

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext *ctx, at::TensorList inputs, ZeroStorage *zero,
                               c10::intrusive_ptr<CheckpointState> state) {
    savePointer(ctx, "zero", zero);
    ctx->saved_data["state"] = IValue::make_capsule(state);
    ctx->save_for_backward(inputs.vec());
    state->rngState = at::globalContext().defaultGenerator(state->device).get_state();
    std::vector<IValue> args = state->args;
    for (size_t i = 0; i < state->tensorArgs.size(); ++i)
      args[state->tensorArgs[i]] = inputs[i];
    state->results = state->run(std::move(args));
    variable_list outputs;
    state->tensorResults.clear();
    for (size_t i = 0; i < state->results.size(); ++i)
      if (state->results[i].isTensor()) {
        state->tensorResults.push_back(i);
        outputs.push_back(state->results[i].toTensor());
        state->results[i] = IValue();
      }
    return outputs;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto *zero = savedPointer<ZeroStorage>(ctx, "zero");
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(
        ctx->saved_data["state"].toCapsule());
    variable_list saved = ctx->get_saved_variables();
    zero->prepareRecompute(state->inst->blockList, state->inst->blockIndex);

    variable_list detached;
    std::vector<IValue> args = state->args;
    for (size_t i = 0; i < state->tensorArgs.size(); ++i) {
      at::Tensor d = saved[i].detach();
      if (saved[i].requires_grad())
        d.requires_grad_(true);
      detached.push_back(d);
      args[state->tensorArgs[i]] = d;
    }
    at::Generator generator = at::globalContext().defaultGenerator(state->device);
    at::Tensor current = generator.get_state();
    generator.set_state(state->rngState);
    std::vector<IValue> results;
    {
      c10::AutoGradMode enable(true);
      results = state->recompute(std::move(args));
    }
    generator.set_state(current);

    variable_list outputs, outputGrads;
    for (size_t k = 0; k < state->tensorResults.size(); ++k) {
      const IValue &r = results.at(state->tensorResults[k]);
      if (!r.isTensor() || !grads[k].defined())
        continue;
      at::Tensor t = r.toTensor();
      if (t.requires_grad()) {
        outputs.push_back(t);
        outputGrads.push_back(grads[k]);
      }
    }
    if (!outputs.empty())
      torch::autograd::backward(outputs, outputGrads);
    zero->releaseFrozen(state->inst->blockList, state->inst->blockIndex);
    variable_list inputGrads;
    for (const at::Tensor &d : detached)
      inputGrads.push_back(d.requires_grad() ? d.grad() : at::Tensor());
    if (state->anchored)
      inputGrads.push_back(at::Tensor());
    inputGrads.push_back(at::Tensor());
    inputGrads.push_back(at::Tensor());
    return inputGrads;
  }
};

std::vector<IValue> callRecomputed(const plan::Instruction &inst, const ExecutorHooks::Run &run,
                                   const ExecutorHooks::Run &recompute, std::vector<IValue> args,
                                   ZeroStorage &zero, at::Device device, bool trainable) {
  auto state = c10::make_intrusive<CheckpointState>();
  state->inst = &inst;
  state->run = run;
  state->recompute = recompute;
  state->device = device;
  variable_list inputs;
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].isTensor()) {
      state->tensorArgs.push_back(i);
      inputs.push_back(args[i].toTensor());
      args[i] = IValue();
    }
  state->args = std::move(args);
  // A block whose parameters train but whose inputs need no gradient (the
  // first block after a frozen embedding): autograd would make its outputs
  // constants and never call backward, losing the parameters' gradients
  // (reentrant torch.utils.checkpoint's pitfall). An anchor input that
  // requires grad keeps the node in the graph.
  if (trainable && std::none_of(inputs.begin(), inputs.end(),
                                [](const at::Tensor &t) { return t.requires_grad(); })) {
    inputs.push_back(at::zeros({}, at::TensorOptions().device(device)).requires_grad_(true));
    state->anchored = true;
  }
  variable_list outputs = CheckpointFunction::apply(at::TensorList(inputs), &zero, state);
  std::vector<IValue> results = state->results;
  for (size_t k = 0; k < state->tensorResults.size(); ++k)
    results[state->tensorResults[k]] = outputs[k];
  return results;
}

} // namespace bmt::runtime
