//===- CpuComm.cpp - CPU reference collectives over a c10d::Store ---------===//
//
// Every collective moves its bytes through the store (see createCpuComm in
// Comm.h for the key layout and the reduction order). One worker thread per
// communicator runs the collectives in issue order, so that Work is
// asynchronous as with NCCL and the seq numbers match across ranks.
//
//===----------------------------------------------------------------------===//

#include "CommInternal.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/maximum.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

namespace bmt::runtime {

namespace {

using namespace detail;
using Clock = std::chrono::steady_clock;

enum class Op : uint8_t {
  AllGather = 1,
  ReduceScatter,
  AllReduce,
  Broadcast,
  Barrier,
  Split,
  AllToAll,
  Send, ///< point-to-point (send and recv); numbered per peer, not in seq_
  Recv
};

const char *opName(Op op) {
  switch (op) {
  case Op::AllGather:
    return "all_gather";
  case Op::ReduceScatter:
    return "reduce_scatter";
  case Op::AllReduce:
    return "all_reduce";
  case Op::Broadcast:
    return "broadcast";
  case Op::Barrier:
    return "barrier";
  case Op::Split:
    return "split";
  case Op::AllToAll:
    return "all_to_all";
  case Op::Send:
    return "send";
  case Op::Recv:
    return "recv";
  }
  return "?";
}

/// The largest value the store gets in one message: TCPStore's libuv server
/// (torchrun's) refuses messages over 8 MiB, so a larger value goes as
/// pieces of this size, "<key>/+1", "<key>/+2", ... holding the bytes after
/// the first piece, which is the value of <key> itself and is written last
/// (readers wait on <key>).
constexpr size_t kMaxStoreValue = size_t(4) << 20;

/// The continuation keys of a value of `bytes` bytes under `key`.
std::vector<std::string> continuationKeys(const std::string &key, size_t bytes) {
  std::vector<std::string> keys;
  for (size_t j = 1; j * kMaxStoreValue < bytes; ++j)
    keys.push_back(key + "/+" + std::to_string(j));
  return keys;
}

/// The 16-byte header in front of every value.
struct Header {
  uint8_t op;
  int8_t dtype;
  uint8_t reduce; // ReduceOp + 1 for reductions, 0 otherwise
  uint8_t pad[5];
  int64_t numel;
};
static_assert(sizeof(Header) == 16, "header layout");

std::vector<uint8_t> pack(const Header &h, const void *data, size_t bytes) {
  std::vector<uint8_t> v(sizeof(Header) + bytes);
  std::memcpy(v.data(), &h, sizeof(Header));
  if (bytes)
    std::memcpy(v.data() + sizeof(Header), data, bytes);
  return v;
}

Header makeHeader(Op op, at::ScalarType dtype, int64_t numel, int reduce = 0) {
  Header h{};
  h.op = static_cast<uint8_t>(op);
  h.dtype = static_cast<int8_t>(dtype);
  h.reduce = static_cast<uint8_t>(reduce);
  h.numel = numel;
  return h;
}

/// A non-owning flat tensor over a received value's payload.
at::Tensor payloadTensor(const std::vector<uint8_t> &v, at::ScalarType dtype, int64_t numel) {
  return at::from_blob(const_cast<uint8_t *>(v.data()) + sizeof(Header), {numel},
                       at::TensorOptions().dtype(dtype));
}

at::ScalarType accumulatorType(at::ScalarType s) {
  return at::isFloatingType(s) ? at::kDouble : at::kLong;
}

/// Reduces `parts` (one per rank, in rank order) into `out` (flat, same
/// numel): rank order 0..N-1 in the accumulator type, one rounding.
void reduceInto(const at::Tensor &out, const std::vector<at::Tensor> &parts, ReduceOp op) {
  at::ScalarType acc = accumulatorType(out.scalar_type());
  at::Tensor sum = parts[0].to(acc, /*non_blocking=*/false, /*copy=*/true);
  for (size_t r = 1; r < parts.size(); ++r) {
    if (op == ReduceOp::Sum)
      sum.add_(parts[r].to(acc));
    else
      sum = at::maximum(sum, parts[r].to(acc));
  }
  out.copy_(sum);
}

std::atomic<WaitCheck> waitCheck{nullptr};

class CpuWork : public Work {
public:
  /// `what`: the collective, for the wait check ("rank 0 of 2 (world):
  /// all_reduce #57").
  explicit CpuWork(std::string what) : what_(std::move(what)) {}

