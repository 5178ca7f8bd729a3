//===- CommTest.cpp - collectives, split, timeouts, rendezvous ------------===//
//
// N = 1..4 ranks as threads of this process over one c10d::HashStore (and
// a suite over TCPStore clients of a server on a free port), checked
// against values computed here; mismatched arguments and a rank that never
// joins (timeout); the local backend; torchrun's environment parsing and
// connect() through the rendezvous (rank 0 hosting the store, and an agent
// store). CommTorchrun.* runs under torchrun (ctest entry comm-torchrun) and
// skips otherwise; CommNccl.* needs CUDA devices and skips without them.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/comm/Comm.h"
#include "bmt/Runtime/comm/Rendezvous.h"
#include "CpuRanks.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

using namespace bmt::runtime;
using namespace bmt::test;
using namespace std::chrono_literals;

/// Rank r's input: r * 1000 + 0.1 * i + 1/3 (not exactly representable,
/// so that rounding shows), in `dtype`.
at::Tensor input(int64_t r, int64_t n, at::ScalarType dtype) {
  at::Tensor x = at::arange(n, at::TensorOptions().dtype(at::kDouble)) * 0.1 + r * 1000 + 1.0 / 3;
  if (!at::isFloatingType(dtype))
    x = at::arange(n, at::TensorOptions().dtype(at::kLong)) * 7 + r * 1000 - 3;
  return x.to(dtype);
}

/// The expected reduction of inputs(0..size-1)[begin, begin+n): in rank
/// order in double (int64 for integers), rounded once.
at::Tensor expectedReduce(int64_t size, int64_t total, int64_t begin, int64_t n,
                          at::ScalarType dtype, ReduceOp op) {
  at::ScalarType acc = at::isFloatingType(dtype) ? at::kDouble : at::kLong;
  at::Tensor sum = input(0, total, dtype).narrow(0, begin, n).to(acc);
  for (int64_t r = 1; r < size; ++r) {
    at::Tensor x = input(r, total, dtype).narrow(0, begin, n).to(acc);
    sum = op == ReduceOp::Sum ? sum + x : at::maximum(sum, x);
  }
  return sum.to(dtype);
}

void expectEqual(const at::Tensor &got, const at::Tensor &want, const std::string &what) {
  EXPECT_TRUE(at::equal(got.view({-1}), want.view({-1})))
      << what << "\ngot  " << got.view({-1}).slice(0, 0, 8) << "\nwant "
      << want.view({-1}).slice(0, 0, 8);
}

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf,
                                             at::kLong};

class CommCpu : public ::testing::TestWithParam<int64_t> {};

TEST_P(CommCpu, AllGather) {
  int64_t size = GetParam();
  runRanks(size, [&](int64_t r, Comm &comm) {
    EXPECT_EQ(comm.rank(), r);
    EXPECT_EQ(comm.size(), size);
    EXPECT_EQ(comm.name(), "world");
    EXPECT_EQ(comm.backend(), "cpu");
    for (at::ScalarType dt : kDtypes) {
      const int64_t n = 5;
      at::Tensor out = at::zeros({size, n}, at::TensorOptions().dtype(dt));
      comm.allGather(out, input(r, n, dt))->wait();
      for (int64_t q = 0; q < size; ++q)
        expectEqual(out[q], input(q, n, dt), "all_gather rank " + std::to_string(q));
      // In place: the input is this rank's slot of the output.
      at::Tensor buf = at::zeros({size * n}, at::TensorOptions().dtype(dt));
      at::Tensor slot = buf.narrow(0, r * n, n);
      slot.copy_(input(r, n, dt));
      comm.allGather(buf, slot)->wait();
      expectEqual(buf, out, "in-place all_gather");
    }
  });
}

