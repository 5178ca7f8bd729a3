//===- Generators.h - seeds of ATen's default generators --------*- C++ -*-===//
//
// The program's random operators (dropout) draw from ATen's default
// generators (CPU, and the run device's). A run seeds them from --seed and
// the rank's data-parallel index (Model::seedGenerators); a resume restores
// each rank's saved states at the same layout, and on another one (N, T or
// P changed: the saved states belong to other ranks) reseeds them from
// --seed, the data-parallel index and the step it resumes at, so that the
// steps after it draw a stream of their own, the same on every such resume
// (docs/runtime/numerics.md).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_GENERATORS_H
#define BMT_RUNTIME_TRAIN_GENERATORS_H

#include <c10/core/Device.h>

#include <cstdint>

namespace bmt::runtime {

/// The seed of a data-parallel rank's generators: at step 0 the one a run
/// starts with (Model::seedGenerators': SplitMix64 of --seed + the golden
/// ratio x (rank + 1)); after `step` > 0 steps that seed mixed with the
/// step, another value for every step.
uint64_t generatorSeed(uint64_t seed, int64_t dataParallelRank, int64_t step);

/// Seeds ATen's default CPU generator, and `device`'s when it is a CUDA
/// device, with generatorSeed(seed, dataParallelRank, step).
void seedGeneratorsAt(at::Device device, uint64_t seed, int64_t dataParallelRank, int64_t step);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_GENERATORS_H
