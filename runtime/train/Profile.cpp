//===- Profile.cpp - a per-op profile of training steps -------------------===//

#include "bmt/Runtime/train/Profile.h"

#include <ATen/record_function.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iomanip>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace bmt::runtime {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool isDeviceActivity(uint8_t type) {
  using K = libkineto::ActivityType;
  return type == static_cast<uint8_t>(K::CONCURRENT_KERNEL) ||
         type == static_cast<uint8_t>(K::GPU_MEMCPY) || type == static_cast<uint8_t>(K::GPU_MEMSET);
}

bool isCpuOp(const prof::KinetoEvent &e) {
  return e.activityType() == static_cast<uint8_t>(libkineto::ActivityType::CPU_OP) &&
         e.deviceType() == c10::DeviceType::CPU && !e.isAsync();
}

struct Row {
  std::string name;
  int64_t calls = 0;
  double ns = 0;
};

/// Rows sorted by time, largest first.
std::vector<Row> sorted(const std::unordered_map<std::string, Row> &rows) {
  std::vector<Row> v;
  v.reserve(rows.size());
  for (const auto &[_, r] : rows)
    v.push_back(r);
  std::sort(v.begin(), v.end(), [](const Row &a, const Row &b) { return a.ns > b.ns; });
  return v;
}

std::string shorten(std::string s, size_t n) {
  if (s.size() > n)
    s = s.substr(0, n - 3) + "...";
  return s;
}

/// Prints the first `top` rows: ms per step, share of `totalNs`, calls per step, name.
void printRows(std::ostream &out, const std::vector<Row> &rows, int top, double totalNs,
               int64_t steps) {
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  int shown = 0;
  for (const Row &r : rows) {
    if (shown++ == top)
      break;
    out << "  " << std::setw(7) << std::setprecision(2) << r.ns / (1e6 * n) << "  "
        << std::setw(5) << std::setprecision(1) << 100.0 * r.ns / totalNs << "  "
        << std::setw(10) << std::setprecision(1) << static_cast<double>(r.calls) / n << "  "
        << r.name << "\n";
  }
}

/// Length of the union of [start, end) intervals (ns).
double unionLength(std::vector<std::pair<int64_t, int64_t>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0;
  int64_t curStart = 0, curEnd = -1;
  for (auto [s, e] : intervals) {
    if (s > curEnd) {
      if (curEnd > curStart)
        total += static_cast<double>(curEnd - curStart);
      curStart = s;
      curEnd = e;
    } else {
      curEnd = std::max(curEnd, e);
    }
  }
  if (curEnd > curStart)
    total += static_cast<double>(curEnd - curStart);
  return total;
}

} // namespace

StepProfiler::StepProfiler() = default;

StepProfiler::~StepProfiler() {
  if (recording_) {
    try {
      prof::disableProfiler();
    } catch (...) {
    }
  }
}

void StepProfiler::start(bool cuda, bool shapes) {
  if (recording_ || prof::isProfilerEnabledInMainThread())
    throw std::runtime_error("a profiler is already recording");
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda)
    activities.insert(ActivityType::CUDA);
  ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/shapes);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  recording_ = true;
  cuda_ = cuda;
  if (cuda) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
    mallocsAtStart_ = stats.num_device_alloc;
    freesAtStart_ = stats.num_device_free;
  }
  startNs_ = nowNs();
}

