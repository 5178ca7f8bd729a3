//===- AdamCudaTest.cpp - the runtime's Adam kernel against ATen's ---------===//
//
// AdamW/Adam with low-precision copies (Optimizer::writeLowPrecisionCopies)
// run the runtime's CUDA kernel (runtime/optim/kernels/Adam.cu). AdamCuda.*
// compare it on a GPU with ATen's at::_fused_adamw_ / _fused_adam_ on the
// same inputs: the gradient in bf16/fp16/fp32 as ZeRO reduces it (a sum over
// ranks) against its float32 average made as ZeroStorage makes it
// (to(float32).div_(ranks)), with weight decay on some pieces, clipping,
// found-inf steps, sizes that are not multiples of the vector width and
// views that are not 16-byte aligned. Skipped without a CUDA device. The
// AdamLowPrecision.* cases run everywhere (the refusals and the checks).
//
// Bounds: the kernel does torch's float32 operations in torch's order; the
// compiler may still contract `p - lr * wd * p` (AdamW) or `g + p * wd`
// (Adam) into one fma in one build and not in the other, a difference of
// one rounding, rare (when the result lies near a rounding boundary) and of
// one ulp. So: AdamW's moments, which do not depend on the param, are equal
// to the bit; params (and Adam's moments, which take p * wd) within 2 float32
// ulps after three updates; step counts equal; each copy is its own master
// rounded (bit-equal to master.to(bf16/fp16)); a found-inf step changes no
// bit of anything; params without a copy take ATen's kernel in the same
// step, bit-equal to it.
//
//===----------------------------------------------------------------------===//

#include "RandomTensor.h"

#include "bmt/Runtime/optim/AdamW.h"
#include "bmt/Runtime/optim/Optimizers.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

using namespace bmt::runtime;