TEST_P(CommCpu, ReduceScatter) {
  int64_t size = GetParam();
  runRanks(size, [&](int64_t r, Comm &comm) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
      for (at::ScalarType dt : kDtypes) {
        const int64_t n = 6;
        at::Tensor out = at::empty({n}, at::TensorOptions().dtype(dt));
        comm.reduceScatter(out, input(r, n * size, dt), op)->wait();
        expectEqual(out, expectedReduce(size, n * size, r * n, n, dt, op),
                    std::string("reduce_scatter ") + reduceOpName(op));
        // In place: the output is this rank's slot of the input.
        at::Tensor in = input(r, n * size, dt);
        at::Tensor slot = in.narrow(0, r * n, n);
        comm.reduceScatter(slot, in, op)->wait();
        expectEqual(slot, out, "in-place reduce_scatter");
      }
  });
}

TEST_P(CommCpu, AllReduceIsBitIdenticalOnEveryRank) {
  int64_t size = GetParam();
  std::mutex m;
  std::map<int64_t, at::Tensor> results;
  runRanks(size, [&](int64_t r, Comm &comm) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
      for (at::ScalarType dt : kDtypes) {
        const int64_t n = 7;
        at::Tensor t = input(r, n, dt).reshape({7, 1});
        comm.allReduce(t, op)->wait();
        expectEqual(t, expectedReduce(size, n, 0, n, dt, op),
                    std::string("all_reduce ") + reduceOpName(op));
      }
    // Float sums of many ranks must agree bit for bit.
    at::Tensor t = at::full({3}, 0.1f + 0.01f * r, at::TensorOptions().dtype(at::kFloat));
    comm.allReduce(t)->wait();
    std::lock_guard<std::mutex> lock(m);
    results[r] = t;
  });
  for (auto &[r, t] : results)
    EXPECT_TRUE(at::equal(t, results[0])) << "rank " << r;
}

TEST_P(CommCpu, MaxKeepsInfAndNan) {
  int64_t size = GetParam();
  runRanks(size, [&](int64_t r, Comm &comm) {
    float inf = std::numeric_limits<float>::infinity();
    at::Tensor t = at::tensor({r == size - 1 ? inf : 0.f, r == 0 ? NAN : 1.f});
    comm.allReduce(t, ReduceOp::Max)->wait();
    EXPECT_TRUE(std::isinf(t[0].item<float>()));
    EXPECT_TRUE(std::isnan(t[1].item<float>()));
    at::Tensor flag = at::full({1}, r == size - 1, at::TensorOptions().dtype(at::kBool));
    comm.allReduce(flag)->wait();
    EXPECT_TRUE(flag.item<bool>());
  });
}

TEST_P(CommCpu, Broadcast) {
  int64_t size = GetParam();
  runRanks(size, [&](int64_t r, Comm &comm) {
    for (at::ScalarType dt : kDtypes)
      for (int64_t root = 0; root < size; ++root) {
        at::Tensor t = input(r, 9, dt);
        comm.broadcast(t, root)->wait();
        expectEqual(t, input(root, 9, dt), "broadcast from " + std::to_string(root));
      }
  });
}

TEST_P(CommCpu, Barrier) {
  int64_t size = GetParam();
  std::atomic<int> arrived{0};
  runRanks(size, [&](int64_t r, Comm &comm) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30 * r));
    ++arrived;
    comm.barrier();
    EXPECT_EQ(arrived.load(), size);
  });
}

TEST_P(CommCpu, ManyOutstandingCollectivesCompleteInOrder) {
  int64_t size = GetParam();
  runRanks(size, [&](int64_t r, Comm &comm) {
    std::vector<at::Tensor> ts;
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 10; ++i) {
      ts.push_back(at::full({4}, static_cast<double>(r + i), at::TensorOptions().dtype(at::kDouble)));
      works.push_back(comm.allReduce(ts.back()));
    }
    for (int i = 9; i >= 0; --i) {
      works[i]->wait();
      works[i]->wait(); // again: returns at once
      EXPECT_EQ(ts[i][0].item<double>(), size * (size - 1) / 2.0 + size * i);
    }
  });
}

