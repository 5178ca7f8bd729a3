//===- OptimizerTest.cpp - AdamW and clipGradNorm against references ------===//
//
// AdamW is checked against a plain-ATen implementation of the update of
// torch.optim.AdamW's documentation (decoupled weight decay, bias-corrected
// moments), computed in float64; clipGradNorm against a norm summed by hand.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/optim/AdamW.h"
#include "bmt/Runtime/optim/LossScaler.h"

#include "RandomTensor.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace {

using bmt::runtime::AdamW;
using bmt::runtime::AdamWConfig;
using bmt::runtime::clipGradNorm;

using bmt::test::randomTensor;

double maxAbsDiff(const at::Tensor &a, const at::Tensor &b) {
  return a.to(at::kDouble).sub(b.to(at::kDouble)).abs().max().item<double>();
}

/// AdamW as documented for torch.optim.AdamW, in float64.
struct ReferenceAdamW {
  at::Tensor p, m, v;
  int64_t t = 0;

  explicit ReferenceAdamW(const at::Tensor &param)
      : p(param.detach().to(at::kDouble).clone()), m(at::zeros_like(p)), v(at::zeros_like(p)) {}

  void step(const at::Tensor &grad, double lr, const AdamWConfig &c) {
    at::Tensor g = grad.to(at::kDouble);
    ++t;
    p = p.mul(1.0 - lr * c.weightDecay);               // p -= lr * wd * p
    m = m.mul(c.beta1).add(g.mul(1.0 - c.beta1));      // m = b1 m + (1 - b1) g
    v = v.mul(c.beta2).add(g.mul(g).mul(1.0 - c.beta2)); // v = b2 v + (1 - b2) g^2
    at::Tensor mHat = m.div(1.0 - std::pow(c.beta1, t));
    at::Tensor vHat = v.div(1.0 - std::pow(c.beta2, t));
    p = p.sub(mHat.div(vHat.sqrt().add(c.eps)).mul(lr)); // p -= lr m^ / (sqrt(v^) + eps)
  }
};

at::Tensor leaf(at::IntArrayRef shape, at::ScalarType dtype, uint64_t seed) {
  return randomTensor(shape, dtype, seed).set_requires_grad(true);
}

TEST(AdamW, MatchesReferenceOverFiveSteps) {
  AdamWConfig config;
  config.beta1 = 0.9;
  config.beta2 = 0.99;
  config.eps = 1e-8;
  config.weightDecay = 0.1;

  // Two float32 params and two float64 ones (two fused groups), a float64
  // param that only gets grads from step 3 on (its own step count), and a
  // float32 param that never has a grad.
  std::vector<at::Tensor> params = {
      leaf({4, 3}, at::kFloat, 1), leaf({7}, at::kDouble, 2), leaf({2, 2, 2}, at::kFloat, 3),
      leaf({5}, at::kDouble, 4),   leaf({6}, at::kDouble, 5), leaf({3}, at::kFloat, 6)};
  const size_t late = 4, never = 5;
  std::vector<at::Tensor> initial;
  for (const at::Tensor &p : params)
    initial.push_back(p.detach().clone());
  const at::Tensor &neverBefore = initial[never];

  std::vector<ReferenceAdamW> refs;
  for (const at::Tensor &p : params)
    refs.emplace_back(p);
  AdamW adam(params, config);

  const double lrs[] = {1e-2, 2e-2, 5e-3, 1e-2, 3e-2};
  for (int s = 0; s < 5; ++s) {
    adam.zeroGrad();
    for (size_t i = 0; i < params.size(); ++i) {
      if (i == never || (i == late && s < 2))
        continue;
      at::Tensor g = randomTensor(params[i].sizes(), params[i].scalar_type(), 100 + 10 * s + i);
      params[i].mutable_grad() = g;
      refs[i].step(g, lrs[s], config);
    }
    adam.step(lrs[s]);
  }

  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE("param " + std::to_string(i));
    if (i == never) {
      EXPECT_TRUE(params[i].equal(neverBefore));
      EXPECT_EQ(adam.expAvg(i).abs().max().item<double>(), 0.0);
      continue;
    }
    const double tol = params[i].scalar_type() == at::kDouble ? 1e-6 : 1e-5;
    EXPECT_LT(maxAbsDiff(params[i], refs[i].p), tol);
    EXPECT_LT(maxAbsDiff(adam.expAvg(i), refs[i].m), tol);
    EXPECT_LT(maxAbsDiff(adam.expAvgSq(i), refs[i].v), tol);
    // The params did move (the test is not vacuous).
    EXPECT_GT(maxAbsDiff(params[i], initial[i]), 1e-3);
    EXPECT_EQ(adam.expAvg(i).scalar_type(), params[i].scalar_type());
  }
  // Tighter for float64: the fused kernel and the reference agree to rounding.
  EXPECT_LT(maxAbsDiff(params[1], refs[1].p), 1e-12);
}

