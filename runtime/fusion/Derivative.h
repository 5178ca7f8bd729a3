//===- Derivative.h - reverse-mode derivative of a region -----*- C++ -*-===//
//
// Private to runtime/fusion: buildRegion's backward graph (Region.h).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_FUSION_DERIVATIVE_H
#define BMT_RUNTIME_FUSION_DERIVATIVE_H

#include "bmt/Runtime/fusion/Region.h"

#include <vector>

namespace bmt::fusion {

/// Reverse-mode differentiation of `g` at `results`: extends `g` by a
/// GradOut per result and the adjoint nodes; returns the adjoint of each
/// input (-1: none).
std::vector<int> differentiate(Graph &g, const std::vector<int> &results, int numInputs);

} // namespace bmt::fusion

#endif // BMT_RUNTIME_FUSION_DERIVATIVE_H
