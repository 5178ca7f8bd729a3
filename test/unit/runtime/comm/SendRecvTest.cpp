//===- SendRecvTest.cpp - point-to-point send and recv --------------------===//
//
// The CPU backend's send/recv (pipeline parallelism's activations and
// gradients) on N ranks as threads over one c10d::HashStore, and over a
// TCPStore for values larger than one store message: values arrive in
// order per peer pair, untouched, and do not disturb the collectives'
// numbering (a collective and a split after unequal numbers of sends);
// mismatched sizes, a bad peer and the local backend; keys are deleted.
// SendRecvNccl needs two CUDA devices and skips without them.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/comm/Comm.h"
#include "CpuRanks.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace {

using namespace bmt::runtime;
using namespace bmt::test;
using namespace std::chrono_literals;

/// The k-th value rank `from` sends: distinct per sender and message, in
/// `dtype` (not exactly representable in the narrow float types).
at::Tensor message(int64_t from, int64_t k, int64_t n, at::ScalarType dtype) {
  at::Tensor x = at::arange(n, at::TensorOptions().dtype(at::kDouble)) / 3 + from * 100 + k;
  return x.to(dtype);
}

class SendRecv : public ::testing::TestWithParam<int64_t> {};

TEST_P(SendRecv, RingInOrderBesideCollectives) {
  // Each rank sends three values of different dtypes to the next rank and
  // receives three from the previous one (a pipeline's activations), then
  // rank 0 alone sends one more to rank 1: the collectives and the split
  // after that still match across ranks.
  const int64_t size = GetParam();
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kBFloat16, at::kLong};
  runRanks(size, [&](int64_t r, Comm &comm) {
    int64_t next = (r + 1) % size, prev = (r + size - 1) % size;
    std::vector<std::shared_ptr<Work>> sends;
    std::vector<at::Tensor> got;
    for (size_t k = 0; k < dtypes.size(); ++k)
      sends.push_back(comm.send(message(r, k, 5 + k, dtypes[k]), next));
    for (size_t k = 0; k < dtypes.size(); ++k) {
      got.push_back(at::empty({int64_t(5 + k)}, at::TensorOptions().dtype(dtypes[k])));
      comm.recv(got.back(), prev)->wait();
    }
    for (auto &w : sends)
      w->wait();
    for (size_t k = 0; k < dtypes.size(); ++k)
      EXPECT_TRUE(at::equal(got[k], message(prev, k, 5 + k, dtypes[k])))
          << "rank " << r << " message " << k << ": " << got[k];
    if (r == 0)
      comm.send(at::full({2}, 7.0), 1)->wait();
    if (r == 1) {
      at::Tensor extra = at::empty({2});
      comm.recv(extra, 0)->wait();
      EXPECT_EQ(extra[1].item<float>(), 7.0f);
    }
    at::Tensor t = at::full({1}, double(r), at::TensorOptions().dtype(at::kDouble));
    comm.allReduce(t)->wait();
    EXPECT_EQ(t.item<double>(), size * (size - 1) / 2.0);
    std::unique_ptr<Comm> sub = comm.split(r % 2, r, "stage");
    ASSERT_TRUE(sub);
    if (sub->size() > 1) {
      // Within the sub-communicator: its rank 0 sends to its rank 1.
      at::Tensor v = at::full({3}, double(r), at::TensorOptions().dtype(at::kDouble));
      if (sub->rank() == 0)
        sub->send(v, 1)->wait();
      else if (sub->rank() == 1)
        sub->recv(v, 0)->wait();
      EXPECT_EQ(v[0].item<double>(), sub->rank() == 1 ? r - 2 : r);
    }
    comm.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, SendRecv, ::testing::Values(2, 3, 4),
                         [](const auto &info) { return "N" + std::to_string(info.param); });

TEST(SendRecvTcp, ValuesLargerThanAStoreMessage) {
  // 3 M floats (12 MB): more than TCPStore's 8 MiB message, sent in pieces.
  const int64_t n = 3 << 20;
  runRanks(
      2,
      [&](int64_t r, Comm &comm) {
        if (r == 0) {
          comm.send(message(0, 0, n, at::kFloat), 1)->wait();
        } else {
          at::Tensor t = at::empty({n});
          comm.recv(t, 0)->wait();
          EXPECT_TRUE(at::equal(t, message(0, 0, n, at::kFloat)));
        }
        comm.barrier();
      },
      StoreKind::Tcp);
}

TEST(SendRecvErrors, SizeMismatchAndBadPeer) {
  runRanks(2, [&](int64_t r, Comm &comm) {
    // A peer outside the communicator, or this rank itself: at once.
    EXPECT_THROW(comm.send(at::ones({1}), r), CommError);
    EXPECT_THROW(comm.recv(at::ones({1}), 2), CommError);
    if (r == 0) {
      comm.send(at::ones({4}), 1)->wait();
    } else {
      at::Tensor t = at::empty({5});
      try {
        comm.recv(t, 0)->wait();
        ADD_FAILURE() << "no error";
      } catch (const CommError &e) {
        EXPECT_NE(std::string(e.what()).find("recv #1 failed: rank 0 called send of 4 elements"),
                  std::string::npos)
            << e.what();
      }
    }
  });
}

TEST(SendRecvErrors, KeysAreDeletedAndLocalRefuses) {
  auto server = c10::make_intrusive<c10d::HashStore>();
  int64_t before = server->getNumKeys();
  {
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        auto comm = createCpuComm(server, r, 2);
        at::Tensor t = at::ones({3 << 20}); // in pieces
        if (r == 0)
          comm->send(t, 1)->wait();
        else
          comm->recv(t, 0)->wait();
        comm->barrier();
      });
    for (auto &t : threads)
      t.join();
  }
  for (int i = 0; i < 100 && server->getNumKeys() != before; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server->getNumKeys(), before);
  // One rank has no peer.
  auto local = createLocalComm();
  EXPECT_THROW(local->send(at::ones({1}), 0), CommError);
}

TEST(SendRecvNccl, RingOnEveryVisibleDevice) {
  if (!ncclAvailable())
    GTEST_SKIP() << "this build has no NCCL backend";
  if (!at::hasCUDA() || at::getNumGPUs() < 2)
    GTEST_SKIP() << "fewer than 2 CUDA devices";
  int64_t n = std::min<int64_t>(at::getNumGPUs(), 4);
  runNcclRanks(n, [&](int64_t r, Comm &comm, at::Device dev) {
    int64_t next = (r + 1) % n, prev = (r + n - 1) % n;
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
      // Even ranks send first, odd ranks receive first (blocking
      // NCCL point-to-point between two ranks must not both send).
      at::Tensor out = message(r, 0, 1000, dt).to(dev);
      at::Tensor in = at::empty({1000}, out.options());
      if (r % 2 == 0) {
        comm.send(out, next)->wait();
        comm.recv(in, prev)->wait();
      } else {
        comm.recv(in, prev)->wait();
        comm.send(out, next)->wait();
      }
      EXPECT_TRUE(at::equal(in.cpu(), message(prev, 0, 1000, dt))) << "rank " << r;
    }
    // Collectives stay in step after the point-to-point traffic.
    at::Tensor t = at::full({4}, double(r), at::TensorOptions().device(dev));
    comm.allReduce(t)->wait();
    EXPECT_EQ(t.cpu()[0].item<double>(), n * (n - 1) / 2.0);
    comm.barrier();
  });
}

} // namespace
