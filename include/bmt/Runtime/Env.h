//===- Env.h - the runtime's BMT_* environment settings ---------*- C++ -*-===//
//
// The one place that reads the BMT_* environment variables the runtime
// knows (docs/runtime/environment.md). Each accessor reads its variable
// when called (tests set them in-process) and checks it: a value it does
// not take is an EnvError whose what() is one line,
// "NAME: expected ..., got 'VALUE'". Unset or empty is the default.
// checkEnvironment() reads them all, so that bmt-run refuses a bad value
// before it loads anything.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_ENV_H
#define BMT_RUNTIME_ENV_H

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace bmt::runtime {

/// A BMT_* variable set to a value it does not take.
struct EnvError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace env {

// --- Settings -------------------------------------------------------------

/// BMT_COMM_TIMEOUT_S: seconds a blocking collective may wait (a positive
/// number up to 1e9; default 300).
std::chrono::milliseconds commTimeout();
/// The same check on a value given as text (rendezvous reads it through
/// its own lookup).
std::chrono::milliseconds parseCommTimeout(const std::string &value);

/// BMT_STOP_WAIT_S: seconds a rank stopped by SIGTERM/SIGINT during the
/// steps goes on waiting in one collective of the CPU backend before it
/// gives up (a peer may have died; a positive whole number, default 10:
/// within torchrun's 30 s before its SIGKILL).
int64_t stopWaitSeconds();

/// BMT_FUSED_ADAM: 0 turns off the runtime's CUDA Adam kernel (ATen's
/// fused Adam instead); 1 or unset keeps it.
bool fusedAdam();
/// BMT_FUSED_CROSS_ENTROPY: 0 turns off the fused CUDA cross-entropy; 1 or
/// unset keeps it.
bool fusedCrossEntropy();
/// BMT_FUSED_ATEN: set to any value, fused regions run as ATen ops instead
/// of NVRTC kernels.
bool fusedRegionsOnAten();
/// BMT_ROW_PREFETCH: "0" (default), "backward" or "1": which row kernels
/// prefetch the next row (a setting for measuring).
std::string rowPrefetch();
/// BMT_ROW_BLOCKS_PER_SM: blocks per SM of the forward row kernel, 1..64
/// (default 16; for measuring).
int64_t rowBlocksPerSm();
/// BMT_NVRTC_LIBRARY: a libnvrtc to try before the usual names.
std::optional<std::string> nvrtcLibrary();
/// BMT_KERNEL_CACHE: the folder of compiled fused kernels (default
/// $XDG_CACHE_HOME/bmt/kernels or ~/.cache/bmt/kernels).
std::optional<std::string> kernelCache();

// --- Test and diagnostic hooks -------------------------------------------

/// BMT_DEBUG_RECOMPUTE_NAN: 1 fills recomputation placeholders with NaN.
bool debugRecomputeNan();
/// BMT_DEBUG_ADAM_COPIES: "aten" serves offered bf16/fp16 copies with
/// ATen ops on any device (the CPU tests' way into that path).
bool debugAdamCopiesAten();
/// BMT_DEBUG_INJECT_INF_STEP ("K" or "K-L") and BMT_DEBUG_INJECT_INF_RANK:
/// an inf in rank R's gradients at steps K..L (0: none).
struct InjectInf {
  int64_t first = 0, last = 0, rank = 0;
};
InjectInf debugInjectInf();
/// BMT_DEBUG_EXIT_AFTER_STEP: exit the process after step N (0: never).
int64_t debugExitAfterStep();
/// BMT_DEBUG_SYNC: 1 synchronises the device after every step.
bool debugSync();
/// BMT_DEBUG_COMM=host: on a GPU, the CPU backend's collectives through
/// host memory instead of NCCL (several ranks sharing one GPU, for tests).
bool debugCommThroughHost();
/// BMT_DEBUG_CHECKPOINT_CHUNK_BYTES: the bytes of a checkpoint's checksummed
/// chunk (a positive integer; unset: the format's default).
std::optional<int64_t> debugCheckpointChunkBytes();
/// BMT_DEBUG_CHECKPOINT_SLOW_MS: milliseconds to sleep after writing each
/// checkpoint tensor (0: none).
int64_t debugCheckpointSlowMs();

/// Reads every variable above: EnvError for the first bad one.
void checkEnvironment();

} // namespace env
} // namespace bmt::runtime

#endif // BMT_RUNTIME_ENV_H
