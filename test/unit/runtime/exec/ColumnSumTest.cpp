//===- ColumnSumTest.cpp - sums over the rows of a matrix ------------------===//
//
// columnSum (bmt/Runtime/exec/ColumnSum.h): the bias gradients of linear
// layers and the column partials of fused row kernels (float32 partials
// rounded to the weight's dtype). ColumnSum.* run everywhere (the refusal
// of other ranks). ColumnSumCuda.* (skipped without a CUDA device) check
// the runtime's kernel against float64 sums of the same values, for the shapes GPT-2 1.3 B and
// the fused kernels give it (one range of rows and split rows), widths that
// are not a multiple of the vector width, an unaligned start, bf16 / fp16 /
// fp32 in, each to bf16 / fp16 / fp32 out. Bounds: a float32 sum of n
// terms in any order is within gamma_(n-1) * sum |x| of the exact sum,
// gamma_k = k u / (1 - k u), u = 2^-24 (Higham, Accuracy and Stability of
// Numerical Algorithms, 2nd ed., eq. 4.4); a low-precision result is
// that sum rounded once, so within half an ulp of its dtype more. Two calls
// give the same bits (a fixed order).
//
//===----------------------------------------------------------------------===//

#include "RandomTensor.h"

#include "bmt/Runtime/exec/ColumnSum.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <tuple>
#include <vector>

using namespace bmt::runtime;

namespace {

/// Half an ulp of `dtype` at magnitudes up to v >= 0 (elementwise), float64.
at::Tensor halfUlp(const at::Tensor &v, at::ScalarType dtype) {
  const int mantissa = dtype == at::kBFloat16 ? 8 : dtype == at::kHalf ? 11 : 24;
  at::Tensor e = at::floor(at::log2(v.clamp_min(1e-30)));
  return at::pow(2.0, e - mantissa);
}

void expectClose(const at::Tensor &x, at::ScalarType outType, const char *what) {
  at::Tensor got = columnSum(x, outType);
  ASSERT_EQ(got.scalar_type(), outType) << what;
  ASSERT_EQ(got.sizes(), at::IntArrayRef({x.size(1)})) << what;
  at::Tensor xd = x.to(at::kCPU, at::kDouble);
  at::Tensor exact = xd.sum(0);
  const double n = static_cast<double>(x.size(0));
  const double u = std::ldexp(1.0, -24), gamma = (n - 1) * u / (1 - (n - 1) * u);
  at::Tensor accumulation = gamma * xd.abs().sum(0);
  at::Tensor bound = accumulation + halfUlp(exact.abs() + accumulation, outType);
  at::Tensor err = (got.to(at::kCPU, at::kDouble) - exact).abs();
  EXPECT_TRUE(err.le(bound).all().item<bool>())
      << what << ": worst error / bound " << (err / bound).max().item<double>();
  at::Tensor again = columnSum(x, outType);
  EXPECT_TRUE(at::equal(got, again)) << what << ": two calls differ";
}

} // namespace

TEST(ColumnSum, RejectsOtherRanks) {
  EXPECT_THROW(columnSum(at::zeros({2, 3, 4}), at::kFloat), std::runtime_error);
  EXPECT_THROW(columnSum(at::zeros({4}), at::kFloat), std::runtime_error);
}

TEST(ColumnSumCuda, MatchesFloat64Sums) {
  if (!at::hasCUDA())
    GTEST_SKIP() << "no CUDA device";
  const std::vector<std::tuple<int64_t, int64_t>> shapes = {
      {8192, 2048}, {8192, 6144}, {528, 2048}, {528, 4096}, {1000, 37}, {3, 5}, {1, 8}, {4097, 264}};
  for (auto [rows, cols] : shapes)
    for (at::ScalarType in : {at::kBFloat16, at::kHalf, at::kFloat})
      for (at::ScalarType out : {at::kBFloat16, at::kHalf, at::kFloat}) {
        at::Tensor x = bmt::test::randomTensor({rows, cols}, in, rows * 131 + cols, 2.0).cuda();
        std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " +
                           c10::toString(in) + " -> " + c10::toString(out);
        expectClose(x, out, what.c_str());
      }
}

TEST(ColumnSumCuda, UnalignedAndStrided) {
  if (!at::hasCUDA())
    GTEST_SKIP() << "no CUDA device";
  at::Tensor flat = bmt::test::randomTensor({2 * 1024 * 256 + 1}, at::kBFloat16, 7).cuda();
  // Contiguous, 2 bytes past a 16-byte boundary: scalar loads.
  expectClose(flat.narrow(0, 1, 2048 * 256).view({2048, 256}), at::kBFloat16, "unaligned");
  // Not contiguous: ATen's sum.
  at::Tensor x = flat.narrow(0, 0, 2048 * 256).view({256, 2048}).t();
  expectClose(x, at::kBFloat16, "transposed");
}
