//===- Batches.cpp - where a run's micro-batches come from ----------------===//

#include "bmt/Runtime/data/Batches.h"
#include "data/Random.h"

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace bmt::runtime {

MicroBatchSource::~MicroBatchSource() = default;

namespace {

void checkKind(const DataPosition &p, const char *kind) {
  if (p.kind != kind)
    throw std::invalid_argument(std::string("the checkpoint's data position is of kind '") +
                                p.kind + "', this run reads " + kind);
}

/// A position recorded in other data than `fingerprint` (the file's) is
/// refused: a count of windows or documents means nothing in another file.
void checkData(const DataPosition &p, const std::string &fingerprint, const TokenFile &file) {
  if (!p.data.empty() && p.data != fingerprint)
    throw std::invalid_argument("the checkpoint's run read other data (" + p.data + ") than " +
                                file.binPath() + " (" + fingerprint +
                                "); resume with the --data it was trained on");
}

class RandomWindows : public MicroBatchSource {
public:
  RandomWindows(const TokenFile &file, int64_t microBatch, int64_t windowLength, uint64_t seed,
                int64_t rank, int64_t worldSize)
      : sampler_(file, microBatch * worldSize, windowLength - 1, seed), file_(file),
        fingerprint_(file.fingerprint()), microBatch_(microBatch), rank_(rank),
        worldSize_(worldSize) {}

  MicroBatch next() override {
    windows_ += microBatch_ * worldSize_;
    return {sampler_.next(), {}, {}, rank_ * microBatch_, (rank_ + 1) * microBatch_};
  }

  DataPosition position() const override {
    DataPosition p{"random-windows", sampler_.generatorState(), windows_, 0};
    p.data = fingerprint_;
    return p;
  }

  void seek(const DataPosition &p) override {
    checkKind(p, "random-windows");
    checkData(p, fingerprint_, file_);
    sampler_.setGeneratorState(p.generator);
    windows_ = p.windows;
  }

private:
  BatchSampler sampler_;
  const TokenFile &file_;
  std::string fingerprint_;
  int64_t microBatch_, rank_, worldSize_;
  int64_t windows_ = 0;
};

class FixedBatches : public MicroBatchSource {
public:
  FixedBatches(const at::Tensor &windows, const at::Tensor &inputIds, const at::Tensor &labels,
               int64_t rank, int64_t worldSize)
      : windows_(windows), inputIds_(inputIds), labels_(labels) {
    const int64_t rows = (windows.defined() ? windows : inputIds).size(1) / worldSize;
    rowBegin_ = rank * rows;
    rowEnd_ = (rank + 1) * rows;
  }

  MicroBatch next() override {
    const int64_t n = (windows_.defined() ? windows_ : inputIds_).size(0);
    const int64_t i = consumed_++ % n;
    if (windows_.defined())
      return {windows_[i], {}, {}, rowBegin_, rowEnd_};
    return {{}, inputIds_[i], labels_[i], rowBegin_, rowEnd_};
  }

  DataPosition position() const override { return {"fixed-batches", "", 0, consumed_}; }

  void seek(const DataPosition &p) override {
    checkKind(p, "fixed-batches");
    consumed_ = p.microBatches;
  }

private:
  const at::Tensor &windows_, &inputIds_, &labels_;
  int64_t rowBegin_ = 0, rowEnd_ = 0;
  int64_t consumed_ = 0;
};

} // namespace

std::vector<int64_t> documentOrder(int64_t numDocuments, uint64_t seed, int64_t epoch) {
  const uint64_t base = splitMix64(seed + static_cast<uint64_t>(epoch));
  std::vector<std::pair<uint64_t, int64_t>> keyed(static_cast<size_t>(numDocuments));
  for (int64_t d = 0; d < numDocuments; ++d)
    keyed[d] = {splitMix64(base + static_cast<uint64_t>(d)), d};
  std::sort(keyed.begin(), keyed.end());
  std::vector<int64_t> order(keyed.size());
  for (size_t i = 0; i < keyed.size(); ++i)
    order[i] = keyed[i].second;
  return order;
}

std::pair<int64_t, int64_t> overlongDocuments(const TokenFile &file, int64_t windowLength) {
  int64_t count = 0, first = -1;
  for (int64_t d = 0; d < file.numDocuments(); ++d)
    if (file.documentEnd(d) - file.documentStart(d) > windowLength) {
      if (count++ == 0)
        first = d;
    }
  return {count, first};
}

DocumentBatches::DocumentBatches(const TokenFile &file, SequenceLayout layout, int64_t microBatch,
                                 int64_t windowLength, uint64_t seed, bool shuffle, int64_t rank,
                                 int64_t worldSize)
    : file_(file), fingerprint_(file.fingerprint()), layout_(layout), microBatch_(microBatch),
      windowLength_(windowLength),
      seed_(seed), shuffle_(shuffle), rank_(rank), worldSize_(worldSize),
      padId_(file.padId().value_or(file.eosId())) {
  if (!file.hasDocuments())
    throw DataError(file.binPath() + ": has no document boundaries (a version-1 token file); "
                    "prepare it again with bmt-prepare-data to train on whole documents");
  if (file.numDocuments() == 0)
    throw DataError(file.binPath() + ": holds no documents");
  if (microBatch < 1 || windowLength < 2 || worldSize < 1 || rank < 0 || rank >= worldSize)
    throw std::invalid_argument("DocumentBatches: micro-batch " + std::to_string(microBatch) +
                                ", window " + std::to_string(windowLength) + ", rank " +
                                std::to_string(rank) + " of " + std::to_string(worldSize));
}

int64_t DocumentBatches::document(int64_t n) {
  const int64_t count = file_.numDocuments();
  if (!shuffle_)
    return n;
  const int64_t epoch = n / count;
  if (epoch != orderEpoch_) {
    order_ = documentOrder(count, seed_, epoch);
    orderEpoch_ = epoch;
  }
  return order_[n % count];
}

MicroBatch DocumentBatches::next() {
  const int64_t wanted = shuffle_ ? microBatch_ * worldSize_ : microBatch_;
  // Each row's documents: (first token, length), in order.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> rows;
  int64_t longest = 0;
  while (static_cast<int64_t>(rows.size()) < wanted && !exhausted()) {
    std::vector<std::pair<int64_t, int64_t>> row;
    int64_t used = 0;
    while (!exhausted()) {
      const int64_t d = document(consumed_);
      const int64_t start = file_.documentStart(d);
      const int64_t length = std::min(file_.documentEnd(d) - start, windowLength_);
      if (used + length > windowLength_)
        break; // starts the next row (or the next micro-batch)
      row.emplace_back(start, length);
      used += length;
      ++consumed_;
      if (layout_ == SequenceLayout::Padded)
        break;
    }
    longest = std::max(longest, used);
    rows.push_back(std::move(row));
  }
  const int64_t numRows = static_cast<int64_t>(rows.size());
  const int64_t width =
      layout_ == SequenceLayout::Packed ? windowLength_ : std::max<int64_t>(longest, 2);
  MicroBatch out;
  out.window = at::full({numRows, width}, padId_, at::kLong);
  out.targets = at::zeros({numRows, width}, at::kBool);
  at::Tensor mask = at::zeros({numRows, width}, at::kLong);
  at::Tensor positions = at::zeros({numRows, width}, at::kLong);
  int64_t *ids = out.window.data_ptr<int64_t>();
  bool *targets = out.targets.data_ptr<bool>();
  int64_t *m = mask.data_ptr<int64_t>(), *pos = positions.data_ptr<int64_t>();
  for (int64_t r = 0; r < numRows; ++r) {
    int64_t offset = r * width;
    for (const auto &[start, length] : rows[r]) {
      at::Tensor tokens = file_.slice(start, length);
      const int64_t *src = tokens.const_data_ptr<int64_t>();
      for (int64_t t = 0; t < length; ++t) {
        ids[offset + t] = src[t];
        targets[offset + t] = t > 0 && file_.isTarget(start + t);
        m[offset + t] = 1;
        pos[offset + t] = t;
      }
      offset += length;
    }
    for (int64_t p = 0; offset + p < (r + 1) * width; ++p)
      pos[offset + p] = p; // the padding: a sequence of its own
  }
  out.attentionMask = mask;
  if (layout_ == SequenceLayout::Packed)
    out.positionIds = positions;
  if (shuffle_) {
    out.rowBegin = rank_ * microBatch_;
    out.rowEnd = (rank_ + 1) * microBatch_;
  }
  return out;
}

DataPosition DocumentBatches::position() const {
  DataPosition p;
  p.kind = "documents";
  p.documents = consumed_;
  p.data = fingerprint_;
  return p;
}

void DocumentBatches::seek(const DataPosition &p) {
  checkKind(p, "documents");
  checkData(p, fingerprint_, file_);
  if (p.documents < 0)
    throw std::invalid_argument("the checkpoint's data position counts " +
                                std::to_string(p.documents) + " documents");
  consumed_ = p.documents;
}

std::unique_ptr<MicroBatchSource> randomWindows(const TokenFile &file, int64_t microBatch,
                                                int64_t windowLength, uint64_t seed,
                                                int64_t rank, int64_t worldSize) {
  return std::make_unique<RandomWindows>(file, microBatch, windowLength, seed, rank, worldSize);
}

std::unique_ptr<MicroBatchSource> fixedBatches(const at::Tensor &windows,
                                               const at::Tensor &inputIds,
                                               const at::Tensor &labels, int64_t rank,
                                               int64_t worldSize) {
  return std::make_unique<FixedBatches>(windows, inputIds, labels, rank, worldSize);
}

} // namespace bmt::runtime
