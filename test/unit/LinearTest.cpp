//===- LinearTest.cpp - the linear layer with its bias gradient from the GEMM ===//
//
// ops::linearWithBias (runtime/ops/Linear.cpp) against ATen's aten::addmm and
// aten::linear with autograd on the same bf16 / fp16 tensors. LinearCuda.*
// (skipped without a CUDA device) checks that the backward took the
// cuBLASLt epilogue, that the output and the input gradient equal ATen's to
// the bit (the same ATen calls), and that the weight and bias gradients are
// as close to float64 sums of the same values as ATen's are: within twice
// ATen's largest error plus one ulp of the largest value (the GEMM may take
// another algorithm, so another order of float32 additions, before the one
// rounding to bf16 / fp16). Linear.* runs everywhere: the arguments it
// refuses.
//
//===----------------------------------------------------------------------===//

#include "RandomTensor.h"

#include "bmt/Runtime/ops/Linear.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

using bmt::runtime::ops::linearStats;
using bmt::runtime::ops::linearWithBias;
using bmt::runtime::ops::WeightLayout;
using bmt::test::randomTensor;

namespace {

/// The spacing of `dtype` at the magnitude `v`.
double ulp(at::ScalarType dtype, double v) {
  const int mantissa = dtype == at::kBFloat16 ? 7 : 10;
  return std::ldexp(1.0, std::ilogb(std::max(v, 1e-30)) - mantissa);
}

double maxAbs(const at::Tensor &t) { return t.abs().max().item<double>(); }

/// Checks one layout, dtype and shape (x [..., in], out features).
void compare(WeightLayout layout, at::ScalarType dtype, std::vector<int64_t> xShape,
             int64_t out) {
  const int64_t in = xShape.back();
  at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA);
  auto leaf = [&](at::IntArrayRef shape, uint64_t seed, double scale) {
    return randomTensor(shape, dtype, seed, scale).to(cuda).requires_grad_(true);
  };
  at::Tensor x = leaf(xShape, 1, 1.0);
  at::Tensor w = layout == WeightLayout::InOut ? leaf({in, out}, 2, 0.05) : leaf({out, in}, 2, 0.05);
  at::Tensor b = leaf({out}, 3, 0.1);
  std::vector<int64_t> yShape = xShape;
  yShape.back() = out;
  at::Tensor gy = randomTensor(yShape, dtype, 4).to(cuda);

  const int64_t before = linearStats().epilogue;
  std::optional<at::Tensor> y = linearWithBias(x, w, b, layout);
  ASSERT_TRUE(y.has_value());
  y->backward(gy);
  EXPECT_EQ(linearStats().epilogue, before + 1) << "the backward fell back to mm + sum";

  at::Tensor xr = x.detach().clone().requires_grad_(true);
  at::Tensor wr = w.detach().clone().requires_grad_(true);
  at::Tensor br = b.detach().clone().requires_grad_(true);
  at::Tensor yr = layout == WeightLayout::InOut
                      ? at::addmm(br, xr.view({-1, in}), wr).view(yShape)
                      : at::linear(xr, wr, br);
  yr.backward(gy);

  EXPECT_TRUE(at::equal(*y, yr)) << "forward";
  EXPECT_TRUE(at::equal(x.grad(), xr.grad())) << "input gradient";

  // float64 sums of the same (rounded) values.
  at::Tensor x64 = x.detach().to(at::kDouble).view({-1, in});
  at::Tensor g64 = gy.to(at::kDouble).view({-1, out});
  at::Tensor dw64 = layout == WeightLayout::InOut ? x64.t().mm(g64) : g64.t().mm(x64);
  at::Tensor db64 = g64.sum(0);
  auto check = [&](const char *name, const at::Tensor &ours, const at::Tensor &aten,
                   const at::Tensor &exact) {
    const double errOurs = maxAbs(ours.to(at::kDouble) - exact);
    const double errAten = maxAbs(aten.to(at::kDouble) - exact);
    const double bound = 2 * errAten + ulp(dtype, maxAbs(exact));
    std::cout << "[ note ] " << name << (layout == WeightLayout::InOut ? " addmm " : " linear ")
              << c10::toString(dtype) << " " << x64.size(0) << "x" << in << "x" << out
              << ": max error " << errOurs << " (ATen " << errAten << ", bound " << bound
              << ")\n";
    EXPECT_LE(errOurs, bound) << name;
  };
  check("weight gradient", w.grad(), wr.grad(), dw64);
  check("bias gradient", b.grad(), br.grad(), db64);
}

} // namespace

TEST(Linear, RefusesWhatTheEpilogueDoesNotTake) {
  at::Tensor x = randomTensor({4, 16}, at::kBFloat16, 1);
  at::Tensor w = randomTensor({8, 16}, at::kBFloat16, 2);
  at::Tensor b = randomTensor({8}, at::kBFloat16, 3).requires_grad_(true);
  EXPECT_FALSE(linearWithBias(x, w, b, WeightLayout::OutIn)) << "a CPU tensor";
  if (!at::hasCUDA())
    return;
  at::TensorOptions cuda = at::TensorOptions().device(at::kCUDA);
  at::Tensor xc = x.to(cuda), wc = w.to(cuda), bc = b.detach().to(cuda).requires_grad_(true);
  EXPECT_FALSE(linearWithBias(xc.to(at::kFloat), wc.to(at::kFloat),
                              bc.detach().to(at::kFloat).requires_grad_(true), WeightLayout::OutIn))
      << "float32";
  EXPECT_FALSE(linearWithBias(xc, wc, bc.detach(), WeightLayout::OutIn)) << "no bias gradient";
  EXPECT_FALSE(linearWithBias(xc, wc, bc, WeightLayout::InOut)) << "W [out, in] given as [in, out]";
  EXPECT_FALSE(linearWithBias(xc.narrow(1, 0, 12), wc.narrow(1, 0, 12).contiguous(), bc,
                              WeightLayout::OutIn))
      << "12 input features (not a multiple of 8) and a strided x";
  {
    c10::NoGradGuard noGrad;
    EXPECT_FALSE(linearWithBias(xc, wc, bc, WeightLayout::OutIn)) << "grad mode off";
  }
  EXPECT_TRUE(linearWithBias(xc, wc, bc, WeightLayout::OutIn));
}

TEST(LinearCuda, GradientsAgreeWithAten) {
  if (!at::hasCUDA())
    GTEST_SKIP() << "no CUDA device";
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    // GPT-2's Conv1D (addmm, W [in, out]) and nn.Linear (W [out, in]),
    // 2-D and 3-D inputs, shapes of a 1.3 B GPT-2's layers at fewer tokens.
    compare(WeightLayout::InOut, dtype, {2048, 1024}, 3072);
    compare(WeightLayout::InOut, dtype, {1024, 2048}, 8192);
    compare(WeightLayout::OutIn, dtype, {4, 512, 1024}, 4096);
    compare(WeightLayout::OutIn, dtype, {1000, 256}, 72);
  }
}
