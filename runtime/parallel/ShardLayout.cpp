//===- ShardLayout.cpp - one rank's shard of a ZeRO storage group ---------===//

#include "parallel/ShardLayout.h"

#include "bmt/Plan/Plan.h"

#include <algorithm>

namespace bmt::runtime {

ShardLayout shardLayout(int64_t size, const std::vector<ShardMember> &members,
                        int64_t shardRank, int64_t shardRanks, bool tensorParallel) {
  const plan::ShardRange range = plan::shardRange(size, shardRank, shardRanks);
  ShardLayout l;
  l.begin = range.begin;
  l.end = range.end;
  l.shardSize = range.shardSize;
  if (tensorParallel)
    for (const ShardMember &m : members) {
      int64_t first = m.offset, last = first + m.numel;
      if (m.reduceGrad)
        l.reduceGradRanges.emplace_back(first, last);
      first = std::max(first, range.begin) - range.begin;
      last = std::min(last, range.end) - range.begin;
      if (first < last)
        (m.split ? l.splitRanges : l.replicatedRanges).emplace_back(first, last);
    }
  l.padded = range.shardSize * shardRanks;
  return l;
}

} // namespace bmt::runtime
