//===- MemoryCheck.cpp - will a micro-batch fit? --------------------------===//

#include "bmt/Runtime/train/MemoryCheck.h"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#ifdef BMT_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace bmt::runtime {

namespace {

/// Counts the bytes allocated on one device type (the profiler's memory
/// hook: each allocation and free is reported with its size).
struct PeakCounter : c10::MemoryReportingInfoBase {
  c10::DeviceType type;
  int64_t current = 0, peak = 0;
  explicit PeakCounter(c10::DeviceType t) : type(t) {}
  void reportMemoryUsage(void *, int64_t size, size_t, size_t, c10::Device device) override {
    if (device.type() != type)
      return;
    current += size;
    peak = std::max(peak, current);
  }
  bool memoryProfilingEnabled() const override { return true; }
};

/// The first number on the line of /proc/meminfo that starts with `key`, in bytes.
int64_t meminfo(const std::string &key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream fields(line.substr(key.size() + 1));
      int64_t kib = -1;
      fields >> kib;
      return kib < 0 ? -1 : kib * 1024;
    }
  return -1;
}

/// A cgroup v2 (else v1) file's number, or -1 ("max", missing).
int64_t cgroupNumber(const char *v2, const char *v1) {
  for (const char *path : {v2, v1}) {
    std::ifstream in(path);
    int64_t v = -1;
    if (in >> v)
      return v;
  }
  return -1;
}

} // namespace

int64_t peakBytesDuring(c10::Device device, const std::function<void()> &run) {
  if (device.is_cuda()) {
    // The caching allocator's own counters (its allocations reach the
    // profiling hook only while a profiler records).
    namespace allocator = c10::cuda::CUDACachingAllocator;
    const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
    allocator::resetPeakStats(index);
    const int64_t before = allocator::getDeviceStats(index).allocated_bytes[0].current;
    run();
    return allocator::getDeviceStats(index).allocated_bytes[0].peak - before;
  }
  auto counter = std::make_shared<PeakCounter>(device.type());
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, counter);
    run();
  }
  return counter->peak;
}

AvailableMemory availableMemory(c10::Device device) {
  AvailableMemory out;
  if (device.is_cuda()) {
#ifdef BMT_WITH_CUDA_KERNELS
    c10::cuda::CUDAGuard guard(device);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess)
      return out;
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const int64_t cachedUnused =
        stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;
    out.bytes = static_cast<int64_t>(free) + std::max<int64_t>(cachedUnused, 0);
    out.source = "free on " + device.str();
#endif
    return out;
  }
  out.bytes = meminfo("MemAvailable");
  out.source = "MemAvailable of this host";
  const int64_t limit = cgroupNumber("/sys/fs/cgroup/memory.max",
                                     "/sys/fs/cgroup/memory/memory.limit_in_bytes");
  const int64_t used = cgroupNumber("/sys/fs/cgroup/memory.current",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes");
  if (limit > 0 && used >= 0 && limit - used < out.bytes) {
    out.bytes = std::max<int64_t>(limit - used, 0);
    out.source = "left under this cgroup's memory limit";
  }
  return out;
}

std::string formatMemory(double bytes) {
  char text[48];
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(text, sizeof text, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  else if (bytes >= 1024.0 * 1024)
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1024.0 * 1024));
  else
    std::snprintf(text, sizeof text, "%.0f bytes", bytes);
  return text;
}

} // namespace bmt::runtime
