//===- LoadPlan.h - which bytes of a checkpoint a rank reads ----*- C++ -*-===//
//
// Private to runtime/checkpoint: the resharding planner of a resume. A
// checkpoint's layout (checkpoint.json's "spaces": saved spaces, their
// shards and TP ranks' copies) and this run's layout of each trainable
// tensor give the runs of elements a rank reads and the rank files and
// byte ranges they are in. Planning only: FileStorage.h reads and checks.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_CHECKPOINT_LOADPLAN_H
#define BMT_RUNTIME_CHECKPOINT_LOADPLAN_H

#include "Metadata.h"

#include "bmt/Plan/SplitRule.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace bmt::runtime::checkpoint {

/// How one run holds a trainable tensor: the global shape, its split over
/// a group of `tp` ranks (the TP group, or the expert group for a split
/// over = Expert), and which rank of that group's slice (`tpRank`). The
/// slicing rule is bmt/Plan/SplitRule.h's (docs/sharded-format.md).
struct SliceLayout {
  std::vector<int64_t> shape;
  TensorSplit split; ///< dim, chunks, paddedSize, over; replicated when not split
  int64_t tp = 1, tpRank = 0; ///< the group's size and rank (T or E)

  bool isSplit() const { return split.isSplit(); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  int64_t localNumel() const { return isSplit() ? split::localNumel(shape, split, tp) : numel(); }
  /// Elements after the split dim (a row of it).
  int64_t inner() const {
    int64_t n = 1;
    for (size_t d = static_cast<size_t>(split.dim) + 1; d < shape.size(); ++d)
      n *= shape[d];
    return n;
  }
  /// Whether the two hold the same slices (the same TP rank's).
  bool sameSlicing(const SliceLayout &o) const {
    if (!isSplit() && !o.isSplit())
      return true;
    return split.dim == o.split.dim && split.chunks == o.split.chunks &&
           split::paddedSize(split, shape[split.dim]) ==
               split::paddedSize(o.split, o.shape[o.split.dim]) &&
           tp == o.tp && tpRank == o.tpRank;
  }

  /// Calls emit(local, global, n) for the elements [a, b) of this slice
  /// (row-major over the local shape) in runs that are contiguous in the
  /// global tensor (row-major, unpadded): local elements [local, local + n)
  /// are global ones [global, global + n). Padding is skipped.
  template <typename F> void toGlobal(int64_t a, int64_t b, F &&emit) const {
    if (!isSplit()) {
      if (a < b)
        emit(a, a, b - a);
      return;
    }
    const int64_t in = inner(), size = shape[split.dim];
    const int64_t row = split::paddedSize(split, size) / tp * in; // local elements per outer index
    for (int64_t at = a; at < b;) {
      const int64_t o = at / row, j = at % row / in;
      const split::Range r = split::localToGlobal(split, size, tp, tpRank, j);
      const int64_t end = std::min(b, o * row + (j + r.length) * in);
      if (r.global < size)
        emit(at, (o * size + r.global) * in + at % in, end - at);
      at = end;
    }
  }

  /// Calls emit(tpRank, local, global, n) for the global elements [g, g +
  /// n) (unpadded, row-major) in runs that are contiguous in one TP rank's
  /// slice: global [global, global + n) are that slice's [local, local + n).
  /// An unsplit tensor is read from this layout's own tpRank's copy.
  template <typename F> void fromGlobal(int64_t g, int64_t n, F &&emit) const {
    if (!isSplit()) {
      if (n > 0)
        emit(tpRank, g, g, n);
      return;
    }
    const int64_t in = inner(), size = shape[split.dim];
    const int64_t localSize = split::paddedSize(split, size) / tp;
    for (int64_t at = g, end = g + n; at < end;) {
      const int64_t o = at / (size * in), j = at / in % size;
      const split::Location l = split::globalToLocal(split, size, tp, j);
      const int64_t upTo = std::min(end, (o * size + j + l.range.length) * in);
      emit(l.tpRank, (o * localSize + l.range.local) * in + at % in, at, upTo - at);
      at = upTo;
    }
  }
};

/// A trainable tensor of the checkpoint: its global shape, dtype, split,
/// and where each saved copy is (space, element offset): one per TP rank,
/// one per expert-group position of an expert-split tensor, else one.
struct SavedMember {
  std::vector<int64_t> shape;
  std::string dtype;
  SliceLayout layout; ///< tpRank unset
  std::vector<std::pair<size_t, int64_t>> copies; ///< by saved TP rank or position
};

struct SavedSpace {
  std::string name, dtype;
  bool master = false;
  int64_t size = 0, shards = 1, shardSize = 0;
  /// The group its copies run over: T TP ranks, E expert-group positions
  /// (an "ep_rank" space), or 1; `position` is the TP rank or expert-group
  /// position whose slices it holds.
  int64_t groupSize = 1, position = 0;
  /// The first rank of the pipeline stage whose ranks wrote it (its
  /// "stage" s times D = world size / P; 0 without stages).
  int64_t firstRank = 0;
  std::vector<std::pair<int64_t, int64_t>> members; ///< (offset, elements)
  std::vector<std::string> names;                   ///< of the members
};

/// A checkpoint's layout, from its checkpoint.json.
class SavedLayout {
public:
  /// Parses meta's "world_size", "tensor_parallel", "expert_parallel",
  /// "pipeline_stages" and "spaces". Throws CheckpointError naming `folder`/checkpoint.json for a
  /// layout that does not hold together (a member that does not fit its
  /// space, a TP rank's or position's copy missing or twice, a bad split).
  SavedLayout(const std::string &folder, const json &meta);