namespace {

/// The largest distance in float32 ulps between a and b (same shape),
/// counting +0 and -0 as equal.
int64_t maxUlps(const at::Tensor &a, const at::Tensor &b) {
  auto ordered = [](const at::Tensor &t) {
    at::Tensor bits = t.detach().cpu().contiguous().to(at::kFloat).view(at::kInt).to(at::kLong);
    at::Tensor magnitude = bits.bitwise_and(0x7fffffff);
    return at::where(bits.lt(0), magnitude.neg(), magnitude);
  };
  if (a.numel() == 0)
    return 0;
  return (ordered(a) - ordered(b)).abs().max().item<int64_t>();
}

/// The largest difference of a and b in fp32 ulps of b's largest magnitude:
/// for Adam's moments with L2 decay, whose gradient g + wd * p may cancel to
/// nearly 0, where one rounding (an fma or not) is many ulps of the result.
double ulpsOfLargest(const at::Tensor &a, const at::Tensor &b) {
  at::Tensor x = a.detach().cpu().to(at::kDouble), y = b.detach().cpu().to(at::kDouble);
  double largest = y.abs().max().item<double>();
  if (largest == 0)
    return (x - y).abs().max().item<double>() == 0 ? 0 : INFINITY;
  return (x - y).abs().max().item<double>() / (largest * std::ldexp(1.0, -23));
}

bool bitEqual(const at::Tensor &a, const at::Tensor &b) {
  at::Tensor x = a.detach().cpu().contiguous(), y = b.detach().cpu().contiguous();
  return x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() &&
         std::memcmp(x.const_data_ptr(), y.const_data_ptr(), x.nbytes()) == 0;
}

/// A flat parameter of many members: odd sizes at odd offsets, matrices
/// (decayed under WeightDecayParams::Matrices) between vectors, enough of
/// them for more than one kernel launch (36 segments), one of several
/// chunks (16384 elements), and 5 padding elements at the end.
ParameterLayout manyMembers(int64_t *numel) {
  ParameterLayout layout;
  int64_t offset = 0;
  for (int m = 0; m < 90; ++m) {
    std::vector<int64_t> shape =
        m == 7 ? std::vector<int64_t>{3, 13337} : m % 2 ? std::vector<int64_t>{17 + m}
                                                        : std::vector<int64_t>{3, 5 + m};
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    layout.members.push_back({"m" + std::to_string(m), shape, offset});
    offset += n;
  }
  *numel = offset + 5;
  return layout;
}

struct Case {
  bool decoupled = true;
  at::ScalarType grad = at::kBFloat16, copy = at::kBFloat16;
  int64_t divisor = 1;
  bool clip = false;
  int64_t misalign = 0; ///< elements the param's (and moments') views start into their buffers
  int64_t gradMisalign = 0; ///< the same for the grad and the copy
};

std::string name(const Case &c) {
  return std::string(c.decoupled ? "AdamW" : "Adam") + " grad " + c10::toString(c.grad) +
         " copy " + c10::toString(c.copy) + " divisor " + std::to_string(c.divisor) +
         (c.clip ? " clipped" : "") + " misalign " + std::to_string(c.misalign) + "/" +
         std::to_string(c.gradMisalign);
}

/// Three steps (found-inf: no, yes, no) of the kernel against ATen's fused
/// kernel, over one parameter with many members and one whole one of an
/// odd size.
void compareWithAten(const Case &c) {
  const at::Device cuda(at::kCUDA, 0);
  const at::TensorOptions floats = at::TensorOptions().dtype(at::kFloat).device(cuda);
  int64_t n0 = 0;
  std::vector<ParameterLayout> layouts{manyMembers(&n0)};
  const int64_t n1 = 3 * 16384 + 4 * 97 + 3;
  layouts.push_back(ParameterLayout{{{"whole", {n1}, 0}}, 0, false});
  const std::vector<int64_t> sizes{n0, n1};

  // The kernel's params are views `misalign` elements into their buffers.
  std::vector<at::Tensor> params, reference, copies;
  for (size_t i = 0; i < sizes.size(); ++i) {
    at::Tensor init = bmt::test::randomTensor({sizes[i]}, at::kFloat, 10 + i).to(cuda);
    at::Tensor buffer = at::zeros({sizes[i] + c.misalign}, floats);
    params.push_back(buffer.narrow(0, c.misalign, sizes[i]).copy_(init));
    reference.push_back(init.clone());
    at::Tensor copyBuffer = at::zeros({sizes[i] + c.gradMisalign}, floats.dtype(c.copy));
    copies.push_back(copyBuffer.narrow(0, c.gradMisalign, sizes[i]).copy_(init));
  }
  const std::string what = name(c);
  AdamWConfig config;
  config.decoupled = c.decoupled;
  config.weightDecay = 0.1;
  config.decayParams = WeightDecayParams::Matrices;
  AdamW kernel(params, config, layouts), aten(reference, config, layouts);
  std::vector<LowPrecisionCopy> given;
  for (size_t i = 0; i < params.size(); ++i)
    given.push_back({i, copies[i], c.divisor});
  ASSERT_TRUE(kernel.writeLowPrecisionCopies(given))
      << "the runtime was built without its CUDA kernels (nvcc), or BMT_FUSED_ADAM=0";

  for (int step = 0; step < 3; ++step) {
    const bool skip = step == 1;
    std::vector<at::Tensor> before;
    for (size_t i = 0; i < params.size(); ++i) {
      before.push_back(params[i].clone());
      before.push_back(kernel.expAvg(i).clone());
      before.push_back(kernel.expAvgSq(i).clone());
      before.push_back(copies[i].clone());
      // The gradient as reduced (a sum over `divisor` ranks), in a buffer
      // of its own alignment; the reference's is ZeroStorage's average.
      at::Tensor sum = bmt::test::randomTensor({sizes[i]}, at::kFloat, 100 * step + i,
                                          0.5 * static_cast<double>(c.divisor))
                           .to(c.grad)
                           .to(cuda);
      at::Tensor gradBuffer = at::zeros({sizes[i] + c.gradMisalign}, floats.dtype(c.grad));
      params[i].mutable_grad() = gradBuffer.narrow(0, c.gradMisalign, sizes[i]).copy_(sum);
      at::Tensor average = sum.to(at::kFloat);
      if (c.divisor > 1)
        average.div_(static_cast<double>(c.divisor));
      reference[i].mutable_grad() = average;
    }
    std::vector<at::Tensor> givenGrads;
    for (const at::Tensor &p : params)
      givenGrads.push_back(p.grad().clone());
    StepInputs inputs;
    inputs.lr = 1e-2 * (step + 1);
    inputs.foundInf = at::full({1}, skip ? 1.0 : 0.0, floats);
    if (c.clip) {
      // A norm that clips (factor ~0.37), not the true one: the kernel only
      // sees the factor.
      inputs.gradNorm = at::full({1}, 0.5 * std::sqrt(static_cast<double>(n0 + n1)),
                                 floats.dtype(at::kDouble));
      inputs.maxNorm = 0.37 * 0.5 * std::sqrt(static_cast<double>(n0 + n1));
    }
    kernel.step(inputs);
    aten.step(inputs);
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string at = what + ", step " + std::to_string(step) + ", param " +
                             std::to_string(i);
      EXPECT_TRUE(bitEqual(params[i].grad(), givenGrads[i])) << at << ": the grad was written";
      if (skip) {
        EXPECT_TRUE(bitEqual(params[i], before[4 * i])) << at;
        EXPECT_TRUE(bitEqual(kernel.expAvg(i), before[4 * i + 1])) << at;
        EXPECT_TRUE(bitEqual(kernel.expAvgSq(i), before[4 * i + 2])) << at;
        EXPECT_TRUE(bitEqual(copies[i], before[4 * i + 3])) << at;
      } else {
        EXPECT_FALSE(bitEqual(params[i], before[4 * i])) << at << ": nothing was updated";
      }
      // AdamW's moments do not read the parameter: bit-exact. Adam's (L2)
      // read g + wd * p, which nvcc may round once (fma) or twice: within 2
      // ulps of the largest moment (elementwise ulps are unbounded where
      // the sum cancels to nearly 0), and so the params within 2 ulps of
      // the largest param (the GPU measured 6 elementwise ulps at step 3).
      const double pUlps = c.decoupled ? maxUlps(params[i], reference[i])
                                       : ulpsOfLargest(params[i], reference[i]);
      const double mUlps = c.decoupled ? maxUlps(kernel.expAvg(i), aten.expAvg(i))
                                       : ulpsOfLargest(kernel.expAvg(i), aten.expAvg(i));
      const double vUlps = c.decoupled ? maxUlps(kernel.expAvgSq(i), aten.expAvgSq(i))
                                       : ulpsOfLargest(kernel.expAvgSq(i), aten.expAvgSq(i));
      EXPECT_LE(pUlps, 2) << at << ": params";
      EXPECT_LE(mUlps, c.decoupled ? 0 : 2) << at << ": exp_avg";
      EXPECT_LE(vUlps, c.decoupled ? 0 : 2) << at << ": exp_avg_sq";
      if (pUlps + mUlps + vUlps > 0)
        std::cout << "[ note ] " << at << ": " << pUlps << "/" << mUlps << "/" << vUlps
                  << " ulps (param/exp_avg/exp_avg_sq" << (c.decoupled ? "" : ": of the largest moment")
                  << ")\n";
      // The padding (no member) is in no piece: left alone by both.
      EXPECT_TRUE(bitEqual(params[i].narrow(0, sizes[i] - (i == 0 ? 5 : 0), i == 0 ? 5 : 0),
                           reference[i].narrow(0, sizes[i] - (i == 0 ? 5 : 0), i == 0 ? 5 : 0)))
          << at;
      EXPECT_TRUE(bitEqual(copies[i].narrow(0, 0, sizes[i] - (i == 0 ? 5 : 0)),
                           params[i].narrow(0, 0, sizes[i] - (i == 0 ? 5 : 0)).to(c.copy)))
          << at << ": the copy is not the master rounded";
      EXPECT_TRUE(bitEqual(kernel.state().tensors.at("step." + std::to_string(i)),
                           aten.state().tensors.at("step." + std::to_string(i))))
          << at;
    }
  }
}

} // namespace