  void finish(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::move(error);
    done_ = true;
    cv_.notify_all();
  }
  /// Polls the wait check (setWaitCheck) once a second while not done: a
  /// rank whose peer died would otherwise wait here until the timeout.
  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    const Clock::time_point start = Clock::now();
    while (!cv_.wait_for(lock, std::chrono::seconds(1), [&] { return done_; }))
      if (WaitCheck check = waitCheck.load()) {
        lock.unlock();
        check(what_, start);
        lock.lock();
      }
    if (error_)
      std::rethrow_exception(error_);
  }

private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

/// What one collective knows while it runs on the worker.
struct Ctx {
  Op op;
  int64_t seq;
  Clock::time_point deadline;
};

class CpuComm : public Comm {
public:
  /// Talks through its own clone of `owner` (a TCPStore client blocks all
  /// other requests on its connection while it waits, so communicators must
  /// not share one); `owner` is kept alive (it may host the server).
  CpuComm(c10::intrusive_ptr<c10d::Store> owner, int64_t rank, int64_t size, std::string name,
          std::chrono::milliseconds timeout, std::string prefix)
      : owner_(std::move(owner)), rank_(rank), size_(size), name_(std::move(name)),
        timeout_(timeout), prefix_(std::move(prefix)) {
    try {
      store_ = owner_->clone();
    } catch (const std::exception &e) {
      throw CommError(who(*this) + ": cannot connect to the store: " + firstLine(e.what()));
    }
    worker_ = std::thread([this] { run(); });
  }

  ~CpuComm() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  std::string name() const override { return name_; }
  std::string backend() const override { return "cpu"; }
  at::Device device() const override { return at::Device(at::kCPU); }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  std::shared_ptr<Work> allGather(at::Tensor out, at::Tensor in) override {
    checkCpu("all_gather", "out", out);
    checkCpu("all_gather", "in", in);
    checkGather(*this, "all_gather", out, in);
    return enqueue(Op::AllGather, [this, out, in](const Ctx &c) { doAllGather(c, out, in); });
  }

  std::shared_ptr<Work> reduceScatter(at::Tensor out, at::Tensor in, ReduceOp op) override {
    checkCpu("reduce_scatter", "out", out);
    checkCpu("reduce_scatter", "in", in);
    checkScatter(*this, "reduce_scatter", out, in);
    return enqueue(Op::ReduceScatter,
                   [this, out, in, op](const Ctx &c) { doReduceScatter(c, out, in, op); });
  }

  std::shared_ptr<Work> allToAll(at::Tensor out, at::Tensor in,
                                 const std::vector<int64_t> &sendCounts,
                                 const std::vector<int64_t> &recvCounts) override {
    checkCpu("all_to_all", "out", out);
    checkCpu("all_to_all", "in", in);
    checkAllToAll(*this, "all_to_all", out, in, sendCounts, recvCounts);
    return enqueue(Op::AllToAll, [this, out, in, sendCounts, recvCounts](const Ctx &c) {
      doAllToAll(c, out, in, sendCounts, recvCounts);
    });
  }

  std::shared_ptr<Work> allReduce(at::Tensor t, ReduceOp op) override {
    checkCpu("all_reduce", "tensor", t);
    checkReducible(*this, "all_reduce", t);
    return enqueue(Op::AllReduce, [this, t, op](const Ctx &c) { doAllReduce(c, t, op); });
  }

  std::shared_ptr<Work> broadcast(at::Tensor t, int64_t root) override {
    checkCpu("broadcast", "tensor", t);
    checkRoot(*this, "broadcast", root);
    return enqueue(Op::Broadcast, [this, t, root](const Ctx &c) { doBroadcast(c, t, root); });
  }

