//===- MoeTest.cpp - MoeDispatch / MoeCombine against their definition ----===//

#include "exec/Moe.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <stdexcept>

using namespace bmt::runtime;

namespace {

/// T = 5 tokens, K = 2 of E = 4 experts each (expert 2 chosen by none).
struct Routed {
  at::Tensor hidden = at::randn({5, 3}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor ids = at::tensor({0, 3, 1, 0, 3, 1, 0, 1, 3, 0}, at::kLong).view({5, 2});
};

} // namespace

TEST(Moe, DispatchSortsTheTokenCopiesByExpert) {
  Routed r;
  moe::Dispatched d = moe::dispatch(r.hidden, r.ids, moe::allExperts(4));
  ASSERT_EQ(d.rows.sizes(), (at::IntArrayRef{10, 3}));
  EXPECT_EQ(d.offsets.scalar_type(), at::kInt);
  // Counts 4, 3, 0, 3: the ends of each expert's rows.
  EXPECT_TRUE(at::equal(d.offsets, at::tensor({4, 7, 7, 10}, at::kInt)));
  at::Tensor flat = r.ids.reshape({-1});
  for (int64_t i = 0; i < 10; ++i) {
    const int64_t copy = d.permutation[i].item<int64_t>(); // token copy t*K + k
    EXPECT_EQ(d.sortedIds[i].item<int64_t>(), flat[copy].item<int64_t>());
    EXPECT_TRUE(at::equal(d.rows[i], r.hidden[copy / 2]));
    if (i > 0)
      EXPECT_LE(d.sortedIds[i - 1].item<int64_t>(), d.sortedIds[i].item<int64_t>());
  }
}

TEST(Moe, CombineSumsEachTokensCopiesInTokenOrder) {
  Routed r;
  moe::Dispatched d = moe::dispatch(r.hidden, r.ids, moe::allExperts(4));
  // Scale row i by its expert + 1: token t gets hidden[t] * (sum over its
  // experts of (e + 1)).
  at::Tensor scaled = d.rows * (d.sortedIds + 1).unsqueeze(-1).to(at::kFloat);
  at::Tensor y = moe::combine(scaled, d.permutation, 2);
  at::Tensor factor = (r.ids + 1).sum(1).to(at::kFloat).unsqueeze(-1);
  EXPECT_TRUE(at::allclose(y, r.hidden * factor, 1e-6, 1e-6));
}

TEST(Moe, GradientsFlowBackToTheHiddenStates) {
  Routed r;
  at::Tensor hidden = r.hidden.clone().requires_grad_(true);
  moe::Dispatched d = moe::dispatch(hidden, r.ids, moe::allExperts(4));
  moe::combine(d.rows, d.permutation, 2).sum().backward();
  // Each token is copied K = 2 times and summed back: d/dhidden = 2.
  EXPECT_TRUE(at::equal(hidden.grad(), at::full({5, 3}, 2.0f)));
}

/// The gradients of dispatch and combine (gathers that differentiate as
/// permutations) against ATen's autograd of the ops they replace (index
/// with an accumulating backward), K = 2 and 3, random per-row scales
/// between them so that every row's gradient differs.
TEST(Moe, GradientsEqualAtensIndexBackward) {
  for (int64_t k : {2, 3}) {
    at::manual_seed(k);
    at::Tensor x = at::randn({6, 4});
    at::Tensor ids = at::randint(0, 5, {6, k}, at::kLong);
    at::Tensor scale = at::randn({6 * k, 1});
    at::Tensor gradOut = at::randn({6, 4});

    at::Tensor hidden = x.clone().requires_grad_(true);
    moe::Dispatched d = moe::dispatch(hidden, ids, moe::allExperts(5));
    at::Tensor rows = d.rows.detach().requires_grad_(true);
    moe::combine(rows * scale, d.permutation, k).backward(gradOut);
    d.rows.backward(rows.grad());

    // The unlowered program: index, inverse by index_put_, index, view, sum.
    at::Tensor refHidden = x.clone().requires_grad_(true);
    auto [sorted, perm] = at::sort(ids.reshape({-1}), -1, false);
    at::Tensor refRows = at::index(refHidden, c10::List<std::optional<at::Tensor>>(
                                                  {at::floor_divide(perm, k)}));
    at::Tensor inverse = at::empty_like(perm);
    inverse.index_put_(c10::List<std::optional<at::Tensor>>({perm}), at::arange(6 * k), false);
    at::Tensor refRowsLeaf = refRows.detach().requires_grad_(true);
    at::index(refRowsLeaf * scale, c10::List<std::optional<at::Tensor>>({inverse}))
        .view({6, k, 4}).sum({1}, false).backward(gradOut);
    refRows.backward(refRowsLeaf.grad());

    // Combine's gradient is a gather (no sum): equal bit for bit.
    EXPECT_TRUE(at::equal(rows.grad(), refRowsLeaf.grad())) << "K = " << k;
    // Dispatch's sums each token's K copies, in order of k rather than of
    // the sorted rows: equal for K = 2, to rounding for K = 3.
    if (k == 2)
      EXPECT_TRUE(at::equal(hidden.grad(), refHidden.grad()));
    else
      EXPECT_TRUE(at::allclose(hidden.grad(), refHidden.grad(), 1e-6, 1e-6));
  }
}

TEST(Moe, ExpertParallelismAndBadShapesAreRefused) {
  Routed r;
  EXPECT_THROW(moe::dispatch(r.hidden, r.ids, moe::ExpertRange{0, 2, 4}), std::invalid_argument);
  EXPECT_THROW(moe::dispatch(r.hidden, r.ids.to(at::kInt), moe::allExperts(4)),
               std::invalid_argument);
  EXPECT_THROW(moe::combine(r.hidden, at::arange(5, at::kLong), 2), std::invalid_argument);
}

TEST(Moe, ExpertLoadSumsEachLayersCountsOverTheStep) {
  Routed r;
  moe::Dispatched d = moe::dispatch(r.hidden, r.ids, moe::allExperts(4));
  EXPECT_TRUE(at::equal(d.counts.to(at::kLong), at::tensor({4, 3, 0, 3}, at::kLong)));
  moe::ExpertLoad load;
  EXPECT_TRUE(load.empty());
  EXPECT_FALSE(load.flat().defined());
  load.add(7, d.counts);                             // layer "7", first forward
  load.add(3, at::tensor({1, 1, 1, 1}, at::kFloat)); // layer "3"
  load.add(7, d.counts);                             // layer "7" again: the next micro-batch
  at::Tensor flat = load.flat();
  EXPECT_EQ(flat.scalar_type(), at::kDouble);
  // In the order the layers first dispatched.
  EXPECT_TRUE(at::equal(flat, at::tensor({8, 6, 0, 6, 1, 1, 1, 1}, at::kDouble)));
  load.beginStep();
  EXPECT_TRUE(load.empty());
}
