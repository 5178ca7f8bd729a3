//===- OptimizerStateTest.cpp - Optimizer::state / loadState --------------===//
//
// An optimizer rebuilt from another's state() (a fresh optimizer over copies
// of the parameters, then loadState) must continue exactly as the original
// does: bit-identical parameters and state after each further step, for
// AdamW and OffloadAdamW on the CPU, with clipping, a loss scale and (for
// OffloadAdamW) a bf16 parameter whose float32 master is the state.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/optim/AdamW.h"
#include "bmt/Runtime/optim/OffloadAdam.h"
#include "bmt/Runtime/optim/Optimizer.h"

#include "RandomTensor.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>

namespace {

using namespace bmt::runtime;

using bmt::test::randomTensor;

std::vector<at::Tensor> copyParams(const std::vector<at::Tensor> &params) {
  std::vector<at::Tensor> copies;
  for (const at::Tensor &p : params)
    copies.push_back(p.detach().clone().requires_grad_(true));
  return copies;
}

OptimizerState cloneState(const OptimizerState &state) {
  OptimizerState copy = state;
  for (auto &[name, t] : copy.tensors)
    t = t.clone();
  return copy;
}

void expectSame(const Optimizer &a, const Optimizer &b, int step) {
  ASSERT_EQ(a.params().size(), b.params().size());
  for (size_t i = 0; i < a.params().size(); ++i)
    EXPECT_TRUE(at::equal(a.params()[i], b.params()[i])) << "param " << i << ", step " << step;
  OptimizerState sa = a.state(), sb = b.state();
  EXPECT_EQ(sa.scalars, sb.scalars);
  ASSERT_EQ(sa.tensors.size(), sb.tensors.size());
  for (const auto &[name, t] : sa.tensors) {
    ASSERT_TRUE(sb.tensors.count(name)) << name;
    EXPECT_TRUE(at::equal(t, sb.tensors.at(name))) << name << ", step " << step;
  }
}

const AdamWConfig config{0.9, 0.95, 1e-8, 0.1};
const double maxNorm = 1.5;

/// The gradient of parameter i at `step` (float32 for the offloaded
/// optimizer's host copies; the parameter's dtype for AdamW).
at::Tensor gradFor(const at::Tensor &p, size_t i, int step, at::ScalarType dtype) {
  return randomTensor(p.sizes(), dtype, 1000 * step + i);
}

TEST(OptimizerState, AdamWResumesBitIdentical) {
  std::vector<at::Tensor> params = {randomTensor({3, 4}, at::kFloat, 1).requires_grad_(true),
                                    randomTensor({5}, at::kFloat, 2).requires_grad_(true)};
  AdamW original(params, config);
  auto stepWith = [](Optimizer &opt, int step) {
    for (size_t i = 0; i < opt.params().size(); ++i)
      opt.params()[i].mutable_grad() = gradFor(opt.params()[i], i, step, at::kFloat);
    StepInputs in;
    in.lr = 1e-2;
    in.gradNorm = clipGradNorm(opt.params(), /*maxNorm=*/0.0);
    in.maxNorm = maxNorm;
    in.foundInf = at::zeros({1}, at::kFloat);
    opt.step(in);
    opt.zeroGrad();
  };
  for (int step = 1; step <= 3; ++step)
    stepWith(original, step);

  OptimizerState saved = cloneState(original.state());
  EXPECT_EQ(saved.tensors.size(), 3 * params.size());
  EXPECT_EQ(saved.scalars.at("num_params"), 2.0);
  AdamW resumed(copyParams(params), config);
  resumed.loadState(saved);
  expectSame(original, resumed, 3);
  for (int step = 4; step <= 6; ++step) {
    stepWith(original, step);
    stepWith(resumed, step);
    expectSame(original, resumed, step);
  }
}

/// Host gradients handed over as a ZeroStorage would (flat, float32).
struct Source : HostGradientSource {
  std::vector<at::Tensor> grads;
  std::vector<size_t> hostGradientOrder() const override { return {1, 0, 2}; }
  at::Tensor waitHostGradient(size_t i) override { return grads.at(i); }
};

TEST(OptimizerState, OffloadAdamWResumesBitIdentical) {
  std::vector<at::Tensor> params = {randomTensor({3, 4}, at::kFloat, 1),
                                    randomTensor({6}, at::kBFloat16, 2),
                                    randomTensor({5}, at::kFloat, 3)};
  Source sourceA, sourceB;
  OffloadAdamW original(params, config, sourceA);
  auto stepWith = [](OffloadAdamW &opt, Source &source, int step) {
    source.grads.clear();
    for (size_t i = 0; i < opt.params().size(); ++i)
      source.grads.push_back(gradFor(opt.params()[i], i, step, at::kFloat).view({-1}).mul(64));
    StepInputs in;
    in.lr = 1e-2;
    in.foundInf = at::zeros({1}, at::kFloat);
    in.lossScale = at::full({1}, 64.0, at::kDouble);
    in.gradNorm = at::full({1}, 2.0 + step, at::kDouble); // any norm: the clip factor's input
    in.maxNorm = maxNorm;
    static_cast<Optimizer &>(opt).step(in);
  };
  for (int step = 1; step <= 3; ++step)
    stepWith(original, sourceA, step);

  OptimizerState saved = cloneState(original.state());
  EXPECT_EQ(saved.tensors.size(), 4 * params.size());
  std::vector<at::Tensor> otherParams;
  for (const at::Tensor &p : params) // not the original's values: loadState must set them
    otherParams.push_back(at::zeros_like(p));
  OffloadAdamW resumed(otherParams, config, sourceB);
  resumed.loadState(saved);
  expectSame(original, resumed, 3);
  for (int step = 4; step <= 6; ++step) {
    stepWith(original, sourceA, step);
    stepWith(resumed, sourceB, step);
    expectSame(original, resumed, step);
  }
}

TEST(OptimizerState, LoadRejectsAnotherOptimizersState) {
  std::vector<at::Tensor> params = {randomTensor({3, 4}, at::kFloat, 1).requires_grad_(true)};
  Source source;
  OffloadAdamW offloaded(params, config, source);
  AdamW adamw(copyParams(params), config);
  EXPECT_THROW(adamw.loadState(offloaded.state()), std::invalid_argument); // "master.0"
  EXPECT_THROW(offloaded.loadState(adamw.state()), std::invalid_argument); // no "master.0"

  OptimizerState wrong = cloneState(adamw.state());
  wrong.tensors["exp_avg.0"] = at::ones({4, 3});
  EXPECT_THROW(adamw.loadState(wrong), std::invalid_argument);
  EXPECT_TRUE(at::equal(adamw.state().tensors.at("exp_avg.0"), at::zeros({3, 4})));
  wrong = cloneState(adamw.state());
  wrong.scalars["num_params"] = 2;
  EXPECT_THROW(adamw.loadState(wrong), std::invalid_argument);
}

} // namespace
