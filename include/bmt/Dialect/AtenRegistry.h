//===- AtenRegistry.h - the operators bmt knows ----------------*- C++ -*-===//
//
// The registry of PyTorch operators that bmt imports, verifies and (later)
// reasons about: one entry per schema overload, listed in AtenOps.def. The
// importers reject any operator not listed here; the `bmt.aten` verifier
// checks argument and result counts against it. A unit test
// (test/unit/AtenRegistryTest.cpp) checks every entry against the schema
// that LibTorch's dispatcher registers under the same name, so the counts
// here cannot drift from PyTorch's.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_DIALECT_ATENREGISTRY_H
#define BMT_DIALECT_ATENREGISTRY_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

namespace bmt {

/// What an operator does, coarsely; passes use it to reason about cost and
/// sharding without matching operator names.
enum class AtenOpKind {
  Elementwise, ///< pointwise math, broadcasting (add, mul, gelu, where, ...)
  Reduction,   ///< reduces over dimensions (sum, mean, softmax, norms, ...)
  Matmul,      ///< contractions (linear, matmul, bmm, addmm, ...)
  View,        ///< reshapes or re-strides without computing (view, transpose, ...)
  Copy,        ///< moves or converts data (to, contiguous, clone, cat, ...)
  Factory,     ///< creates a tensor from sizes (arange, ones, full, ...)
  Indexing,    ///< gathers or scatters by index (embedding, index, slice, ...)
  Attention,   ///< fused attention (scaled_dot_product_attention)
  Random,      ///< draws random numbers (dropout)
  Metadata,    ///< reads tensor metadata or converts scalars (size, Int, ...)
};

/// One operator overload.
struct AtenOpInfo {
  /// Qualified name and overload as TorchScript prints it: "aten::softmax.int";
  /// the default overload has no suffix: "aten::linear".
  llvm::StringRef name;
  /// Number of schema arguments, keyword-only ones included.
  unsigned numArgs;
  /// Number of results; -1 when the schema returns one list (`Tensor[]`),
  /// which bmt.aten spreads over as many results as the program unpacks.
  int numResults;
  AtenOpKind kind;
};

/// The entry for `name` ("aten::softmax.int"), or nullptr when bmt does not
/// know the operator.
const AtenOpInfo *lookupAtenOp(llvm::StringRef name);

/// Every entry, in AtenOps.def order.
llvm::ArrayRef<AtenOpInfo> getAtenOps();

/// The kind's name in lower case ("elementwise").
llvm::StringRef stringifyAtenOpKind(AtenOpKind kind);

} // namespace bmt

#endif // BMT_DIALECT_ATENREGISTRY_H
