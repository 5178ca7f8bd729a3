//===- HostStagedTest.cpp - the CPU backend for GPU tensors ---------------===//
//
// createHostStagedComm over the CPU backend: 3 ranks as threads, their
// tensors on cuda:0 when CUDA is there (several ranks sharing one GPU, as
// BMT_DEBUG_COMM=host runs them), else on the CPU. Every operation's result
// against values computed here, on the tensors' own device: all-gather
// (in place too), reduce-scatter (in place), all-reduce, broadcast,
// all-to-all, a send/recv ring, a split.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/comm/Comm.h"
#include "CpuRanks.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <thread>

namespace {

using namespace bmt::runtime;

at::Device sharedDevice() {
  return at::hasCUDA() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

/// Rank r's values: r * 100 + i (exact in float32).
at::Tensor values(int64_t r, int64_t n, at::Device device) {
  return (at::arange(n, at::TensorOptions().dtype(at::kFloat)) + 100.0 * r).to(device);
}

void expectOn(const at::Tensor &got, const at::Tensor &want, at::Device device,
              const std::string &what) {
  EXPECT_EQ(got.device(), device) << what;
  EXPECT_TRUE(at::equal(got.cpu(), want.cpu())) << what << ": " << got << " vs " << want;
}

TEST(CommHostStaged, EveryOperationOnOneDevice) {
  const int64_t size = 3, n = 4;
  const at::Device device = sharedDevice();
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<Comm> comm =
            createHostStagedComm(createCpuComm(store, r, size), device);
        EXPECT_EQ(comm->backend(), "cpu-host-staged");
        EXPECT_EQ(comm->device(), device);
        std::vector<at::Tensor> all;
        for (int64_t q = 0; q < size; ++q)
          all.push_back(values(q, n, device));
        at::Tensor gathered = at::cat(all);

        at::Tensor out = at::zeros({size * n}, at::TensorOptions().device(device));
        comm->allGather(out, values(r, n, device))->wait();
        expectOn(out, gathered, device, "all_gather");
        at::Tensor buf = at::zeros({size * n}, at::TensorOptions().device(device));
        buf.narrow(0, r * n, n).copy_(values(r, n, device));
        comm->allGather(buf, buf.narrow(0, r * n, n))->wait();
        expectOn(buf, gathered, device, "in-place all_gather");

        // Reduce-scatter of every rank's `gathered`: slot r times 3.
        at::Tensor in = gathered.clone();
        comm->reduceScatter(in.narrow(0, r * n, n), in)->wait();
        expectOn(in.narrow(0, r * n, n), values(r, n, device) * 3, device,
                 "in-place reduce_scatter");

        at::Tensor sum = values(r, n, device);
        comm->allReduce(sum)->wait();
        expectOn(sum, all[0] + all[1] + all[2], device, "all_reduce");

        at::Tensor b = values(r, n, device);
        comm->broadcast(b, 2)->wait();
        expectOn(b, all[2], device, "broadcast");

        // All-to-all: q rows to rank q (row of rank r to rank q: r * 10 + q).
        std::vector<int64_t> sendCounts, recvCounts;
        std::vector<at::Tensor> rows, want;
        for (int64_t q = 0; q < size; ++q) {
          sendCounts.push_back(q + 1);
          recvCounts.push_back(r + 1);
          rows.push_back(at::full({q + 1, 2}, double(r * 10 + q),
                                  at::TensorOptions().device(device)));
          want.push_back(at::full({r + 1, 2}, double(q * 10 + r)));
        }
        at::Tensor got = at::empty({size * (r + 1), 2}, at::TensorOptions().device(device));
        comm->allToAll(got, at::cat(rows), sendCounts, recvCounts)->wait();
        expectOn(got, at::cat(want), device, "all_to_all");

        // A ring: send to the next rank, receive from the previous.
        const int64_t next = (r + 1) % size, prev = (r + size - 1) % size;
        std::shared_ptr<Work> sent = comm->send(values(r, n, device), next);
        at::Tensor received = at::empty({n}, at::TensorOptions().device(device));
        comm->recv(received, prev)->wait();
        sent->wait();
        expectOn(received, all[prev], device, "recv");

        std::unique_ptr<Comm> pair = comm->split(r < 2 ? 0 : -1, r, "pair");
        if (r < 2) {
          ASSERT_TRUE(pair);
          EXPECT_EQ(pair->device(), device);
          at::Tensor t = values(r, n, device);
          pair->allReduce(t)->wait();
          expectOn(t, all[0] + all[1], device, "split all_reduce");
        } else {
          EXPECT_FALSE(pair);
        }
        comm->barrier();
      } catch (const std::exception &e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  for (auto &t : threads)
    t.join();
}

TEST(CommHostStaged, RefusesAnotherBackendAndAnotherDevice) {
  EXPECT_THROW(createHostStagedComm(createLocalComm(), sharedDevice()), CommError);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::unique_ptr<Comm> comm = createHostStagedComm(createCpuComm(store, 0, 1), sharedDevice());
  at::Tensor elsewhere = at::zeros({2}, at::TensorOptions().device(
      sharedDevice().is_cuda() ? at::Device(at::kCPU) : at::Device(at::kMeta)));
  EXPECT_THROW(comm->allReduce(elsewhere), CommError);
}

} // namespace