TEST_P(CommCpu, Split) {
  int64_t size = GetParam();
  runRanks(size, [&](int64_t r, Comm &comm) {
    // Two groups by parity, ordered by descending world rank.
    std::unique_ptr<Comm> sub = comm.split(r % 2, -r, "shard");
    ASSERT_TRUE(sub);
    std::vector<int64_t> members;
    for (int64_t q = size - 1; q >= 0; --q)
      if (q % 2 == r % 2)
        members.push_back(q);
    EXPECT_EQ(sub->name(), "shard");
    EXPECT_EQ(sub->size(), static_cast<int64_t>(members.size()));
    EXPECT_EQ(members[sub->rank()], r);
    at::Tensor t = at::full({2}, r, at::TensorOptions().dtype(at::kLong));
    sub->allReduce(t)->wait();
    int64_t want = 0;
    for (int64_t q : members)
      want += q;
    EXPECT_EQ(t[0].item<int64_t>(), want);
    at::Tensor g = at::empty({sub->size()}, at::TensorOptions().dtype(at::kLong));
    sub->allGather(g, at::full({1}, r, at::TensorOptions().dtype(at::kLong)))->wait();
    for (size_t i = 0; i < members.size(); ++i)
      EXPECT_EQ(g[i].item<int64_t>(), members[i]);
    // The parent still works, interleaved with the child.
    at::Tensor w = at::full({1}, 1.0, at::TensorOptions().dtype(at::kDouble));
    auto work = comm.allReduce(w);
    sub->barrier();
    work->wait();
    EXPECT_EQ(w.item<double>(), size);
    // A rank with a negative color joins nothing; the others form a group.
    std::unique_ptr<Comm> some = comm.split(r == 0 ? -1 : 0, r, "replica");
    EXPECT_EQ(some == nullptr, r == 0);
    if (some) {
      EXPECT_EQ(some->size(), size - 1);
      EXPECT_EQ(some->rank(), r - 1);
      some->barrier();
    }
    comm.barrier();
  });
}

TEST(CommCpuTcp, EveryCollectiveOverTcpStore) {
  const int64_t size = 3;
  runRanks(
      size,
      [&](int64_t r, Comm &comm) {
        at::Tensor t = input(r, 5, at::kFloat);
        comm.allReduce(t)->wait();
        expectEqual(t, expectedReduce(size, 5, 0, 5, at::kFloat, ReduceOp::Sum), "all_reduce");
        at::Tensor out = at::empty({2}, at::TensorOptions().dtype(at::kBFloat16));
        comm.reduceScatter(out, input(r, 2 * size, at::kBFloat16), ReduceOp::Max)->wait();
        expectEqual(out, expectedReduce(size, 2 * size, 2 * r, 2, at::kBFloat16, ReduceOp::Max),
                    "reduce_scatter");
        at::Tensor g = at::empty({size * 4}, at::TensorOptions().dtype(at::kLong));
        comm.allGather(g, input(r, 4, at::kLong))->wait();
        for (int64_t q = 0; q < size; ++q)
          expectEqual(g.narrow(0, 4 * q, 4), input(q, 4, at::kLong), "all_gather");
        at::Tensor b = input(r, 3, at::kHalf);
        comm.broadcast(b, 2)->wait();
        expectEqual(b, input(2, 3, at::kHalf), "broadcast");
        auto sub = comm.split(r == 1 ? 1 : 0, 0, "shard");
        EXPECT_EQ(sub->size(), r == 1 ? 1 : 2);
        at::Tensor one = at::ones({1});
        sub->allReduce(one)->wait();
        EXPECT_EQ(one.item<float>(), sub->size());
        comm.barrier();
      },
      StoreKind::Tcp);
}

TEST(CommCpuTcp, ValuesLargerThanAStoreMessage) {
  // 3 M floats (12 MB) per rank: more than TCPStore's 8 MiB message limit,
  // so every value goes in pieces.
  const int64_t size = 2, n = 3 << 20;
  runRanks(
      size,
      [&](int64_t r, Comm &comm) {
        at::Tensor g = at::empty({size * n}, at::TensorOptions().dtype(at::kFloat));
        comm.allGather(g, input(r, n, at::kFloat))->wait();
        for (int64_t q = 0; q < size; ++q)
          expectEqual(g.narrow(0, n * q, n), input(q, n, at::kFloat), "all_gather");
        at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
        comm.reduceScatter(out, input(r, size * n, at::kFloat), ReduceOp::Sum)->wait();
        expectEqual(out, expectedReduce(size, size * n, r * n, n, at::kFloat, ReduceOp::Sum),
                    "reduce_scatter");
        at::Tensor b = input(r, n, at::kFloat);
        comm.broadcast(b, 1)->wait();
        expectEqual(b, input(1, n, at::kFloat), "broadcast");
        comm.barrier();
      },
      StoreKind::Tcp);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommCpu, ::testing::Values(1, 2, 3, 4),
                         [](const auto &info) { return "N" + std::to_string(info.param); });

