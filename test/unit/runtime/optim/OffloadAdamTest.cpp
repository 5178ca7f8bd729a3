//===- OffloadAdamTest.cpp - OffloadAdamW against AdamW on the device ----===//
//
// OffloadAdamW (host masters and moments, host gradient copies taken before
// unscaling and clipping) must do exactly what the device path does with
// AdamW: unscale the gradients (at::_amp_foreach_non_finite_check_and_unscale_),
// their global norm (clipGradNorm), AdamW::step with the found-inf flag and
// the norm (clipping in the kernel), and for bf16 parameters float32 masters
// copied into them. Here the
// "device" is the CPU, so both paths run the same kernels and must agree to
// the bit: parameters, masters, moments and step counts, over several steps
// with clipping active, a loss scale, a skipped (inf) step and a parameter
// without a gradient in some steps.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/optim/OffloadAdam.h"
#include "bmt/Runtime/optim/AdamW.h"

#include "RandomTensor.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <limits>

#include <optional>
#include <random>
#include <stdexcept>

namespace {

using namespace bmt::runtime;

using bmt::test::randomTensor;

/// Gradients handed to the optimizer as a ZeroStorage would: flat copies,
/// in a given order; records which ones were waited for.
struct FakeSource : HostGradientSource {
  std::vector<at::Tensor> grads; ///< undefined: no gradient this step
  std::vector<size_t> order;
  std::vector<size_t> waited;
  std::vector<size_t> hostGradientOrder() const override { return order; }
  at::Tensor waitHostGradient(size_t i) override {
    waited.push_back(i);
    return grads.at(i);
  }
};

/// The device path of Trainer::train for one step: unscale (when `scale`),
/// the global norm, AdamW::step with the flag and the clipping, refresh bf16
/// parameters from their float32 masters. Returns the norm before clipping.
at::Tensor devicePathStep(AdamW &adamw, const std::vector<at::Tensor> &params,
                          const std::vector<at::Tensor> &trainable,
                          const std::vector<at::Tensor> &rawGrads, double lr,
                          std::optional<double> scale, bool injectInf, double maxNorm,
                          at::Tensor &found) {
  for (size_t i = 0; i < trainable.size(); ++i)
    trainable[i].mutable_grad() = rawGrads[i].defined() ? rawGrads[i].clone() : at::Tensor();
  if (injectInf)
    trainable[0].grad().view({-1})[0].fill_(std::numeric_limits<double>::infinity());
  std::optional<at::Tensor> flag;
  if (scale) {
    found = at::zeros({1}, at::kFloat);
    at::Tensor inv = at::full({1}, *scale, at::kDouble).reciprocal().to(at::kFloat);
    for (const at::Tensor &p : trainable)
      if (p.grad().defined())
        at::_amp_foreach_non_finite_check_and_unscale_({p.grad()}, found, inv);
    flag = found;
  }
  at::Tensor norm = clipGradNorm(trainable, /*maxNorm=*/0.0); // clipped inside the kernel
  adamw.step(lr, flag, norm, maxNorm);
  c10::NoGradGuard noGrad;
  for (size_t i = 0; i < params.size(); ++i)
    if (!params[i].is_same(trainable[i]))
      params[i].detach().copy_(trainable[i].detach());
  return norm;
}

struct Case {
  at::ScalarType dtype;
  std::optional<double> scale; // loss scaling
};

void checkAgainstAdamW(const Case &c) {
  AdamWConfig config;
  config.beta1 = 0.9;
  config.beta2 = 0.95;
  config.eps = 1e-8;
  config.weightDecay = 0.1;
  const double maxNorm = 0.5; // the gradients' norm is ~10: clipping is active
  const std::vector<std::vector<int64_t>> shapes = {{37}, {4, 5}, {130}};
  const size_t late = 2;       // no gradient in step 1
  const int64_t skipped = 3;   // an inf in step 3 (with loss scaling)

  // Both paths start from the same parameters: device path with float32
  // masters for bf16 (what ZeroStorage makes without offloading).
  std::vector<at::Tensor> deviceParams, deviceTrainable, offloadParams;
  for (size_t i = 0; i < shapes.size(); ++i) {
    at::Tensor init = randomTensor(shapes[i], c.dtype, 10 + i);
    deviceParams.push_back(init.clone().set_requires_grad(true));
    offloadParams.push_back(init.clone().set_requires_grad(true));
    deviceTrainable.push_back(c.dtype == at::kFloat
                                  ? deviceParams.back()
                                  : init.to(at::kFloat).set_requires_grad(true));
  }
  AdamW adamw(deviceTrainable, config);
  FakeSource source;
  OffloadAdamW offload(offloadParams, config, source);
  ASSERT_EQ(offload.hostBytes(), 3 * 4 * (37 + 20 + 130));
  for (size_t i = 0; i < shapes.size(); ++i)
    ASSERT_TRUE(at::equal(offload.master(i), deviceTrainable[i].detach()));

  for (int64_t step = 1; step <= 5; ++step) {
    double lr = 1e-2 * static_cast<double>(step);
    const bool inject = c.scale && step == skipped;
    // Raw gradients, as the backward leaves them (multiplied by the scale).
    std::vector<at::Tensor> raw;
    for (size_t i = 0; i < shapes.size(); ++i)
      raw.push_back(step == 1 && i == late
                        ? at::Tensor()
                        : randomTensor(shapes[i], at::kFloat, 100 * step + i, c.scale.value_or(1.0)));
    at::Tensor found;
    at::Tensor norm = devicePathStep(adamw, deviceParams, deviceTrainable, raw, lr, c.scale,
                                     inject, maxNorm, found);
    // The offloaded step sees the gradients as copied before unscaling and
    // clipping (the injected inf came later: only the flag knows about it).
    source.grads.clear();
    source.order.clear();
    source.waited.clear();
    for (size_t i = 0; i < shapes.size(); ++i)
      source.grads.push_back(raw[i].defined() ? raw[i].reshape({-1}).clone() : at::Tensor());
    for (size_t i : {size_t(2), size_t(0), size_t(1)}) // the order the copies were made
      if (raw[i].defined())
        source.order.push_back(i);
    std::optional<at::Tensor> scale;
    if (c.scale)
      scale = at::full({1}, *c.scale, at::kDouble);
    offload.step(lr, c.scale ? std::optional<at::Tensor>(found) : std::nullopt, scale, norm,
                 maxNorm);
    if (inject)
      EXPECT_TRUE(source.waited.empty()) << "a skipped step needs no gradient";
    else
      EXPECT_EQ(source.waited, source.order);

    for (size_t i = 0; i < shapes.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(step) + ", parameter " + std::to_string(i));
      EXPECT_TRUE(at::equal(offloadParams[i].detach(), deviceParams[i].detach()));
      EXPECT_TRUE(at::equal(offload.master(i), deviceTrainable[i].detach()));
      EXPECT_TRUE(at::equal(offload.expAvg(i), adamw.expAvg(i)));
      EXPECT_TRUE(at::equal(offload.expAvgSq(i), adamw.expAvgSq(i)));
      double expectedSteps = static_cast<double>(step) - (i == late ? 1 : 0) -
                             (c.scale && step >= skipped ? 1 : 0);
      EXPECT_EQ(offload.stepCount(i), expectedSteps);
    }
  }
  // The parameters moved (the comparison is not between two no-ops).
  for (size_t i = 0; i < shapes.size(); ++i)
    EXPECT_FALSE(at::equal(offloadParams[i].detach(), randomTensor(shapes[i], c.dtype, 10 + i)));
}

