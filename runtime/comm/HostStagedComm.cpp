//===- HostStagedComm.cpp - the CPU backend for GPU tensors ---------------===//
//
// createHostStagedComm (Comm.h): each operation copies its GPU tensors to
// host memory, runs the CPU backend's operation on the copies, and its
// Work's wait() copies the results back. For several ranks sharing one GPU
// (NCCL refuses two ranks on one device): tests of the GPU paths of
// pipeline, tensor and expert parallelism on a one-GPU machine. Slow by
// design; not a production backend.
//
//===----------------------------------------------------------------------===//

#include "CommInternal.h"

#include <ATen/ops/empty.h>

#include <utility>

namespace bmt::runtime {

namespace {

/// A host copy of `t` (after the current stream's work on it).
at::Tensor toHost(const at::Tensor &t) { return t.to(at::kCPU).contiguous(); }

/// An uninitialised host tensor shaped as `t`.
at::Tensor hostLike(const at::Tensor &t) {
  return at::empty(t.sizes(), t.options().device(at::kCPU));
}

/// The CPU operation's Work; wait() then copies each host result into its
/// GPU tensor (once; a failed operation throws again on every wait()).
class StagedWork : public Work {
public:
  StagedWork(std::shared_ptr<Work> inner, std::vector<std::pair<at::Tensor, at::Tensor>> back)
      : inner_(std::move(inner)), back_(std::move(back)) {}
  void wait() override {
    inner_->wait();
    for (auto &[device, host] : back_)
      device.copy_(host);
    back_.clear();
  }

private:
  std::shared_ptr<Work> inner_;
  std::vector<std::pair<at::Tensor, at::Tensor>> back_; ///< (GPU tensor, host result)
};

class HostStagedComm : public Comm {
public:
  HostStagedComm(std::unique_ptr<Comm> cpu, at::Device device)
      : cpu_(std::move(cpu)), device_(device) {}

  int64_t rank() const override { return cpu_->rank(); }
  int64_t size() const override { return cpu_->size(); }
  std::string name() const override { return cpu_->name(); }
  std::string backend() const override { return "cpu-host-staged"; }
  at::Device device() const override { return device_; }
  std::chrono::milliseconds timeout() const override { return cpu_->timeout(); }

  std::shared_ptr<Work> allGather(at::Tensor out, at::Tensor in) override {
    check("all_gather", "out", out);
    check("all_gather", "in", in);
    at::Tensor hostOut = hostLike(out);
    return staged(cpu_->allGather(hostOut, toHost(in)), {{out, hostOut}});
  }
  std::shared_ptr<Work> reduceScatter(at::Tensor out, at::Tensor in, ReduceOp op) override {
    check("reduce_scatter", "out", out);
    check("reduce_scatter", "in", in);
    at::Tensor hostOut = hostLike(out);
    return staged(cpu_->reduceScatter(hostOut, toHost(in), op), {{out, hostOut}});
  }
  std::shared_ptr<Work> allToAll(at::Tensor out, at::Tensor in,
                                 const std::vector<int64_t> &sendCounts,
                                 const std::vector<int64_t> &recvCounts) override {
    check("all_to_all", "out", out);
    check("all_to_all", "in", in);
    at::Tensor hostOut = hostLike(out);
    return staged(cpu_->allToAll(hostOut, toHost(in), sendCounts, recvCounts), {{out, hostOut}});
  }
  std::shared_ptr<Work> allReduce(at::Tensor t, ReduceOp op) override {
    check("all_reduce", "tensor", t);
    at::Tensor host = toHost(t);
    return staged(cpu_->allReduce(host, op), {{t, host}});
  }
  std::shared_ptr<Work> broadcast(at::Tensor t, int64_t root) override {
    check("broadcast", "tensor", t);
    at::Tensor host = toHost(t);
    return staged(cpu_->broadcast(host, root), {{t, host}});
  }
  std::shared_ptr<Work> send(at::Tensor t, int64_t peer) override {
    check("send", "tensor", t);
    return cpu_->send(toHost(t), peer);
  }
  std::shared_ptr<Work> recv(at::Tensor t, int64_t peer) override {
    check("recv", "tensor", t);
    at::Tensor host = hostLike(t);
    return staged(cpu_->recv(host, peer), {{t, host}});
  }
  void barrier() override { cpu_->barrier(); }
  std::unique_ptr<Comm> split(int64_t color, int64_t key, const std::string &name) override {
    std::unique_ptr<Comm> part = cpu_->split(color, key, name);
    return part ? std::make_unique<HostStagedComm>(std::move(part), device_) : nullptr;
  }

private:
  void check(const char *op, const char *what, const at::Tensor &t) const {
    detail::checkTensor(*this, op, what, t,
                        [&](const at::Tensor &x) { return x.device() == device_; },
                        device_.str());
  }
  static std::shared_ptr<Work> staged(std::shared_ptr<Work> inner,
                                      std::vector<std::pair<at::Tensor, at::Tensor>> back) {
    return std::make_shared<StagedWork>(std::move(inner), std::move(back));
  }

  std::unique_ptr<Comm> cpu_;
  at::Device device_;
};

} // namespace

std::unique_ptr<Comm> createHostStagedComm(std::unique_ptr<Comm> cpu, at::Device device) {
  if (!cpu || cpu->backend() != "cpu")
    throw CommError("createHostStagedComm: needs a CPU backend communicator");
  return std::make_unique<HostStagedComm>(std::move(cpu), device);
}

} // namespace bmt::runtime