TEST(CommCpuErrors, LocalArgumentErrorsThrowAtOnce) {
  runRanks(2, [&](int64_t r, Comm &comm) {
    at::Tensor in = at::zeros({4});
    try {
      comm.allGather(at::zeros({7}), in);
      ADD_FAILURE() << "no error";
    } catch (const CommError &e) {
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(r) + " of 2 (world): all_gather: out has 7 elements, expected in.numel() * size() = 8"), std::string::npos) << e.what();
    }
    EXPECT_THROW(comm.reduceScatter(at::zeros({3}), in), CommError);
    EXPECT_THROW(comm.allGather(at::zeros({8}, at::TensorOptions().dtype(at::kDouble)), in),
                 CommError);
    EXPECT_THROW(comm.allReduce(at::zeros({4, 4}).t()), CommError); // not contiguous
    EXPECT_THROW(comm.broadcast(in, 2), CommError);
    EXPECT_THROW(comm.allReduce(at::Tensor()), CommError);
    // The communicator is still usable: nothing was issued.
    at::Tensor t = at::ones({2});
    comm.allReduce(t)->wait();
    EXPECT_EQ(t[0].item<float>(), 2.f);
  });
}

TEST(CommCpuErrors, PeerMismatchIsReportedOnBothRanks) {
  runRanks(2, [&](int64_t r, Comm &comm) {
    at::Tensor t = at::zeros({r == 0 ? 4 : 5});
    try {
      comm.allReduce(t)->wait();
      ADD_FAILURE() << "no error";
    } catch (const CommError &e) {
      std::string other = std::to_string(1 - r);
      EXPECT_NE(std::string(e.what()).find("all_reduce #1 failed: rank " + other + " called all_reduce(sum) of " + (r == 0 ? "5" : "4") + " elements of Float"), std::string::npos) << e.what();
    }
  });
}

TEST(CommCpuErrors, TimeoutNamesRankAndCollective) {
  std::atomic<bool> rank0Done{false};
  runRanks(
      2,
      [&](int64_t r, Comm &comm) {
        if (r == 1) {
          // Never joins the all-gather; keeps its communicator alive until
          // rank 0 has seen the timeout.
          while (!rank0Done)
            std::this_thread::sleep_for(10ms);
          return;
        }
        auto start = std::chrono::steady_clock::now();
        at::Tensor out = at::zeros({8}), in = at::ones({4});
        try {
          comm.allGather(out, in)->wait();
          ADD_FAILURE() << "no timeout";
        } catch (const CommError &e) {
          double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          EXPECT_LT(s, 2.5);
          EXPECT_GE(s, 0.9);
          EXPECT_STREQ(e.what(),
                       "rank 0 of 2 (world): all_gather #1 timed out after 1 s waiting for rank 1");
        }
        // The communicator is broken from now on: later collectives fail at once.
        try {
          comm.allReduce(in)->wait();
          ADD_FAILURE() << "no error";
        } catch (const CommError &e) {
          EXPECT_NE(std::string(e.what()).find("all_reduce #2 not run: the communicator failed earlier"), std::string::npos) << e.what();
        }
        rank0Done = true;
      },
      StoreKind::Tcp, 1000ms);
}

