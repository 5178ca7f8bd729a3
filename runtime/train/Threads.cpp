//===- Threads.cpp - the CPU threads of a rank ----------------------------===//

#include "bmt/Runtime/train/Threads.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sched.h>
#include <string>
#include <unistd.h>

namespace bmt::runtime {

/// The CPUs this process may use: its affinity mask, capped by a cgroup
/// CPU quota (cpu.max "QUOTA PERIOD", rounded up).
int64_t usableCpus() {
  cpu_set_t set;
  int64_t cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  std::ifstream in("/sys/fs/cgroup/cpu.max");
  std::string quota;
  int64_t period = 0;
  if (in >> quota >> period && quota != "max" && period > 0) {
    const int64_t q = std::atoll(quota.c_str());
    if (q > 0)
      cpus = std::min(cpus, (q + period - 1) / period);
  }
  return std::max<int64_t>(cpus, 1);
}

/// Without OMP_NUM_THREADS, restarts the process (the same pid, argv) with
/// OMP_NUM_THREADS = the usable CPUs divided by the processes of this host
/// (LOCAL_WORLD_SIZE, at least 1 each) and, unless set, OMP_WAIT_POLICY =
/// passive: OpenMP reads both when it loads, before main. LibTorch's own
/// default counts the host's cores, ignoring a container's CPU quota and
/// other jobs, and OpenMP's threads spin while they wait: on a busy 2-core
/// machine a run was 9x slower (docs/runtime/failures.md, "Threads"). The count does
/// not follow the machine's load: CPU reductions may round differently with
/// another thread count, and a run must repeat bit for bit. Returns when
/// nothing is to be done or exec fails.
void chooseThreads(char **argv) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr)
    return;
  int64_t local = 1;
  if (const char *l = std::getenv("LOCAL_WORLD_SIZE"))
    local = std::max<int64_t>(1, std::atoll(l));
  const int64_t threads = std::max<int64_t>(1, usableCpus() / local);
  ::setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
  ::setenv("OMP_WAIT_POLICY", "passive", 0);
  ::execv("/proc/self/exe", argv);
}

} // namespace bmt::runtime
