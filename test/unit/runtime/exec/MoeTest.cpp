//===- MoeTest.cpp - MoeDispatch / MoeCombine against their definition ----===//

#include "exec/Moe.h"

#include "CpuRanks.h"
#include "bmt/Runtime/comm/Comm.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <mutex>
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

TEST(Moe, ExpertRangesThatDoNotFitAndBadShapesAreRefused) {
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

namespace {

/// An expert layer as transformers' grouped_mm experts compute it:
/// dispatch, one grouped matmul over all E experts' weights, the routing
/// weights multiplied, combine. Over `group` (expert parallelism) or all
/// local (group null).
at::Tensor expertLayer(const at::Tensor &hidden, const at::Tensor &ids, const at::Tensor &weights,
                       const at::Tensor &w, bmt::runtime::Comm *group) {
  const int64_t e = w.size(0);
  moe::ExpertRange range = group ? moe::expertsOfRank(e, group->size(), group->rank())
                                 : moe::allExperts(e);
  moe::Dispatched d = moe::dispatch(hidden, ids, range, group, weights);
  at::Tensor out = at::_grouped_mm(d.rows, w, d.offsets) * d.weights.unsqueeze(-1);
  return moe::combine(out, d.permutation, ids.size(-1), d.exchange.get());
}

/// Rank r's tokens: T = 3 + r, K = 2 of E = 4 experts; rank 1 routes
/// nothing to experts 2 and 3 (so at P = 2 it sends rank 1 nothing).
struct RankTokens {
  at::Tensor hidden, ids, weights;
  explicit RankTokens(int64_t r) {
    at::manual_seed(100 + r);
    const int64_t t = 3 + r;
    hidden = at::randn({t, 8}); // _grouped_mm: rows of a multiple of 16 bytes
    ids = r == 1 ? at::tensor({0, 1, 1, 0, 0, 1, 1, 0}, at::kLong).view({4, 2})
                 : at::stack({at::arange(t, at::kLong) % 4, (at::arange(t, at::kLong) + 1 + r) % 4}, 1);
    weights = at::rand({t, 2});
  }
};

} // namespace

class MoeExpertParallel : public ::testing::TestWithParam<int64_t> {};

/// Each rank's layer output, and the gradients of its tokens and routing
/// weights, equal the all-local layer's on the same tokens; the experts'
/// weight gradients summed over the ranks equal the sum of the all-local
/// ones (each expert's rows reach only its rank, from every rank).
TEST_P(MoeExpertParallel, EqualsAllLocalExperts) {
  const int64_t n = GetParam();
  at::manual_seed(7);
  const at::Tensor weight = at::randn({4, 8, 4});
  at::Tensor localGradSum = at::zeros_like(weight), parallelGradSum = at::zeros_like(weight);
  std::mutex m;
  bmt::test::runRanks(n, [&](int64_t r, bmt::runtime::Comm &comm) {
    RankTokens a(r);
    // All local.
    at::Tensor h0 = a.hidden.clone().requires_grad_(true), g0 = a.weights.clone().requires_grad_(true);
    at::Tensor w0 = weight.clone().requires_grad_(true);
    at::Tensor y0 = expertLayer(h0, a.ids, g0, w0, nullptr);
    at::Tensor up = at::cos(at::arange(y0.numel(), at::kFloat)).view(y0.sizes());
    torch::autograd::backward({y0}, {up});
    // Expert parallel.
    at::Tensor h1 = a.hidden.clone().requires_grad_(true), g1 = a.weights.clone().requires_grad_(true);
    at::Tensor w1 = weight.clone().requires_grad_(true);
    at::Tensor y1 = expertLayer(h1, a.ids, g1, w1, &comm);
    torch::autograd::backward({y1}, {up});
    EXPECT_TRUE(at::allclose(y1, y0, 1e-6, 1e-6)) << "rank " << r;
    EXPECT_TRUE(at::allclose(h1.grad(), h0.grad(), 1e-6, 1e-6)) << "rank " << r;
    EXPECT_TRUE(at::allclose(g1.grad(), g0.grad(), 1e-6, 1e-6)) << "rank " << r;
    // Only this rank's experts get a gradient here.
    moe::ExpertRange own = moe::expertsOfRank(4, n, r);
    at::Tensor others = w1.grad().clone();
    others.narrow(0, own.first, own.count).zero_();
    EXPECT_EQ(others.abs().max().item<float>(), 0.0f) << "rank " << r;
    // Local weights (split over the expert group): this rank's experts
    // only, local offsets and ids; values and that slice's gradient as
    // with the whole weights.
    at::Tensor h2 = a.hidden.clone().requires_grad_(true), g2 = a.weights.clone().requires_grad_(true);
    at::Tensor w2 = weight.narrow(0, own.first, own.count).clone().requires_grad_(true);
    moe::ExpertRange mine = own;
    mine.localWeights = true;
    moe::Dispatched d = moe::dispatch(h2, a.ids, mine, &comm, g2);
    EXPECT_EQ(d.offsets.size(0), own.count);
    if (d.sortedIds.numel() > 0) {
      EXPECT_GE(d.sortedIds.min().item<int64_t>(), 0);
      EXPECT_LT(d.sortedIds.max().item<int64_t>(), own.count);
    }
    at::Tensor out = at::_grouped_mm(d.rows, w2, d.offsets) * d.weights.unsqueeze(-1);
    at::Tensor y2 = moe::combine(out, d.permutation, a.ids.size(-1), d.exchange.get());
    torch::autograd::backward({y2}, {up});
    EXPECT_TRUE(at::equal(y2, y1)) << "rank " << r;
    EXPECT_TRUE(at::equal(h2.grad(), h1.grad())) << "rank " << r;
    EXPECT_TRUE(at::equal(w2.grad(), w1.grad().narrow(0, own.first, own.count))) << "rank " << r;
    std::lock_guard<std::mutex> lock(m);
    localGradSum += w0.grad();
    parallelGradSum += w1.grad();
  });
  EXPECT_TRUE(at::allclose(parallelGradSum, localGradSum, 1e-5, 1e-5))
      << (parallelGradSum - localGradSum).abs().max().item<float>();
}

INSTANTIATE_TEST_SUITE_P(Ranks, MoeExpertParallel, ::testing::Values(2, 4),
                         [](const auto &info) { return "P" + std::to_string(info.param); });

TEST(MoeExpertParallelErrors, ExpertsThatDoNotDivideAndWrongRangesAreRefused) {
  EXPECT_THROW(moe::expertsOfRank(6, 4, 0), std::invalid_argument);
  bmt::test::runRanks(2, [&](int64_t r, bmt::runtime::Comm &comm) {
    RankTokens a(r);
    // Rank r computes experts [2r, 2r + 2) of 4, not all of them.
    EXPECT_THROW(moe::dispatch(a.hidden, a.ids, moe::allExperts(4), &comm), std::invalid_argument);
    moe::ExpertRange local = moe::allExperts(4);
    local.localWeights = true; // local weights without an expert group
    EXPECT_THROW(moe::dispatch(a.hidden, a.ids, local, nullptr), std::invalid_argument);
  });
}