TEST(CommCpuErrors, TimeoutListsEveryMissingRank) {
  std::atomic<int> waiting{0};
  runRanks(
      4,
      [&](int64_t r, Comm &comm) {
        if (r >= 2) {
          while (waiting < 2)
            std::this_thread::sleep_for(10ms);
          return;
        }
        try {
          comm.barrier();
          ADD_FAILURE() << "no timeout";
        } catch (const CommError &e) {
          EXPECT_EQ(std::string(e.what()),
                    "rank " + std::to_string(r) +
                        " of 4 (world): barrier #1 timed out after 0.5 s waiting for ranks 2, 3");
        }
        ++waiting;
      },
      StoreKind::Hash, 500ms);
}

TEST(CommCpuErrors, KeysAreDeleted) {
  auto server = c10::make_intrusive<c10d::HashStore>();
  int64_t before = server->getNumKeys();
  {
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < 3; ++r)
      threads.emplace_back([&, r] {
        auto comm = createCpuComm(server, r, 3);
        at::Tensor t = at::ones({3});
        comm->allReduce(t)->wait();
        at::Tensor out = at::empty({1});
        comm->reduceScatter(out, t)->wait();
        comm->broadcast(t, 1)->wait();
        comm->allGather(at::empty({9}), t)->wait();
        at::Tensor big = at::ones({3 << 20}); // in pieces
        comm->allGather(at::empty({3 * (3 << 20)}), big)->wait();
        auto sub = comm->split(0, 0, "sub");
        sub->allReduce(t)->wait();
        sub->barrier();
        comm->barrier();
      });
    for (auto &t : threads)
      t.join();
  }
  // The last reader of each collective deletes its keys (allow the final
  // barrier's deleter to finish).
  for (int i = 0; i < 100 && server->getNumKeys() != before; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server->getNumKeys(), before);
}

TEST(CommLocal, CollectivesAreCopies) {
  auto comm = createLocalComm();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend(), "local");
  at::Tensor in = at::arange(5, at::TensorOptions().dtype(at::kFloat));
  at::Tensor out = at::zeros({5});
  comm->allGather(out, in)->wait();
  expectEqual(out, in, "all_gather");
  out.zero_();
  comm->reduceScatter(out, in, ReduceOp::Max)->wait();
  expectEqual(out, in, "reduce_scatter");
  comm->allReduce(out)->wait();
  comm->broadcast(out, 0)->wait();
  expectEqual(out, in, "all_reduce");
  EXPECT_THROW(comm->broadcast(out, 1), CommError);
  EXPECT_THROW(comm->allGather(at::zeros({4}), in), CommError);
  comm->barrier();
  auto sub = comm->split(3, 0, "shard");
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->name(), "shard");
  EXPECT_EQ(comm->split(-1, 0, "none"), nullptr);
}

TEST(CommTimeout, EnvironmentOverridesDefault) {
  ::unsetenv("BMT_COMM_TIMEOUT_S");
  EXPECT_EQ(defaultCommTimeout(), 300s);
  ::setenv("BMT_COMM_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(defaultCommTimeout(), 2500ms);
  ::setenv("BMT_COMM_TIMEOUT_S", "soon", 1);
  try {
    defaultCommTimeout();
    ADD_FAILURE() << "no error";
  } catch (const CommError &e) {
    EXPECT_NE(std::string(e.what()).find("BMT_COMM_TIMEOUT_S"), std::string::npos);
  }
  ::setenv("BMT_COMM_TIMEOUT_S", "0", 1);
  EXPECT_THROW(defaultCommTimeout(), CommError);
  ::unsetenv("BMT_COMM_TIMEOUT_S");
}

// ---- rendezvous ------------------------------------------------------------

RendezvousInfo parse(const std::map<std::string, std::string> &env) {
  return parseRendezvous([&](const std::string &k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end())
      return std::nullopt;
    return it->second;
  });
}

std::string parseError(const std::map<std::string, std::string> &env) {
  try {
    parse(env);
  } catch (const CommError &e) {
    return e.what();
  }
  return "no error";
}

