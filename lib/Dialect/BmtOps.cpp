//===- BmtOps.cpp - bmt dialect operations --------------------------------===//

#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/TensorSplit.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>

using namespace mlir;
using namespace bmt;

//===----------------------------------------------------------------------===//
// bmt.parameter / bmt.buffer
//===----------------------------------------------------------------------===//

/// Checks what parameters and buffers share: a static shape, a dtype PyTorch
/// has, and aliases that are distinct from the symbol and from each other.
static LogicalResult verifyGlobal(Operation *op, StringRef symName,
                                  RankedTensorType type,
                                  std::optional<ArrayAttr> aliases) {
  if (!type.hasStaticShape())
    return op->emitOpError("needs a static shape, got ") << type;
  int64_t elements = 1;
  for (int64_t dim : type.getShape())
    if (__builtin_mul_overflow(elements, dim, &elements))
      return op->emitOpError("has more elements than fit in int64: ") << type;
  Type elt = type.getElementType();
  bool known = elt.isF16() || elt.isBF16() || elt.isF32() || elt.isF64() ||
               elt.isSignlessInteger(1) || elt.isSignlessInteger(8) ||
               elt.isUnsignedInteger(8) || elt.isSignlessInteger(16) ||
               elt.isSignlessInteger(32) || elt.isSignlessInteger(64);
  if (!known)
    return op->emitOpError("has an element type PyTorch has no dtype for: ")
           << elt;
  if (!aliases)
    return success();
  llvm::StringSet<> seen;
  seen.insert(symName);
  for (Attribute alias : *aliases) {
    StringRef name = cast<StringAttr>(alias).getValue();
    if (!seen.insert(name).second)
      return op->emitOpError("lists the name '")
             << name << "' twice (as symbol or alias)";
  }
  return success();
}

int64_t ParameterOp::getNumElements() {
  return cast<RankedTensorType>(getType()).getNumElements();
}

LogicalResult ParameterOp::verify() {
  return verifyGlobal(*this, getSymName(), cast<RankedTensorType>(getType()),
                      getAliases());
}

LogicalResult BufferOp::verify() {
  return verifyGlobal(*this, getSymName(), cast<RankedTensorType>(getType()),
                      getAliases());
}

//===----------------------------------------------------------------------===//
// bmt.get_global
//===----------------------------------------------------------------------===//

LogicalResult
GetGlobalOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  Operation *target = symbolTable.lookupNearestSymbolFrom(*this, getGlobalAttr());
  if (!target)
    return emitOpError("refers to an undefined symbol ") << getGlobalAttr();
  if (!isa<ParameterOp, BufferOp>(target))
    return emitOpError("refers to ")
           << getGlobalAttr() << ", which is not a bmt.parameter or bmt.buffer";
  return success();
}

//===----------------------------------------------------------------------===//
// bmt.block_list
//===----------------------------------------------------------------------===//

LogicalResult BlockListOp::verify() {
  if (getBlocks().size() < 2)
    return emitOpError("needs at least two blocks, got ") << getBlocks().size();
  llvm::StringSet<> seen;
  for (Attribute block : getBlocks())
    if (!seen.insert(cast<FlatSymbolRefAttr>(block).getValue()).second)
      return emitOpError("lists ") << block << " twice";
  return success();
}

LogicalResult
BlockListOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto isFunction = [&](FlatSymbolRefAttr ref) {
    return isa_and_nonnull<func::FuncOp>(symbolTable.lookupNearestSymbolFrom(*this, ref));
  };
  if (!isFunction(getCallerAttr()))
    return emitOpError("caller ") << getCallerAttr() << " is not a function";
  for (Attribute block : getBlocks())
    if (!isFunction(cast<FlatSymbolRefAttr>(block)))
      return emitOpError("block ") << block << " is not a function";
  return success();
}

//===----------------------------------------------------------------------===//
// bmt.storage_group
//===----------------------------------------------------------------------===//

