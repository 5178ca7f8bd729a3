//===- Comm.cpp - Comm interface, shared checks, the local backend --------===//
//
// The local backend serves a single process (rank 0 of 1): collectives are
// copies on the tensors' device, so the executor needs no special case for
// one rank.
//
//===----------------------------------------------------------------------===//

#include "CommInternal.h"

#include "bmt/Runtime/Env.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

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

void checkRoot(const Comm &comm, const char *op, int64_t root) {
  if (root < 0 || root >= comm.size())
    throw CommError(who(comm) + ": " + op + ": root " + std::to_string(root) +
                    " is not a rank of this communicator");
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

std::unique_ptr<Comm> createLocalComm(const CommOptions &options) {
  return std::make_unique<LocalComm>(options.name, detail::resolveTimeout(options.timeout));
}

} // namespace bmt::runtime
