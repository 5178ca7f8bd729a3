//===- Random.h - portable draws from std::mt19937_64 -----------*- C++ -*-===//
//
// Internal to the runtime: uniform draws computed from the generator's raw
// 64-bit output, so that a seed gives the same numbers with every standard
// library (std::uniform_int_distribution's algorithm is
// implementation-defined).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_RANDOM_H
#define BMT_RUNTIME_RANDOM_H

#include <cstdint>
#include <random>

namespace bmt::runtime {

/// SplitMix64 (Steele, Lea and Flood 2014): a well-mixed 64-bit value of
/// `x`, for seeds derived from a seed and an index.
inline uint64_t splitMix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// A uniform integer in [0, n) (n >= 1), by rejection.
inline uint64_t uniformBelow(std::mt19937_64 &rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n; // 2^64 mod n
  for (;;) {
    uint64_t x = rng();
    if (x >= threshold)
      return x % n;
  }
}

/// A uniform double in [0, 1) with 53 random bits.
inline double uniform01(std::mt19937_64 &rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
}

} // namespace bmt::runtime

#endif // BMT_RUNTIME_RANDOM_H
