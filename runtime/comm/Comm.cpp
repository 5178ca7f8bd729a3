//===- Comm.cpp - Comm interface, shared checks, the local backend --------===//
//
// The local backend serves a single process (rank 0 of 1): collectives are
// copies on the tensors' device, so the executor needs no special case for
// one rank.
//
//===----------------------------------------------------------------------===//

#include "CommInternal.h"

#include "bmt/Runtime/Env.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <tuple>
#include <utility>

namespace bmt::runtime {

Work::~Work() = default;
Comm::~Comm() = default;

const char *reduceOpName(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return "sum";
  case ReduceOp::Max:
    return "max";
  }
  return "?";
}

std::chrono::milliseconds defaultCommTimeout() {
  try {
    return env::commTimeout();
  } catch (const EnvError &e) {
    throw CommError(e.what());
  }
}

namespace detail {

std::string who(int64_t rank, int64_t size, const std::string &name) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(size) + " (" + name + ")";
}

std::string seconds(std::chrono::milliseconds d) {
  std::ostringstream os;
  os << static_cast<double>(d.count()) / 1000.0 << " s";
  return os.str();
}

std::string rankList(const std::vector<int64_t> &ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string firstLine(const std::string &text) {
  size_t nl = text.find('\n');
  return nl == std::string::npos ? text : text.substr(0, nl);
}

std::chrono::milliseconds parseTimeoutSeconds(const std::string &value) {
  try {
    return env::parseCommTimeout(value);
  } catch (const EnvError &e) {
    throw CommError(e.what());
  }
}

std::chrono::milliseconds resolveTimeout(std::chrono::milliseconds t) {
  return t.count() > 0 ? t : defaultCommTimeout();
}

static std::string describe(const at::Tensor &t) {
  std::ostringstream os;
  os << t.numel() << " elements of " << t.scalar_type() << " on " << t.device();
  return os.str();
}

void checkTensor(const Comm &comm, const char *op, const char *what, const at::Tensor &t,
                 const std::function<bool(const at::Tensor &)> &deviceOk,
                 const std::string &deviceWhat) {
  std::string head = who(comm) + ": " + op + ": ";
  if (!t.defined())
    throw CommError(head + what + " is an undefined tensor");
  if (!t.is_contiguous())
    throw CommError(head + what + " is not contiguous");
  if (!deviceOk(t))
    throw CommError(head + what + " is on " + t.device().str() + ", expected " + deviceWhat);
}

void checkGather(const Comm &comm, const char *op, const at::Tensor &out, const at::Tensor &in) {
  std::string head = who(comm) + ": " + op + ": ";
  if (out.scalar_type() != in.scalar_type() || out.device() != in.device())
    throw CommError(head + "out (" + describe(out) + ") and in (" + describe(in) +
                    ") differ in dtype or device");
  if (out.numel() != in.numel() * comm.size())
    throw CommError(head + "out has " + std::to_string(out.numel()) +
                    " elements, expected in.numel() * size() = " +
                    std::to_string(in.numel() * comm.size()));
}

void checkReducible(const Comm &comm, const char *op, const at::Tensor &t) {
  at::ScalarType s = t.scalar_type();
  if (!at::isFloatingType(s) && !at::isIntegralType(s, /*includeBool=*/true))
    throw CommError(who(comm) + ": " + op + ": cannot reduce tensors of " +
                    std::string(c10::toString(s)));
}

void checkScatter(const Comm &comm, const char *op, const at::Tensor &out, const at::Tensor &in) {
  std::string head = who(comm) + ": " + op + ": ";
  if (out.scalar_type() != in.scalar_type() || out.device() != in.device())
    throw CommError(head + "out (" + describe(out) + ") and in (" + describe(in) +
                    ") differ in dtype or device");
  if (in.numel() != out.numel() * comm.size())
    throw CommError(head + "in has " + std::to_string(in.numel()) +
                    " elements, expected out.numel() * size() = " +
                    std::to_string(out.numel() * comm.size()));
  checkReducible(comm, op, in);
}

void checkCounts(const Comm &comm, const char *op, const char *what,
                 const std::vector<int64_t> &counts) {
  std::string head = who(comm) + ": " + op + ": ";
  if (static_cast<int64_t>(counts.size()) != comm.size())
    throw CommError(head + what + " has " + std::to_string(counts.size()) +
                    " entries, expected one per rank (" + std::to_string(comm.size()) + ")");
  for (size_t r = 0; r < counts.size(); ++r)
    if (counts[r] < 0)
      throw CommError(head + what + "[" + std::to_string(r) + "] is " + std::to_string(counts[r]) +
                      ", expected a row count >= 0");
}

int64_t rowNumel(const at::Tensor &t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d)
    n *= t.size(d);
  return n;
}

