//===- OptimizersTest.cpp - SGD, Adam, Lion, Adafactor (Optimizers.h) -----===//
//
// What the Python tests (test_optimizers.py: each optimizer against
// torch.optim on a model) do not isolate:
//   - a step with foundInf != 0 changes nothing (parameters, every state
//     tensor) for every optimizer, even with inf/NaN gradients, and the
//     next finite step does;
//   - the weight-decay groups over a flat buffer of members (a ZeRO shard):
//     the same result, bit for bit, as the optimizer over the members as
//     separate tensors with decay on the matrices only; padding untouched;
//   - Adafactor over a flat buffer holding a matrix and a vector equals
//     Adafactor over the two tensors (the factored statistics per member);
//   - state() / loadState() continue bit-identically (SGD, Lion,
//     Adafactor) and refuse another optimizer's state;
//   - bad settings are refused with a message naming them.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/optim/Optimizers.h"

#include "RandomTensor.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <memory>
#include <stdexcept>

namespace {

using namespace bmt::runtime;
using bmt::test::randomTensor;

const OptimizerKind kKinds[] = {OptimizerKind::SGD, OptimizerKind::Adam, OptimizerKind::AdamW,
                                OptimizerKind::Lion, OptimizerKind::Adafactor};

OptimizerConfig configFor(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.weightDecay = 0.1;
  if (kind == OptimizerKind::SGD)
    c.momentum = 0.9;
  return c;
}

std::vector<at::Tensor> makeParams(uint64_t seed) {
  return {randomTensor({4, 6}, at::kFloat, seed).requires_grad_(true),
          randomTensor({5}, at::kFloat, seed + 1).requires_grad_(true)};
}

void setGrads(const std::vector<at::Tensor> &params, uint64_t seed) {
  for (size_t i = 0; i < params.size(); ++i)
    params[i].mutable_grad() = randomTensor(params[i].sizes(), at::kFloat, seed + 10 * i, 0.1);
}

std::map<std::string, at::Tensor> snapshot(const Optimizer &opt) {
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < opt.params().size(); ++i)
    out["param." + std::to_string(i)] = opt.params()[i].detach().clone();
  for (const auto &[name, t] : opt.state().tensors)
    out[name] = t.clone();
  return out;
}

std::unique_ptr<Optimizer> make(OptimizerKind kind, const std::vector<at::Tensor> &params,
                                std::vector<ParameterLayout> layouts = {}) {
  if (layouts.empty())
    for (const at::Tensor &p : params)
      layouts.push_back(wholeLayout(p));
  return makeDeviceOptimizer(params, layouts, configFor(kind), nullptr);
}

TEST(Optimizers, FoundInfStepChangesNothing) {
  for (OptimizerKind kind : kKinds) {
    std::vector<at::Tensor> params = makeParams(1);
    std::unique_ptr<Optimizer> opt = make(kind, params);
    setGrads(params, 2);
    opt->step({1e-2});
    std::map<std::string, at::Tensor> before = snapshot(*opt);
    setGrads(params, 3);
    params[0].grad()[1][2] = std::numeric_limits<float>::infinity();
    params[1].grad()[0] = std::numeric_limits<float>::quiet_NaN();
    StepInputs skipped{1e-2, at::ones({1}), std::nullopt,
                       at::full({1}, 3.0, at::kDouble), /*maxNorm=*/1.0};
    opt->step(skipped);
    for (const auto &[name, t] : snapshot(*opt))
      EXPECT_TRUE(at::equal(t, before.at(name)))
          << optimizerKindName(kind) << ": " << name << " changed in a skipped step";
    setGrads(params, 4);
    opt->step({1e-2, at::zeros({1})});
    EXPECT_FALSE(at::equal(params[0].detach(), before.at("param.0"))) << optimizerKindName(kind);
    EXPECT_EQ(opt->state().tensors.at("step.0").item<double>(), 2.0) << optimizerKindName(kind);
  }
}

/// A flat buffer [24 + 5 + 3 padding] holding a [4, 6] matrix and a [5]
/// vector, as a ZeRO shard of one rank holds its group.
ParameterLayout flatLayout() {
  ParameterLayout layout;
  layout.members = {{"w", {4, 6}, 0}, {"b", {5}, 24}};
  return layout;
}

TEST(Optimizers, WeightDecayGroupsOverAFlatBufferMatchSeparateTensors) {
  for (OptimizerKind kind : kKinds) {
    std::vector<at::Tensor> separate = makeParams(5);
    at::Tensor flat = at::cat({separate[0].detach().reshape({-1}), separate[1].detach(),
                               at::zeros({3})})
                          .requires_grad_(true);
    OptimizerConfig c = configFor(kind); // decayParams: matrices
    std::unique_ptr<Optimizer> one =
        makeDeviceOptimizer({flat}, {flatLayout()}, c, nullptr);
    std::unique_ptr<Optimizer> two = makeDeviceOptimizer(
        separate, {wholeLayout(separate[0]), wholeLayout(separate[1])}, c, nullptr);
    for (int step = 0; step < 3; ++step) {
      setGrads(separate, 20 + step);
      flat.mutable_grad() = at::cat({separate[0].grad().reshape({-1}), separate[1].grad(),
                                     at::zeros({3})});
      StepInputs in{1e-2, std::nullopt, std::nullopt, at::full({1}, 2.0, at::kDouble), 1.0};
      one->step(in);
      two->step(in);
    }
    at::Tensor want = at::cat({separate[0].detach().reshape({-1}), separate[1].detach()});
    if (kind == OptimizerKind::Adafactor)
      EXPECT_TRUE(at::allclose(flat.detach().narrow(0, 0, 29), want, 1e-6, 1e-7))
          << optimizerKindName(kind);
    else
      EXPECT_TRUE(at::equal(flat.detach().narrow(0, 0, 29), want)) << optimizerKindName(kind);
    EXPECT_TRUE(at::equal(flat.detach().narrow(0, 29, 3), at::zeros({3})))
        << optimizerKindName(kind) << ": padding changed";
  }
}