const std::map<std::string, std::string> kTorchrunEnv = {
    {"RANK", "3"},          {"WORLD_SIZE", "4"},
    {"LOCAL_RANK", "1"},    {"LOCAL_WORLD_SIZE", "2"},
    {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"},
    {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "2"}};

TEST(Rendezvous, SingleProcessWithoutLauncher) {
  RendezvousInfo info = parse({});
  EXPECT_FALSE(info.launched);
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.worldSize, 1);
  EXPECT_EQ(info.timeout, 300s);
  EXPECT_EQ(parse({{"BMT_COMM_TIMEOUT_S", "12"}}).timeout, 12s);
  auto comm = connect(info, at::Device(at::kCPU));
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend(), "local");
  EXPECT_THROW(connectStore(info), CommError);
}

TEST(Rendezvous, TorchrunVariables) {
  RendezvousInfo info = parse(kTorchrunEnv);
  EXPECT_TRUE(info.launched);
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.worldSize, 4);
  EXPECT_EQ(info.localRank, 1);
  EXPECT_EQ(info.localWorldSize, 2);
  EXPECT_EQ(info.masterAddr, "node0");
  EXPECT_EQ(info.masterPort, 29500);
  EXPECT_TRUE(info.useAgentStore);
  EXPECT_EQ(info.restartCount, 2);
  auto env = kTorchrunEnv;
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  env.erase("LOCAL_RANK");
  env.erase("LOCAL_WORLD_SIZE");
  info = parse(env);
  EXPECT_FALSE(info.useAgentStore);
  EXPECT_EQ(info.localRank, 3);
  EXPECT_EQ(info.localWorldSize, 4);
}