LogicalResult StorageGroupOp::verify() {
  if (getParams().size() != getOffsets().size())
    return emitOpError("has ") << getParams().size() << " params but "
                               << getOffsets().size() << " offsets";
  if (getAlignment() <= 0)
    return emitOpError("needs a positive alignment");
  Type element = getElementType();
  if (!element.isIntOrFloat())
    return emitOpError("needs an integer or float element type");
  int64_t elementBytes = std::max<int64_t>(1, element.getIntOrFloatBitWidth() / 8);
  if (getAlignment() % elementBytes != 0)
    return emitOpError("alignment ") << getAlignment()
                                     << " is not a multiple of the element size";
  int64_t alignElements = getAlignment() / elementBytes;
  int64_t previous = -1;
  for (int64_t offset : getOffsets()) {
    if (offset < 0 || offset % alignElements != 0 || offset <= previous)
      return emitOpError("offset ") << offset << " is not increasing and aligned to "
                                    << getAlignment() << " bytes";
    previous = offset;
  }
  if (getBlock().has_value() != getBlockIndex().has_value())
    return emitOpError("needs both block and block_index, or neither");
  return success();
}

LogicalResult
StorageGroupOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  int64_t end = 0;
  for (auto [ref, offset] : llvm::zip(getParams(), getOffsets())) {
    auto param = dyn_cast_or_null<ParameterOp>(
        symbolTable.lookupNearestSymbolFrom(*this, cast<FlatSymbolRefAttr>(ref)));
    if (!param)
      return emitOpError("member ") << ref << " is not a bmt.parameter";
    auto type = cast<RankedTensorType>(param.getType());
    if (type.getElementType() != getElementType())
      return emitOpError("member ") << ref << " has element type "
                                    << type.getElementType();
    if (offset < end)
      return emitOpError("member ") << ref << " overlaps the one before it";
    if (param.getRequiresGrad() == getFrozen())
      return emitOpError("member ") << ref << (getFrozen() ? " trains, in a frozen group"
                                                           : " is frozen, in a trainable group");
    end = offset + localNumElements(param); // a TP rank's slice with T > 1
  }
  if (end > static_cast<int64_t>(getSize()))
    return emitOpError("size ") << getSize() << " is smaller than its members' end " << end;
  if (auto block = getBlockAttr())
    if (!isa_and_nonnull<BlockListOp>(symbolTable.lookupNearestSymbolFrom(*this, block)))
      return emitOpError("block ") << block << " is not a bmt.block_list";
  return success();
}

//===----------------------------------------------------------------------===//
// bmt.all_gather, bmt.release
//===----------------------------------------------------------------------===//

static LogicalResult verifyGroupRef(Operation *op, FlatSymbolRefAttr group,
                                    SymbolTableCollection &symbolTable) {
  if (!isa_and_nonnull<StorageGroupOp>(symbolTable.lookupNearestSymbolFrom(op, group)))
    return op->emitOpError("group ") << group << " is not a bmt.storage_group";
  return success();
}

LogicalResult AllGatherOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  return verifyGroupRef(*this, getGroupAttr(), symbolTable);
}

LogicalResult ReleaseOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  return verifyGroupRef(*this, getGroupAttr(), symbolTable);
}

//===----------------------------------------------------------------------===//
// bmt.aten
//===----------------------------------------------------------------------===//

StringRef AtenOp::getOperatorName() {
  StringRef full = getName();
  size_t ns = full.find("::");
  size_t dot = full.find('.', ns == StringRef::npos ? 0 : ns + 2);
  return full.take_front(dot);
}

StringRef AtenOp::getOverloadName() {
  StringRef full = getName();
  StringRef op = getOperatorName();
  return op.size() < full.size() ? full.drop_front(op.size() + 1) : StringRef();
}

/// Prints one schema argument: an operand in place of each #bmt.operand,
/// nested lists in brackets, i64/f64 constants without their type.
static void printAtenArg(OpAsmPrinter &p, Attribute arg,
                         OperandRange::iterator &nextOperand) {
  if (isa<OperandAttr>(arg)) {
    p.printOperand(*nextOperand++);
    return;
  }
  if (auto list = dyn_cast<ArrayAttr>(arg)) {
    p << '[';
    llvm::interleaveComma(list, p, [&](Attribute element) {
      printAtenArg(p, element, nextOperand);
    });
    p << ']';
    return;
  }
  if (auto i = dyn_cast<IntegerAttr>(arg); i && i.getType().isInteger(64)) {
    p.printAttributeWithoutType(arg);
    return;
  }
  // Non-finite floats print as hex, which would read back as an integer.
  if (auto f = dyn_cast<FloatAttr>(arg);
      f && f.getType().isF64() && std::isfinite(f.getValueAsDouble())) {
    p.printAttributeWithoutType(arg);
    return;
  }
  p.printAttribute(arg);
}