TEST(AdamW, ZeroGradSetsGradsToNone) {
  std::vector<at::Tensor> params = {leaf({3}, at::kFloat, 1)};
  AdamW adam(params, AdamWConfig{});
  params[0].mutable_grad() = randomTensor({3}, at::kFloat, 2);
  ASSERT_TRUE(params[0].grad().defined());
  adam.zeroGrad();
  EXPECT_FALSE(params[0].grad().defined());
  // A step with no grads changes nothing.
  at::Tensor before = params[0].detach().clone();
  adam.step(1e-2);
  EXPECT_TRUE(params[0].equal(before));
}

TEST(AdamW, FoundInfSkipsTheStepOnTheDevice) {
  // A step with a non-zero found-inf flag changes nothing (params, moments,
  // step counts): the next clean steps equal a run that never had it.
  std::vector<at::Tensor> params = {leaf({4, 3}, at::kFloat, 1), leaf({5}, at::kDouble, 2)};
  std::vector<ReferenceAdamW> refs;
  for (const at::Tensor &p : params)
    refs.emplace_back(p);
  AdamW adam(params, AdamWConfig{});
  at::Tensor yes = at::full({1}, 1.0, at::TensorOptions().dtype(at::kFloat));
  at::Tensor no = at::zeros({1}, at::TensorOptions().dtype(at::kFloat));
  for (int s = 0; s < 3; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor g = randomTensor(params[i].sizes(), params[i].scalar_type(), 200 + 10 * s + i);
      params[i].mutable_grad() = g;
      if (s != 1)
        refs[i].step(g, 1e-2, AdamWConfig{});
    }
    adam.step(1e-2, s == 1 ? yes : no);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE("param " + std::to_string(i));
    EXPECT_LT(maxAbsDiff(params[i], refs[i].p), 1e-5);
    EXPECT_LT(maxAbsDiff(adam.expAvgSq(i), refs[i].v), 1e-5);
  }
}

TEST(AdamW, ClipsInsideTheKernelAsClipGradNormThenStep) {
  // step(lr, nullopt, norm, maxNorm) == clipGradNorm(params, maxNorm) + step(lr).
  std::vector<at::Tensor> a = {leaf({4, 3}, at::kFloat, 1), leaf({5}, at::kDouble, 2)};
  std::vector<at::Tensor> b = {a[0].detach().clone().requires_grad_(true),
                               a[1].detach().clone().requires_grad_(true)};
  AdamW adamA(a, AdamWConfig{}), adamB(b, AdamWConfig{});
  for (int s = 0; s < 3; ++s) {
    for (size_t i = 0; i < a.size(); ++i) {
      at::Tensor g = randomTensor(a[i].sizes(), a[i].scalar_type(), 300 + 10 * s + i).mul(4);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    const double maxNorm = s == 1 ? 1e9 : 0.5; // step 1 does not clip
    at::Tensor norm = clipGradNorm(a, 0.0);
    adamA.step(1e-2, std::nullopt, norm, maxNorm);
    clipGradNorm(b, maxNorm);
    adamB.step(1e-2);
  }
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("param " + std::to_string(i));
    // The kernel's grad_scale is float32: the factor is rounded to it.
    EXPECT_LT(maxAbsDiff(a[i], b[i]), a[i].scalar_type() == at::kDouble ? 1e-9 : 1e-6);
    EXPECT_LT(maxAbsDiff(adamA.expAvgSq(i), adamB.expAvgSq(i)), 1e-6);
  }
}

TEST(AdamW, RejectsNonFloatingParams) {
  at::Tensor ints = at::empty({3}, at::kLong);
  EXPECT_THROW(AdamW({ints}, AdamWConfig{}), std::invalid_argument);
}

/// sqrt of the sum of squares of all defined grads, summed in double by hand.
double manualNorm(const std::vector<at::Tensor> &params) {
  double sum = 0;
  for (const at::Tensor &p : params) {
    if (!p.grad().defined())
      continue;
    at::Tensor g = p.grad().to(at::kDouble).contiguous();
    const double *d = g.data_ptr<double>();
    for (int64_t i = 0; i < g.numel(); ++i)
      sum += d[i] * d[i];
  }
  return std::sqrt(sum);
}

std::vector<at::Tensor> paramsWithGrads() {
  std::vector<at::Tensor> params = {leaf({4, 5}, at::kFloat, 1), leaf({7}, at::kDouble, 2),
                                    leaf({3}, at::kFloat, 3)};
  params[0].mutable_grad() = randomTensor({4, 5}, at::kFloat, 11);
  params[1].mutable_grad() = randomTensor({7}, at::kDouble, 12);
  // params[2] has no grad: counts as 0.
  return params;
}

