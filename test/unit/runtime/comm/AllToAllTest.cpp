//===- AllToAllTest.cpp - uneven all-to-all and its autograd function ----===//
//
// Comm::allToAll, allToAllCounts and allToAllTokens (Collectives.h) on
// N = 2, 3, 4 CPU ranks (threads over one c10d::HashStore, CpuRanks.h) and
// on the local backend. The reference is built here from the counts matrix
// C (C[q][r]: rows rank q sends rank r): rank r's expected output is, for
// q = 0..N-1, the C[q][r] rows that rank q addresses to r, each written
// from its formula, not sliced out of q's input. Counts are uneven and have
// zeros (a rank that sends itself nothing; a rank that sends and receives
// nothing; all zero); rows of 1, 3 and 2x2 elements; float32, bf16, int64.
// The gradient of allToAllTokens is checked against weights placed by the
// same arithmetic. Argument errors throw on every rank at once and leave the
// communicator usable; counts that disagree between two ranks fail on both
// without waiting for the timeout. CommNcclAllToAll needs CUDA devices.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/comm/Collectives.h"
#include "bmt/Runtime/comm/Comm.h"
#include "CpuRanks.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace bmt::runtime;
using namespace bmt::test;
using namespace std::chrono_literals;

using Counts = std::vector<std::vector<int64_t>>; // C[q][r]: rows q sends r

/// Uneven, with zeros: rank 1 sends itself nothing, rank 3 sends rank 0
/// nothing (N = 4).
Counts uneven(int64_t n) {
  Counts c(n, std::vector<int64_t>(n));
  for (int64_t q = 0; q < n; ++q)
    for (int64_t r = 0; r < n; ++r)
      c[q][r] = (q + 2 * r + 1) % 4;
  return c;
}

/// The last rank sends and receives nothing.
Counts lastIdle(int64_t n) {
  Counts c(n, std::vector<int64_t>(n, 0));
  for (int64_t q = 0; q + 1 < n; ++q)
    for (int64_t r = 0; r + 1 < n; ++r)
      c[q][r] = (q + r) % 3 + 1;
  return c;
}

Counts allZero(int64_t n) { return Counts(n, std::vector<int64_t>(n, 0)); }

std::vector<int64_t> column(const Counts &c, int64_t r) {
  std::vector<int64_t> col;
  for (const auto &row : c)
    col.push_back(row[r]);
  return col;
}

int64_t sum(const std::vector<int64_t> &v) {
  int64_t s = 0;
  for (int64_t x : v)
    s += x;
  return s;
}

/// Element c of row i of the block rank q sends rank r: a distinct integer
/// in [1, 256] (counts < 4, rows of <= 4 elements, N <= 4), so that it is
/// exact in bf16 and a misplaced row or column shows.
double value(int64_t q, int64_t r, int64_t i, int64_t c) {
  return static_cast<double>(((q * 4 + r) * 4 + i) * 4 + c + 1);
}

/// The block rank q sends rank r: [rows, cols] from value().
at::Tensor block(int64_t q, int64_t r, int64_t rows, int64_t cols, at::ScalarType dtype) {
  at::Tensor b = at::empty({rows, cols}, at::TensorOptions().dtype(at::kDouble));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c)
      b[i][c] = value(q, r, i, c);
  return b.to(dtype);
}

/// Rank q's input: its blocks for ranks 0..N-1, in rank order, reshaped to
/// [rows] + rowShape.
at::Tensor input(const Counts &c, int64_t q, at::IntArrayRef rowShape, at::ScalarType dtype) {
  int64_t cols = 1;
  for (int64_t d : rowShape)
    cols *= d;
  std::vector<at::Tensor> blocks;
  for (int64_t r = 0; r < static_cast<int64_t>(c.size()); ++r)
    blocks.push_back(block(q, r, c[q][r], cols, dtype));
  std::vector<int64_t> shape{sum(c[q])};
  shape.insert(shape.end(), rowShape.begin(), rowShape.end());
  return at::cat(blocks).reshape(shape);
}

/// What rank r receives: rank q's block for r, q = 0..N-1.
at::Tensor expected(const Counts &c, int64_t r, at::IntArrayRef rowShape, at::ScalarType dtype) {
  int64_t cols = 1;
  for (int64_t d : rowShape)
    cols *= d;
  std::vector<at::Tensor> blocks;
  for (int64_t q = 0; q < static_cast<int64_t>(c.size()); ++q)
    blocks.push_back(block(q, r, c[q][r], cols, dtype));
  std::vector<int64_t> shape{sum(column(c, r))};
  shape.insert(shape.end(), rowShape.begin(), rowShape.end());
  return at::cat(blocks).reshape(shape);
}