  std::shared_ptr<Work> send(at::Tensor t, int64_t peer) override {
    checkCpu("send", "tensor", t);
    checkPeer(*this, "send", peer, t);
    int64_t n = ++sent_[peer];
    return enqueue(Op::Send, [this, t, peer, n](const Ctx &c) {
      Header h = makeHeader(Op::Send, t.scalar_type(), t.numel());
      put(c, p2pKey(rank_, peer, n), pack(h, t.data_ptr(), t.nbytes()));
    }, n);
  }

  std::shared_ptr<Work> recv(at::Tensor t, int64_t peer) override {
    checkCpu("recv", "tensor", t);
    checkPeer(*this, "recv", peer, t);
    int64_t n = ++received_[peer];
    return enqueue(Op::Recv, [this, t, peer, n](const Ctx &c) {
      Header h = makeHeader(Op::Send, t.scalar_type(), t.numel());
      std::string k = p2pKey(peer, rank_, n);
      std::vector<std::vector<uint8_t>> got = fetch(c, {k}, {peer}, h);
      if (t.nbytes())
        std::memcpy(t.data_ptr(), got[0].data() + sizeof(Header), t.nbytes());
      try {
        store_->deleteKey(k);
        for (const std::string &more : continuationKeys(k, got[0].size()))
          store_->deleteKey(more);
      } catch (const std::exception &e) {
        fail(c, "failed: store error while cleaning up: " + firstLine(e.what()));
      }
    }, n);
  }

  void barrier() override {
    enqueue(Op::Barrier, [this](const Ctx &c) {
      Header h = makeHeader(Op::Barrier, at::kByte, 0);
      exchangeAll(c, h, nullptr, 0);
    })->wait();
  }

  std::unique_ptr<Comm> split(int64_t color, int64_t key, const std::string &name) override {
    struct Result {
      std::vector<int64_t> members; // parent ranks, in new-rank order
      int64_t seq = 0;
    };
    auto result = std::make_shared<Result>();
    enqueue(Op::Split, [this, color, key, result](const Ctx &c) {
      int64_t mine[2] = {color, key};
      Header h = makeHeader(Op::Split, at::kLong, 2);
      std::vector<std::vector<uint8_t>> all = exchangeAll(c, h, mine, sizeof(mine));
      std::vector<std::pair<int64_t, int64_t>> byKey; // (key, rank)
      for (int64_t r = 0; r < size_; ++r) {
        int64_t theirs[2];
        std::memcpy(theirs, all[r].data() + sizeof(Header), sizeof(theirs));
        if (theirs[0] == color && color >= 0)
          byKey.emplace_back(theirs[1], r);
      }
      std::sort(byKey.begin(), byKey.end());
      for (auto &[k, r] : byKey)
        result->members.push_back(r);
      result->seq = c.seq;
    })->wait();
    if (color < 0)
      return nullptr;
    const auto &m = result->members;
    int64_t newRank = std::find(m.begin(), m.end(), rank_) - m.begin();
    std::string prefix = prefix_ + "/s" + std::to_string(result->seq) + "c" + std::to_string(color);
    return std::make_unique<CpuComm>(owner_, newRank, static_cast<int64_t>(m.size()), name,
                                     timeout_, prefix);
  }

private:
  // ---- issuing ---------------------------------------------------------

  void checkCpu(const char *op, const char *what, const at::Tensor &t) const {
    checkTensor(*this, op, what, t, [](const at::Tensor &x) { return x.is_cpu(); }, "cpu");
  }

  /// Queues `fn` on the worker. Collectives take the next number of seq_
  /// (every rank alike); a point-to-point op passes its own per-peer
  /// number `p2p` (> 0) and leaves seq_ alone.
  std::shared_ptr<Work> enqueue(Op op, std::function<void(const Ctx &)> fn, int64_t p2p = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t seq = p2p > 0 ? p2p : ++seq_;
    auto work = std::make_shared<CpuWork>(who(*this) + ": " + opName(op) + " #" +
                                          std::to_string(seq));
    queue_.push_back([this, op, seq, fn = std::move(fn), work] {
      if (!broken_.empty()) {
        work->finish(std::make_exception_ptr(
            CommError(who(*this) + ": " + opName(op) + " #" + std::to_string(seq) +
                      " not run: the communicator failed earlier: " + broken_)));
        return;
      }
      try {
        fn(Ctx{op, seq, Clock::now() + timeout_});
        work->finish(nullptr);
      } catch (const CommError &e) {
        broken_ = e.what();
        work->finish(std::current_exception());
      } catch (const std::exception &e) {
        broken_ = who(*this) + ": " + opName(op) + " #" + std::to_string(seq) +
                  " failed: " + firstLine(e.what());
        work->finish(std::make_exception_ptr(CommError(broken_)));
      }
    });
    cv_.notify_all();
    return work;
  }

  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty())
          return; // stopping, and every issued collective ran
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  // ---- store protocol --------------------------------------------------

