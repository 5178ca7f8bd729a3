//===- Profile.h - a per-op profile of training steps -----------*- C++ -*-===//
//
// Records a window of training steps with LibTorch's profiler (Kineto:
// CPU ops through RecordFunction, CUDA kernels and copies through CUPTI)
// and says where the time went: each GPU kernel is charged to the ATen op
// that launched it (the innermost op on the launching thread, by Kineto's
// correlation ids, as torch.profiler's key_averages() does), and on the CPU
// each op's self time is its duration less its children's. Optionally
// writes the Chrome trace (chrome://tracing, Perfetto).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_PROFILE_H
#define BMT_RUNTIME_TRAIN_PROFILE_H

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

namespace bmt::runtime {

class StepProfiler {
public:
  StepProfiler();
  ~StepProfiler();

  /// Starts recording CPU ops, and CUDA activity when `cuda`; with
  /// `shapes` each op also records its inputs' sizes and dtypes (for a
  /// Chrome trace: "Input Dims"). Throws std::runtime_error when a profiler
  /// is already recording on this thread.
  void start(bool cuda, bool shapes = false);

  /// Stops recording (call after the device finished the window's work),
  /// writes the Chrome trace to `tracePath` when it is not empty, and prints
  /// to `out` the `top` ops by time per step over `steps` steps:
  /// - CUDA: milliseconds of kernel time per step and the share of all
  ///   kernel time, per launching op; then the kernel time of the
  ///   collectives (NCCL kernels, on their own streams), the wall time per
  ///   step and the share of it during which any kernel ran, and the
  ///   cudaMalloc/cudaFree calls of the caching allocator in the window
  ///   (0 in a steady state: no allocator churn).
  /// - CPU only: milliseconds of self time per step per op.
  /// Throws std::runtime_error when the trace cannot be written.
  void stop(std::ostream &out, const std::string &tracePath, int64_t steps, int top = 30);

  bool recording() const { return recording_; }

private:
  bool recording_ = false;
  bool cuda_ = false;
  int64_t startNs_ = 0;
  int64_t mallocsAtStart_ = 0, freesAtStart_ = 0;
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_PROFILE_H
