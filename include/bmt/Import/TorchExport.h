//===- TorchExport.h - import torch.export (.pt2) archives -----*- C++ -*-===//
//
// Like TorchScript.h, this header includes no LibTorch header: the dialect
// and the passes never see one.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_IMPORT_TORCHEXPORT_H
#define BMT_IMPORT_TORCHEXPORT_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/StringRef.h"

namespace mlir {
class MLIRContext;
} // namespace mlir

namespace bmt {

/// The major version of torch.export's serialized program schema
/// (torch/_export/serde/schema.py, SCHEMA_VERSION) that the importer reads.
/// torch 2.11 writes 8.17; any minor version of this major is accepted.
constexpr int kTorchExportSchemaMajor = 8;

/// True when `path` is a zip archive whose records are those of
/// `torch.export.save` (an `archive_format` record or `models/*.json`).
/// False for unreadable files, non-zips and other PyTorch archives.
bool looksLikeTorchExportArchive(llvm::StringRef path);

/// Imports the ExportedProgram archive at `path` (written by
/// `torch.export.save`, schema version kTorchExportSchemaMajor.x) into a new
/// module of the `bmt` dialect, the same IR importTorchScript produces:
///  - parameters and buffers of the graph signature as `bmt.parameter` /
///    `bmt.buffer` symbols named by their state-dict names; names whose
///    weights are one stored tensor (same weight record, offset, sizes,
///    strides, dtype) are one symbol with `aliases`;
///  - one `func.func` per submodule instance, rebuilt from each node's
///    `nn_module_stack`, named `<module path>.forward` (the root's is
///    `forward`), with `func.call`s between them;
///  - every ATen node as `bmt.aten` by its overload name, every schema
///    argument present (defaults filled in from LibTorch's schema).
/// The module carries bmt.source (absolute path) and
/// bmt.source_format = "torch.export".
///
/// On failure emits exactly one error diagnostic naming the file (and the
/// node, where one is at fault) and returns a null module. Never throws.
mlir::OwningOpRef<mlir::ModuleOp> importTorchExport(llvm::StringRef path,
                                                    mlir::MLIRContext &context);

} // namespace bmt

#endif // BMT_IMPORT_TORCHEXPORT_H