TEST(OffloadAdamW, Float32MatchesAdamWWithClipping) { checkAgainstAdamW({at::kFloat, std::nullopt}); }

TEST(OffloadAdamW, BFloat16MastersMatchAdamWWithClipping) {
  checkAgainstAdamW({at::kBFloat16, std::nullopt});
}

TEST(OffloadAdamW, LossScaleAndSkippedStepMatchAdamW) {
  checkAgainstAdamW({at::kFloat, 1024.0});
  checkAgainstAdamW({at::kHalf, 65536.0});
}

TEST(OffloadAdamW, RejectsBadParametersAndGradients) {
  FakeSource source;
  EXPECT_THROW(OffloadAdamW({at::zeros({3}, at::kLong)}, AdamWConfig{}, source),
               std::invalid_argument);
  EXPECT_THROW(OffloadAdamW({at::Tensor()}, AdamWConfig{}, source), std::invalid_argument);
  AdamWConfig bad;
  bad.beta1 = 1.0;
  EXPECT_THROW(OffloadAdamW({at::zeros({3})}, bad, source), std::invalid_argument);

  at::Tensor p = at::zeros({3}).set_requires_grad(true);
  OffloadAdamW offload({p}, AdamWConfig{}, source);
  source.grads = {at::zeros({3}, at::kDouble)}; // not the master's dtype
  source.order = {0};
  EXPECT_THROW(offload.step(1e-3, std::nullopt, std::nullopt, at::zeros({1}, at::kDouble), 0),
               std::logic_error);
}

TEST(OffloadAdamW, MasterDtypes) {
  EXPECT_EQ(masterDtype(at::kFloat), at::kFloat);
  EXPECT_EQ(masterDtype(at::kBFloat16), at::kFloat);
  EXPECT_EQ(masterDtype(at::kHalf), at::kFloat);
  EXPECT_EQ(masterDtype(at::kDouble), at::kDouble);
  at::Tensor t = emptyHostTensor(5, at::kFloat, /*pinned=*/false);
  EXPECT_EQ(t.numel(), 5);
  EXPECT_TRUE(t.device().is_cpu());
}

} // namespace
