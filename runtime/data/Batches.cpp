//===- Batches.cpp - where a run's micro-batches come from ----------------===//

#include "bmt/Runtime/data/Batches.h"

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

class RandomWindows : public MicroBatchSource {
public:
  RandomWindows(const TokenFile &file, int64_t microBatch, int64_t windowLength, uint64_t seed,
                int64_t rank, int64_t worldSize)
      : sampler_(file, microBatch * worldSize, windowLength - 1, seed), microBatch_(microBatch),
        rank_(rank), worldSize_(worldSize) {}

  MicroBatch next() override {
    windows_ += microBatch_ * worldSize_;
    return {sampler_.next(), {}, {}, rank_ * microBatch_, (rank_ + 1) * microBatch_};
  }

  DataPosition position() const override {
    return {"random-windows", sampler_.generatorState(), windows_, 0};
  }

  void seek(const DataPosition &p) override {
    checkKind(p, "random-windows");
    sampler_.setGeneratorState(p.generator);
    windows_ = p.windows;
  }

private:
  BatchSampler sampler_;
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
