//===- SplitRule.h - a tensor's split over a group of ranks ---------------===//
//
// The one statement of bmt's split rule, shared by the dialect
// (`#bmt.tensor_split`), the plan (tpSlice/tpUnslice), the checkpoint
// reader (resharding) and the checkpoint metadata bmt-to-hf reads. Plain
// C++: no LibTorch, no MLIR, no exceptions.
//
// A split runs over one group of ranks (TensorSplit::over): the
// tensor-parallel group of T ranks, or the expert group of E ranks (expert
// parallelism: an expert parameter [X, ...] cut on dim 0, position p of the
// group holding experts [p*X/E, (p+1)*X/E); chunks 1, no padding). The
// functions below take the size of that group as `tensorParallel` (T, or
// E for an expert split); a caller picks it by TensorSplit::over.
//
// The rule: along `dim`, the tensor is padded with zeros at the end to
// P = paddedSize (or its size) elements, which form `chunks` equal chunks,
// each cut into T equal pieces. TP rank t holds piece t of every chunk, in
// chunk order: local size P / T; P % (chunks * T) == 0. A fused QKV is
// chunks = 3, a padded vocabulary paddedSize > size (chunks = 1).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PLAN_SPLITRULE_H
#define BMT_PLAN_SPLITRULE_H

#include <cstdint>
#include <string>
#include <vector>

namespace bmt {

/// The group of ranks a split runs over.
enum class SplitGroup : int8_t {
  Tensor, ///< the tensor-parallel group (T ranks)
  Expert, ///< the expert group (E ranks; dim 0, chunks 1, no padding)
};

/// How a tensor is split over a group of ranks (`over`); dim == -1 when it
/// is replicated.
struct TensorSplit {
  int64_t dim = -1;       ///< -1: replicated; else the split dim of the global shape
  int64_t chunks = 1;     ///< equal chunks of `dim`, each split T ways (a fused QKV: 3)
  int64_t paddedSize = 0; ///< 0, or the size of `dim` after zero padding (>= size; chunks 1)
  /// A replicated tensor whose gradient differs per TP rank: the gradient is
  /// summed over the TP group before the optimizer.
  bool reduceGrad = false;
  /// The group the split runs over. Code that knows only tensor
  /// parallelism asks isTensorSplit(), never isSplit().
  SplitGroup over = SplitGroup::Tensor;

  /// Split over any group.
  bool isSplit() const { return dim >= 0; }
  bool isTensorSplit() const { return dim >= 0 && over == SplitGroup::Tensor; }
  bool isExpertSplit() const { return dim >= 0 && over == SplitGroup::Expert; }
  bool isDefault() const {
    return dim < 0 && chunks == 1 && paddedSize == 0 && !reduceGrad && over == SplitGroup::Tensor;
  }
};

/// The split of an expert parameter [X, ...] over the expert group.
inline TensorSplit expertSplit() {
  TensorSplit s;
  s.dim = 0;
  s.over = SplitGroup::Expert;
  return s;
}

namespace split {

/// One run of indices of the split dim: local indices [local, local +
/// length) of a TP rank's slice are global ones [global, global + length).
/// A global index >= the dim's size is zero padding.
struct Range {
  int64_t local = 0;
  int64_t global = 0;
  int64_t length = 0;
  bool operator==(const Range &o) const {
    return local == o.local && global == o.global && length == o.length;
  }
};

/// Which TP rank holds a global index, and the run from it (Range).
struct Location {
  int64_t tpRank = 0;
  Range range;
};

/// Checks `split` for a tensor of `rank` dims whose split dim has `size`
/// elements (ignored when `size` < 0: not known) over `tensorParallel`
/// ranks (0: not known; the expert group's E for an expert split). Returns
/// "" when it fits, else the reason (one phrase naming the field, e.g.
/// "chunks must be at least 1").
std::string check(const TensorSplit &split, int64_t rank, int64_t size, int64_t tensorParallel);

/// P: the size of the split dim after padding (`size` when not padded).
int64_t paddedSize(const TensorSplit &split, int64_t size);

/// The shape of one TP rank's slice of a tensor of global `shape` (`shape`
/// when replicated). The split must fit (check()).
std::vector<int64_t> localShape(const std::vector<int64_t> &shape, const TensorSplit &split,
                                int64_t tensorParallel);
/// The elements of localShape().
int64_t localNumel(const std::vector<int64_t> &shape, const TensorSplit &split,
                   int64_t tensorParallel);

/// The runs of the split dim (global size `size`) that TP rank `tpRank`
/// holds, in local order: one per chunk, padding (global >= size) cut
/// away, so a piece wholly in the padding has no range. Local indices the
/// ranges do not cover are zero padding (at the end of the slice). Empty
/// when not split.
std::vector<Range> tpRanges(const TensorSplit &split, int64_t size, int64_t tensorParallel,
                            int64_t tpRank);

/// Local to global: the run of TP rank `tpRank`'s slice from local index
/// `local` (0 <= local < P / T) to the end of its piece or of the data,
/// whichever comes first; global >= size when it is padding.
Range localToGlobal(const TensorSplit &split, int64_t size, int64_t tensorParallel,
                    int64_t tpRank, int64_t local);

/// Global to local: the TP rank holding global index `global` (0 <= global
/// < size) and the run from it to the end of its piece or of the data.
Location globalToLocal(const TensorSplit &split, int64_t size, int64_t tensorParallel,
                       int64_t global);

} // namespace split
} // namespace bmt

#endif // BMT_PLAN_SPLITRULE_H