TEST(AdamCuda, MatchesFusedAdamWAndAdam) {
  if (!at::hasCUDA())
    GTEST_SKIP() << "no CUDA device";
  for (bool decoupled : {true, false})
    for (at::ScalarType grad : {at::kBFloat16, at::kHalf, at::kFloat})
      for (int64_t divisor : {int64_t{1}, int64_t{3}, int64_t{4}})
        compareWithAten(Case{decoupled, grad, at::kBFloat16, divisor, divisor == 3, 0, 0});
  // fp16 copies, and misaligned views. (Every case has pieces at odd
  // offsets of aligned buffers: a scalar head, then vectors. Params off by
  // 1 or 3 elements while their moments, made by the optimizer, are
  // aligned, or grads and copies off by another offset than the params:
  // scalar throughout.)
  compareWithAten(Case{true, at::kHalf, at::kHalf, 2, true, 0, 0});
  compareWithAten(Case{true, at::kBFloat16, at::kBFloat16, 2, true, 1, 1});
  compareWithAten(Case{true, at::kBFloat16, at::kHalf, 1, false, 3, 3});
  compareWithAten(Case{false, at::kBFloat16, at::kBFloat16, 4, true, 0, 1});
  compareWithAten(Case{true, at::kFloat, at::kBFloat16, 3, true, 2, 1});
}

