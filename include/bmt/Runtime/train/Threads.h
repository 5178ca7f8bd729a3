//===- Threads.h - the CPU threads of a rank --------------------*- C++ -*-===//
//
// The OpenMP thread count a run uses when OMP_NUM_THREADS is not set
// (docs/runtime/failures.md, "Threads"). OpenMP reads its settings when it loads,
// before main, so the choice restarts the process.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_THREADS_H
#define BMT_RUNTIME_TRAIN_THREADS_H

#include <cstdint>

namespace bmt::runtime {

/// The CPUs this process may use: its affinity mask, capped by a cgroup
/// CPU quota (cpu.max "QUOTA PERIOD", rounded up); at least 1.
int64_t usableCpus();

/// Without OMP_NUM_THREADS, restarts the process (the same pid, `argv`)
/// with OMP_NUM_THREADS = usableCpus() / LOCAL_WORLD_SIZE (at least 1) and,
/// unless set, OMP_WAIT_POLICY=passive. The count does not follow the
/// machine's load: CPU reductions may round differently with another
/// thread count, and a run must repeat bit for bit. Returns when there is
/// nothing to do or exec fails (the run goes on with LibTorch's default).
void chooseThreads(char **argv);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_THREADS_H