void checkAllToAll(const Comm &comm, const char *op, const at::Tensor &out, const at::Tensor &in,
                   const std::vector<int64_t> &sendCounts, const std::vector<int64_t> &recvCounts) {
  std::string head = who(comm) + ": " + op + ": ";
  checkCounts(comm, op, "sendCounts", sendCounts);
  checkCounts(comm, op, "recvCounts", recvCounts);
  if (out.scalar_type() != in.scalar_type() || out.device() != in.device())
    throw CommError(head + "out (" + describe(out) + ") and in (" + describe(in) +
                    ") differ in dtype or device");
  for (auto [what, t] : {std::pair{"in", &in}, std::pair{"out", &out}})
    if (t->dim() == 0)
      throw CommError(head + what + " is 0-dimensional, expected rows along dim 0");
  if (rowNumel(in) != rowNumel(out))
    throw CommError(head + "in has rows of " + std::to_string(rowNumel(in)) + " elements, out of " +
                    std::to_string(rowNumel(out)) +
                    " (rows are dim 0; the other dims must hold as many elements)");
  auto sum = [](const std::vector<int64_t> &v) {
    int64_t s = 0;
    for (int64_t x : v)
      s += x;
    return s;
  };
  for (auto [what, t, counts, name] : {std::tuple{"in", &in, &sendCounts, "sendCounts"},
                                       std::tuple{"out", &out, &recvCounts, "recvCounts"}})
    if (t->size(0) != sum(*counts))
      throw CommError(head + what + " has " + std::to_string(t->size(0)) + " rows (dim 0), but " +
                      name + " sum to " + std::to_string(sum(*counts)));
  const auto self = static_cast<size_t>(comm.rank());
  if (sendCounts[self] != recvCounts[self])
    throw CommError(head + "sendCounts[" + std::to_string(self) + "] is " +
                    std::to_string(sendCounts[self]) + " but recvCounts[" + std::to_string(self) +
                    "] is " + std::to_string(recvCounts[self]) +
                    " (the rows this rank sends itself are the rows it receives from itself)");
  const auto *o = static_cast<const char *>(out.data_ptr());
  const auto *i = static_cast<const char *>(in.data_ptr());
  if (out.nbytes() && in.nbytes() && o < i + in.nbytes() && i < o + out.nbytes())
    throw CommError(head + "out and in overlap");
}

void checkRoot(const Comm &comm, const char *op, int64_t root) {
  if (root < 0 || root >= comm.size())
    throw CommError(who(comm) + ": " + op + ": root " + std::to_string(root) +
                    " is not a rank of this communicator");
}

void checkPeer(const Comm &comm, const char *op, int64_t peer, const at::Tensor &t) {
  if (peer < 0 || peer >= comm.size() || peer == comm.rank())
    throw CommError(who(comm) + ": " + op + ": peer " + std::to_string(peer) +
                    " is not another rank of this communicator");
  if (!t.is_contiguous())
    throw CommError(who(comm) + ": " + op + ": the tensor must be contiguous");
}

} // namespace detail