  [[noreturn]] void fail(const Ctx &c, const std::string &what) const {
    throw CommError(who(*this) + ": " + opName(c.op) + " #" + std::to_string(c.seq) + " " + what);
  }

  /// The key of the n-th value rank `from` sends to rank `to`.
  std::string p2pKey(int64_t from, int64_t to, int64_t n) const {
    return prefix_ + "/p2p/" + std::to_string(from) + ">" + std::to_string(to) + "/" +
           std::to_string(n);
  }

  std::string key(const Ctx &c, const std::string &suffix) const {
    return prefix_ + "/" + std::to_string(c.seq) + "/" + suffix;
  }

  /// Sets `k` to `value`, in pieces when it is larger than kMaxStoreValue.
  void put(const Ctx &c, const std::string &k, const std::vector<uint8_t> &value) {
    try {
      std::vector<std::string> more = continuationKeys(k, value.size());
      for (size_t j = 1; j <= more.size(); ++j) {
        auto first = value.begin() + static_cast<std::ptrdiff_t>(j * kMaxStoreValue);
        auto last = value.begin() + static_cast<std::ptrdiff_t>(
                                        std::min(value.size(), (j + 1) * kMaxStoreValue));
        store_->set(more[j - 1], std::vector<uint8_t>(first, last));
      }
      if (more.empty())
        store_->set(k, value);
      else
        store_->set(k, std::vector<uint8_t>(value.begin(), value.begin() + kMaxStoreValue));
    } catch (const std::exception &e) {
      fail(c, "failed: store error: " + firstLine(e.what()));
    }
  }

  /// Appends the pieces after the first of a value `v` read from `k`: as
  /// many as its sender's header says (check() then compares the header
  /// with this rank's).
  void readContinuation(const Ctx &c, const std::string &k, std::vector<uint8_t> &v,
                        int64_t from) {
    if (v.size() != kMaxStoreValue)
      return; // the whole value (or a malformed one: check() says so)
    Header h;
    std::memcpy(&h, v.data(), sizeof(Header));
    auto dtype = static_cast<at::ScalarType>(h.dtype);
    if (h.dtype < 0 || h.dtype >= static_cast<int8_t>(at::ScalarType::NumOptions) || h.numel < 0)
      return;
    size_t total = sizeof(Header) + static_cast<size_t>(h.numel) * c10::elementSize(dtype);
    for (const std::string &more : continuationKeys(k, total)) {
      try {
        std::vector<uint8_t> piece = store_->get(more);
        v.insert(v.end(), piece.begin(), piece.end());
      } catch (const std::exception &e) {
        fail(c, "failed reading rank " + std::to_string(from) +
                    "'s data: store error: " + firstLine(e.what()));
      }
    }
  }

  /// Waits (until the collective's deadline) for the values of `keys`
  /// written by `from`, and returns them, each checked against `expect`.
  std::vector<std::vector<uint8_t>> fetch(const Ctx &c, const std::vector<std::string> &keys,
                                          const std::vector<int64_t> &from, const Header &expect) {
    return fetch(c, keys, from, std::vector<Header>(keys.size(), expect));
  }