TEST(Optimizers, DecayOnlyOnMatricesByDefault) {
  // With zero gradients SGD's update is the decay alone: lr * wd * p.
  std::vector<at::Tensor> params = makeParams(7);
  std::vector<at::Tensor> start{params[0].detach().clone(), params[1].detach().clone()};
  OptimizerConfig c = configFor(OptimizerKind::SGD);
  c.momentum = 0;
  std::unique_ptr<Optimizer> opt =
      makeDeviceOptimizer(params, {wholeLayout(params[0]), wholeLayout(params[1])}, c, nullptr);
  for (const at::Tensor &p : params)
    p.mutable_grad() = at::zeros_like(p);
  opt->step({0.5});
  EXPECT_TRUE(at::allclose(params[0].detach(), start[0].mul(1 - 0.5 * 0.1)));
  EXPECT_TRUE(at::equal(params[1].detach(), start[1])) << "a vector was decayed";
}

TEST(Optimizers, StateRoundTripContinuesBitIdentically) {
  for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::Lion, OptimizerKind::Adafactor}) {
    std::vector<at::Tensor> a = makeParams(9);
    std::unique_ptr<Optimizer> first = make(kind, a);
    for (int step = 0; step < 2; ++step) {
      setGrads(a, 30 + step);
      first->step({1e-2});
    }
    std::vector<at::Tensor> b;
    for (const at::Tensor &p : a)
      b.push_back(p.detach().clone().requires_grad_(true));
    std::unique_ptr<Optimizer> second = make(kind, b);
    OptimizerState saved = first->state();
    for (auto &[name, t] : saved.tensors)
      t = t.clone();
    second->loadState(saved);
    for (int step = 0; step < 2; ++step) {
      setGrads(a, 40 + step);
      setGrads(b, 40 + step);
      first->step({1e-2});
      second->step({1e-2});
    }
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(at::equal(a[i].detach(), b[i].detach())) << optimizerKindName(kind);
    // Another optimizer's state is refused.
    std::unique_ptr<Optimizer> other =
        make(kind == OptimizerKind::SGD ? OptimizerKind::Lion : OptimizerKind::SGD, b);
    EXPECT_THROW(other->loadState(first->state()), std::invalid_argument)
        << optimizerKindName(kind);
  }
}

void expectRefused(OptimizerConfig c, const std::string &words) {
  try {
    checkOptimizerConfig(c);
    ADD_FAILURE() << "accepted; expected: " << words;
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(Optimizers, BadSettingsAreRefused) {
  EXPECT_FALSE(parseOptimizerKind("rmsprop"));
  EXPECT_EQ(parseOptimizerKind("adafactor"), OptimizerKind::Adafactor);
  OptimizerConfig c;
  c.kind = OptimizerKind::SGD;
  c.nesterov = true;
  expectRefused(c, "--nesterov needs --momentum > 0");
  c.momentum = 0.9;
  c.dampening = 0.5;
  expectRefused(c, "--nesterov needs");
  c = OptimizerConfig{};
  c.kind = OptimizerKind::Lion;
  c.beta1 = 1.0;
  expectRefused(c, "must lie in [0, 1)");
  c = OptimizerConfig{};
  c.kind = OptimizerKind::Adafactor;
  c.clipThreshold = 0.5;
  expectRefused(c, "--adafactor-d");
  c = OptimizerConfig{};
  c.weightDecay = -1;
  expectRefused(c, "--weight-decay must be finite and >= 0");
  c = OptimizerConfig{};
  c.kind = OptimizerKind::Adafactor;
  c.momentum = 0.9;
  expectRefused(c, "takes no --momentum");
  // A member split over a TP group needs the group's communicator.
  ParameterLayout split;
  split.members.push_back({"w", {4, 2}, 0});
  split.members.back().tpDim = 0;
  split.members.back().globalShape = {8, 2};
  try {
    Adafactor(std::vector<at::Tensor>{at::zeros({8}).requires_grad_()}, AdafactorConfig{}, {split});
    ADD_FAILURE() << "Adafactor took a TP-split member without a communicator";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("member w is split over a tensor-parallel group"),
              std::string::npos)
        << e.what();
  }
  // Torch's defaults.
  EXPECT_EQ(OptimizerConfig{}.weightDecayValue(), 0.01);
  c = OptimizerConfig{};
  c.kind = OptimizerKind::Lion;
  EXPECT_EQ(c.beta2Value(), 0.99);
  EXPECT_EQ(c.weightDecayValue(), 0.0);
}

} // namespace
