//===- ShardedArchive.h - write sharded.pt from bmt IR ----------*- C++ -*-===//
//
// The exporter: the last compiler stage. Includes no LibTorch header.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_EXPORT_SHARDEDARCHIVE_H
#define BMT_EXPORT_SHARDEDARCHIVE_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/StringRef.h"

namespace bmt {

/// Summary of what exportShardedArchive wrote.
struct ExportStats {
  int64_t numTensors = 0;
  int64_t weightBytes = 0;
  int64_t numFunctions = 0;
  int64_t numInstructions = 0;
};

/// Writes `module` (bmt dialect, as imported or after passes) to `path` as a
/// sharded.pt archive (include/bmt/Plan/Archive.h; docs/sharded-format.md):
/// the runtime plan, `programText` (the module as MLIR text), and the
/// weights, read from the model file named by the module's `bmt.source`
/// attribute. The file is written atomically.
///
/// Fails with one error diagnostic (on the op, or on the module) when: the
/// module has no `bmt.source` or it cannot be read, a parameter is missing
/// from it or has another shape or dtype, the module holds an op the plan
/// cannot express, or the file cannot be written. No file is left then.
mlir::LogicalResult exportShardedArchive(mlir::ModuleOp module,
                                         llvm::StringRef path,
                                         llvm::StringRef programText,
                                         ExportStats *stats = nullptr);

} // namespace bmt

#endif // BMT_EXPORT_SHARDEDARCHIVE_H