  /// As above, value i checked against expect[i].
  std::vector<std::vector<uint8_t>> fetch(const Ctx &c, const std::vector<std::string> &keys,
                                          const std::vector<int64_t> &from,
                                          const std::vector<Header> &expect) {
    std::vector<std::vector<uint8_t>> values(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - Clock::now());
      try {
        store_->wait({keys[i]}, std::max(left, std::chrono::milliseconds(1)));
      } catch (const c10::DistStoreError &) {
        // Timed out: name every rank whose key is still missing.
        std::vector<int64_t> missing;
        for (size_t j = i; j < keys.size(); ++j) {
          bool present = false;
          try {
            present = store_->check({keys[j]});
          } catch (const std::exception &) {
          }
          if (!present)
            missing.push_back(from[j]);
        }
        if (missing.empty())
          missing.push_back(from[i]);
        fail(c, "timed out after " + seconds(timeout_) + " waiting for " + rankList(missing));
      } catch (const std::exception &e) {
        fail(c, "failed waiting for rank " + std::to_string(from[i]) +
                    ": store error: " + firstLine(e.what()));
      }
      try {
        values[i] = store_->get(keys[i]);
      } catch (const std::exception &e) {
        fail(c, "failed reading rank " + std::to_string(from[i]) +
                    "'s data: store error: " + firstLine(e.what()));
      }
      readContinuation(c, keys[i], values[i], from[i]);
      check(c, values[i], from[i], expect[i]);
    }
    return values;
  }

  void check(const Ctx &c, const std::vector<uint8_t> &v, int64_t from, const Header &expect) {
    if (v.size() < sizeof(Header))
      fail(c, "failed: rank " + std::to_string(from) + " sent a malformed value");
    Header h;
    std::memcpy(&h, v.data(), sizeof(Header));
    auto describe = [](const Header &x) {
      std::string s = opName(static_cast<Op>(x.op));
      if (x.reduce)
        s += std::string("(") + reduceOpName(static_cast<ReduceOp>(x.reduce - 1)) + ")";
      s += " of " + std::to_string(x.numel) + " elements of " +
           std::string(c10::toString(static_cast<at::ScalarType>(x.dtype)));
      return s;
    };
    if (h.op == expect.op && h.op == static_cast<uint8_t>(Op::AllToAll) &&
        h.dtype == expect.dtype && h.numel != expect.numel)
      fail(c, "failed: rank " + std::to_string(from) + " sent this rank " +
                  std::to_string(h.numel) + " elements, but recvCounts[" + std::to_string(from) +
                  "] asks for " + std::to_string(expect.numel) +
                  " (rank q's sendCounts[r] must be rank r's recvCounts[q]; allToAllCounts "
                  "gives them)");
    if (h.op != expect.op || h.dtype != expect.dtype || h.numel != expect.numel ||
        h.reduce != expect.reduce)
      fail(c, "failed: rank " + std::to_string(from) + " called " + describe(h) +
                  ", this rank " + describe(expect) +
                  " (every rank must call the same collectives with the same sizes and dtype)");
    size_t bytes = static_cast<size_t>(h.numel) * c10::elementSize(static_cast<at::ScalarType>(h.dtype));
    if (v.size() != sizeof(Header) + bytes)
      fail(c, "failed: rank " + std::to_string(from) + " sent " + std::to_string(v.size()) +
                  " bytes, expected " + std::to_string(sizeof(Header) + bytes));
  }

  /// Counts this rank as done with collective `c`; the last rank deletes
  /// the collective's keys (values of `valueBytes` bytes each, with their
  /// continuation keys).
  void done(const Ctx &c, const std::vector<std::string> &keys, size_t valueBytes) {
    try {
      std::string counter = key(c, "done");
      if (store_->add(counter, 1) == size_) {
        for (const std::string &k : keys) {
          store_->deleteKey(k);
          for (const std::string &more : continuationKeys(k, valueBytes))
            store_->deleteKey(more);
        }
        store_->deleteKey(counter);
      }
    } catch (const std::exception &e) {
      fail(c, "failed: store error while cleaning up: " + firstLine(e.what()));
    }
  }