struct Case {
  std::vector<int64_t> rowShape;
  at::ScalarType dtype;
};
const std::vector<Case> kCases = {
    {{}, at::kFloat}, {{3}, at::kFloat}, {{2, 2}, at::kBFloat16}, {{2}, at::kLong}};

class AllToAllCpu : public ::testing::TestWithParam<int64_t> {};

TEST_P(AllToAllCpu, EveryRankReceivesItsBlocksInRankOrder) {
  const int64_t n = GetParam();
  runRanks(n, [&](int64_t r, Comm &comm) {
    for (const Counts &c : {uneven(n), lastIdle(n), allZero(n)}) {
      EXPECT_EQ(allToAllCounts(comm, c[r]), column(c, r)) << "rank " << r;
      // Issued together, waited afterwards: they run in issue order.
      std::vector<at::Tensor> outs;
      std::vector<std::shared_ptr<Work>> works;
      for (const Case &k : kCases) {
        at::Tensor in = input(c, r, k.rowShape, k.dtype);
        outs.push_back(at::full_like(expected(c, r, k.rowShape, k.dtype), -1));
        works.push_back(comm.allToAll(outs.back(), in, c[r], column(c, r)));
      }
      for (size_t i = 0; i < kCases.size(); ++i) {
        works[i]->wait();
        at::Tensor want = expected(c, r, kCases[i].rowShape, kCases[i].dtype);
        EXPECT_EQ(outs[i].sizes(), want.sizes());
        EXPECT_TRUE(at::equal(outs[i], want))
            << "rank " << r << " case " << i << "\ngot  " << outs[i] << "\nwant " << want;
      }
    }
  });
}

