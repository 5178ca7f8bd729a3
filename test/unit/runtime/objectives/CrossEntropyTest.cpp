//===- CrossEntropyTest.cpp - the loss against ATen's cross_entropy ------===//
//
// crossEntropy() (fused CUDA kernels on a GPU) against
// at::cross_entropy_loss on float32 copies of the same logits: loss and
// the gradient of the logits, for float32/bfloat16/float16, vocab sizes
// that take the vectorized and the scalar paths, ignored labels and a
// row stride larger than the vocab. The CUDA cases skip without a GPU.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/objectives/CrossEntropy.h"

#include <ATen/Context.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>

namespace {

using bmt::runtime::crossEntropy;
using bmt::runtime::fusedCrossEntropyApplies;

struct Case {
  at::ScalarType dtype;
  int64_t rows, vocab, pad; // pad: extra columns per row (stride = vocab + pad)
};

/// Loss and logits gradient of crossEntropy and of ATen on float32 copies.
void compare(const Case &c, at::Device device) {
  SCOPED_TRACE(std::string(c10::toString(c.dtype)) + " rows " + std::to_string(c.rows) +
               " vocab " + std::to_string(c.vocab) + " pad " + std::to_string(c.pad));
  at::manual_seed(1);
  at::TensorOptions options = at::TensorOptions().device(device);
  at::Tensor wide = at::randn({c.rows, c.vocab + c.pad}, options.dtype(at::kFloat)).mul(3);
  at::Tensor base = wide.to(c.dtype);
  at::Tensor logits = base.narrow(1, 0, c.vocab).detach().requires_grad_(true);
  at::Tensor labels = at::randint(0, c.vocab, {c.rows}, options.dtype(at::kLong));
  labels[0].fill_(-100); // ignored rows
  labels[3].fill_(-100);
  at::Tensor reference = logits.detach().to(at::kFloat).requires_grad_(true);

  at::Tensor loss = crossEntropy(logits, labels);
  at::Tensor expected = at::cross_entropy_loss(reference, labels, {}, at::Reduction::Mean, -100);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-5 * expected.item<double>());

  torch::autograd::backward({loss.mul(2.5)});
  torch::autograd::backward({expected.mul(2.5)});
  ASSERT_TRUE(logits.grad().defined());
  EXPECT_EQ(logits.grad().scalar_type(), c.dtype);
  at::Tensor got = logits.grad().to(at::kFloat), want = reference.grad();
  const double scale = want.abs().max().item<double>();
  // float32: rounding only; 16-bit: the gradient is rounded to its dtype.
  const double tol = c.dtype == at::kFloat ? 1e-6 : (c.dtype == at::kBFloat16 ? 8e-3 : 1e-3);
  EXPECT_LE(got.sub(want).abs().max().item<double>(), tol * scale);
  EXPECT_EQ(got[0].abs().max().item<double>(), 0.0); // ignored row
}

TEST(CrossEntropy, MatchesAtenOnCuda) {
  if (!at::hasCUDA())
    GTEST_SKIP() << "no CUDA device";
  at::Device cuda(at::kCUDA, 0);
  EXPECT_TRUE(fusedCrossEntropyApplies(at::randn({2, 3}, at::TensorOptions().device(cuda))));
  for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf})
    for (Case c : {Case{t, 64, 50304, 0}, Case{t, 33, 1000, 0}, Case{t, 17, 997, 0},
                   Case{t, 9, 512, 8}, Case{t, 5, 7, 0}})
      compare(c, cuda);
}

TEST(CrossEntropy, CpuIsAtenOnFloat32) {
  at::Device cpu(at::kCPU);
  EXPECT_FALSE(fusedCrossEntropyApplies(at::randn({2, 3})));
  compare(Case{at::kFloat, 16, 101, 0}, cpu);
  compare(Case{at::kBFloat16, 16, 101, 3}, cpu);
}

TEST(CrossEntropy, RejectsBadShapes) {
  EXPECT_THROW(crossEntropy(at::randn({2, 3, 4}), at::zeros({2}, at::kLong)),
               std::invalid_argument);
  EXPECT_THROW(crossEntropy(at::randn({2, 3}), at::zeros({3}, at::kLong)), std::invalid_argument);
  EXPECT_THROW(crossEntropy(at::randn({2, 3}), at::zeros({2}, at::kInt)), std::invalid_argument);
}

} // namespace
