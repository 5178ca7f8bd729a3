//===- RandomTensor.h - seeded random tensors for the unit tests -*- C++ -*-===//

#ifndef BMT_TEST_UNIT_RANDOMTENSOR_H
#define BMT_TEST_UNIT_RANDOMTENSOR_H

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>
#include <random>

namespace bmt::test {

/// A tensor of `shape` and `dtype` (converted from float64) holding normal
/// values times `scale`, drawn from std::mt19937_64(seed): the same values
/// for a seed on every machine, independent of ATen's generator.
inline at::Tensor randomTensor(at::IntArrayRef shape, at::ScalarType dtype, uint64_t seed,
                               double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  at::Tensor t = at::empty(shape, at::kDouble);
  double *data = t.data_ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i)
    data[i] = normal(rng) * scale;
  return t.to(dtype);
}

} // namespace bmt::test

#endif // BMT_TEST_UNIT_RANDOMTENSOR_H