TEST(ClipGradNorm, ReturnsTheNormWithoutClipping) {
  std::vector<at::Tensor> params = paramsWithGrads();
  at::Tensor g0 = params[0].grad().clone(), g1 = params[1].grad().clone();
  const double expected = manualNorm(params);
  ASSERT_GT(expected, 1.0);
  EXPECT_NEAR(clipGradNorm(params, 1e9).item<double>(), expected, 1e-5);
  EXPECT_TRUE(params[0].grad().equal(g0));
  EXPECT_TRUE(params[1].grad().equal(g1));
  // maxNorm <= 0: only the norm.
  EXPECT_NEAR(clipGradNorm(params, 0.0).item<double>(), expected, 1e-5);
  EXPECT_TRUE(params[0].grad().equal(g0));
}

TEST(ClipGradNorm, ClipsToMaxNorm) {
  std::vector<at::Tensor> params = paramsWithGrads();
  at::Tensor g0 = params[0].grad().to(at::kDouble), g1 = params[1].grad().clone();
  const double norm = manualNorm(params);
  const double maxNorm = norm / 4;
  const double returned = clipGradNorm(params, maxNorm).item<double>();
  EXPECT_NEAR(returned, norm, 1e-5);
  // Scaled by maxNorm / (norm + 1e-6), with the norm it computed (float32
  // grads give a float32 partial norm) and with the manual one.
  const double factor = maxNorm / (returned + 1e-6);
  EXPECT_LT(maxAbsDiff(params[0].grad(), g0.mul(factor)), 1e-6);
  EXPECT_LT(maxAbsDiff(params[1].grad(), g1.mul(factor)), 1e-12);
  EXPECT_LT(maxAbsDiff(params[1].grad(), g1.mul(maxNorm / (norm + 1e-6))), 1e-6);
  EXPECT_NEAR(manualNorm(params), maxNorm, 1e-5);
  EXPECT_FALSE(params[2].grad().defined());
}

TEST(ClipGradNorm, NonFiniteNormsPropagate) {
  std::vector<at::Tensor> params = paramsWithGrads();
  params[1].grad().data_ptr<double>()[3] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(clipGradNorm(params, 1.0).item<double>()));

  params = paramsWithGrads();
  params[0].grad().data_ptr<float>()[0] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(clipGradNorm(params, 0.0).item<double>()));
}

TEST(ClipGradNorm, NoGradsIsZero) {
  std::vector<at::Tensor> params = {leaf({3}, at::kFloat, 1)};
  EXPECT_EQ(clipGradNorm(params, 1.0).item<double>(), 0.0);
  EXPECT_EQ(clipGradNorm({}, 1.0).item<double>(), 0.0);
}

} // namespace

namespace {
/// One LossScaler::update with a found-inf flag; returns the new scale.
double update(bmt::runtime::LossScaler &s, bool overflow) {
  s.update(at::full({1}, overflow ? 1.0 : 0.0, at::TensorOptions().dtype(at::kFloat)));
  return s.scale().item<double>();
}
} // namespace

TEST(LossScaler, HalvesOnOverflowNotBelowTheMinimum) {
  bmt::runtime::LossScaler s(8, 2, 1024, 3);
  EXPECT_EQ(s.scale().item<double>(), 8);
  EXPECT_EQ(s.scale().scalar_type(), at::kDouble);
  EXPECT_EQ(update(s, true), 4);
  EXPECT_EQ(update(s, true), 3); // 2 would be below the minimum
  EXPECT_EQ(update(s, true), 3);
}

TEST(LossScaler, GrowsAfterWindowCleanSteps) {
  bmt::runtime::LossScaler s(4, 2, 3, 1);
  EXPECT_EQ(update(s, false), 4);
  EXPECT_EQ(update(s, false), 4);
  EXPECT_EQ(update(s, false), 8); // third clean step in a row
  EXPECT_EQ(update(s, false), 8);
  EXPECT_EQ(update(s, true), 4);  // an overflow restarts the count
  EXPECT_EQ(update(s, false), 4);
  EXPECT_EQ(update(s, false), 4);
  EXPECT_EQ(update(s, false), 8);
}

TEST(LossScaler, RejectsBadSettings) {
  EXPECT_THROW(bmt::runtime::LossScaler(0), std::invalid_argument);
  EXPECT_THROW(bmt::runtime::LossScaler(4, 0.5), std::invalid_argument);
  EXPECT_THROW(bmt::runtime::LossScaler(4, 2, 0), std::invalid_argument);
  EXPECT_THROW(bmt::runtime::LossScaler(4, 2, 10, 8), std::invalid_argument);
}
