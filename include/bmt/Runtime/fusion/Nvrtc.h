//===- Nvrtc.h - compile generated CUDA source at run time ------*- C++ -*-===//
//
// NVRTC (the CUDA toolkit's run-time compiler) loaded with dlopen, so that
// bmt-run links without it and runs on CPU machines that lack it. The
// library is the first of $BMT_NVRTC_LIBRARY, libnvrtc.so.13, libnvrtc.so.12,
// libnvrtc.so (the loader's path: LD_LIBRARY_PATH, the torch wheel's
// nvidia/cu13/lib or cuda_nvrtc/lib, /usr/local/cuda/lib64) that loads.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_FUSION_NVRTC_H
#define BMT_RUNTIME_FUSION_NVRTC_H

#include <string>

namespace bmt::fusion {

/// Whether an NVRTC library could be loaded.
bool nvrtcAvailable();

/// Compiles `source` (a self-contained CUDA C++ translation unit) for
/// compute capability major.minor: a CUBIN for sm_XY when `cubin`, else
/// PTX for compute_XY. Results are cached on disk by a hash of the source,
/// the architecture and the NVRTC version, in $BMT_KERNEL_CACHE (default
/// $XDG_CACHE_HOME/bmt/kernels, else ~/.cache/bmt/kernels; a cache that
/// cannot be written is skipped); `cached`, when given, says whether the
/// result came from there. Thread-safe. Throws FusionError with NVRTC's log
/// when compilation fails, or when no NVRTC library loads.
std::string compileCuda(const std::string &source, const std::string &name, int major, int minor,
                        bool cubin, bool *cached = nullptr);

} // namespace bmt::fusion

#endif // BMT_RUNTIME_FUSION_NVRTC_H