TEST(AdamCuda, MatchesAtenFusedAdamWCalledDirectly) {
  if (!at::hasCUDA())
    GTEST_SKIP() << "no CUDA device";
  // One whole param, no layout: the kernel against at::_fused_adamw_ as
  // torch.optim.AdamW(fused=True) calls it (step count incremented first,
  // grad_scale = 1 / the clip factor).
  const at::Device cuda(at::kCUDA, 0);
  const int64_t n = 100003;
  at::Tensor init = bmt::test::randomTensor({n}, at::kFloat, 7).to(cuda);
  at::Tensor p = init.clone(), copy = init.to(at::kBFloat16);
  AdamWConfig config;
  config.weightDecay = 0.05;
  AdamW kernel({p}, config);
  ASSERT_TRUE(kernel.writeLowPrecisionCopies({{0, copy, 2}}));
  at::Tensor q = init.clone(), m = at::zeros_like(q), v = at::zeros_like(q);
  at::Tensor stepCount = at::zeros({}, q.options());
  for (int step = 0; step < 2; ++step) {
    at::Tensor sum = bmt::test::randomTensor({n}, at::kBFloat16, 50 + step, 2.0).to(cuda);
    p.mutable_grad() = sum;
    at::Tensor grad = sum.to(at::kFloat).div_(2.0);
    at::Tensor norm = at::full({1}, 400.0, q.options().dtype(at::kDouble));
    kernel.step({1e-3, std::nullopt, std::nullopt, norm, 100.0});
    stepCount.add_(1);
    at::Tensor gradScale = clipFactor(norm, 100.0).reciprocal().to(at::kFloat).reshape({});
    at::_fused_adamw_({q}, {grad}, {m}, {v}, {}, {stepCount}, 1e-3, config.beta1, config.beta2,
                      config.weightDecay, config.eps, false, false, gradScale, std::nullopt);
    EXPECT_LE(maxUlps(p, q), 2) << "step " << step;
    EXPECT_EQ(maxUlps(kernel.expAvg(0), m), 0) << "step " << step;
    EXPECT_EQ(maxUlps(kernel.expAvgSq(0), v), 0) << "step " << step;
    EXPECT_TRUE(bitEqual(copy, p.to(at::kBFloat16))) << "step " << step;
  }
}