  /// The trainable tensors, by name.
  const std::map<std::string, SavedMember> &members() const { return members_; }
  const std::vector<SavedSpace> &spaces() const { return spaces_; }
  int64_t worldSize() const { return worldSize_; }
  int64_t tensorParallel() const { return tp_; }
  /// E of a checkpoint whose expert weights are split over the expert
  /// group (version 3), else 1.
  int64_t expertParallel() const { return ep_; }
  /// P of a checkpoint of a pipelined run (versions 4 and 5), else 1.
  int64_t pipelineStages() const { return stages_; }
  /// V of a checkpoint of an interleaved pipeline (version 5), else 1.
  int64_t virtualStages() const { return virtualStages_; }
  /// The rank whose file holds shard `shard` of saved space `space`: shard
  /// q of TP rank t's space is written by data-parallel rank q of TP rank
  /// t, world rank q * T + t; shard q of position p's copy of an
  /// expert-split group by world rank q * E + p; else by rank q; all of
  /// them counted from the first rank of the stage that wrote the space
  /// (stage s's T x D ranks begin at s * T * D).
  int64_t rankOf(size_t space, int64_t shard) const {
    return spaces_[space].firstRank + shard * spaces_[space].groupSize +
           spaces_[space].position;
  }

  /// One read from a rank file: bytes [offset, offset + nbytes) of shard
  /// `shard` of a saved space's field (in rank `rank`'s file) to bytes
  /// [dst, dst + nbytes) of the destination.
  struct ShardRead {
    int64_t rank = 0, shard = 0, offset = 0, nbytes = 0, dst = 0;
  };
  /// The reads of elements [begin, begin + numel) of saved space `space`
  /// (of `elementSize` bytes each; the destination's element 0 is
  /// `begin`), one per shard they span, in order.
  std::vector<ShardRead> shardReads(size_t space, int64_t begin, int64_t numel,
                                    int64_t elementSize) const;

private:
  std::string folder_;
  int64_t worldSize_ = 0, tp_ = 1, ep_ = 1, stages_ = 1, virtualStages_ = 1;
  std::vector<SavedSpace> spaces_;
  std::map<std::string, SavedMember> members_;
};

/// Plans the reads of local elements [a, b) of the slice `mine` holds of a
/// trainable tensor that the checkpoint slices as `theirs`: calls
/// emit(savedTpRank, savedLocal, at, n) for each run, meaning that
/// elements [savedLocal, savedLocal + n) of saved copy savedTpRank's
/// slice are elements [a + at, a + at + n) of mine. The same slicing: one
/// run from theirs.tpRank; another split (another T or E, a split over
/// another group, or none): runs through the global tensor, mine's padding
/// never emitted (it stays as it is). Returns whether the slicing differs
/// (a reshard).
template <typename F>
bool planSlice(const SliceLayout &mine, const SliceLayout &theirs, int64_t a, int64_t b,
               F &&emit) {
  if (mine.sameSlicing(theirs)) {
    emit(theirs.tpRank, a, int64_t{0}, b - a);
    return false;
  }
  mine.toGlobal(a, b, [&](int64_t local, int64_t global, int64_t n) {
    theirs.fromGlobal(global, n, [&](int64_t savedRank, int64_t savedLocal, int64_t g,
                                     int64_t k) {
      emit(savedRank, savedLocal, local - a + (g - global), k);
    });
  });
  return true;
}

} // namespace bmt::runtime::checkpoint

#endif // BMT_RUNTIME_CHECKPOINT_LOADPLAN_H
