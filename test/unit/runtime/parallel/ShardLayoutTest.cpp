//===- ShardLayoutTest.cpp - one rank's shard of a ZeRO storage group -----===//
//
// runtime/parallel/ShardLayout.h (the arithmetic of ZeroStorage's groups)
// against a reference that places every element on its own: for each rank
// of N = 1, 2, 3, 4, 7, each element of its padded shard is either one of
// the buffer's (which, and of which member: TP-split, replicated, in a gap
// between members) or padding. Groups of uneven sizes (a prime, fewer
// elements than ranks, one element, none), members with gaps between them
// and an empty member; with tensor parallelism and without.

#include "parallel/ShardLayout.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace bmt::runtime;

namespace {

/// A test group: its buffer's size and members.
struct Group {
  std::string name;
  int64_t size = 0;
  std::vector<ShardMember> members;
};

/// The groups: members are (offset, numel, split, reduceGrad).
std::vector<Group> groups() {
  return {
      {"one member, prime size", 97, {{0, 97, true, false}}},
      {"split, replicated, reduce_grad",
       61,
       {{0, 24, true, false}, {24, 7, false, true}, {31, 30, true, false}}},
      {"gaps and an empty member",
       50,
       {{2, 10, false, false}, {16, 0, true, false}, {16, 13, true, true}, {32, 17, false, false}}},
      {"fewer elements than ranks", 5, {{0, 2, true, false}, {2, 3, false, true}}},
      {"one element", 1, {{0, 1, false, false}}},
      {"no elements", 0, {}},
  };
}

/// What the reference says of element p of the buffer (p >= size: padding).
enum class Kind { Padding, Gap, Split, Replicated };

Kind kindOf(const Group &g, int64_t p) {
  if (p >= g.size)
    return Kind::Padding;
  for (const ShardMember &m : g.members)
    if (m.offset <= p && p < m.offset + m.numel)
      return m.split ? Kind::Split : Kind::Replicated;
  return Kind::Gap;
}

bool inReduceGrad(const Group &g, int64_t p) {
  for (const ShardMember &m : g.members)
    if (m.reduceGrad && m.offset <= p && p < m.offset + m.numel)
      return true;
  return false;
}

/// The smallest shard length whose n shards hold `size` elements, counted
/// up (not the ceil-division under test).
int64_t referenceShardSize(int64_t size, int64_t n) {
  int64_t s = 0;
  while (s * n < size)
    ++s;
  return s;
}

/// Marks each element of `ranges` in a vector of `length` flags (counting,
/// so that an element in two ranges shows).
std::vector<int> covered(const std::vector<std::pair<int64_t, int64_t>> &ranges,
                         int64_t length) {
  std::vector<int> flags(static_cast<size_t>(length), 0);
  for (const auto &[begin, end] : ranges) {
    EXPECT_LE(0, begin);
    EXPECT_LT(begin, end) << "an empty range";
    EXPECT_LE(end, length);
    for (int64_t i = std::max<int64_t>(begin, 0); i < std::min(end, length); ++i)
      ++flags[static_cast<size_t>(i)];
  }
  return flags;
}

class ShardLayoutTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(ShardLayoutTest, EveryElementPlacedAsTheReferenceSays) {
  const int64_t n = GetParam();
  for (const Group &g : groups())
    for (bool tp : {false, true}) {
      SCOPED_TRACE(g.name + (tp ? ", TP" : ", no TP") + ", N = " + std::to_string(n));
      const int64_t shardSize = referenceShardSize(g.size, n);
      // Per buffer element: how many ranks hold it, and how many count it
      // in the gradient norm (split or replicated ranges).
      std::vector<int> holders(static_cast<size_t>(g.size), 0);
      std::vector<int> normed(static_cast<size_t>(g.size), 0);
      for (int64_t q = 0; q < n; ++q) {
        SCOPED_TRACE("rank " + std::to_string(q));
        const ShardLayout l = shardLayout(g.size, g.members, q, n, tp);
        ASSERT_EQ(l.shardSize, shardSize);
        ASSERT_EQ(l.padded, shardSize * n);
        EXPECT_LT(l.padded - g.size, std::max<int64_t>(n, 1)) << "padding of a whole shard";
        const std::vector<int> split = covered(l.splitRanges, shardSize);
        const std::vector<int> replicated = covered(l.replicatedRanges, shardSize);
        for (int64_t e = 0; e < shardSize; ++e) {
          const int64_t p = q * shardSize + e; // the buffer's element at e
          const Kind k = kindOf(g, p);
          const size_t i = static_cast<size_t>(e);
          EXPECT_EQ(l.begin <= p && p < l.end, k != Kind::Padding) << "element " << p;
          EXPECT_EQ(split[i], tp && k == Kind::Split ? 1 : 0) << "element " << p;
          EXPECT_EQ(replicated[i], tp && k == Kind::Replicated ? 1 : 0) << "element " << p;
          if (k != Kind::Padding) {
            ++holders[static_cast<size_t>(p)];
            normed[static_cast<size_t>(p)] += split[i] + replicated[i];
          }
        }
        // The reduce_grad ranges: buffer ranges, the same on every rank.
        const std::vector<int> reduce = covered(l.reduceGradRanges, g.size);
        for (int64_t p = 0; p < g.size; ++p)
          EXPECT_EQ(reduce[static_cast<size_t>(p)], tp && inReduceGrad(g, p) ? 1 : 0)
              << "element " << p;
      }
      // Every element of the buffer on exactly one rank; with TP every
      // member's element counted once in the gradient norm over the ranks.
      for (int64_t p = 0; p < g.size; ++p) {
        EXPECT_EQ(holders[static_cast<size_t>(p)], 1) << "element " << p;
        const bool member = kindOf(g, p) == Kind::Split || kindOf(g, p) == Kind::Replicated;
        EXPECT_EQ(normed[static_cast<size_t>(p)], tp && member ? 1 : 0) << "element " << p;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardLayoutTest, ::testing::Values(1, 2, 3, 4, 7),
                         [](const ::testing::TestParamInfo<int64_t> &info) {
                           return "N" + std::to_string(info.param);
                         });

TEST(ShardLayout, WorkedByHand) {
  // 10 elements over 4 ranks: shards of 3, the last holding one element
  // and two of padding.
  const std::vector<ShardMember> members = {{0, 4, true, false}, {4, 6, false, true}};
  const ShardLayout last = shardLayout(10, members, 3, 4, true);
  EXPECT_EQ(last.begin, 9);
  EXPECT_EQ(last.end, 10);
  EXPECT_EQ(last.shardSize, 3);
  EXPECT_EQ(last.padded, 12);
  EXPECT_TRUE(last.splitRanges.empty());
  ASSERT_EQ(last.replicatedRanges.size(), 1u);
  EXPECT_EQ(last.replicatedRanges[0], std::make_pair(int64_t{0}, int64_t{1}));
  ASSERT_EQ(last.reduceGradRanges.size(), 1u);
  EXPECT_EQ(last.reduceGradRanges[0], std::make_pair(int64_t{4}, int64_t{10}));
  // Rank 1 holds [3, 6): the split member's last element, then two of the
  // replicated one.
  const ShardLayout second = shardLayout(10, members, 1, 4, true);
  ASSERT_EQ(second.splitRanges.size(), 1u);
  EXPECT_EQ(second.splitRanges[0], std::make_pair(int64_t{0}, int64_t{1}));
  ASSERT_EQ(second.replicatedRanges.size(), 1u);
  EXPECT_EQ(second.replicatedRanges[0], std::make_pair(int64_t{1}, int64_t{3}));
}

TEST(ShardLayout, RefusesARankOutsideTheGroup) {
  const std::vector<ShardMember> members = {{0, 8, false, false}};
  EXPECT_THROW(shardLayout(8, members, 2, 2, false), std::runtime_error);
  EXPECT_THROW(shardLayout(8, members, -1, 2, false), std::runtime_error);
  EXPECT_THROW(shardLayout(8, members, 0, 0, false), std::runtime_error);
}

} // namespace
