//===- TorchScript.h - import TorchScript archives -------------*- C++ -*-===//
//
// The seam between LibTorch and the compiler: this header includes no
// LibTorch header, so the dialect and the passes never see one.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_IMPORT_TORCHSCRIPT_H
#define BMT_IMPORT_TORCHSCRIPT_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/StringRef.h"

namespace mlir {
class MLIRContext;
} // namespace mlir

namespace bmt {

/// Returns true when the file at `path` starts like a zip archive (the
/// container of TorchScript `.pt` and torch.export `.pt2` files), so that a
/// driver can tell an archive from MLIR text. False for unreadable files.
bool looksLikeZipArchive(llvm::StringRef path);

/// Imports the TorchScript archive at `path`, as written by
/// `torch.jit.save` (typically of a `torch.jit.trace`d model), into a new
/// module of the `bmt` dialect:
///  - every parameter and buffer as a `bmt.parameter` / `bmt.buffer` symbol
///    named by its dotted path (`transformer.h.0.attn.c_attn.weight`), with
///    shape and dtype; names that share one storage (tied weights) become
///    one symbol with `aliases`;
///  - one `func.func` per (submodule, method) reached from `forward`, named
///    `<module path>.<method>` (the root's is `forward`), with `func.call`
///    where TorchScript has `prim::CallMethod`;
///  - ATen nodes as `bmt.aten`, with constants folded into their arguments;
///    prim:: bookkeeping (GetAttr, List/Tuple/Dict construction and unpacking,
///    Constant, NumToTensor) resolved into these forms.
/// Locations are the original Python source lines where the archive keeps
/// them (`.debug_pkl`).
///
/// On failure emits exactly one error diagnostic on `context` that names the
/// file and, for a node it cannot import (control flow such as prim::If or
/// prim::Loop, an operator not in bmt's registry, ...), the node, and returns
/// a null module. Failures include: a missing or unreadable file, a file that
/// is not a zip archive, an archive that LibTorch cannot load (truncated or
/// corrupt). Never throws.
mlir::OwningOpRef<mlir::ModuleOp> importTorchScript(llvm::StringRef path,
                                                    mlir::MLIRContext &context);

} // namespace bmt

#endif // BMT_IMPORT_TORCHSCRIPT_H
