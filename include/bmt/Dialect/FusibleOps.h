//===- FusibleOps.h - the ATen ops a fused region may hold ------*- C++ -*-===//
//
// The operators of FusibleOps.def as values, for bmt-fuse-elementwise (which
// forms the regions) and the runtime's region code generator (which turns
// each op into a per-element expression). Free of MLIR and LLVM: the
// runtime, built without them, includes it too.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_DIALECT_FUSIBLEOPS_H
#define BMT_DIALECT_FUSIBLEOPS_H

#include "bmt/Dialect/AtenOpId.h"

#include <optional>

namespace bmt {

/// What the region code generator makes of a fusible op (FusibleOps.def
/// says which arguments each kind takes).
enum class FusibleKind {
  // binary
  Add, Sub, Rsub, Mul, Div, Pow,
  // unary
  Neg, Sqrt, Rsqrt, Exp, Log, Tanh, Sigmoid, Relu, Silu, Erf, Cos, Sin, Gelu,
  // cast
  Cast,
  // reductions over the last dim
  Mean, Sum, LayerNorm, Softmax,
};

/// The kind of `id` in a fused region, or none when no region may hold it.
inline std::optional<FusibleKind> fusibleKindOf(AtenOpId id) {
  switch (id) {
#define BMT_FUSIBLE_OP(ID, KIND)                                                                   \
  case AtenOpId::ID:                                                                               \
    return FusibleKind::KIND;
#include "bmt/Dialect/FusibleOps.def"
  default:
    return std::nullopt;
  }
}

/// Whether `kind` reduces over the last dim (mean, sum, layer_norm, softmax).
inline bool isFusibleReduction(FusibleKind kind) {
  return kind == FusibleKind::Mean || kind == FusibleKind::Sum ||
         kind == FusibleKind::LayerNorm || kind == FusibleKind::Softmax;
}

} // namespace bmt

#endif // BMT_DIALECT_FUSIBLEOPS_H
