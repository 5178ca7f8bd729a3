//===- Optimizer.cpp - the optimizer interface's state helpers ------------===//

#include "bmt/Runtime/optim/Optimizer.h"

#include <c10/core/GradMode.h>

#include <set>
#include <stdexcept>

namespace bmt::runtime {

Optimizer::~Optimizer() = default;

namespace {

std::string stateKey(const std::string &name, size_t i) { return name + "." + std::to_string(i); }

std::string shapeText(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t d = 0; d < sizes.size(); ++d)
    s += (d ? ", " : "") + std::to_string(sizes[d]);
  return s + "]";
}

} // namespace

OptimizerState stateOf(const ConstStateSlots &slots) {
  OptimizerState state;
  size_t count = 0;
  for (const auto &[name, tensors] : slots) {
    count = tensors->size();
    for (size_t i = 0; i < tensors->size(); ++i)
      state.tensors[stateKey(name, i)] = (*tensors)[i];
  }
  state.scalars["num_params"] = static_cast<double>(count);
  return state;
}

void loadStateInto(const OptimizerState &state, const StateSlots &slots,
                   const std::vector<at::Tensor> &params, const std::string &who) {
  auto count = state.scalars.find("num_params");
  if (count == state.scalars.end() || count->second != static_cast<double>(params.size()))
    throw std::invalid_argument(who + ": the state is for " +
                                (count == state.scalars.end()
                                     ? std::string("an unknown number of")
                                     : std::to_string(static_cast<int64_t>(count->second))) +
                                " parameters, the optimizer has " + std::to_string(params.size()));
  std::set<std::string> expected;
  for (const auto &[name, tensors] : slots)
    for (size_t i = 0; i < params.size(); ++i) {
      std::string key = stateKey(name, i);
      expected.insert(key);
      auto it = state.tensors.find(key);
      if (it == state.tensors.end() || !it->second.defined())
        throw std::invalid_argument(who + ": the state has no tensor \"" + key + "\"");
      // Step counts are 0-dim; moments and masters have the parameter's shape.
      at::IntArrayRef want = name == "step" ? at::IntArrayRef() : params[i].sizes();
      if (it->second.sizes() != want)
        throw std::invalid_argument(who + ": state tensor \"" + key + "\" is " +
                                    shapeText(it->second.sizes()) + ", expected " +
                                    shapeText(want));
    }
  for (const auto &[key, value] : state.tensors)
    if (!expected.count(key))
      throw std::invalid_argument(who + ": unexpected state tensor \"" + key + "\"");
  c10::NoGradGuard noGrad;
  for (const auto &[name, tensors] : slots)
    for (size_t i = 0; i < tensors->size(); ++i)
      (*tensors)[i].copy_(state.tensors.at(stateKey(name, i)));
}

void checkStepInputs(const StepInputs &inputs, const std::string &who) {
  if (inputs.maxNorm > 0 && !inputs.gradNorm)
    throw std::invalid_argument(who + ": clipping (max norm > 0) needs the gradient norm");
}

} // namespace bmt::runtime
