//===- Rendezvous.cpp - torchrun's environment, the store, connect() ------===//
//
// Mirrors what torch.distributed's env:// rendezvous does for the same
// variables: with torchrun's agent store every rank is a TCPStore client of
// MASTER_ADDR:MASTER_PORT; otherwise rank 0 hosts the TCPStore there.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/comm/Rendezvous.h"
#include "bmt/Runtime/Env.h"

#include "CommInternal.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>

namespace bmt::runtime {

namespace {

using Lookup = std::function<std::optional<std::string>(const std::string &)>;

[[noreturn]] void bad(const std::string &var, const std::string &what) {
  throw CommError("rendezvous: " + var + ": " + what);
}

/// An integer >= `min` from variable `var` (value `v`).
int64_t parseInt(const std::string &var, const std::string &v, int64_t min) {
  errno = 0;
  char *end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || errno != 0 || *end != '\0' || x < min)
    bad(var, "expected an integer >= " + std::to_string(min) + ", got '" + v + "'");
  return x;
}

} // namespace

RendezvousInfo parseRendezvous(const Lookup &lookup) {
  RendezvousInfo info;
  if (auto t = lookup("BMT_COMM_TIMEOUT_S"); t && !t->empty())
    info.timeout = detail::parseTimeoutSeconds(*t);

  std::optional<std::string> rank = lookup("RANK"), world = lookup("WORLD_SIZE");
  if (!rank && !world)
    return info; // a single process
  if (!rank)
    bad("RANK", "not set, but WORLD_SIZE is");
  if (!world)
    bad("WORLD_SIZE", "not set, but RANK is");
  info.launched = true;
  info.worldSize = parseInt("WORLD_SIZE", *world, 1);
  info.rank = parseInt("RANK", *rank, 0);
  if (info.rank >= info.worldSize)
    bad("RANK", "RANK=" + *rank + " is not below WORLD_SIZE=" + *world);

  std::optional<std::string> lrank = lookup("LOCAL_RANK"), lworld = lookup("LOCAL_WORLD_SIZE");
  info.localRank = lrank ? parseInt("LOCAL_RANK", *lrank, 0) : info.rank;
  info.localWorldSize = lworld ? parseInt("LOCAL_WORLD_SIZE", *lworld, 1) : info.worldSize;
  if (info.localRank >= info.localWorldSize)
    bad("LOCAL_RANK", "LOCAL_RANK=" + std::to_string(info.localRank) +
                          " is not below LOCAL_WORLD_SIZE=" + std::to_string(info.localWorldSize));

  std::optional<std::string> addr = lookup("MASTER_ADDR"), port = lookup("MASTER_PORT");
  if (addr)
    info.masterAddr = *addr;
  if (port) {
    info.masterPort = parseInt("MASTER_PORT", *port, 1);
    if (info.masterPort > 65535)
      bad("MASTER_PORT", "expected a port in [1, 65535], got '" + *port + "'");
  }
  if (info.worldSize > 1) {
    if (info.masterAddr.empty())
      bad("MASTER_ADDR", "not set (needed when WORLD_SIZE > 1)");
    if (!port)
      bad("MASTER_PORT", "not set (needed when WORLD_SIZE > 1)");
  }

  if (auto a = lookup("TORCHELASTIC_USE_AGENT_STORE"); a && !a->empty()) {
    if (*a == "True" || *a == "true" || *a == "1")
      info.useAgentStore = true;
    else if (*a == "False" || *a == "false" || *a == "0")
      info.useAgentStore = false;
    else
      bad("TORCHELASTIC_USE_AGENT_STORE", "expected True or False, got '" + *a + "'");
  }
  if (auto r = lookup("TORCHELASTIC_RESTART_COUNT"); r && !r->empty())
    info.restartCount = parseInt("TORCHELASTIC_RESTART_COUNT", *r, 0);
  return info;
}

RendezvousInfo rendezvousFromEnvironment() {
  return parseRendezvous([](const std::string &name) -> std::optional<std::string> {
    const char *v = std::getenv(name.c_str());
    if (!v)
      return std::nullopt;
    return std::string(v);
  });
}

c10::intrusive_ptr<c10d::Store> connectStore(const RendezvousInfo &info) {
  std::string who = detail::who(info.rank, info.worldSize, "world");
  if (info.worldSize <= 1)
    throw CommError(who + ": connectStore: a single process needs no store");
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(info.masterPort);
  opts.isServer = !info.useAgentStore && info.rank == 0;
  if (opts.isServer)
    opts.numWorkers = static_cast<size_t>(info.worldSize);
  opts.waitWorkers = false;
  opts.timeout = info.timeout;
  std::string where = info.masterAddr + ":" + std::to_string(info.masterPort);
  // A process hosts a port's server once: a later connect() (or another
  // rank-0 thread in tests) reuses the live one.
  static std::mutex hostedMutex;
  static std::map<std::string, c10::weak_intrusive_ptr<c10d::TCPStore>> hosted;
  std::unique_lock<std::mutex> lock(hostedMutex, std::defer_lock);
  if (opts.isServer) {
    lock.lock();
    auto it = hosted.find(where);
    if (it != hosted.end())
      if (c10::intrusive_ptr<c10d::TCPStore> live = it->second.lock())
        return live;
  }
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(info.masterAddr, opts);
    if (opts.isServer)
      hosted.insert_or_assign(where, c10::weak_intrusive_ptr<c10d::TCPStore>(store));
    return store;
  } catch (const std::exception &e) {
    throw CommError(who + ": " +
                    (opts.isServer ? "cannot host the rendezvous store on "
                                   : "cannot reach the rendezvous store at ") +
                    where + " (MASTER_ADDR:MASTER_PORT" +
                    (info.useAgentStore ? ", torchrun's agent store" : "") +
                    "): " + detail::firstLine(e.what()));
  }
}

std::unique_ptr<Comm> connect(const RendezvousInfo &info, at::Device device) {
  CommOptions options;
  options.name = "world";
  options.timeout = info.timeout;
  if (info.worldSize <= 1)
    return createLocalComm(options);
  c10::intrusive_ptr<c10d::Store> store = connectStore(info);
  std::string base = "bmt/attempt_" + std::to_string(info.restartCount);
  int64_t n = 0;
  try {
    n = store->add(base + "/connects/" + std::to_string(info.rank), 1);
  } catch (const std::exception &e) {
    throw CommError(detail::who(info.rank, info.worldSize, "world") +
                    ": rendezvous store error: " + detail::firstLine(e.what()));
  }
  options.keyPrefix = base + "/c" + std::to_string(n);
  if (device.is_cuda()) {
    if (!device.has_index())
      device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(info.localRank));
    if (env::debugCommThroughHost())
      return createHostStagedComm(createCpuComm(store, info.rank, info.worldSize, options),
                                  device);
    return createNcclComm(store, info.rank, info.worldSize, device, options);
  }
  return createCpuComm(store, info.rank, info.worldSize, options);
}

} // namespace bmt::runtime
