//===- ImportSupport.h - what both importers' parts share -------*- C++ -*-===//
//
// Private to lib/Import: the MLIR names both importers use unqualified, and
// their one failure type. Each importer's private header pulls these into
// its namespace with `using namespace bmt::import;`.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_LIB_IMPORT_IMPORTSUPPORT_H
#define BMT_LIB_IMPORT_IMPORTSUPPORT_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/SmallVector.h"

#include <string>

namespace bmt::import {

using llvm::SmallVectorImpl;
using mlir::Attribute;
using mlir::Location;
using mlir::MLIRContext;
using mlir::ModuleOp;
using mlir::OpBuilder;
using mlir::OwningOpRef;
using mlir::RankedTensorType;
using mlir::Type;
using mlir::Value;
namespace func = mlir::func;

/// An import failure: where and what. Thrown inside an importer and caught
/// once, at its entry point, which emits it as one diagnostic.
struct ImportError {
  Location loc;
  std::string message;
};

} // namespace bmt::import

#endif // BMT_LIB_IMPORT_IMPORTSUPPORT_H
