//===- AtenRegistry.h - the operators bmt knows ----------------*- C++ -*-===//
//
// The registry of PyTorch operators that bmt imports, verifies and (later)
// reasons about: one entry per schema overload, listed in AtenOps.def. The
// importers reject any operator not listed here; the `bmt.aten` verifier
// checks argument and result counts against it; passes read arguments by
// schema name (include/bmt/Dialect/AtenArgs.h) and consult an entry's kind
// and flags instead of lists of operator names. A unit test
// (test/unit/Import/AtenRegistryTest.cpp) checks every entry against the schema
// that LibTorch's dispatcher registers under the same name, so names,
// counts and the flags a schema states cannot drift from PyTorch's.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_DIALECT_ATENREGISTRY_H
#define BMT_DIALECT_ATENREGISTRY_H

#include "bmt/Dialect/AtenOpId.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <optional>

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

/// Properties of an operator beyond its kind, as bits of AtenOpInfo::flags.
namespace AtenOpFlag {
enum : unsigned {
  /// Writes its `self` argument (add_, masked_fill_, detach_); the schema
  /// annotates `self` as `Tensor(a!)`.
  InPlace = 1u << 0,
  /// A result may share storage with an input: views, conversions that
  /// return their input when nothing changes, in-place ops (the schema's
  /// result is `Tensor(a)`; aten::type_as too, whose schema omits it).
  Alias = 1u << 1,
  /// Draws random numbers (dropout, the dropout_p of SDPA); LibTorch tags
  /// these `nondeterministic_seeded`.
  Random = 1u << 2,
};
} // namespace AtenOpFlag

/// One operator overload.
struct AtenOpInfo {
  /// The operator as an enum value (AtenOpId.h).
  AtenOpId id;
  /// Qualified name and overload as TorchScript prints it: "aten::softmax.int";
  /// the default overload has no suffix: "aten::linear".
  llvm::StringRef name;
  /// Number of schema arguments, keyword-only ones included.
  unsigned numArgs;
  /// The schema's argument names, in order ("self", "other", "alpha").
  llvm::ArrayRef<llvm::StringRef> argNames;
  /// Number of results; -1 when the schema returns one list (`Tensor[]`),
  /// which bmt.aten spreads over as many results as the program unpacks.
  int numResults;
  AtenOpKind kind;
  /// AtenOpFlag bits.
  unsigned flags;
  /// For a reduction, the index of the argument giving the reduced dims
  /// (`dim`; layer_norm's `normalized_shape`: the trailing dims); -1 when
  /// it reduces every dim, and for ops that are no reduction.
  int reducedDimsArg;

  bool isInPlace() const { return flags & AtenOpFlag::InPlace; }
  bool mayAlias() const { return flags & AtenOpFlag::Alias; }
  bool isRandom() const { return flags & AtenOpFlag::Random; }
  /// The index of the argument named `name`, or -1 when the schema has none.
  int argIndex(llvm::StringRef name) const;
};

/// The entry for `name` ("aten::softmax.int"), or nullptr when bmt does not
/// know the operator.
const AtenOpInfo *lookupAtenOp(llvm::StringRef name);

/// The operator named `name` ("aten::softmax.int": AtenOpId::softmax_int), or
/// none when bmt does not know it.
std::optional<AtenOpId> atenOpIdOf(llvm::StringRef name);

/// The entry of `id`.
const AtenOpInfo &getAtenOpInfo(AtenOpId id);

/// The overload name of `id` ("aten::softmax.int").
llvm::StringRef atenOpName(AtenOpId id);

/// The operator name of `id` without namespace and overload, for matching
/// every overload of one operator: "add" for aten::add.Tensor and
/// aten::add.Scalar, "add_" for aten::add_.Tensor, "to" for aten::to.dtype.
llvm::StringRef atenOpBase(AtenOpId id);

/// Every entry, in AtenOps.def order (entry i has AtenOpId i).
llvm::ArrayRef<AtenOpInfo> getAtenOps();

/// The kind's name in lower case ("elementwise").
llvm::StringRef stringifyAtenOpKind(AtenOpKind kind);

} // namespace bmt

#endif // BMT_DIALECT_ATENREGISTRY_H
