//===- Prewarm.h - compile a run's fused kernels before its first step -*- C++ -*-===//
//
// The kernels a run's steps launch depend on its tensors (dtypes, shapes,
// strides, alignment, which gradients autograd asks for), so they are found
// by a dry run: one micro-batch's forward and backward with a dry-run
// KernelRecorder set on every region (train/Trainer.h prewarmFusedKernels).
// prewarm() then compiles the distinct sources on a few threads (NVRTC is
// thread-safe per program; the disk cache of Nvrtc.h serves warm ones) and
// installs them in their regions. docs/runtime/prewarm.md says
// why this is exact and where it is not.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_FUSION_PREWARM_H
#define BMT_RUNTIME_FUSION_PREWARM_H

#include "bmt/Runtime/fusion/Fused.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace bmt::fusion {

/// Collects the kernels regions ask for while it is set on them
/// (FusedRegion::setRecorder; thread-safe: backward runs on autograd's
/// threads). A dry-run recorder also makes those calls compute nothing:
/// their results are allocated as the kernels would allocate them, so the
/// rest of the program sees the same layouts, but hold no values.
class KernelRecorder {
public:
  explicit KernelRecorder(bool dryRun) : dryRun_(dryRun) {}
  bool dryRun() const { return dryRun_; }

  /// One kernel of one region on one device, once however often called;
  /// `threads`: the most threads a block of the 8-wide row kernel was
  /// launched with (0: another kernel).
  struct Request {
    FusedRegion *region = nullptr;
    KernelSpec spec;
    at::Device device{at::kCPU};
    int threads = 0;
  };
  void add(FusedRegion *region, const KernelSpec &spec, const at::Device &device, int threads);
  /// The requests in the order of their first call.
  std::vector<Request> requests() const;

private:
  bool dryRun_;
  mutable std::mutex mutex_;
  std::vector<Request> requests_;
  std::map<std::pair<FusedRegion *, std::string>, size_t> index_; // (region, device + key)
};

/// Sets `recorder` on `regions` for the scope's life (then none again).
class RecordingScope {
public:
  RecordingScope(std::vector<FusedRegion *> regions, KernelRecorder *recorder);
  ~RecordingScope();
  RecordingScope(const RecordingScope &) = delete;
  RecordingScope &operator=(const RecordingScope &) = delete;

private:
  std::vector<FusedRegion *> regions_;
};

struct PrewarmOptions {
  int threads = 0; ///< compiling threads; 0: min(8, cores / LOCAL_WORLD_SIZE), at least 1
  /// The compute capability to compile for where the requests' device is
  /// not a GPU (tests); a GPU's own otherwise.
  int major = 0, minor = 0;
};

struct PrewarmResult {
  int64_t kernels = 0;  ///< distinct kernel sources compiled or read from the disk cache
  int64_t cached = 0;   ///< of them, read from the disk cache
  int64_t installed = 0; ///< (region, kernel) pairs made ready
  double seconds = 0;   ///< wall time of compiling and installing
};

/// Compiles every request's kernel (each distinct source once, in
/// parallel) and installs it in its region. A row kernel too wide for its
/// registers (Request::threads above what the loaded kernel allows) gets
/// its scalar variant installed too, as its call would ask for it. Throws
/// FusionError (NVRTC's log) when a kernel does not compile, and when no
/// architecture is known for a device without kernels.
PrewarmResult prewarm(const std::vector<KernelRecorder::Request> &requests,
                      const PrewarmOptions &options = {});

} // namespace bmt::fusion

#endif // BMT_RUNTIME_FUSION_PREWARM_H