TEST(AdamCuda, ParamsWithoutCopiesStayOnAtenInTheSameStep) {
  if (!at::hasCUDA())
    GTEST_SKIP() << "no CUDA device";
  // p0 has a copy (the kernel), p1 none (ATen's kernel, bit-equal to the
  // reference); in the second step p0 has no gradient: it, its copy and its
  // step count stay as they are, as torch.optim skips it.
  const at::Device cuda(at::kCUDA, 0);
  at::Tensor p0 = bmt::test::randomTensor({4099}, at::kFloat, 60).to(cuda), p1 =
      bmt::test::randomTensor({33, 7}, at::kFloat, 61).to(cuda);
  at::Tensor r0 = p0.clone(), r1 = p1.clone(), copy = p0.to(at::kHalf);
  AdamWConfig config;
  AdamW kernel({p0, p1}, config), aten({r0, r1}, config);
  ASSERT_TRUE(kernel.writeLowPrecisionCopies({{0, copy, 1}}));
  for (int step = 0; step < 3; ++step) {
    at::Tensor before = p0.clone(), copyBefore = copy.clone();
    if (step == 1) {
      p0.mutable_grad() = at::Tensor();
      r0.mutable_grad() = at::Tensor();
    } else {
      p0.mutable_grad() = bmt::test::randomTensor({4099}, at::kHalf, 70 + step).to(cuda);
      r0.mutable_grad() = p0.grad().to(at::kFloat);
    }
    p1.mutable_grad() = bmt::test::randomTensor({33, 7}, at::kFloat, 80 + step).to(cuda);
    r1.mutable_grad() = p1.grad().clone();
    kernel.step(1e-2);
    aten.step(1e-2);
    EXPECT_TRUE(bitEqual(p1, r1)) << "step " << step;
    EXPECT_TRUE(bitEqual(kernel.expAvg(1), aten.expAvg(1))) << "step " << step;
    EXPECT_LE(maxUlps(p0, r0), 2) << "step " << step;
    EXPECT_EQ(maxUlps(kernel.expAvg(0), aten.expAvg(0)), 0) << "step " << step;
    EXPECT_TRUE(bitEqual(copy, p0.to(at::kHalf))) << "step " << step;
    EXPECT_TRUE(bitEqual(kernel.state().tensors.at("step.0"), aten.state().tensors.at("step.0")));
    if (step == 1) {
      EXPECT_TRUE(bitEqual(p0, before));
      EXPECT_TRUE(bitEqual(copy, copyBefore));
    }
  }
  // A copy-owning param's grad of another dtype is refused.
  p0.mutable_grad() = at::zeros({4099}, p0.options().dtype(at::kDouble));
  EXPECT_THROW(kernel.step(1e-2), std::invalid_argument);
}

TEST(AdamLowPrecision, CpuKeepsTheAtenPath) {
  // Without CUDA (or the runtime's kernels) the offer is refused and the
  // step is ATen's, on float32 gradients as before; the copy is not written.
  at::Tensor p = bmt::test::randomTensor({37}, at::kFloat, 1), ref = p.clone();
  at::Tensor copy = at::zeros({37}, at::kBFloat16);
  AdamW opt({p}, AdamWConfig{}), plain({ref}, AdamWConfig{});
  EXPECT_FALSE(opt.writeLowPrecisionCopies({{0, copy, 2}}));
  p.mutable_grad() = bmt::test::randomTensor({37}, at::kFloat, 2);
  ref.mutable_grad() = p.grad().clone();
  opt.step(1e-2);
  plain.step(1e-2);
  EXPECT_TRUE(bitEqual(p, ref));
  EXPECT_TRUE(bitEqual(copy, at::zeros({37}, at::kBFloat16)));
  // Other optimizers never take copies.
  auto sgd = makeDeviceOptimizer({ref}, {}, OptimizerConfig{OptimizerKind::SGD}, nullptr);
  EXPECT_FALSE(sgd->writeLowPrecisionCopies({{0, copy, 1}}));
}

