//===- SplitRuleTest.cpp - the split rule's index arithmetic ------------===//
//
// bmt/Plan/SplitRule.h against a reference that builds each TP rank's slice
// of the split dim element by element (pad with -1, cut into chunks, cut
// each chunk T ways, concatenate a rank's pieces), for T = 1, 2, 4.

#include "bmt/Plan/SplitRule.h"

#include <gtest/gtest.h>

#include <vector>

using bmt::TensorSplit;
namespace split = bmt::split;

namespace {

TensorSplit splitOf(int64_t dim, int64_t chunks, int64_t paddedSize = 0) {
  TensorSplit s;
  s.dim = dim;
  s.chunks = chunks;
  s.paddedSize = paddedSize;
  return s;
}

/// The global index of each local index of TP rank t's slice (-1: padding).
std::vector<int64_t> referenceSlice(int64_t size, int64_t padded, int64_t chunks, int64_t tp,
                                    int64_t t) {
  std::vector<int64_t> global(static_cast<size_t>(padded), -1);
  for (int64_t g = 0; g < size; ++g)
    global[static_cast<size_t>(g)] = g;
  std::vector<int64_t> local;
  const int64_t chunk = padded / chunks, piece = chunk / tp;
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t i = 0; i < piece; ++i)
      local.push_back(global[static_cast<size_t>(c * chunk + t * piece + i)]);
  return local;
}

/// Checks tpRanges, localToGlobal and globalToLocal against referenceSlice.
void checkAgainstReference(const TensorSplit &s, int64_t size, int64_t tp) {
  const int64_t padded = s.paddedSize ? s.paddedSize : size;
  ASSERT_EQ(split::check(s, 2, size, tp), "");
  std::vector<int64_t> owner(static_cast<size_t>(size), -1), at(static_cast<size_t>(size), -1);
  for (int64_t t = 0; t < tp; ++t) {
    std::vector<int64_t> ref = referenceSlice(size, padded, s.chunks, tp, t);
    ASSERT_EQ(static_cast<int64_t>(ref.size()), padded / tp);
    // tpRanges: every real element once, in local order, padding left out.
    std::vector<int64_t> fromRanges(ref.size(), -1);
    int64_t next = 0;
    for (const split::Range &r : split::tpRanges(s, size, tp, t)) {
      EXPECT_GE(r.local, next);
      EXPECT_GT(r.length, 0);
      for (int64_t i = 0; i < r.length; ++i)
        fromRanges[static_cast<size_t>(r.local + i)] = r.global + i;
      next = r.local + r.length;
    }
    EXPECT_EQ(fromRanges, ref) << "T " << tp << ", TP rank " << t;
    // localToGlobal: a run of data or of padding from every local index;
    // checked element by element at each run's start, and inside a run as
    // the same run cut shorter.
    split::Range run;
    for (int64_t j = 0; j < padded / tp; ++j) {
      split::Range r = split::localToGlobal(s, size, tp, t, j);
      ASSERT_EQ(r.local, j);
      ASSERT_GT(r.length, 0);
      if (j < run.local + run.length) {
        ASSERT_EQ(r.global, run.global + (j - run.local)) << "T " << tp << ", local " << j;
        ASSERT_EQ(r.length, run.length - (j - run.local)) << "T " << tp << ", local " << j;
        continue;
      }
      run = r;
      for (int64_t i = 0; i < r.length; ++i) {
        const int64_t want = ref[static_cast<size_t>(j + i)];
        if (r.global < size)
          ASSERT_EQ(want, r.global + i) << "T " << tp << ", TP rank " << t << ", local " << j;
        else
          ASSERT_EQ(want, -1) << "T " << tp << ", TP rank " << t << ", local " << j;
      }
    }
    for (size_t j = 0; j < ref.size(); ++j)
      if (ref[j] >= 0) {
        owner[static_cast<size_t>(ref[j])] = t;
        at[static_cast<size_t>(ref[j])] = static_cast<int64_t>(j);
      }
  }
  // globalToLocal: the inverse, over every real global index (each run
  // checked element by element at its start, as above).
  split::Location run;
  for (int64_t g = 0; g < size; ++g) {
    split::Location l = split::globalToLocal(s, size, tp, g);
    ASSERT_EQ(l.tpRank, owner[static_cast<size_t>(g)]) << "global " << g;
    ASSERT_EQ(l.range.local, at[static_cast<size_t>(g)]) << "global " << g;
    ASSERT_EQ(l.range.global, g);
    ASSERT_GT(l.range.length, 0);
    if (g < run.range.global + run.range.length) {
      ASSERT_EQ(l.range.length, run.range.length - (g - run.range.global)) << "global " << g;
      continue;
    }
    run = l;
    ASSERT_LE(g + l.range.length, size);
    for (int64_t i = 0; i < l.range.length; ++i) {
      ASSERT_EQ(owner[static_cast<size_t>(g + i)], l.tpRank);
      ASSERT_EQ(at[static_cast<size_t>(g + i)], l.range.local + i);
    }
  }
}

} // namespace

TEST(SplitRule, RowSplitAtOneTwoFourRanks) {
  for (int64_t tp : {1, 2, 4})
    checkAgainstReference(splitOf(0, 1), 64, tp);
}

