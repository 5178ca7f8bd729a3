//===- Rendezvous.h - the job's ranks from torchrun's environment -*- C++ -*-===//
//
// A bmt-run process learns its place in the job from the variables torchrun
// (torch.distributed.run, "--no-python") sets: RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE,
// TORCHELASTIC_RESTART_COUNT. Without RANK and WORLD_SIZE it is a single
// process (rank 0 of 1). connect() then builds the world communicator.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_COMM_RENDEZVOUS_H
#define BMT_RUNTIME_COMM_RENDEZVOUS_H

#include "bmt/Runtime/comm/Comm.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace bmt::runtime {

struct RendezvousInfo {
  /// Global rank in [0, worldSize) (RANK) and number of processes
  /// (WORLD_SIZE, >= 1).
  int64_t rank = 0, worldSize = 1;
  /// Rank on this node and processes on this node (LOCAL_RANK,
  /// LOCAL_WORLD_SIZE; default RANK and WORLD_SIZE, i.e. one node). The
  /// NCCL backend uses cuda:localRank.
  int64_t localRank = 0, localWorldSize = 1;
  /// The rendezvous store's address (MASTER_ADDR, MASTER_PORT in
  /// [1, 65535]); required when worldSize > 1.
  std::string masterAddr;
  int64_t masterPort = 0;
  /// TORCHELASTIC_USE_AGENT_STORE == "True": torchrun's agent already hosts
  /// a TCPStore on MASTER_ADDR:MASTER_PORT and every rank is a client.
  /// Otherwise rank 0 hosts the store and the others connect to it.
  bool useAgentStore = false;
  /// TORCHELASTIC_RESTART_COUNT (default 0): part of every store key, so
  /// that a restarted attempt never reads a failed attempt's keys.
  int64_t restartCount = 0;
  /// True when RANK and WORLD_SIZE were set (a launcher started us).
  bool launched = false;
  /// Limit of every blocking wait: BMT_COMM_TIMEOUT_S (seconds) or 300 s.
  std::chrono::milliseconds timeout{300 * 1000};
};

/// Reads the variables through `lookup` (nullopt: not set). Throws
/// CommError naming the variable when one is malformed ("WORLD_SIZE:
/// expected an integer >= 1, got 'x'"), out of range (RANK >= WORLD_SIZE,
/// LOCAL_RANK >= LOCAL_WORLD_SIZE, a port outside [1, 65535]), or missing
/// (RANK without WORLD_SIZE or the reverse; MASTER_ADDR/MASTER_PORT when
/// WORLD_SIZE > 1). TORCHELASTIC_USE_AGENT_STORE accepts True/False
/// (also true/false/1/0).
RendezvousInfo
parseRendezvous(const std::function<std::optional<std::string>(const std::string &)> &lookup);

/// parseRendezvous over this process's environment.
RendezvousInfo rendezvousFromEnvironment();

/// The job's c10d::TCPStore: a client of MASTER_ADDR:MASTER_PORT, or, on
/// rank 0 when useAgentStore is false, the server (listening on
/// MASTER_PORT) and a client of it. Connecting retries until info.timeout.
/// Throws CommError naming MASTER_ADDR:MASTER_PORT when the store cannot be
/// reached or the port cannot be bound; also for a single process
/// (worldSize == 1), which needs no store.
c10::intrusive_ptr<c10d::Store> connectStore(const RendezvousInfo &info);

/// The world communicator ("world"): for worldSize == 1 a local
/// communicator (no store); otherwise connectStore() and the NCCL backend
/// for a CUDA `device` (cuda:localRank when it has no index) or the CPU
/// backend for any other device. Every rank must call it (it synchronizes
/// through the store). Store keys live under
/// "bmt/attempt_<restartCount>/c<n>/" (n: this rank's n-th connect()),
/// clear of torchrun's own keys.
std::unique_ptr<Comm> connect(const RendezvousInfo &info, at::Device device);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_COMM_RENDEZVOUS_H