namespace {

using namespace detail;

bool anyDevice(const at::Tensor &) { return true; }

/// One rank: collectives are local copies on the tensors' device.
class LocalComm : public Comm {
public:
  LocalComm(std::string name, std::chrono::milliseconds timeout)
      : name_(std::move(name)), timeout_(timeout) {}

  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  std::string name() const override { return name_; }
  std::string backend() const override { return "local"; }
  at::Device device() const override { return at::Device(at::kCPU); }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  std::shared_ptr<Work> allGather(at::Tensor out, at::Tensor in) override {
    checkTensor(*this, "all_gather", "out", out, anyDevice, "any device");
    checkTensor(*this, "all_gather", "in", in, anyDevice, "any device");
    checkGather(*this, "all_gather", out, in);
    copy(out, in);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> reduceScatter(at::Tensor out, at::Tensor in, ReduceOp) override {
    checkTensor(*this, "reduce_scatter", "out", out, anyDevice, "any device");
    checkTensor(*this, "reduce_scatter", "in", in, anyDevice, "any device");
    checkScatter(*this, "reduce_scatter", out, in);
    copy(out, in);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> allToAll(at::Tensor out, at::Tensor in,
                                 const std::vector<int64_t> &sendCounts,
                                 const std::vector<int64_t> &recvCounts) override {
    checkTensor(*this, "all_to_all", "out", out, anyDevice, "any device");
    checkTensor(*this, "all_to_all", "in", in, anyDevice, "any device");
    checkAllToAll(*this, "all_to_all", out, in, sendCounts, recvCounts);
    copy(out, in);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> allReduce(at::Tensor t, ReduceOp) override {
    checkTensor(*this, "all_reduce", "tensor", t, anyDevice, "any device");
    checkReducible(*this, "all_reduce", t);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> broadcast(at::Tensor t, int64_t root) override {
    checkTensor(*this, "broadcast", "tensor", t, anyDevice, "any device");
    checkRoot(*this, "broadcast", root);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> send(at::Tensor t, int64_t peer) override {
    checkPeer(*this, "send", peer, t); // one rank: there is no other
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> recv(at::Tensor t, int64_t peer) override {
    checkPeer(*this, "recv", peer, t);
    return std::make_shared<DoneWork>();
  }
  void barrier() override {}
  std::unique_ptr<Comm> split(int64_t color, int64_t, const std::string &name) override {
    if (color < 0)
      return nullptr;
    return std::make_unique<LocalComm>(name, timeout_);
  }

private:
  static void copy(const at::Tensor &out, const at::Tensor &in) {
    if (out.numel() == 0 || out.data_ptr() == in.data_ptr())
      return;
    out.view({-1}).copy_(in.view({-1}));
  }

  std::string name_;
  std::chrono::milliseconds timeout_;
};

} // namespace

std::vector<int64_t> allToAllCounts(Comm &comm, const std::vector<int64_t> &sendCounts) {
  detail::checkCounts(comm, "all_to_all_counts", "sendCounts", sendCounts);
  const int64_t n = comm.size();
  auto options = at::TensorOptions().dtype(at::kLong);
  at::Tensor in = at::from_blob(const_cast<int64_t *>(sendCounts.data()), {n, 1}, options)
                      .to(comm.device(), /*non_blocking=*/false, /*copy=*/true);
  at::Tensor out = at::empty({n, 1}, options.device(comm.device()));
  std::vector<int64_t> ones(n, 1);
  comm.allToAll(out, in, ones, ones)->wait();
  out = out.cpu(); // after the current stream waited for the exchange
  const int64_t *p = out.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + n);
}

std::unique_ptr<Comm> createLocalComm(const CommOptions &options) {
  return std::make_unique<LocalComm>(options.name, detail::resolveTimeout(options.timeout));
}

} // namespace bmt::runtime