TEST(AdamLowPrecision, RejectsCopiesThatDoNotFit) {
  at::Tensor p = at::zeros({8}), q = at::zeros({8}, at::kDouble);
  AdamW opt({p, q}, AdamWConfig{});
  at::Tensor bf16 = at::zeros({8}, at::kBFloat16);
  EXPECT_THROW(opt.writeLowPrecisionCopies({{2, bf16, 1}}), std::invalid_argument); // no param 2
  EXPECT_THROW(opt.writeLowPrecisionCopies({{0, bf16, 1}, {0, bf16, 1}}), std::invalid_argument);
  EXPECT_THROW(opt.writeLowPrecisionCopies({{1, bf16, 1}}), std::invalid_argument); // float64 param
  EXPECT_THROW(opt.writeLowPrecisionCopies({{0, at::zeros({8}), 1}}), std::invalid_argument);
  EXPECT_THROW(opt.writeLowPrecisionCopies({{0, at::zeros({7}, at::kBFloat16), 1}}),
               std::invalid_argument);
  EXPECT_THROW(opt.writeLowPrecisionCopies({{0, at::zeros({16}, at::kHalf).slice(0, 0, 16, 2), 1}}),
               std::invalid_argument); // not contiguous
  EXPECT_THROW(opt.writeLowPrecisionCopies({{0, bf16, 0}}), std::invalid_argument);
  EXPECT_THROW(opt.writeLowPrecisionCopies({{0, at::Tensor(), 1}}), std::invalid_argument);
}

TEST(AdamLowPrecision, AtenHookServesCopiesOnTheCpu) {
  // BMT_DEBUG_ADAM_COPIES=aten (the CPU tests' way into ZeroStorage's side):
  // the grad is a bf16 sum over 3 ranks, the result that of ATen's step on
  // its float32 average (x * (1.0f / 3), as ATen's CUDA div_ computes it),
  // the copy the master rounded; a skipped step changes neither.
  ::setenv("BMT_DEBUG_ADAM_COPIES", "aten", 1);
  at::Tensor p = bmt::test::randomTensor({301}, at::kFloat, 3), ref = p.clone();
  at::Tensor copy = p.to(at::kBFloat16);
  AdamWConfig config;
  AdamW opt({p}, config), plain({ref}, config);
  const bool taken = opt.writeLowPrecisionCopies({{0, copy, 3}});
  ::unsetenv("BMT_DEBUG_ADAM_COPIES");
  ASSERT_TRUE(taken);
  for (int step = 0; step < 3; ++step) {
    at::Tensor sum = bmt::test::randomTensor({301}, at::kBFloat16, 20 + step, 3.0);
    p.mutable_grad() = sum;
    ref.mutable_grad() = sum.to(at::kFloat).mul(1.0f / 3.0f);
    at::Tensor before = copy.clone();
    at::Tensor skip = at::full({1}, step == 1 ? 1.0 : 0.0);
    opt.step(1e-2, skip);
    plain.step(1e-2, skip);
    EXPECT_TRUE(bitEqual(p, ref)) << "step " << step;
    EXPECT_TRUE(bitEqual(copy, p.to(at::kBFloat16))) << "step " << step;
    if (step == 1)
      EXPECT_TRUE(bitEqual(copy, before));
    else
      EXPECT_FALSE(bitEqual(copy, before));
  }
  // A grad of another dtype or size is refused before anything changes.
  at::Tensor steps = opt.state().tensors.at("step.0").clone(), params = p.clone();
  p.mutable_grad() = at::zeros({301}, at::kDouble);
  EXPECT_THROW(opt.step(1e-2), std::invalid_argument);
  p.mutable_grad() = at::zeros({300}, at::kBFloat16);
  EXPECT_THROW(opt.step(1e-2), std::invalid_argument);
  EXPECT_TRUE(bitEqual(opt.state().tensors.at("step.0"), steps));
  EXPECT_TRUE(bitEqual(p, params));
}