TEST_P(AllToAllCpu, TokensGradientIsTheReverseExchange) {
  const int64_t n = GetParam(), cols = 3;
  const Counts c = uneven(n);
  // The loss is sum(y * w) with rank r's weights w(r, row, col); the
  // gradient of row i of x's block for rank r is rank r's weight row at
  // that block's place in r's output: after the blocks of ranks p < this.
  auto weight = [](int64_t r, int64_t row, int64_t col) { return 0.5 + r + 0.25 * row - col; };
  runRanks(n, [&](int64_t r, Comm &comm) {
    at::Tensor x = input(c, r, {cols}, at::kDouble).requires_grad_(true);
    at::Tensor y = allToAllTokens(x, comm, c[r], column(c, r));
    EXPECT_TRUE(at::equal(y.detach(), expected(c, r, {cols}, at::kDouble))) << "rank " << r;
    at::Tensor w = at::empty_like(y.detach());
    for (int64_t i = 0; i < w.size(0); ++i)
      for (int64_t k = 0; k < cols; ++k)
        w[i][k] = weight(r, i, k);
    torch::autograd::backward({(y * w).sum()});
    at::Tensor want = at::empty_like(x.detach());
    int64_t row = 0;
    for (int64_t dst = 0; dst < n; ++dst) {
      int64_t offset = 0; // where this rank's block starts in dst's output
      for (int64_t p = 0; p < r; ++p)
        offset += c[p][dst];
      for (int64_t i = 0; i < c[r][dst]; ++i, ++row)
        for (int64_t k = 0; k < cols; ++k)
          want[row][k] = weight(dst, offset + i, k);
    }
    ASSERT_TRUE(x.grad().defined());
    EXPECT_TRUE(at::equal(x.grad(), want))
        << "rank " << r << "\ngot  " << x.grad() << "\nwant " << want;
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllCpu, ::testing::Values(2, 3, 4),
                         [](const auto &info) { return "N" + std::to_string(info.param); });

/// The CommError text of fn(), or "no error".
std::string errorOf(const std::function<void()> &fn) {
  try {
    fn();
  } catch (const CommError &e) {
    return e.what();
  }
  return "no error";
}

TEST(AllToAllErrors, BadArgumentsThrowOnEveryRankAtOnce) {
  const int64_t n = 3;
  const Counts c = uneven(n);
  runRanks(n, [&](int64_t r, Comm &comm) {
    const std::string head = "rank " + std::to_string(r) + " of 3 (world): all_to_all: ";
    at::Tensor in = input(c, r, {2}, at::kFloat);
    at::Tensor out = at::empty({sum(column(c, r)), 2});
    std::vector<int64_t> send = c[r], recv = column(c, r);
    auto call = [&](at::Tensor o, at::Tensor i, std::vector<int64_t> s, std::vector<int64_t> v) {
      return errorOf([&] { comm.allToAll(o, i, s, v); });
    };
    std::vector<int64_t> shortCounts(send.begin(), send.end() - 1);
    EXPECT_EQ(call(out, in, shortCounts, recv),
              head + "sendCounts has 2 entries, expected one per rank (3)");
    std::vector<int64_t> negative = recv;
    negative[2] = -1;
    EXPECT_EQ(call(out, in, send, negative),
              head + "recvCounts[2] is -1, expected a row count >= 0");
    std::vector<int64_t> more = send;
    more[(r + 1) % n] += 1;
    EXPECT_EQ(call(out, in, more, recv), head + "in has " + std::to_string(sum(send)) +
                                             " rows (dim 0), but sendCounts sum to " +
                                             std::to_string(sum(send) + 1));
    EXPECT_EQ(call(out.narrow(0, 0, out.size(0) - 1), in, send, recv),
              head + "out has " + std::to_string(sum(recv) - 1) +
                  " rows (dim 0), but recvCounts sum to " + std::to_string(sum(recv)));
    std::vector<int64_t> self = send;
    self[r] += 1;
    self[(r + 1) % n] -= 1; // still sums to in's rows, none negative
    EXPECT_EQ(call(out, in, self, recv),
              head + "sendCounts[" + std::to_string(r) + "] is " + std::to_string(self[r]) +
                  " but recvCounts[" + std::to_string(r) + "] is " + std::to_string(recv[r]) +
                  " (the rows this rank sends itself are the rows it receives from itself)");
    EXPECT_EQ(call(out.to(at::kBFloat16), in, send, recv),
              head + "out (" + std::to_string(out.numel()) +
                  " elements of BFloat16 on cpu) and in (" + std::to_string(in.numel()) +
                  " elements of Float on cpu) differ in dtype or device");
    EXPECT_EQ(call(at::empty({sum(recv), 3}), in, send, recv),
              head +
                  "in has rows of 2 elements, out of 3 (rows are dim 0; the other dims must hold "
                  "as many elements)");
    EXPECT_EQ(call(out, at::empty({2, sum(send)}).t(), send, recv), head + "in is not contiguous");
    EXPECT_EQ(call(out, at::zeros({}), send, recv),
              head + "in is 0-dimensional, expected rows along dim 0");
    at::Tensor both = at::empty({sum(send) + sum(recv), 2});
    EXPECT_EQ(call(both.narrow(0, 1, sum(recv)), both.narrow(0, 0, sum(send)), send, recv),
              head + "out and in overlap");
    EXPECT_EQ(errorOf([&] {
                allToAllCounts(comm, {1, 2});
              }),
              "rank " + std::to_string(r) +
                  " of 3 (world): all_to_all_counts: sendCounts has 2 entries, expected one per "
                  "rank (3)");
    // Nothing was issued: the communicator still works.
    comm.allToAll(out, in, send, recv)->wait();
    EXPECT_TRUE(at::equal(out, expected(c, r, {2}, at::kFloat))) << "rank " << r;
  });
}

TEST(AllToAllErrors, CountsThatDisagreeFailOnBothRanksWithoutTimeout) {
  // Rank 0 sends rank 1 two rows, rank 1 expects three; rank 1 sends rank 0
  // one row, rank 0 expects two.
  const Counts send = {{1, 2}, {1, 1}}, recv = {{1, 2}, {3, 1}};
  runRanks(
      2,
      [&](int64_t r, Comm &comm) {
        auto start = std::chrono::steady_clock::now();
        at::Tensor in = at::ones({sum(send[r]), 2}), out = at::empty({sum(recv[r]), 2});
        std::string err = errorOf([&] { comm.allToAll(out, in, send[r], recv[r])->wait(); });
        std::string other = std::to_string(1 - r);
        EXPECT_EQ(err, "rank " + std::to_string(r) + " of 2 (world): all_to_all #1 failed: rank " +
                           other + " sent this rank " + (r == 0 ? "2" : "4") +
                           " elements, but recvCounts[" + other + "] asks for " +
                           (r == 0 ? "4" : "6") +
                           " (rank q's sendCounts[r] must be rank r's recvCounts[q]; "
                           "allToAllCounts gives them)");
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                  2.0);
      },
      StoreKind::Hash, 10s);
}

TEST(AllToAllCpuStore, KeysAreDeletedAlsoOfValuesInPieces) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  int64_t before = store->getNumKeys();
  // Rank 0 sends rank 2 1.1 M float rows (4.4 MB: more than one 4 MiB
  // store value); the other slots are small or empty.
  const int64_t big = 1100 * 1000;
  const Counts c = {{1, 0, big}, {2, 1, 0}, {0, 3, 1}};
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = createCpuComm(store, r, 3);
        at::Tensor in = at::arange(sum(c[r]), at::TensorOptions().dtype(at::kFloat)) + 2e6 * r;
        at::Tensor out = at::empty({sum(column(c, r))});
        comm->allToAll(out, in, c[r], column(c, r))->wait();
        // Rank q's rows for r: in_q[sum(C[q][0..r)) ..] (arange + offset).
        int64_t pos = 0;
        for (int64_t q = 0; q < 3; ++q) {
          int64_t first = 0;
          for (int64_t p = 0; p < r; ++p)
            first += c[q][p];
          at::Tensor want =
              at::arange(first, first + c[q][r], at::TensorOptions().dtype(at::kFloat)) + 2e6 * q;
          EXPECT_TRUE(at::equal(out.narrow(0, pos, c[q][r]), want))
              << "rank " << r << " from " << q;
          pos += c[q][r];
        }
        comm->barrier();
      } catch (const std::exception &e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  for (auto &t : threads)
    t.join();
  for (int i = 0; i < 100 && store->getNumKeys() != before; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(store->getNumKeys(), before);
}

TEST(AllToAllLocal, OneRankCopies) {
  auto comm = createLocalComm();
  at::Tensor in = at::arange(6, at::TensorOptions().dtype(at::kFloat)).view({3, 2});
  at::Tensor out = at::zeros({3, 2});
  comm->allToAll(out, in, {3}, {3})->wait();
  EXPECT_TRUE(at::equal(out, in));
  EXPECT_EQ(allToAllCounts(*comm, {5}), std::vector<int64_t>{5});
  at::Tensor x = in.clone().requires_grad_(true);
  at::Tensor y = allToAllTokens(x, *comm, {3}, {3});
  EXPECT_TRUE(at::equal(y.detach(), in));
  torch::autograd::backward({(y * 2).sum()});
  EXPECT_TRUE(at::equal(x.grad(), at::full({3, 2}, 2.f)));
  EXPECT_EQ(errorOf([&] { comm->allToAll(out, in, {3}, {2}); }),
            "rank 0 of 1 (world): all_to_all: out has 3 rows (dim 0), but recvCounts sum to 2");
  EXPECT_EQ(errorOf([&] {
              comm->allToAll(out, in, {3, 0}, {3});
            }),
            "rank 0 of 1 (world): all_to_all: sendCounts has 2 entries, expected one per rank (1)");
}

// ---- NCCL (needs CUDA devices; one thread per device) ----------------------

TEST(CommNcclAllToAll, UnevenCountsAndGradientOnEveryVisibleDevice) {
  if (!ncclAvailable())
    GTEST_SKIP() << "this build has no NCCL backend";
  if (!at::hasCUDA())
    GTEST_SKIP() << "no CUDA device";
  const int64_t n = std::min<int64_t>(at::getNumGPUs(), 4);
  runNcclRanks(n, [&](int64_t r, Comm &comm, at::Device dev) {
    for (const Counts &c : {uneven(n), lastIdle(n)}) {
      EXPECT_EQ(allToAllCounts(comm, c[r]), column(c, r)) << "rank " << r;
      for (const Case &k : kCases) {
        at::Tensor in = input(c, r, k.rowShape, k.dtype).to(dev);
        at::Tensor want = expected(c, r, k.rowShape, k.dtype);
        at::Tensor out = at::full_like(want, -1).to(dev);
        comm.allToAll(out, in, c[r], column(c, r))->wait();
        EXPECT_TRUE(at::equal(out.cpu(), want)) << "rank " << r;
      }
    }
    const Counts c = uneven(n);
    at::Tensor x = input(c, r, {3}, at::kFloat).to(dev).requires_grad_(true);
    at::Tensor y = allToAllTokens(x, comm, c[r], column(c, r));
    torch::autograd::backward({y}, {y.detach() * 2});
    // The gradient y * 2 goes back to where each row came from: 2 x.
    EXPECT_TRUE(at::equal(x.grad().cpu(), input(c, r, {3}, at::kFloat) * 2)) << "rank " << r;
    EXPECT_THROW(comm.allToAll(at::empty({1}), at::empty({1}), c[r], column(c, r)),
                 CommError); // CPU tensors
    comm.barrier();
  });
}

} // namespace
