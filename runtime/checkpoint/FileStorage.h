//===- FileStorage.h - checkpoint folders on a file system ------*- C++ -*-===//
//
// Private to runtime/checkpoint: synced writes, the folder protocol of a
// save (markers, commit, cleanup; docs/checkpoint-format.md) and finding
// the complete checkpoints of a folder.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_CHECKPOINT_FILESTORAGE_H
#define BMT_RUNTIME_CHECKPOINT_FILESTORAGE_H

#include "Metadata.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace bmt::runtime::checkpoint {

/// strerror(errno).
std::string systemError();
/// Writes `text` to `path` and fsyncs it. Throws std::runtime_error.
void writeSynced(const std::string &path, const std::string &text);
/// fsyncs a folder (its entries), ignoring errors.
void syncDirectory(const std::string &dir);
/// The bytes of `path` ("" when it cannot be read).
std::string readText(const std::string &path);

/// `folder`'s COMPLETE file, parsed (present false without one).
CompleteFile readComplete(const std::filesystem::path &folder);
/// The step of a checkpoint folder that this bmt-run reads, by its COMPLETE
/// file, or -1.
int64_t completeStepOf(const std::filesystem::path &folder);
/// The step of a checkpoint that a save of this run manages in its
/// --checkpoint-dir (`--resume auto`, --keep): a folder named
/// step-<8 digits> whose COMPLETE file this bmt-run reads and says the same
/// step; else -1. (A checkpoint resumed by name may be called anything.)
int64_t completeStep(const std::filesystem::path &folder);
/// The checkpoints in `dir` that saves of a run starting at `step` would
/// replace or mix with: the folders step-<8 digits> of a later step with a
/// COMPLETE file (of any format version), by step.
std::vector<std::string> checkpointsAfter(const std::string &dir, int64_t step);

} // namespace bmt::runtime::checkpoint

#endif // BMT_RUNTIME_CHECKPOINT_FILESTORAGE_H