void StepProfiler::stop(std::ostream &out, const std::string &tracePath, int64_t steps,
                        int top) {
  if (!recording_)
    throw std::runtime_error("the profiler is not recording");
  const double wallNs = static_cast<double>(nowNs() - startNs_);
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  recording_ = false;
  if (!tracePath.empty()) {
    std::FILE *probe = std::fopen(tracePath.c_str(), "w");
    if (!probe)
      throw std::runtime_error("cannot write the profile trace " + tracePath);
    std::fclose(probe);
    result->save(tracePath);
  }
  const std::vector<prof::KinetoEvent> &events = result->events();
  const double perStep = 1.0 / (1e6 * static_cast<double>(std::max<int64_t>(steps, 1)));

  std::unordered_map<uint64_t, const prof::KinetoEvent *> opByCorrelation;
  for (const prof::KinetoEvent &e : events)
    if (isCpuOp(e))
      opByCorrelation[e.correlationId()] = &e;

  std::unordered_map<std::string, Row> rows;
  std::ios::fmtflags flags = out.flags();
  out << std::fixed;
  if (cuda_) {
    // Kernel time per launching op.
    std::unordered_map<std::string, Row> kernels;
    std::vector<std::pair<int64_t, int64_t>> busy;
    double total = 0, collectives = 0;
    for (const prof::KinetoEvent &e : events) {
      if (!isDeviceActivity(e.activityType()))
        continue;
      const double ns = static_cast<double>(e.durationNs());
      busy.emplace_back(static_cast<int64_t>(e.startNs()), static_cast<int64_t>(e.endNs()));
      std::string kernel = e.name();
      if (kernel.rfind("nccl", 0) == 0) {
        collectives += ns;
        continue;
      }
      total += ns;
      auto op = opByCorrelation.find(e.linkedCorrelationId());
      std::string name = op == opByCorrelation.end() ? "(no op: " + shorten(kernel, 40) + ")"
                                                     : op->second->name();
      Row &r = rows[name];
      r.name = name;
      ++r.calls;
      r.ns += ns;
      Row &k = kernels[kernel];
      k.name = kernel;
      ++k.calls;
      k.ns += ns;
    }
    out << "profile: " << steps << " steps, " << std::setprecision(1) << wallNs * perStep
        << " ms wall per step; compute kernels " << total * perStep << " ms per step, GPU busy "
        << std::setprecision(1) << 100.0 * unionLength(busy) / wallNs << " % of the wall time; "
        << "collective kernels " << collectives * perStep << " ms per step (own streams)\n";
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
    out << "  caching allocator: " << stats.num_device_alloc - mallocsAtStart_ << " cudaMalloc and "
        << stats.num_device_free - freesAtStart_ << " cudaFree calls in the window\n";
    out << "  ms/step      %   calls/step  op (kernels it launched)\n";
    printRows(out, sorted(rows), top, total, steps);
    out << "  top kernels:\n";
    int shown = 0;
    for (const Row &r : sorted(kernels)) {
      if (shown++ == 24)
        break;
      out << "  " << std::setw(7) << std::setprecision(2) << r.ns * perStep << "  "
          << std::setw(5) << std::setprecision(1) << 100.0 * r.ns / total << "  "
          << shorten(r.name, 110) << "\n";
    }
  } else {
    // Self time per op: its duration less that of the ops nested in it on
    // the same thread.
    std::map<uint64_t, std::vector<const prof::KinetoEvent *>> byThread;
    for (const prof::KinetoEvent &e : events)
      if (isCpuOp(e))
        byThread[e.startThreadId()].push_back(&e);
    double total = 0;
    for (auto &[_, ops] : byThread) {
      std::sort(ops.begin(), ops.end(), [](const auto *a, const auto *b) {
        return a->startNs() != b->startNs() ? a->startNs() < b->startNs()
                                            : a->endNs() > b->endNs();
      });
      std::vector<std::pair<const prof::KinetoEvent *, double>> stack; // op, self ns
      auto pop = [&] {
        auto [op, self] = stack.back();
        stack.pop_back();
        Row &r = rows[op->name()];
        r.name = op->name();
        ++r.calls;
        r.ns += self;
        total += self;
      };
      for (const prof::KinetoEvent *e : ops) {
        while (!stack.empty() && stack.back().first->endNs() <= e->startNs())
          pop();
        if (!stack.empty())
          stack.back().second -= static_cast<double>(e->durationNs());
        stack.emplace_back(e, static_cast<double>(e->durationNs()));
      }
      while (!stack.empty())
        pop();
    }
    out << "profile: " << steps << " steps, " << std::setprecision(1) << wallNs * perStep
        << " ms wall per step; op self time " << total * perStep << " ms per step (all threads)\n";
    out << "  ms/step      %   calls/step  op\n";
    printRows(out, sorted(rows), top, total, steps);
  }
  out.flags(flags);
  out.flush();
}

} // namespace bmt::runtime
