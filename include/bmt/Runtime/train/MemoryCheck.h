//===- MemoryCheck.h - will a micro-batch fit? ------------------*- C++ -*-===//
//
// bmt-run's check before step 1 (docs/runtime/failures.md, "Memory check"): the
// bytes a forward allocates, measured at 1 and 2 rows through LibTorch's
// memory reporting (the profiler's hook; on CUDA the caching allocator's statistics), scaled to the run's micro-batch,
// against the device's free memory or the host's available memory.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_MEMORYCHECK_H
#define BMT_RUNTIME_TRAIN_MEMORYCHECK_H

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>

namespace bmt::runtime {

/// The most bytes allocated on `device` at once, above what was allocated
/// before, while `run` runs on this thread: on the CPU through the memory
/// profiling hook installed meanwhile (LibTorch's allocator reports each
/// allocation to it), on CUDA from the caching allocator's statistics (its
/// peak is reset first: Metrics' peak GiB counts from here). Exceptions of
/// `run` pass through.
int64_t peakBytesDuring(c10::Device device, const std::function<void()> &run);

/// Memory that allocations on `device` can still get, and where the number
/// comes from: on CUDA the driver's free memory (cudaMemGetInfo) plus what
/// LibTorch's caching allocator holds unused; on the CPU the host's
/// MemAvailable (/proc/meminfo), or less under a cgroup's memory limit.
/// bytes < 0 when it cannot be known.
struct AvailableMemory {
  int64_t bytes = -1;
  std::string source; ///< "free on cuda:0", "MemAvailable of this host", "left under the cgroup limit"
};
AvailableMemory availableMemory(c10::Device device);

/// "3.2 GiB", "512.0 MiB", "784 bytes".
std::string formatMemory(double bytes);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_MEMORYCHECK_H
