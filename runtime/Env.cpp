//===- Env.cpp - the runtime's BMT_* environment settings -----------------===//

#include "bmt/Runtime/Env.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace bmt::runtime::env {

namespace {

/// The variable's value; none when unset or (unless `emptyIsSet`) empty.
std::optional<std::string> read(const char *name, bool emptyIsSet = false) {
  const char *v = std::getenv(name);
  if (v == nullptr || (*v == '\0' && !emptyIsSet))
    return std::nullopt;
  return std::string(v);
}

[[noreturn]] void bad(const char *name, const std::string &expected, const std::string &value) {
  throw EnvError(std::string(name) + ": expected " + expected + ", got '" + value + "'");
}

/// An integer from `min` to `max`, else EnvError.
int64_t integer(const char *name, const std::string &v, int64_t min, int64_t max,
                const std::string &expected) {
  errno = 0;
  char *end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0' || n < min || n > max)
    bad(name, expected, v);
  return static_cast<int64_t>(n);
}

int64_t integerOr(const char *name, int64_t fallback, int64_t min, const std::string &expected) {
  std::optional<std::string> v = read(name);
  return v ? integer(name, *v, min, INT64_MAX, expected) : fallback;
}

/// "0" or "1" (unset: `fallback`).
bool flag(const char *name, bool fallback) {
  std::optional<std::string> v = read(name);
  if (!v)
    return fallback;
  if (*v != "0" && *v != "1")
    bad(name, "0 or 1", *v);
  return *v == "1";
}

} // namespace

std::chrono::milliseconds parseCommTimeout(const std::string &value) {
  errno = 0;
  char *end = nullptr;
  double s = std::strtod(value.c_str(), &end);
  if (errno != 0 || end == value.c_str() || *end != '\0' || !std::isfinite(s) || s <= 0 ||
      s > 1e9)
    bad("BMT_COMM_TIMEOUT_S", "a positive number of seconds", value);
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(s * 1000)));
}

std::chrono::milliseconds commTimeout() {
  std::optional<std::string> v = read("BMT_COMM_TIMEOUT_S");
  return v ? parseCommTimeout(*v) : std::chrono::milliseconds(300 * 1000);
}

int64_t stopWaitSeconds() {
  return integerOr("BMT_STOP_WAIT_S", 10, 1, "a positive whole number of seconds");
}

bool fusedAdam() { return flag("BMT_FUSED_ADAM", true); }

bool fusedCrossEntropy() { return flag("BMT_FUSED_CROSS_ENTROPY", true); }

bool fusedRegionsOnAten() { return read("BMT_FUSED_ATEN", /*emptyIsSet=*/true).has_value(); }

std::string rowPrefetch() {
  std::string m = read("BMT_ROW_PREFETCH").value_or("0");
  if (m != "0" && m != "backward" && m != "1")
    bad("BMT_ROW_PREFETCH", "0, backward or 1", m);
  return m;
}

int64_t rowBlocksPerSm() {
  std::optional<std::string> v = read("BMT_ROW_BLOCKS_PER_SM");
  return v ? integer("BMT_ROW_BLOCKS_PER_SM", *v, 1, 64, "an integer from 1 to 64") : 16;
}

std::optional<std::string> nvrtcLibrary() { return read("BMT_NVRTC_LIBRARY"); }

std::optional<std::string> kernelCache() { return read("BMT_KERNEL_CACHE"); }

bool debugRecomputeNan() { return flag("BMT_DEBUG_RECOMPUTE_NAN", false); }

bool debugAdamCopiesAten() {
  std::optional<std::string> v = read("BMT_DEBUG_ADAM_COPIES");
  if (v && *v != "aten")
    bad("BMT_DEBUG_ADAM_COPIES", "aten", *v);
  return v.has_value();
}

InjectInf debugInjectInf() {
  const char *name = "BMT_DEBUG_INJECT_INF_STEP";
  const std::string steps = "a step K or steps K-L";
  InjectInf r;
  if (std::optional<std::string> v = read(name)) {
    const size_t dash = v->find('-');
    r.first = integer(name, v->substr(0, dash), 0, INT64_MAX, steps);
    r.last = dash == std::string::npos ? r.first
                                       : integer(name, v->substr(dash + 1), 0, INT64_MAX, steps);
  }
  r.rank = integerOr("BMT_DEBUG_INJECT_INF_RANK", 0, 0, "a rank (an integer >= 0)");
  return r;
}

int64_t debugExitAfterStep() {
  return integerOr("BMT_DEBUG_EXIT_AFTER_STEP", 0, 0, "a step (an integer >= 0)");
}

bool debugSync() { return integerOr("BMT_DEBUG_SYNC", 0, 0, "0 or 1") != 0; }

bool debugCommThroughHost() {
  std::optional<std::string> v = read("BMT_DEBUG_COMM");
  if (v && *v != "host")
    bad("BMT_DEBUG_COMM", "host", *v);
  return v.has_value();
}

std::optional<int64_t> debugCheckpointChunkBytes() {
  std::optional<std::string> v = read("BMT_DEBUG_CHECKPOINT_CHUNK_BYTES");
  if (!v)
    return std::nullopt;
  return integer("BMT_DEBUG_CHECKPOINT_CHUNK_BYTES", *v, 1, INT64_MAX,
                 "a positive number of bytes");
}

int64_t debugCheckpointSlowMs() {
  return integerOr("BMT_DEBUG_CHECKPOINT_SLOW_MS", 0, 0, "milliseconds (an integer >= 0)");
}

void checkEnvironment() {
  commTimeout();
  stopWaitSeconds();
  fusedAdam();
  fusedCrossEntropy();
  rowPrefetch();
  rowBlocksPerSm();
  debugRecomputeNan();
  debugAdamCopiesAten();
  debugInjectInf();
  debugExitAfterStep();
  debugSync();
  debugCommThroughHost();
  debugCheckpointChunkBytes();
  debugCheckpointSlowMs();
}

} // namespace bmt::runtime::env