static ParseResult
parseAtenArg(OpAsmParser &parser, Attribute &arg,
             SmallVectorImpl<OpAsmParser::UnresolvedOperand> &operands) {
  OpAsmParser::UnresolvedOperand operand;
  OptionalParseResult isOperand = parser.parseOptionalOperand(operand);
  if (isOperand.has_value()) {
    if (failed(*isOperand))
      return failure();
    operands.push_back(operand);
    arg = OperandAttr::get(parser.getContext());
    return success();
  }
  if (succeeded(parser.parseOptionalLSquare())) {
    SmallVector<Attribute> elements;
    if (failed(parser.parseOptionalRSquare())) {
      do {
        Attribute element;
        if (parseAtenArg(parser, element, operands))
          return failure();
        elements.push_back(element);
      } while (succeeded(parser.parseOptionalComma()));
      if (parser.parseRSquare())
        return failure();
    }
    arg = parser.getBuilder().getArrayAttr(elements);
    return success();
  }
  return parser.parseAttribute(arg);
}

void AtenOp::print(OpAsmPrinter &p) {
  p << ' ';
  p.printAttributeWithoutType(getNameAttr());
  p << '(';
  OperandRange::iterator nextOperand = getOperands().begin();
  llvm::interleaveComma(getArgs(), p, [&](Attribute arg) {
    printAtenArg(p, arg, nextOperand);
  });
  p << ')';
  p.printOptionalAttrDict((*this)->getAttrs(),
                          {getNameAttrName(), getArgsAttrName()});
  p << " : ";
  p.printFunctionalType(getOperandTypes(), getResultTypes());
}

ParseResult AtenOp::parse(OpAsmParser &parser, OperationState &result) {
  StringAttr name;
  SmallVector<Attribute> args;
  SmallVector<OpAsmParser::UnresolvedOperand> operands;
  if (parser.parseAttribute(name, parser.getBuilder().getNoneType()) ||
      parser.parseLParen())
    return failure();
  if (failed(parser.parseOptionalRParen())) {
    do {
      Attribute arg;
      if (parseAtenArg(parser, arg, operands))
        return failure();
      args.push_back(arg);
    } while (succeeded(parser.parseOptionalComma()));
    if (parser.parseRParen())
      return failure();
  }
  result.addAttribute(getNameAttrName(result.name), name);
  result.addAttribute(getArgsAttrName(result.name),
                      parser.getBuilder().getArrayAttr(args));
  FunctionType type;
  SMLoc typeLoc = parser.getCurrentLocation();
  if (parser.parseOptionalAttrDict(result.attributes) ||
      parser.parseColonType(type))
    return failure();
  if (type.getNumInputs() != operands.size())
    return parser.emitError(typeLoc)
           << "expected " << operands.size() << " operand types, got "
           << type.getNumInputs();
  if (parser.resolveOperands(operands, type.getInputs(), typeLoc,
                             result.operands))
    return failure();
  result.addTypes(type.getResults());
  return success();
}

/// Counts #bmt.operand markers in `arg` and rejects attributes that are not
/// schema constants.
static LogicalResult countOperandMarkers(AtenOp op, Attribute arg,
                                         unsigned &count) {
  if (isa<OperandAttr>(arg)) {
    ++count;
    return success();
  }
  if (auto list = dyn_cast<ArrayAttr>(arg)) {
    for (Attribute element : list)
      if (failed(countOperandMarkers(op, element, count)))
        return failure();
    return success();
  }
  if (isa<IntegerAttr, FloatAttr, StringAttr, NoneAttr, DeviceAttr>(arg))
    return success();
  return op.emitOpError("has an argument that is not a schema constant: ")
         << arg;
}

LogicalResult AtenOp::verify() {
  const AtenOpInfo *info = lookupAtenOp(getName());
  if (!info)
    return emitOpError("calls '")
           << getName() << "', which is not in bmt's operator registry";
  if (getArgs().size() != info->numArgs)
    return emitOpError("'") << getName() << "' takes " << info->numArgs
                            << " arguments, got " << getArgs().size();
  unsigned markers = 0;
  for (Attribute arg : getArgs())
    if (failed(countOperandMarkers(*this, arg, markers)))
      return failure();
  if (markers != getNumOperands())
    return emitOpError("has ") << markers << " operand places in its arguments "
                               << "but " << getNumOperands() << " operands";
  if (info->numResults >= 0 &&
      getNumResults() != static_cast<unsigned>(info->numResults))
    return emitOpError("'") << getName() << "' returns " << info->numResults
                            << " values, got " << getNumResults() << " results";
  return success();
}

