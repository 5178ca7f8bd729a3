//===- AtenArgs.cpp - reading a bmt.aten op's schema arguments ------------===//

#include "bmt/Dialect/AtenArgs.h"

#include "bmt/Dialect/AtenRegistry.h"

#include "mlir/IR/BuiltinAttributes.h"

using namespace mlir;
using namespace bmt;

namespace {

/// An integer attribute's value; none for bools and anything else.
std::optional<int64_t> intOf(Attribute attr) {
  if (auto dense = dyn_cast_or_null<DenseElementsAttr>(attr)) {
    Type element = dense.getElementType();
    if (dense.getType().getRank() != 0 || !isa<IntegerType>(element) || element.isInteger(1))
      return std::nullopt;
    return dense.getSplatValue<APInt>().getSExtValue();
  }
  auto i = dyn_cast_or_null<IntegerAttr>(attr);
  if (!i || i.getType().isInteger(1))
    return std::nullopt;
  return i.getValue().getSExtValue();
}

/// A float or integer attribute's value; none for bools and anything else.
std::optional<double> numberOf(Attribute attr) {
  if (auto f = dyn_cast_or_null<FloatAttr>(attr))
    return f.getValueAsDouble();
  if (auto dense = dyn_cast_or_null<DenseElementsAttr>(attr);
      dense && dense.getType().getRank() == 0 && isa<FloatType>(dense.getElementType()))
    return dense.getSplatValue<APFloat>().convertToDouble();
  if (std::optional<int64_t> i = intOf(attr))
    return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<bool> boolOf(Attribute attr) {
  if (auto b = dyn_cast_or_null<BoolAttr>(attr))
    return b.getValue();
  if (auto dense = dyn_cast_or_null<DenseElementsAttr>(attr);
      dense && dense.getType().getRank() == 0 && dense.getElementType().isInteger(1))
    return dense.getSplatValue<bool>();
  return std::nullopt;
}

/// The attribute of the `bmt.constant` defining `v`, or null.
Attribute constantOf(Value v) {
  auto c = v ? v.getDefiningOp<ConstantOp>() : ConstantOp();
  return c ? c.getValue() : Attribute();
}

/// Decodes `attr`, taking operands from `op` starting at `next`.
AtenArg decode(AtenOp op, Attribute attr, unsigned &next) {
  if (isa<OperandAttr>(attr)) {
    unsigned number = next++;
    return AtenArg::ofOperand(op->getOperand(number), number);
  }
  if (auto list = dyn_cast<ArrayAttr>(attr)) {
    unsigned first = next;
    std::vector<AtenArg> elements;
    for (Attribute e : list)
      elements.push_back(decode(op, e, next));
    return AtenArg::ofList(std::move(elements), first);
  }
  return AtenArg::ofConstant(attr);
}

} // namespace

AtenArg AtenArg::ofOperand(Value value, unsigned operandNumber) {
  AtenArg a;
  a.value = value;
  a.operandNumber = operandNumber;
  return a;
}

AtenArg AtenArg::ofConstant(Attribute attr) {
  AtenArg a;
  a.attr = attr;
  return a;
}

AtenArg AtenArg::ofList(std::vector<AtenArg> elements, unsigned firstOperand) {
  AtenArg a;
  a.list = true;
  a.operandNumber = firstOperand;
  a.elements = std::move(elements);
  return a;
}

bool AtenArg::isNone() const { return isa_and_nonnull<NoneAttr>(attr); }

std::optional<int64_t> AtenArg::getInt() const {
  return intOf(value ? constantOf(value) : attr);
}

std::optional<double> AtenArg::getNumber() const {
  return numberOf(value ? constantOf(value) : attr);
}

std::optional<bool> AtenArg::getBool() const {
  return boolOf(value ? constantOf(value) : attr);
}

std::optional<llvm::SmallVector<int64_t>> AtenArg::getInts() const {
  if (!list)
    return std::nullopt;
  llvm::SmallVector<int64_t> out;
  for (const AtenArg &e : elements) {
    std::optional<int64_t> i = e.getInt();
    if (!i)
      return std::nullopt;
    out.push_back(*i);
  }
  return out;
}

llvm::SmallVector<AtenArg> bmt::getAtenArgs(AtenOp op) {
  llvm::SmallVector<AtenArg> out;
  unsigned next = 0;
  for (Attribute attr : op.getArgs())
    out.push_back(decode(op, attr, next));
  return out;
}

std::optional<AtenArg> bmt::getAtenArg(AtenOp op, unsigned index) {
  ArrayAttr args = op.getArgs();
  if (index >= args.size())
    return std::nullopt;
  unsigned next = 0;
  for (unsigned i = 0; i < index; ++i)
    decode(op, args[i], next);
  return decode(op, args[index], next);
}

std::optional<AtenArg> bmt::getAtenArg(AtenOp op, llvm::StringRef name) {
  const AtenOpInfo *info = lookupAtenOp(op.getName());
  int index = info ? info->argIndex(name) : -1;
  if (index < 0)
    return std::nullopt;
  return getAtenArg(op, static_cast<unsigned>(index));
}

std::optional<int64_t> bmt::getConstantInt(Value v) { return intOf(constantOf(v)); }

std::optional<double> bmt::getConstantNumber(Value v) { return numberOf(constantOf(v)); }

std::optional<AtenOpId> bmt::atenOpId(Operation *op) {
  auto aten = llvm::dyn_cast_if_present<AtenOp>(op);
  return aten ? atenOpIdOf(aten.getName()) : std::nullopt;
}

bool bmt::isAten(Operation *op, std::initializer_list<AtenOpId> ids) {
  std::optional<AtenOpId> id = atenOpId(op);
  return id && llvm::is_contained(ids, *id);
}
