//===- CpuRanks.h - ranks as threads with CPU (or NCCL) communicators -*- C++ -*-===//
//
// The unit tests' way to run N ranks inside one process: one thread per
// rank, each with a CPU communicator (createCpuComm) over one shared
// c10d::HashStore or its own TCPStore client of a server on a free port.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_TEST_UNIT_CPURANKS_H
#define BMT_TEST_UNIT_CPURANKS_H

#include "bmt/Runtime/comm/Comm.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace bmt::test {

using namespace std::chrono_literals;

/// A TCPStore server on a free port (port 0: the OS picks).
inline c10::intrusive_ptr<c10d::TCPStore> makeServer() {
  c10d::TCPStoreOptions o;
  o.port = 0;
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = 30s;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
}

inline c10::intrusive_ptr<c10d::Store> makeClient(uint16_t port) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = false;
  o.timeout = 30s;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
}

enum class StoreKind { Hash, Tcp };

/// Runs fn(rank, comm) on `n` threads, each with a CPU communicator over
/// one shared HashStore or its own TCPStore client. Failures inside the
/// threads are gtest failures; exceptions are reported with their text.
/// (Most tests use the HashStore: on the gVisor sandboxes of the dev/CI
/// machines about one TCP connect in twenty to a local port stalls 5 s.)
inline void runRanks(int64_t n,
                     const std::function<void(int64_t, runtime::Comm &)> &fn,
                     StoreKind kind = StoreKind::Hash,
                     std::chrono::milliseconds timeout = 30s) {
  bool hashStore = kind == StoreKind::Hash;
  c10::intrusive_ptr<c10d::TCPStore> server;
  c10::intrusive_ptr<c10d::Store> shared;
  if (hashStore)
    shared = c10::make_intrusive<c10d::HashStore>();
  else
    server = makeServer();
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        c10::intrusive_ptr<c10d::Store> store =
            hashStore ? shared : makeClient(server->getPort());
        runtime::CommOptions o;
        o.timeout = timeout;
        std::unique_ptr<runtime::Comm> comm =
            runtime::createCpuComm(store, r, n, o);
        fn(r, *comm);
      } catch (const std::exception &e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  for (auto &t : threads)
    t.join();
}

/// Runs fn(rank, comm, device) on `n` threads, rank r on CUDA device r with
/// an NCCL communicator over one shared HashStore (the caller checks that
/// NCCL and n devices are there). Failures as runRanks.
inline void runNcclRanks(int64_t n,
                         const std::function<void(int64_t, runtime::Comm &, at::Device)> &fn,
                         std::chrono::milliseconds timeout = 60s) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        at::Device dev(at::kCUDA, static_cast<c10::DeviceIndex>(r));
        runtime::CommOptions o;
        o.timeout = timeout;
        std::unique_ptr<runtime::Comm> comm = runtime::createNcclComm(store, r, n, dev, o);
        fn(r, *comm, dev);
      } catch (const std::exception &e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  for (auto &t : threads)
    t.join();
}

} // namespace bmt::test

#endif // BMT_TEST_UNIT_CPURANKS_H
