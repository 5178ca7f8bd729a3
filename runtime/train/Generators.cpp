//===- Generators.cpp - seeds of ATen's default generators ----------------===//

#include "bmt/Runtime/train/Generators.h"
#include "data/Random.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>

namespace bmt::runtime {

uint64_t generatorSeed(uint64_t seed, int64_t dataParallelRank, int64_t step) {
  const uint64_t start =
      splitMix64(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(dataParallelRank + 1));
  return step == 0 ? start : splitMix64(start + static_cast<uint64_t>(step));
}

void seedGeneratorsAt(at::Device device, uint64_t seed, int64_t dataParallelRank, int64_t step) {
  const uint64_t s = generatorSeed(seed, dataParallelRank, step);
  auto seedOne = [s](at::Generator g) { // (a handle: the default generator itself)
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(s);
  };
  seedOne(at::detail::getDefaultCPUGenerator());
  if (device.is_cuda())
    seedOne(at::globalContext().defaultGenerator(device));
}

} // namespace bmt::runtime