TEST(SplitRule, FusedQkvAtOneTwoFourRanks) {
  // GPT-2's c_attn: 3 x hidden columns, each of q, k, v cut T ways.
  for (int64_t tp : {1, 2, 4})
    checkAgainstReference(splitOf(1, 3), 96, tp);
  // At T = 2, TP rank 1 holds the second half of each of q, k and v.
  std::vector<split::Range> want = {{0, 16, 16}, {16, 48, 16}, {32, 80, 16}};
  EXPECT_EQ(split::tpRanges(splitOf(1, 3), 96, 2, 1), want);
  EXPECT_EQ(split::localShape({32, 96}, splitOf(1, 3), 2), (std::vector<int64_t>{32, 48}));
}

TEST(SplitRule, PaddedVocabAtOneTwoFourRanks) {
  // GPT-2's vocabulary padded to a multiple of T (50257 -> 50260 at T = 4):
  // the padding is at the end of the last TP rank's slice.
  checkAgainstReference(splitOf(0, 1, 50260), 50257, 4);
  checkAgainstReference(splitOf(0, 1, 50258), 50257, 2);
  checkAgainstReference(splitOf(0, 1, 50257), 50257, 1);
  checkAgainstReference(splitOf(0, 1, 12), 10, 4); // a whole piece of padding: rank 3 has 1 row
  std::vector<split::Range> last = {{0, 37695, 12562}};
  EXPECT_EQ(split::tpRanges(splitOf(0, 1, 50260), 50257, 4, 3), last);
  EXPECT_EQ(split::localNumel({50257, 8}, splitOf(0, 1, 50260), 4), 12565 * 8);
  split::Range pad = split::localToGlobal(splitOf(0, 1, 50260), 50257, 4, 3, 12562);
  EXPECT_EQ(pad.global, 50257); // padding: at or past the size
  EXPECT_EQ(pad.length, 3);
}

TEST(SplitRule, ReplicatedKeepsTheShape) {
  TensorSplit replicated;
  EXPECT_EQ(split::check(replicated, 2, 7, 4), "");
  EXPECT_TRUE(split::tpRanges(replicated, 7, 4, 0).empty());
  EXPECT_EQ(split::localShape({7, 3}, replicated, 4), (std::vector<int64_t>{7, 3}));
  replicated.reduceGrad = true;
  EXPECT_EQ(split::check(replicated, 2, 7, 4), "");
}

TEST(SplitRule, CheckNamesWhatDoesNotFit) {
  EXPECT_NE(split::check(splitOf(0, 0), 2, 8, 2).find("chunks must be at least 1"),
            std::string::npos);
  EXPECT_NE(split::check(splitOf(2, 1), 2, 8, 2).find("out of range"), std::string::npos);
  EXPECT_NE(split::check(splitOf(0, 1, 6), 2, 8, 2).find("smaller than"), std::string::npos);
  EXPECT_NE(split::check(splitOf(0, 3), 2, 90, 4).find("not a multiple of chunks (3) times "
                                                        "tensor_parallel (4)"),
            std::string::npos);
  EXPECT_EQ(split::check(splitOf(0, 3), 2, 96, 0), ""); // T not known: not checked
  EXPECT_NE(split::check(splitOf(-1, 3), 2, 96, 2).find("need a split dim"), std::string::npos);
  EXPECT_NE(split::check(splitOf(0, 3, 99), 2, 96, 1).find("padded_size with chunks > 1"),
            std::string::npos);
  TensorSplit reduce = splitOf(0, 1);
  reduce.reduceGrad = true;
  EXPECT_NE(split::check(reduce, 2, 8, 2).find("reduce_grad is for replicated"), std::string::npos);
}

TEST(SplitRule, AnExpertSplitIsDimZeroOverTheExpertGroup) {
  // 8 experts over E = 4: position p holds experts [2p, 2p + 2), the rule
  // of an unchunked, unpadded split of dim 0 (the same index arithmetic).
  const TensorSplit e = bmt::expertSplit();
  EXPECT_TRUE(e.isSplit());
  EXPECT_TRUE(e.isExpertSplit());
  EXPECT_FALSE(e.isTensorSplit());
  EXPECT_FALSE(e.isDefault());
  checkAgainstReference(e, 8, 4);
  EXPECT_EQ(split::localShape({8, 6, 3}, e, 4), (std::vector<int64_t>{2, 6, 3}));
  EXPECT_EQ(split::tpRanges(e, 8, 4, 3), (std::vector<split::Range>{{0, 6, 2}}));
  // Not dim 0, chunked, padded, reduce_grad or without a dim: refused,
  // naming what an expert split is; X not a multiple of E names E.
  TensorSplit bad = e;
  bad.dim = 1;
  EXPECT_NE(split::check(bad, 3, 6, 2).find("dim 0"), std::string::npos);
  bad = e;
  bad.chunks = 2;
  EXPECT_NE(split::check(bad, 3, 8, 2).find("chunks 1"), std::string::npos);
  bad = e;
  bad.paddedSize = 10;
  EXPECT_NE(split::check(bad, 3, 8, 2).find("padded_size"), std::string::npos);
  bad = e;
  bad.reduceGrad = true;
  EXPECT_NE(split::check(bad, 3, 8, 2).find("reduce_grad"), std::string::npos);
  bad = e;
  bad.dim = -1;
  EXPECT_NE(split::check(bad, 3, 8, 2).find("dim 0"), std::string::npos);
  EXPECT_EQ(split::check(e, 3, 6, 4), "dim 0 of size 6 is not a multiple of expert_parallel (4)");
  // A TP split's message still names tensor_parallel.
  EXPECT_NE(split::check(splitOf(0, 1), 3, 6, 4).find("tensor_parallel (4)"), std::string::npos);
}