TEST(Rendezvous, BadVariablesAreNamed) {
  auto with = [](const std::string &k, const std::string &v) {
    auto env = kTorchrunEnv;
    env[k] = v;
    return parseError(env);
  };
  auto without = [](const std::string &k) {
    auto env = kTorchrunEnv;
    env.erase(k);
    return parseError(env);
  };
  EXPECT_EQ(with("WORLD_SIZE", "four"), "rendezvous: WORLD_SIZE: expected an integer >= 1, got 'four'");
  EXPECT_EQ(with("WORLD_SIZE", "0"), "rendezvous: WORLD_SIZE: expected an integer >= 1, got '0'");
  EXPECT_EQ(with("WORLD_SIZE", "3"), "rendezvous: RANK: RANK=3 is not below WORLD_SIZE=3");
  EXPECT_EQ(with("RANK", "-1"), "rendezvous: RANK: expected an integer >= 0, got '-1'");
  EXPECT_EQ(with("LOCAL_RANK", "2"), "rendezvous: LOCAL_RANK: LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
  EXPECT_EQ(with("MASTER_PORT", "70000"), "rendezvous: MASTER_PORT: expected a port in [1, 65535], got '70000'");
  EXPECT_EQ(with("MASTER_PORT", "29500x"), "rendezvous: MASTER_PORT: expected an integer >= 1, got '29500x'");
  EXPECT_EQ(with("TORCHELASTIC_USE_AGENT_STORE", "maybe"), "rendezvous: TORCHELASTIC_USE_AGENT_STORE: expected True or False, got 'maybe'");
  EXPECT_EQ(with("BMT_COMM_TIMEOUT_S", "-1"), "BMT_COMM_TIMEOUT_S: expected a positive number of seconds, got '-1'");
  EXPECT_EQ(without("WORLD_SIZE"), "rendezvous: WORLD_SIZE: not set, but RANK is");
  EXPECT_EQ(without("RANK"), "rendezvous: RANK: not set, but WORLD_SIZE is");
  EXPECT_EQ(without("MASTER_ADDR"), "rendezvous: MASTER_ADDR: not set (needed when WORLD_SIZE > 1)");
  EXPECT_EQ(without("MASTER_PORT"), "rendezvous: MASTER_PORT: not set (needed when WORLD_SIZE > 1)");
}

/// A port that was free a moment ago.
uint16_t freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

void connectAndReduce(bool agentStore) {
  const int64_t n = 3;
  c10::intrusive_ptr<c10d::TCPStore> agent;
  uint16_t port = 0;
  if (agentStore) {
    agent = makeServer(); // stands for torchrun's agent
    agent->set("torchelastic/some_key", std::vector<uint8_t>{1});
    port = agent->getPort();
  } else {
    port = freePort();
  }
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        RendezvousInfo info = parse({{"RANK", std::to_string(r)},
                                     {"WORLD_SIZE", std::to_string(n)},
                                     {"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", std::to_string(port)},
                                     {"TORCHELASTIC_USE_AGENT_STORE", agentStore ? "True" : "False"},
                                     {"BMT_COMM_TIMEOUT_S", "30"}});
        auto comm = connect(info, at::Device(at::kCPU));
        EXPECT_EQ(comm->backend(), "cpu");
        EXPECT_EQ(comm->rank(), r);
        at::Tensor t = at::full({2}, static_cast<double>(r + 1), at::TensorOptions().dtype(at::kDouble));
        comm->allReduce(t)->wait();
        EXPECT_EQ(t[1].item<double>(), 6.0);
        // A second connect() in the same job gets its own keys.
        auto again = connect(info, at::Device(at::kCPU));
        again->allReduce(t)->wait();
        EXPECT_EQ(t[1].item<double>(), 18.0);
        comm->barrier();
      } catch (const std::exception &e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  for (auto &t : threads)
    t.join();
  if (agent) {
    EXPECT_EQ(agent->get("torchelastic/some_key"), std::vector<uint8_t>{1});
  }
}

TEST(Rendezvous, ConnectRankZeroHostsStore) { connectAndReduce(false); }
TEST(Rendezvous, ConnectThroughAgentStore) { connectAndReduce(true); }

TEST(Rendezvous, UnreachableStoreNamesAddress) {
  RendezvousInfo info = parse({{"RANK", "1"},
                               {"WORLD_SIZE", "2"},
                               {"MASTER_ADDR", "127.0.0.1"},
                               {"MASTER_PORT", std::to_string(freePort())},
                               {"BMT_COMM_TIMEOUT_S", "0.5"}});
  try {
    connect(info, at::Device(at::kCPU));
    ADD_FAILURE() << "no error";
  } catch (const CommError &e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 of 2 (world): cannot reach the rendezvous store at 127.0.0.1:"), std::string::npos) << e.what();
  }
}

// ---- under torchrun (ctest: comm-torchrun) ---------------------------------

TEST(CommTorchrun, AllReduceThroughRendezvous) {
  RendezvousInfo info = rendezvousFromEnvironment();
  if (!info.launched || info.worldSize < 2) {
    if (std::getenv("BMT_EXPECT_TORCHRUN"))
      FAIL() << "BMT_EXPECT_TORCHRUN is set, but RANK/WORLD_SIZE are not (or WORLD_SIZE < 2)";
    GTEST_SKIP() << "run under torchrun with --nproc_per_node >= 2";
  }
  const char *dev = std::getenv("BMT_TEST_DEVICE");
  at::Device device = dev && std::string(dev) == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  auto comm = connect(info, device);
  int64_t n = info.worldSize;
  at::Tensor t = at::full({4}, static_cast<double>(info.rank + 1), at::TensorOptions().dtype(at::kDouble)).to(device);
  comm->allReduce(t)->wait();
  EXPECT_EQ(t.cpu()[3].item<double>(), n * (n + 1) / 2.0);
  at::Tensor out = at::empty({n}, t.options());
  comm->allGather(out, t.narrow(0, 0, 1).fill_(info.rank))->wait();
  EXPECT_TRUE(at::equal(out.cpu(), at::arange(n, at::TensorOptions().dtype(at::kDouble))));
  auto sub = comm->split(info.rank % 2, info.rank, "shard");
  at::Tensor one = at::ones({1}, t.options());
  sub->allReduce(one)->wait();
  EXPECT_EQ(one.cpu().item<double>(), static_cast<double>(sub->size()));
  comm->barrier();
}

// ---- NCCL (needs CUDA devices; one thread per device) ----------------------

TEST(CommNccl, CollectivesOnEveryVisibleDevice) {
  if (!ncclAvailable())
    GTEST_SKIP() << "this build has no NCCL backend";
  if (!at::hasCUDA())
    GTEST_SKIP() << "no CUDA device";
  int64_t n = std::min<int64_t>(at::getNumGPUs(), 4);
  runNcclRanks(n, [&](int64_t r, Comm &comm, at::Device dev) {
    EXPECT_EQ(comm.backend(), "nccl");
    auto on = at::TensorOptions().device(dev);
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kLong}) {
      at::Tensor in = input(r, 5, dt).to(dev);
      at::Tensor out = at::zeros({n * 5}, on.dtype(dt));
      comm.allGather(out, in)->wait();
      for (int64_t q = 0; q < n; ++q)
        expectEqual(out.narrow(0, q * 5, 5).cpu(), input(q, 5, dt), "nccl all_gather");
      at::Tensor t = at::full({6}, r + 1, on.dtype(dt));
      comm.allReduce(t)->wait();
      EXPECT_EQ(t.cpu()[0].item<double>(), n * (n + 1) / 2.0);
      at::Tensor m = at::full({6}, r, on.dtype(dt));
      comm.allReduce(m, ReduceOp::Max)->wait();
      EXPECT_EQ(m.cpu()[5].item<double>(), n - 1.0);
      at::Tensor rs = at::empty({2}, on.dtype(dt));
      comm.reduceScatter(rs, at::full({2 * n}, r + 1, on.dtype(dt)))->wait();
      EXPECT_EQ(rs.cpu()[1].item<double>(), n * (n + 1) / 2.0);
      at::Tensor b = at::full({3}, r, on.dtype(dt));
      comm.broadcast(b, n - 1)->wait();
      EXPECT_EQ(b.cpu()[2].item<double>(), n - 1.0);
    }
    EXPECT_THROW(comm.allReduce(at::ones({2})), CommError); // a CPU tensor
    comm.barrier();
    auto sub = comm.split(0, -r, "shard");
    ASSERT_TRUE(sub);
    EXPECT_EQ(sub->rank(), n - 1 - r);
    at::Tensor one = at::ones({1}, on);
    sub->allReduce(one)->wait();
    EXPECT_EQ(one.cpu().item<float>(), static_cast<float>(n));
    sub->barrier();
  });
}

} // namespace

