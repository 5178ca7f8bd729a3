//===- ImportResult.h - running an importer in a unit test ------*- C++ -*-===//
//
// Test support for ImporterTest.cpp and TorchExportImporterTest.cpp: runs
// an importer on a file and keeps the module and the error diagnostics.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_TEST_UNIT_IMPORTRESULT_H
#define BMT_TEST_UNIT_IMPORTRESULT_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/OwningOpRef.h"

#include <string>
#include <vector>

namespace bmt::test {

/// The imported module (null on failure) and the errors it reported.
struct Imported {
  mlir::OwningOpRef<mlir::ModuleOp> module;
  std::vector<std::string> errors;
};

/// Runs `importer` (bmt::importTorchScript or bmt::importTorchExport) on
/// `file`, collecting the error diagnostics.
template <typename Importer>
Imported importWith(Importer importer, const std::string &file, mlir::MLIRContext &context) {
  Imported result;
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &diag) {
    if (diag.getSeverity() == mlir::DiagnosticSeverity::Error)
      result.errors.push_back(diag.str());
    return mlir::success();
  });
  result.module = importer(file, context);
  return result;
}

} // namespace bmt::test

#endif // BMT_TEST_UNIT_IMPORTRESULT_H