//===----------------------------------------------------------------------===//
// bmt.constant
//===----------------------------------------------------------------------===//

/// The type of the value a constant attribute stands for, or null.
static Type typeOfConstant(Attribute value) {
  MLIRContext *ctx = value.getContext();
  if (auto i = dyn_cast<IntegerAttr>(value))
    return i.getType().isInteger(64) || i.getType().isInteger(1) ? i.getType()
                                                                 : Type();
  if (auto f = dyn_cast<FloatAttr>(value))
    return f.getType().isF64() ? f.getType() : Type();
  if (isa<NoneAttr>(value))
    return bmt::NoneType::get(ctx);
  if (isa<StringAttr>(value))
    return bmt::StringType::get(ctx);
  if (isa<DeviceAttr>(value))
    return bmt::DeviceType::get(ctx);
  if (isa<ElementsAttr>(value))
    return bmt::TensorType::get(ctx);
  return Type();
}

LogicalResult ConstantOp::inferReturnTypes(
    MLIRContext *context, std::optional<Location> location, ValueRange operands,
    DictionaryAttr attributes, OpaqueProperties properties, RegionRange regions,
    SmallVectorImpl<Type> &inferredReturnTypes) {
  ConstantOp::Adaptor adaptor(operands, attributes, properties, regions);
  Type type = adaptor.getValue() ? typeOfConstant(adaptor.getValue()) : Type();
  if (!type)
    return emitOptionalError(location, "bmt.constant cannot hold ",
                             adaptor.getValue());
  inferredReturnTypes.push_back(type);
  return success();
}

LogicalResult MoeDispatchOp::verify() {
  if (getNumExperts() < 1)
    return emitOpError("needs at least one expert, got ") << getNumExperts();
  if (static_cast<bool>(getWeights()) != static_cast<bool>(getRoutedWeights()))
    return emitOpError("has routed weights exactly when it takes weights");
  return success();
}

LogicalResult LoraAdapterOp::verify() {
  double scale = getScale().convertToDouble(), p = getDropout().convertToDouble();
  if (!std::isfinite(scale))
    return emitOpError("needs a finite scale, got ") << scale;
  if (!(p >= 0 && p < 1))
    return emitOpError("needs a dropout in [0, 1), got ") << p;
  if (getInputParts() < 1)
    return emitOpError("needs input_parts >= 1, got ") << getInputParts();
  return success();
}

LogicalResult ConstantOp::verify() {
  Type type = typeOfConstant(getValue());
  if (!type || type != getType())
    return emitOpError("cannot make a value of type ")
           << getType() << " from " << getValue();
  return success();
}

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

//===----------------------------------------------------------------------===//
// bmt.fused
//===----------------------------------------------------------------------===//

LogicalResult FusedOp::verify() {
  if (getKind() != "pointwise" && getKind() != "row")
    return emitOpError("kind must be \"pointwise\" or \"row\", got \"") << getKind() << "\"";
  Block &body = getBody().front();
  if (body.getNumArguments() != getInputs().size())
    return emitOpError("body has ") << body.getNumArguments() << " arguments for "
                                    << getInputs().size() << " inputs";
  for (BlockArgument arg : body.getArguments())
    if (!isa<bmt::TensorType>(arg.getType()))
      return emitOpError("body arguments must be !bmt.tensor");
  auto yield = dyn_cast<YieldOp>(body.getTerminator());
  if (getNumResults() == 0)
    return emitOpError("must have at least one result");
  if (!yield || yield.getValues().size() != getNumResults() ||
      !llvm::all_of(yield.getValues().getTypes(), [](Type t) { return isa<bmt::TensorType>(t); }))
    return emitOpError("body must end in bmt.yield of one tensor per result");
  for (Operation &op : body.without_terminator())
    if (!isa<AtenOp, ConstantOp, NumToTensorOp>(op))
      return emitOpError("body may hold only bmt.aten, bmt.constant and bmt.num_to_tensor ops, "
                         "found '")
             << op.getName() << "'";
  return success();
}

#define GET_OP_CLASSES
#include "bmt/Dialect/BmtOps.cpp.inc"
