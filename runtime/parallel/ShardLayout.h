//===- ShardLayout.h - one rank's shard of a ZeRO storage group -*- C++ -*-===//
//
// Private to runtime/parallel: the arithmetic of ZeroStorage's groups, free
// of LibTorch. A storage group is one flat buffer of `size` elements (its
// members at their offsets) padded with zeros to shardRanks * shardSize
// and cut into shardRanks equal shards; rank q holds shard q, of which the
// elements [begin, end) are the buffer's (the rest is padding).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_PARALLEL_SHARDLAYOUT_H
#define BMT_RUNTIME_PARALLEL_SHARDLAYOUT_H

#include <cstdint>
#include <utility>
#include <vector>

namespace bmt::runtime {

/// A member of a storage group as the layout sees it: its elements
/// [offset, offset + numel) of the buffer (this TP rank's slice with
/// tensor parallelism), whether it is TP-split, and whether its gradient
/// is summed over the TP ranks (reduce_grad).
struct ShardMember {
  int64_t offset = 0, numel = 0;
  bool split = false, reduceGrad = false;
};

/// One rank's shard of a storage group; fixed once built.
struct ShardLayout {
  int64_t begin = 0, end = 0; ///< the buffer's elements in this shard, clipped to size
  int64_t shardSize = 0;      ///< ceil(size / shardRanks), the padded shard length
  int64_t padded = 0;         ///< shardSize * shardRanks, the gathered buffer's length
  /// Tensor parallelism only (empty without): this rank's shard as element
  /// ranges [begin, end), relative to the shard, of TP-split members and of
  /// replicated ones (for the gradient norm), and the buffer ranges of
  /// reduce_grad members (absolute, whichever shard holds them).
  std::vector<std::pair<int64_t, int64_t>> splitRanges, replicatedRanges, reduceGradRanges;
};

/// The shard of rank `shardRank` of `shardRanks` of a group of `size`
/// elements with `members` (in buffer order), under tensor parallelism
/// when `tensorParallel`. Throws plan::PlanError (plan::shardRange's) for
/// a rank outside [0, shardRanks), shardRanks <= 0 or a negative size.
ShardLayout shardLayout(int64_t size, const std::vector<ShardMember> &members,
                        int64_t shardRank, int64_t shardRanks, bool tensorParallel);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_PARALLEL_SHARDLAYOUT_H