  /// Every rank sets "<seq>/<rank>" to header + bytes and reads every
  /// other's; returns the N values in rank order (this rank's too).
  std::vector<std::vector<uint8_t>> exchangeAll(const Ctx &c, const Header &h, const void *data,
                                                size_t bytes) {
    std::vector<std::string> keys;
    for (int64_t r = 0; r < size_; ++r)
      keys.push_back(key(c, std::to_string(r)));
    std::vector<uint8_t> mine = pack(h, data, bytes);
    put(c, keys[rank_], mine);
    std::vector<std::string> others;
    std::vector<int64_t> from;
    for (int64_t r = 0; r < size_; ++r)
      if (r != rank_) {
        others.push_back(keys[r]);
        from.push_back(r);
      }
    std::vector<std::vector<uint8_t>> got = fetch(c, others, from, h);
    std::vector<std::vector<uint8_t>> all(size_);
    for (size_t i = 0; i < from.size(); ++i)
      all[from[i]] = std::move(got[i]);
    all[rank_] = std::move(mine);
    done(c, keys, sizeof(Header) + bytes);
    return all;
  }

  // ---- collectives -----------------------------------------------------

  void doAllGather(const Ctx &c, const at::Tensor &out, const at::Tensor &in) {
    int64_t n = in.numel();
    Header h = makeHeader(Op::AllGather, in.scalar_type(), n);
    // Reads `in` before writing `out`: `in` may be a view of out's slot.
    std::vector<std::vector<uint8_t>> all = exchangeAll(c, h, in.data_ptr(), in.nbytes());
    uint8_t *dst = static_cast<uint8_t *>(out.data_ptr());
    size_t bytes = in.nbytes();
    for (int64_t r = 0; r < size_; ++r)
      if (bytes)
        std::memcpy(dst + r * bytes, all[r].data() + sizeof(Header), bytes);
  }

  void doAllReduce(const Ctx &c, const at::Tensor &t, ReduceOp op) {
    Header h = makeHeader(Op::AllReduce, t.scalar_type(), t.numel(), static_cast<int>(op) + 1);
    std::vector<std::vector<uint8_t>> all = exchangeAll(c, h, t.data_ptr(), t.nbytes());
    std::vector<at::Tensor> parts;
    for (int64_t r = 0; r < size_; ++r)
      parts.push_back(payloadTensor(all[r], t.scalar_type(), t.numel()));
    reduceInto(t.view({-1}), parts, op);
  }

  void doBroadcast(const Ctx &c, const at::Tensor &t, int64_t root) {
    Header h = makeHeader(Op::Broadcast, t.scalar_type(), t.numel());
    std::string k = key(c, std::to_string(root));
    if (rank_ == root) {
      put(c, k, pack(h, t.data_ptr(), t.nbytes()));
    } else {
      std::vector<std::vector<uint8_t>> got = fetch(c, {k}, {root}, h);
      if (t.nbytes())
        std::memcpy(t.data_ptr(), got[0].data() + sizeof(Header), t.nbytes());
    }
    done(c, {k}, sizeof(Header) + t.nbytes());
  }

  void doReduceScatter(const Ctx &c, const at::Tensor &out, const at::Tensor &in, ReduceOp op) {
    int64_t n = out.numel();
    size_t bytes = out.nbytes();
    Header h = makeHeader(Op::ReduceScatter, in.scalar_type(), n, static_cast<int>(op) + 1);
    auto slotKey = [&](int64_t src, int64_t dst) {
      return key(c, std::to_string(src) + "/" + std::to_string(dst));
    };
    const uint8_t *src = static_cast<const uint8_t *>(in.data_ptr());
    for (int64_t r = 0; r < size_; ++r)
      if (r != rank_)
        put(c, slotKey(rank_, r), pack(h, src + r * bytes, bytes));
    std::vector<std::string> keys;
    std::vector<int64_t> from;
    for (int64_t q = 0; q < size_; ++q)
      if (q != rank_) {
        keys.push_back(slotKey(q, rank_));
        from.push_back(q);
      }
    std::vector<std::vector<uint8_t>> got = fetch(c, keys, from, h);
    std::vector<at::Tensor> parts(size_);
    for (size_t i = 0; i < from.size(); ++i)
      parts[from[i]] = payloadTensor(got[i], in.scalar_type(), n);
    parts[rank_] = in.view({-1}).narrow(0, rank_ * n, n);
    // reduceInto reads every part before writing `out` (which may alias
    // in's slot of this rank).
    reduceInto(out.view({-1}), parts, op);
    std::vector<std::string> all;
    for (int64_t q = 0; q < size_; ++q)
      for (int64_t r = 0; r < size_; ++r)
        if (q != r)
          all.push_back(slotKey(q, r));
    done(c, all, sizeof(Header) + bytes);
  }

