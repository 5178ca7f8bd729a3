//===- InputFile.h - checks every importer makes on its input ---*- C++ -*-===//
//
// Private to lib/Import (header-only, MLIR and LLVM Support only).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_LIB_IMPORT_INPUTFILE_H
#define BMT_LIB_IMPORT_INPUTFILE_H

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
#include "llvm/Support/FileSystem.h"

#include <string>

namespace bmt::import {

/// Emits one error at `loc` and returns false when `path` does not exist
/// ("PATH: no such file") or is a directory ("PATH: is a directory, not a
/// KIND"); `kind` names the archive expected, e.g. "TorchScript archive".
inline bool checkInputFile(const std::string &path, const char *kind, mlir::Location loc) {
  if (!llvm::sys::fs::exists(path)) {
    mlir::emitError(loc) << path << ": no such file";
    return false;
  }
  if (llvm::sys::fs::is_directory(path)) {
    mlir::emitError(loc) << path << ": is a directory, not a " << kind;
    return false;
  }
  return true;
}

} // namespace bmt::import

#endif // BMT_LIB_IMPORT_INPUTFILE_H
