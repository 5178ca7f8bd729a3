//===- NcclComm.cpp - NCCL collectives through c10d::ProcessGroupNCCL -----===//
//
// A thin wrapper: LibTorch's ProcessGroupNCCL (libtorch_cuda) owns the NCCL
// communicators, its high-priority streams, the end events that Work::wait
// makes the current stream wait on, the caching-allocator safety of the
// tensors, and the watchdog that enforces the timeout. This file adds the
// bmt interface, argument checks, messages naming the rank/communicator/
// collective, and split() (the (color, key) pairs are all-gathered over
// NCCL, then a new ProcessGroupNCCL is made over a PrefixStore).
//
// Built only when the wheel is LibTorch's CUDA build (BMT_WITH_NCCL, see
// runtime/CMakeLists.txt); otherwise createNcclComm throws CommError.
//
//===----------------------------------------------------------------------===//

#include "CommInternal.h"

#ifdef BMT_WITH_NCCL

#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <algorithm>

namespace bmt::runtime {

namespace {

using namespace detail;

c10d::ReduceOp toC10d(ReduceOp op) {
  return op == ReduceOp::Max ? c10d::ReduceOp(c10d::ReduceOp::MAX)
                             : c10d::ReduceOp(c10d::ReduceOp::SUM);
}

class NcclWork : public Work {
public:
  NcclWork(c10::intrusive_ptr<c10d::Work> work, std::string what, std::chrono::milliseconds timeout)
      : work_(std::move(work)), what_(std::move(what)), timeout_(timeout) {}

  void wait() override {
    try {
      work_->wait();
    } catch (const std::exception &e) {
      std::string text = firstLine(e.what());
      bool timedOut = text.find("imeout") != std::string::npos ||
                      text.find("timed out") != std::string::npos;
      throw CommError(what_ + (timedOut ? " timed out after " + seconds(timeout_) + ": "
                                        : " failed: ") +
                      text);
    }
  }

private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  std::chrono::milliseconds timeout_;
};

class NcclComm : public Comm {
public:
  NcclComm(c10::intrusive_ptr<c10d::Store> store, int64_t rank, int64_t size, at::Device device,
           std::string name, std::chrono::milliseconds timeout, std::string prefix,
           std::vector<uint64_t> globalRanks)
      : store_(std::move(store)), rank_(rank), size_(size), device_(device),
        name_(std::move(name)), timeout_(timeout), prefix_(std::move(prefix)) {
    c10::cuda::set_device(device_.index());
    auto options = c10d::ProcessGroupNCCL::Options::create(/*is_high_priority_stream=*/true);
    options->timeout = timeout_;
    options->group_name = prefix_;
    options->group_desc = name_;
    options->global_ranks_in_group = std::move(globalRanks);
    globalRanks_ = options->global_ranks_in_group;
    try {
      pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>(prefix_ + "/nccl", store_), static_cast<int>(rank_),
          static_cast<int>(size_), options);
    } catch (const std::exception &e) {
      throw CommError(who(*this) + ": creating the NCCL process group failed: " +
                      firstLine(e.what()));
    }
  }