  void doAllToAll(const Ctx &c, const at::Tensor &out, const at::Tensor &in,
                  const std::vector<int64_t> &sendCounts, const std::vector<int64_t> &recvCounts) {
    const size_t rowBytes = static_cast<size_t>(rowNumel(in)) * in.element_size();
    auto slotKey = [&](int64_t src, int64_t dst) {
      return key(c, std::to_string(src) + "/" + std::to_string(dst));
    };
    // Row offsets of each rank's block in `in` and `out`.
    std::vector<size_t> sendAt(size_ + 1, 0), recvAt(size_ + 1, 0);
    for (int64_t r = 0; r < size_; ++r) {
      sendAt[r + 1] = sendAt[r] + static_cast<size_t>(sendCounts[r]);
      recvAt[r + 1] = recvAt[r] + static_cast<size_t>(recvCounts[r]);
    }
    const auto *src = static_cast<const uint8_t *>(in.data_ptr());
    auto *dst = static_cast<uint8_t *>(out.data_ptr());
    // Every slot is sent, empty ones too, so that a peer expecting rows
    // this rank does not send fails at once instead of timing out.
    for (int64_t r = 0; r < size_; ++r)
      if (r != rank_) {
        Header h = makeHeader(Op::AllToAll, in.scalar_type(), sendCounts[r] * rowNumel(in));
        put(c, slotKey(rank_, r), pack(h, src + sendAt[r] * rowBytes, sendCounts[r] * rowBytes));
      }
    if (recvCounts[rank_])
      std::memcpy(dst + recvAt[rank_] * rowBytes, src + sendAt[rank_] * rowBytes,
                  recvCounts[rank_] * rowBytes);
    std::vector<std::string> keys;
    std::vector<int64_t> from;
    std::vector<Header> expect;
    for (int64_t q = 0; q < size_; ++q)
      if (q != rank_) {
        keys.push_back(slotKey(q, rank_));
        from.push_back(q);
        expect.push_back(makeHeader(Op::AllToAll, in.scalar_type(), recvCounts[q] * rowNumel(out)));
      }
    std::vector<std::vector<uint8_t>> got = fetch(c, keys, from, expect);
    for (size_t i = 0; i < from.size(); ++i) {
      size_t bytes = got[i].size() - sizeof(Header);
      if (bytes)
        std::memcpy(dst + recvAt[from[i]] * rowBytes, got[i].data() + sizeof(Header), bytes);
    }
    // Each slot has one reader, which deletes it: the last rank could not
    // name the pieces of slots whose sizes only their two ranks know.
    try {
      for (size_t i = 0; i < keys.size(); ++i) {
        store_->deleteKey(keys[i]);
        for (const std::string &more : continuationKeys(keys[i], got[i].size()))
          store_->deleteKey(more);
      }
    } catch (const std::exception &e) {
      fail(c, "failed: store error while cleaning up: " + firstLine(e.what()));
    }
  }

  c10::intrusive_ptr<c10d::Store> owner_, store_;
  int64_t rank_, size_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  std::string prefix_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  int64_t seq_ = 0;
  /// Point-to-point values sent to / received from each peer so far
  /// (touched by the issuing thread only).
  std::map<int64_t, int64_t> sent_, received_;
  std::string broken_; // first error; only touched by the worker
  std::thread worker_;
};

} // namespace

void setWaitCheck(WaitCheck check) { waitCheck.store(check); }

std::unique_ptr<Comm> createCpuComm(c10::intrusive_ptr<c10d::Store> store, int64_t rank,
                                    int64_t size, const CommOptions &options) {
  if (!store)
    throw CommError(detail::who(rank, size, options.name) + ": createCpuComm: no store");
  if (size < 1 || rank < 0 || rank >= size)
    throw CommError(detail::who(rank, size, options.name) +
                    ": createCpuComm: rank must be in [0, size) and size >= 1");
  return std::make_unique<CpuComm>(std::move(store), rank, size, options.name,
                                   detail::resolveTimeout(options.timeout), options.keyPrefix);
}

} // namespace bmt::runtime
