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

#include <string>

namespace bmt {

/// Summary of what exportShardedArchive wrote.
struct ExportStats {
  int64_t numTensors = 0;
  int64_t weightBytes = 0;
  int64_t numFunctions = 0;
  int64_t numInstructions = 0;
  /// Weights streamed from a checkpoint (a model from bmt-export-hf
  /// --checkpoint): its directory and number of files, bytes read from
  /// them; "" and 0 for weights taken from the model file.
  std::string checkpoint;
  int64_t checkpointFiles = 0;
  int64_t bytesRead = 0;
  int64_t bytesWritten = 0; ///< the archive's size
  double seconds = 0;       ///< writing the archive, reading the weights included
};

/// How the exporter writes the weights.
struct ExportOptions {
  /// A weights-free plan (pretraining from scratch; benchmarks): trainable
  /// parameters get no bytes, only an init rule the runtime applies at load,
  /// as Hugging Face's GPT-2/LLaMA `_init_weights` do: matrices and
  /// embeddings normal(0, 0.02); vectors ones where the program uses them as
  /// a scale (weight of aten::layer_norm / aten::rms_norm, operand of
  /// aten::mul), zeros elsewhere (biases). Buffers and frozen parameters are
  /// still copied from the model.
  bool randomInit = false;
};

/// Writes `module` (bmt dialect, as imported or after passes) to `path` as a
/// sharded.pt archive (include/bmt/Plan/Archive.h; docs/sharded-format.md):
/// the runtime plan, `programText` (the module as MLIR text), and the
/// weights, read from the model file named by the module's `bmt.source`
/// attribute, or, when that file records a checkpoint instead of holding
/// the weights (bmt-export-hf --checkpoint; CheckpointWeights.h), streamed
/// from the checkpoint's safetensors files a range at a time and converted
/// to the program's dtypes. The file is written atomically.
///
/// Fails with one error diagnostic (on the op, or on the module) when: the
/// module has no `bmt.source` or it cannot be read, a parameter is missing
/// from it (or from the checkpoint it records) or has another shape or
/// dtype, a checkpoint file is missing, changed or truncated, the module
/// holds an op the plan cannot express, or the file cannot be written. No
/// file is left then.
mlir::LogicalResult exportShardedArchive(mlir::ModuleOp module,
                                         llvm::StringRef path,
                                         llvm::StringRef programText,
                                         ExportStats *stats = nullptr,
                                         const ExportOptions &options = {});

} // namespace bmt

#endif // BMT_EXPORT_SHARDEDARCHIVE_H
