//===- Batches.h - where a run's micro-batches come from --------*- C++ -*-===//
//
// The training loop draws its micro-batches from a MicroBatchSource: random
// windows of a token file (BatchSampler, TokenData.h), whole documents of a
// version-2 token file (supervised fine-tuning: documentBatches) or the
// fixed batches of bmt-run --batches. A source can say where it is (DataPosition) and go
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
#include <utility>
#include <vector>

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
  /// Documents (documentBatches): bool [batch, seq + 1], whether window
  /// token t is a training target (a loss-mask 1, not padding, not the first
  /// token of its document): the label of position t - 1 is window[t] there
  /// and -100 elsewhere. Undefined: every token after the first is one.
  at::Tensor targets;
  /// Documents: int64 [batch, seq + 1], 1 on tokens, 0 on padding (padded
  /// rows: the model's attention_mask is its first seq columns; packed rows
  /// are not given one). Undefined: all ones.
  at::Tensor attentionMask;
  /// Packed documents: int64 [batch, seq + 1], each token's position in its
  /// document (0 at each document's start; the padding after the last
  /// document counts from 0 too): the model's position_ids.
  at::Tensor positionIds;
};

/// Where a source is: for random windows the window generator's state (the
/// text form of std::mt19937_64's operator<<) and the windows drawn so far;
/// for documents the documents consumed over all epochs; for fixed batches
/// the micro-batches consumed.
struct DataPosition {
  std::string kind; ///< "random-windows", "documents" or "fixed-batches"
  std::string generator;
  int64_t windows = 0;
  int64_t microBatches = 0;
  int64_t documents = 0;
  /// The data it is a position in (TokenFile::fingerprint); empty for fixed
  /// batches and in checkpoints written before it was recorded. seek()
  /// refuses a position in other data.
  std::string data;
};

class MicroBatchSource {
public:
  virtual ~MicroBatchSource();
  virtual MicroBatch next() = 0;
  virtual DataPosition position() const = 0;
  /// Continues from `position` (as position() returned it, possibly in a
  /// run with another world size). Throws std::invalid_argument for a
  /// position of another kind, in other data, or a generator state that
  /// does not parse.
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

/// How documents become the rows of a micro-batch (bmt-run --sequences).
enum class SequenceLayout {
  /// One document a row, right-padded to the longest row of the global
  /// micro-batch (attentionMask 0 on the padding).
  Padded,
  /// Whole documents, greedily in order, into rows of windowLength tokens;
  /// a document that does not fit in what is left of a row starts the next
  /// one; the rest of a row is padding. positionIds restart at 0 at each
  /// document (transformers' packed-sequence detection then keeps documents
  /// from attending to each other).
  Packed,
};

/// The document order of epoch `epoch` (0, 1, ...) of `numDocuments`
/// documents with `seed`: the indices d sorted by key(d) =
/// mix(mix(seed + epoch) + d), ties by d, where mix is SplitMix64's output
/// function (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", 2014: z = x + 0x9E3779B97F4A7C15; z = (z ^ z >> 30) *
/// 0xBF58476D1CE4E5B9; z = (z ^ z >> 27) * 0x94D049BB133111EB; z ^ z >> 31,
/// all modulo 2^64). Documented so that a test can rebuild the order.
std::vector<int64_t> documentOrder(int64_t numDocuments, uint64_t seed, int64_t epoch);

/// Documents of `file` longer than `windowLength` tokens (the ones a
/// micro-batch truncates to their first windowLength tokens), and the first
/// of them (-1 when none).
std::pair<int64_t, int64_t> overlongDocuments(const TokenFile &file, int64_t windowLength);

/// Whole documents of a version-2 `file` (TokenFile::hasDocuments):
/// `shuffle`: every rank draws the same global micro-batch of microBatch *
/// worldSize rows from the documents in documentOrder(seed, epoch), epoch
/// after epoch, and trains on rows [rank * microBatch, (rank + 1) *
/// microBatch); the documents and their order depend on the seed only, not
/// on the world size. Without `shuffle` (evaluation): the documents in file
/// order, one pass; the last micro-batch may have fewer rows, and after it
/// exhausted() is true. Rows are at most windowLength tokens (a longer
/// document is cut to its first windowLength). position() counts the
/// documents consumed. Throws DataError for a file without documents,
/// std::invalid_argument for microBatch < 1 or windowLength < 2.
class DocumentBatches : public MicroBatchSource {
public:
  DocumentBatches(const TokenFile &file, SequenceLayout layout, int64_t microBatch,
                  int64_t windowLength, uint64_t seed, bool shuffle, int64_t rank,
                  int64_t worldSize);
  MicroBatch next() override;
  DataPosition position() const override;
  void seek(const DataPosition &position) override;
  /// Without shuffle: whether every document has been returned.
  bool exhausted() const { return !shuffle_ && consumed_ >= file_.numDocuments(); }

private:
  int64_t document(int64_t n); ///< the n-th document drawn (all epochs)

  const TokenFile &file_;
  std::string fingerprint_;
  SequenceLayout layout_;
  int64_t microBatch_, windowLength_;
  uint64_t seed_;
  bool shuffle_;
  int64_t rank_, worldSize_, padId_;
  int64_t consumed_ = 0;
  int64_t orderEpoch_ = -1;
  std::vector<int64_t> order_;
};

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
