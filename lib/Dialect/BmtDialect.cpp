//===- BmtDialect.cpp - bmt dialect registration and types ----------------===//

#include "bmt/Dialect/BmtDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace bmt;

#include "bmt/Dialect/BmtDialect.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "bmt/Dialect/BmtTypes.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "bmt/Dialect/BmtAttrs.cpp.inc"

void BmtDialect::initialize() {
  registerTypes();
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "bmt/Dialect/BmtOps.cpp.inc"
      >();
}

void BmtDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "bmt/Dialect/BmtTypes.cpp.inc"
      >();
}

void BmtDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "bmt/Dialect/BmtAttrs.cpp.inc"
      >();
}

Operation *BmtDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                           Type type, Location loc) {
  return ConstantOp::create(builder, loc, type, value);
}
