//===- Batches.h - where a run's micro-batches come from --------*- C++ -*-===//
//
// The training loop draws its micro-batches from a MicroBatchSource: random
// windows of a token file (BatchSampler, TokenData.h) or the fixed batches
// of bmt-run --batches. A source can say where it is (DataPosition) and go
// back there, so that a resumed run continues with the next micro-batch.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_DATA_BATCHES_H
#define BMT_RUNTIME_DATA_BATCHES_H

#include "bmt/Runtime/data/TokenData.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

namespace bmt::runtime {

/// One micro-batch: token windows, which the objective turns into inputs
/// and labels, or (encoder-decoders) ready source/target pairs.
struct MicroBatch {
  at::Tensor window; ///< int64 [batch, seq + 1], CPU
  /// Without a window: an encoder-decoder's encoder input [batch, n] and
  /// target [batch, m] (int64, CPU; -100 labels are ignored), trained
  /// with teacher forcing (decoder input = shiftRight(labels)).
  at::Tensor inputIds, labels;
  /// The rows [rowBegin, rowEnd) this rank trains on when the batch above
  /// is the global one of all ranks (every rank corrupts all of it the same
  /// way, then takes its rows, and weights its loss by its share of the
  /// predicted tokens: N ranks train as one process with the whole batch).
  /// rowEnd -1: every row is this rank's own.
  int64_t rowBegin = 0, rowEnd = -1;
};

/// Where a source is: for random windows the window generator's state (the
/// text form of std::mt19937_64's operator<<) and the windows drawn so far;
/// for fixed batches the micro-batches consumed.
struct DataPosition {
  std::string kind; ///< "random-windows" or "fixed-batches"
  std::string generator;
  int64_t windows = 0;
  int64_t microBatches = 0;
};

class MicroBatchSource {
public:
  virtual ~MicroBatchSource();
  virtual MicroBatch next() = 0;
  virtual DataPosition position() const = 0;
  /// Continues from `position` (as position() returned it, possibly in a
  /// run with another world size). Throws std::invalid_argument for a
  /// position of another kind or a generator state that does not parse.
  virtual void seek(const DataPosition &position) = 0;
};

/// Random windows of `file`: every rank draws the same global batch of
/// microBatch * worldSize windows of `windowLength` tokens (BatchSampler,
/// seeded) and trains on rows [rank * microBatch, (rank + 1) * microBatch).
/// The sequence of windows depends on the seed only, not on the world
/// size. Throws as BatchSampler.
std::unique_ptr<MicroBatchSource> randomWindows(const TokenFile &file, int64_t microBatch,
                                                int64_t windowLength, uint64_t seed,
                                                int64_t rank, int64_t worldSize);

/// The fixed batches of bmt-run --batches, in order and round again:
/// `windows` int64 [n, rows, seq + 1], or (encoder-decoders, `windows`
/// undefined) `inputIds` [n, rows, S] with `labels` [n, rows, T]; rank r
/// trains on rows [r * rows / worldSize, (r + 1) * rows / worldSize).
/// The tensors must outlive the source.
std::unique_ptr<MicroBatchSource> fixedBatches(const at::Tensor &windows,
                                               const at::Tensor &inputIds,
                                               const at::Tensor &labels, int64_t rank,
                                               int64_t worldSize);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_DATA_BATCHES_H
