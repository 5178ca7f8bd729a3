//===- Optimizer.cpp - the optimizer interface's state helpers ------------===//

#include "bmt/Runtime/optim/Optimizer.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <functional>
#include <set>
#include <stdexcept>

namespace bmt::runtime {

Optimizer::~Optimizer() = default;

bool Optimizer::writeLowPrecisionCopies(const std::vector<LowPrecisionCopy> &) { return false; }

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

ParameterLayout wholeLayout(const at::Tensor &param, const std::string &name) {
  ParameterLayout layout;
  layout.members.push_back({name, param.sizes().vec(), 0});
  return layout;
}

bool decays(const std::vector<int64_t> &shape, WeightDecayParams rule) {
  return rule == WeightDecayParams::All || shape.size() >= 2;
}

std::vector<ParameterPiece> piecesOf(const ParameterLayout &layout, int64_t numel) {
  std::vector<ParameterPiece> pieces;
  const int64_t begin = layout.begin, end = layout.begin + numel;
  for (size_t m = 0; m < layout.members.size(); ++m) {
    const ParameterLayout::Member &member = layout.members[m];
    int64_t size = 1;
    for (int64_t d : member.shape)
      size *= d;
    const int64_t from = std::max(begin, member.offset);
    const int64_t to = std::min(end, member.offset + size);
    if (from < to)
      pieces.push_back({m, from - begin, to - from, from - member.offset});
  }
  return pieces;
}

PieceViews pieceViews(const std::vector<at::Tensor> &params,
                      const std::vector<at::Tensor> &grads,
                      const std::vector<const std::vector<at::Tensor> *> &states,
                      const std::vector<ParameterLayout> &layouts, WeightDecayParams rule,
                      bool decay) {
  PieceViews views;
  views.states.resize(states.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined())
      continue;
    const ParameterLayout &layout = layouts.at(i);
    const int64_t numel = params[i].numel();
    std::vector<ParameterPiece> pieces = piecesOf(layout, numel);
    auto add = [&](const at::Tensor &p, const at::Tensor &g,
                   const std::function<at::Tensor(const at::Tensor &)> &view) {
      views.params.push_back(view(p));
      views.grads.push_back(view(g));
      for (size_t k = 0; k < states.size(); ++k)
        views.states[k].push_back(view((*states[k])[i]));
      views.index.push_back(i);
    };
    if (pieces.size() == 1 && pieces[0].numel == numel) {
      if (decays(layout.members[pieces[0].member].shape, rule) == decay)
        add(params[i].detach(), grads[i], [](const at::Tensor &t) { return t; });
      continue;
    }
    for (const ParameterPiece &piece : pieces)
      if (decays(layout.members[piece.member].shape, rule) == decay)
        add(params[i].detach(), grads[i], [&](const at::Tensor &t) {
          return t.view({-1}).narrow(0, piece.offset, piece.numel);
        });
  }
  return views;
}

void checkStepInputs(const StepInputs &inputs, const std::string &who) {
  if (inputs.maxNorm > 0 && !inputs.gradNorm)
    throw std::invalid_argument(who + ": clipping (max norm > 0) needs the gradient norm");
}

} // namespace bmt::runtime
