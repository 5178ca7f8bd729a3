//===- Prewarm.cpp - compile a run's fused kernels before its first step --===//

#include "bmt/Runtime/fusion/Prewarm.h"

#include "bmt/Runtime/fusion/Nvrtc.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <thread>

#ifdef BMT_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#endif

namespace bmt::fusion {

void KernelRecorder::add(FusedRegion *region, const KernelSpec &spec, const at::Device &device,
                         int threads) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, added] =
      index_.try_emplace({region, device.str() + " " + spec.key()}, requests_.size());
  if (added)
    requests_.push_back({region, spec, device, threads});
  else
    requests_[it->second].threads = std::max(requests_[it->second].threads, threads);
}

std::vector<KernelRecorder::Request> KernelRecorder::requests() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return requests_;
}

RecordingScope::RecordingScope(std::vector<FusedRegion *> regions, KernelRecorder *recorder)
    : regions_(std::move(regions)) {
  for (FusedRegion *r : regions_)
    r->setRecorder(recorder);
}

RecordingScope::~RecordingScope() {
  for (FusedRegion *r : regions_)
    r->setRecorder(nullptr);
}

namespace {

/// The compute capability kernels for `device` are compiled for.
std::pair<int, int> architecture(const at::Device &device, const PrewarmOptions &options) {
#ifdef BMT_WITH_CUDA_KERNELS
  if (device.is_cuda()) {
    const cudaDeviceProp *prop = at::cuda::getDeviceProperties(device.index());
    return {prop->major, prop->minor};
  }
#endif
  if (options.major <= 0)
    throw FusionError("prewarm: no GPU architecture to compile for on " + device.str());
  return {options.major, options.minor};
}

int compileThreads(const PrewarmOptions &options, size_t jobs) {
  int n = options.threads;
  if (n <= 0) {
    // A few threads, sharing the host's cores with the other ranks on it.
    int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const char *local = std::getenv("LOCAL_WORLD_SIZE");
    int ranks = local ? std::max(1, std::atoi(local)) : 1;
    n = std::clamp(cores / ranks, 1, 8);
  }
  return static_cast<int>(std::min<size_t>(static_cast<size_t>(n), std::max<size_t>(jobs, 1)));
}

struct Job {
  std::string name, source;
  std::pair<int, int> arch;
  std::string binary;
  bool cached = false;
};

/// Compiles every job on `threads` threads; rethrows the first failure.
void compileAll(std::vector<Job> &jobs, int threads) {
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::exception_ptr failure;
  auto work = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      try {
        Job &j = jobs[i];
        j.binary = compileCuda(j.source, j.name, j.arch.first, j.arch.second, /*cubin=*/true, &j.cached);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failure)
          failure = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t)
    pool.emplace_back(work);
  work();
  for (std::thread &t : pool)
    t.join();
  if (failure)
    std::rethrow_exception(failure);
}

} // namespace

PrewarmResult prewarm(const std::vector<KernelRecorder::Request> &requests,
                      const PrewarmOptions &options) {
  const auto start = std::chrono::steady_clock::now();
  PrewarmResult result;
  std::map<std::string, std::string> binaries; // by architecture and source
  std::vector<KernelRecorder::Request> pending = requests;
  // A second round only for the scalar variants of row kernels whose
  // registers do not allow the 8-wide one's block (known once loaded).
  while (!pending.empty()) {
    std::vector<Job> jobs;
    std::map<std::string, size_t> jobOf;
    std::vector<std::string> keys;
    for (const KernelRecorder::Request &r : pending) {
      auto [name, source] = r.region->kernelSource(r.spec);
      std::pair<int, int> arch = architecture(r.device, options);
      std::string key = std::to_string(arch.first) + std::to_string(arch.second) + "\n" + source;
      keys.push_back(key);
      if (!binaries.count(key) && jobOf.try_emplace(key, jobs.size()).second)
        jobs.push_back({name, source, arch, {}, false});
    }
    compileAll(jobs, compileThreads(options, jobs.size()));
    for (Job &j : jobs) {
      ++result.kernels;
      result.cached += j.cached ? 1 : 0;
      binaries[std::to_string(j.arch.first) + std::to_string(j.arch.second) + "\n" + j.source] =
          std::move(j.binary);
    }
    std::vector<KernelRecorder::Request> scalar;
    for (size_t i = 0; i < pending.size(); ++i) {
      const KernelRecorder::Request &r = pending[i];
      int maxThreads = r.region->install(r.spec, r.device, binaries.at(keys[i]));
      ++result.installed;
      if (r.spec.rowVector && r.threads > maxThreads) {
        KernelRecorder::Request s = r;
        s.spec.rowVector.reset();
        s.threads = 0;
        scalar.push_back(std::move(s));
      }
    }
    pending = std::move(scalar);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

} // namespace bmt::fusion