/// NCCL timeout with TORCH_NCCL_BLOCKING_WAIT=1: Work::wait() throws
/// CommError. Needs 2 CUDA devices and BMT_TEST_NCCL_TIMEOUT=1 (run by hand
/// in its own process with TORCH_NCCL_BLOCKING_WAIT=1 and
/// TORCH_NCCL_ASYNC_ERROR_HANDLING=2, so the watchdog does not end it).
TEST(CommNccl, BlockingWaitTimeoutThrows) {
  if (!std::getenv("BMT_TEST_NCCL_TIMEOUT"))
    GTEST_SKIP() << "set BMT_TEST_NCCL_TIMEOUT=1 (and TORCH_NCCL_BLOCKING_WAIT=1) to run";
  if (!ncclAvailable() || !at::hasCUDA() || at::getNumGPUs() < 2)
    GTEST_SKIP() << "needs NCCL and 2 CUDA devices";
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        at::Device dev(at::kCUDA, static_cast<c10::DeviceIndex>(r));
        CommOptions o;
        o.timeout = 3s;
        auto comm = createNcclComm(store, r, 2, dev, o);
        at::Tensor t = at::ones({4}, at::TensorOptions().device(dev));
        comm->allReduce(t)->wait(); // both ranks: creates the NCCL communicator
        EXPECT_EQ(t.cpu()[0].item<float>(), 2.f);
        if (r == 1) {
          while (!done)
            std::this_thread::sleep_for(10ms);
          return;
        }
        auto start = std::chrono::steady_clock::now();
        try {
          comm->allReduce(t)->wait();
          ADD_FAILURE() << "no timeout";
        } catch (const CommError &e) {
          double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          std::cout << "after " << s << " s: " << e.what() << "\n";
          EXPECT_NE(std::string(e.what()).find("rank 0 of 2 (world): all_reduce #2 timed out after 3 s"), std::string::npos) << e.what();
        }
        done = true;
      } catch (const std::exception &e) {
        done = true;
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  for (auto &t : threads)
    t.join();
}
