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

/// The message for operator `name` (as "aten::one_hot") missing from the
/// registry, in function `function`. transformers' eager experts (a Python
/// loop over the experts a batch hits: one_hot, nonzero, index_add_) trace
/// into a program of the experts hit while tracing; the message says so and
/// names the implementation that traces whole.
inline std::string unsupportedOperatorMessage(const std::string &name,
                                              const std::string &function) {
  std::string message = "unsupported operator '" + name + "' (not in bmt's operator registry)";
  const bool expertLoop = name == "aten::one_hot" || name == "aten::nonzero" ||
                          name == "aten::index_add_" || name == "aten::where.single_argument";
  if (expertLoop && function.find("experts") != std::string::npos)
    message += "; this looks like a mixture-of-experts layer traced with transformers' eager "
               "experts (a Python loop over the experts the traced batch hit), whose trace "
               "leaves out every other expert: export the model with "
               "config._experts_implementation = \"grouped_mm\" (transformers' default)";
  return message;
}

} // namespace bmt::import

#endif // BMT_LIB_IMPORT_IMPORTSUPPORT_H
