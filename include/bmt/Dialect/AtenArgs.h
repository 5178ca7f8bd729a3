//===- AtenArgs.h - reading a bmt.aten op's schema arguments ----*- C++ -*-===//
//
// A `bmt.aten` op keeps its schema arguments in one `args` array: constants
// as attributes, and a #bmt.operand marker where an argument (or a list
// element) is an SSA operand, markers matched with the operands in order,
// depth first. This is the one place that decodes that encoding; passes
// and the exporter read an argument by schema name or index through it:
//
//   std::optional<AtenArg> mask = getAtenArg(sdpa, "attn_mask");
//   if (mask && !mask->isNone()) ... mask->getOperand() ...
//
// Names come from the operator registry (AtenOps.def). Constants may be
// written in `args` or be the value of a `bmt.constant` that defines the
// operand (a .pt2's scalars, a trace's 0-dim tensors); the getters below
// read both. None is always written in `args`.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_DIALECT_ATENARGS_H
#define BMT_DIALECT_ATENARGS_H

#include "bmt/Dialect/AtenOpId.h"
#include "bmt/Dialect/BmtDialect.h"

#include "llvm/ADT/SmallVector.h"

#include <optional>
#include <vector>

namespace bmt {

/// One schema argument (or list element) of a `bmt.aten` op: an operand, a
/// constant attribute, or a list of arguments.
class AtenArg {
public:
  static AtenArg ofOperand(mlir::Value value, unsigned operandNumber);
  static AtenArg ofConstant(mlir::Attribute attr);
  static AtenArg ofList(std::vector<AtenArg> elements, unsigned firstOperand);

  bool isOperand() const { return static_cast<bool>(value); }
  bool isList() const { return list; }
  /// The operand; null for a constant or a list.
  mlir::Value getOperand() const { return value; }
  /// The position among the op's operands of the operand (for a list, of
  /// its first operand, or where it would be).
  unsigned getOperandNumber() const { return operandNumber; }
  /// The constant as written in `args`; null for an operand or a list.
  mlir::Attribute getAttr() const { return attr; }
  /// The elements of a list; empty otherwise.
  llvm::ArrayRef<AtenArg> getElements() const { return elements; }

  /// Whether the argument is None (#bmt.none in `args`).
  bool isNone() const;
  /// The integer when the argument is an integer constant (an integer
  /// attribute other than a bool, or a 0-dim integer tensor constant);
  /// none otherwise.
  std::optional<int64_t> getInt() const;
  /// The number when the argument is a float or integer constant (scalar
  /// or 0-dim tensor; bools are not numbers); none otherwise.
  std::optional<double> getNumber() const;
  /// The value when the argument is a bool constant (scalar or 0-dim).
  std::optional<bool> getBool() const;
  /// The integers of a list whose every element is an integer constant.
  std::optional<llvm::SmallVector<int64_t>> getInts() const;

private:
  mlir::Value value;
  mlir::Attribute attr;
  bool list = false;
  unsigned operandNumber = 0;
  std::vector<AtenArg> elements;
};

/// The operator of `op` when it is a `bmt.aten` (whose verifier admits only
/// registered names), or none for any other op or a null one.
std::optional<AtenOpId> atenOpId(mlir::Operation *op);

/// Whether `op` is a `bmt.aten` of one of `ids`:
/// `isAten(op, {AtenOpId::view, AtenOpId::reshape})`.
bool isAten(mlir::Operation *op, std::initializer_list<AtenOpId> ids);

/// Every schema argument of `op`, in schema order.
llvm::SmallVector<AtenArg> getAtenArgs(AtenOp op);

/// Schema argument `index` of `op`; none when `op` has fewer arguments.
std::optional<AtenArg> getAtenArg(AtenOp op, unsigned index);

/// The schema argument named `name` ("attn_mask"); none when `op`'s schema
/// (looked up in the registry) has no argument of that name.
std::optional<AtenArg> getAtenArg(AtenOp op, llvm::StringRef name);

/// The integer (as AtenArg::getInt) or number (as AtenArg::getNumber) that
/// `v` holds when a `bmt.constant` defines it; none otherwise.
std::optional<int64_t> getConstantInt(mlir::Value v);
std::optional<double> getConstantNumber(mlir::Value v);

} // namespace bmt

#endif // BMT_DIALECT_ATENARGS_H