  ~NcclComm() override {
    try {
      pg_->shutdown();
    } catch (...) {
    }
  }

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  std::string name() const override { return name_; }
  std::string backend() const override { return "nccl"; }
  at::Device device() const override { return device_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  std::shared_ptr<Work> allGather(at::Tensor out, at::Tensor in) override {
    checkDevice("all_gather", "out", out);
    checkDevice("all_gather", "in", in);
    checkGather(*this, "all_gather", out, in);
    return run("all_gather", [&] { return pg_->_allgather_base(out, in); });
  }

  std::shared_ptr<Work> reduceScatter(at::Tensor out, at::Tensor in, ReduceOp op) override {
    checkDevice("reduce_scatter", "out", out);
    checkDevice("reduce_scatter", "in", in);
    checkScatter(*this, "reduce_scatter", out, in);
    c10d::ReduceScatterOptions o;
    o.reduceOp = toC10d(op);
    return run("reduce_scatter", [&] { return pg_->_reduce_scatter_base(out, in, o); });
  }

  std::shared_ptr<Work> allToAll(at::Tensor out, at::Tensor in,
                                 const std::vector<int64_t> &sendCounts,
                                 const std::vector<int64_t> &recvCounts) override {
    checkDevice("all_to_all", "out", out);
    checkDevice("all_to_all", "in", in);
    checkAllToAll(*this, "all_to_all", out, in, sendCounts, recvCounts);
    // ProcessGroupNCCL takes the split sizes by non-const reference.
    std::vector<int64_t> outSplits = recvCounts, inSplits = sendCounts;
    return run("all_to_all", [&] { return pg_->alltoall_base(out, in, outSplits, inSplits); });
  }

  std::shared_ptr<Work> allReduce(at::Tensor t, ReduceOp op) override {
    checkDevice("all_reduce", "tensor", t);
    checkReducible(*this, "all_reduce", t);
    c10d::AllreduceOptions o;
    o.reduceOp = toC10d(op);
    std::vector<at::Tensor> ts{t};
    return run("all_reduce", [&] { return pg_->allreduce(ts, o); });
  }

  std::shared_ptr<Work> broadcast(at::Tensor t, int64_t root) override {
    checkDevice("broadcast", "tensor", t);
    checkRoot(*this, "broadcast", root);
    c10d::BroadcastOptions o;
    o.rootRank = root;
    std::vector<at::Tensor> ts{t};
    return run("broadcast", [&] { return pg_->broadcast(ts, o); });
  }

  std::shared_ptr<Work> send(at::Tensor t, int64_t peer) override {
    checkDevice("send", "tensor", t);
    checkPeer(*this, "send", peer, t);
    std::vector<at::Tensor> ts{t};
    return run("send", [&] { return pg_->send(ts, static_cast<int>(peer), /*tag=*/0); },
               /*p2p=*/true);
  }

  std::shared_ptr<Work> recv(at::Tensor t, int64_t peer) override {
    checkDevice("recv", "tensor", t);
    checkPeer(*this, "recv", peer, t);
    std::vector<at::Tensor> ts{t};
    return run("recv", [&] { return pg_->recv(ts, static_cast<int>(peer), /*tag=*/0); },
               /*p2p=*/true);
  }

  void barrier() override {
    c10d::BarrierOptions o;
    o.device_ids = {device_.index()};
    run("barrier", [&] { return pg_->barrier(o); })->wait();
  }

  std::unique_ptr<Comm> split(int64_t color, int64_t key, const std::string &name) override {
    int64_t seq = seq_ + 1; // the all-gather below takes this number
    at::Tensor mine = at::tensor({color, key}, at::TensorOptions().dtype(at::kLong)).to(device_);
    at::Tensor all = at::empty({2 * size_}, mine.options());
    allGather(all, mine)->wait();
    at::Tensor pairs = all.cpu(); // after the current stream waited for the gather
    if (color < 0)
      return nullptr;
    const int64_t *p = pairs.data_ptr<int64_t>();
    std::vector<std::pair<int64_t, int64_t>> byKey; // (key, rank)
    for (int64_t r = 0; r < size_; ++r)
      if (p[2 * r] == color)
        byKey.emplace_back(p[2 * r + 1], r);
    std::sort(byKey.begin(), byKey.end());
    int64_t newRank = 0;
    std::vector<uint64_t> global;
    for (size_t i = 0; i < byKey.size(); ++i) {
      if (byKey[i].second == rank_)
        newRank = static_cast<int64_t>(i);
      global.push_back(globalRanks_[byKey[i].second]);
    }
    std::string prefix = prefix_ + "/s" + std::to_string(seq) + "c" + std::to_string(color);
    return std::make_unique<NcclComm>(store_, newRank, static_cast<int64_t>(byKey.size()), device_,
                                      name, timeout_, prefix, std::move(global));
  }

private:
  void checkDevice(const char *op, const char *what, const at::Tensor &t) const {
    at::Device d = device_;
    checkTensor(*this, op, what, t, [d](const at::Tensor &x) { return x.device() == d; },
                d.str());
  }

  /// Issues a collective (numbered by seq_, alike on every rank: split()
  /// names sub-communicators by it) or, with `p2p`, a send or recv
  /// (numbered apart, since only two ranks take part).
  template <typename F> std::shared_ptr<Work> run(const char *op, F &&issue, bool p2p = false) {
    std::string what = who(*this) + ": " + op + " #" + std::to_string(p2p ? ++p2pSeq_ : ++seq_);
    c10::intrusive_ptr<c10d::Work> w;
    try {
      w = issue();
    } catch (const std::exception &e) {
      throw CommError(what + " failed: " + firstLine(e.what()));
    }
    return std::make_shared<NcclWork>(std::move(w), std::move(what), timeout_);
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int64_t rank_, size_;
  at::Device device_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  std::string prefix_;
  std::vector<uint64_t> globalRanks_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  int64_t seq_ = 0;
  int64_t p2pSeq_ = 0;
};

} // namespace

bool ncclAvailable() { return true; }

std::unique_ptr<Comm> createNcclComm(c10::intrusive_ptr<c10d::Store> store, int64_t rank,
                                     int64_t size, at::Device device, const CommOptions &options) {
  std::string head = detail::who(rank, size, options.name) + ": createNcclComm: ";
  if (!store)
    throw CommError(head + "no store");
  if (size < 1 || rank < 0 || rank >= size)
    throw CommError(head + "rank must be in [0, size) and size >= 1");
  if (!device.is_cuda())
    throw CommError(head + "NCCL needs a CUDA device, got " + device.str());
  if (!device.has_index())
    device = at::Device(at::kCUDA, c10::cuda::current_device());
  if (device.index() >= c10::cuda::device_count())
    throw CommError(head + device.str() + " does not exist (" +
                    std::to_string(c10::cuda::device_count()) + " CUDA devices visible)");
  std::vector<uint64_t> global(size);
  for (int64_t r = 0; r < size; ++r)
    global[r] = static_cast<uint64_t>(r);
  return std::make_unique<NcclComm>(std::move(store), rank, size, device, options.name,
                                    detail::resolveTimeout(options.timeout), options.keyPrefix,
                                    std::move(global));
}

} // namespace bmt::runtime

#else // !BMT_WITH_NCCL

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace bmt::runtime {

bool ncclAvailable() { return false; }

std::unique_ptr<Comm> createNcclComm(c10::intrusive_ptr<c10d::Store>, int64_t rank, int64_t size,
                                     at::Device, const CommOptions &options) {
  throw CommError(detail::who(rank, size, options.name) +
                  ": createNcclComm: this build has no NCCL backend (LibTorch without CUDA)");
}

} // namespace bmt::runtime

#endif // BMT_WITH_NCCL
