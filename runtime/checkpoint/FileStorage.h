//===- FileStorage.h - checkpoint folders on a file system ------*- C++ -*-===//
//
// Private to runtime/checkpoint: synced writes, the folder protocol of a
// save (markers, commit, cleanup; docs/checkpoint-format.md), finding
// the complete checkpoints of a folder, and reading a resume's pieces from
// the rank files, every byte checked against its CRC-32 (CheckpointReader).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_CHECKPOINT_FILESTORAGE_H
#define BMT_RUNTIME_CHECKPOINT_FILESTORAGE_H

#include "LoadPlan.h"
#include "Metadata.h"

#include "bmt/Runtime/io/Safetensors.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
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


/// An exclusive flock on a checkpoint folder, held until destroyed (the
/// kernel drops it when the process dies, even by SIGKILL): two runs saving
/// into one folder would replace each other's checkpoints.
class FolderLock {
public:
  FolderLock() = default;
  ~FolderLock();
  FolderLock(const FolderLock &) = delete;
  FolderLock &operator=(const FolderLock &) = delete;
  /// Takes the lock of `dir`; false when another live run holds it (a
  /// folder that cannot be opened or locked otherwise is left to the
  /// caller's write probe).
  bool acquire(const std::string &dir);

private:
  int fd_ = -1;
};

/// A rank's marker in a save's folder (rank-R.done, or rank-R.failed with
/// the reason), its room taken before the rank's big write so that it can
/// be written on a disk that fills up: written in place as
/// rank-R.marker, then renamed to its name.
class RankMarker {
public:
  RankMarker(const std::filesystem::path &folder, int64_t rank);
  ~RankMarker();
  RankMarker(const RankMarker &) = delete;
  RankMarker &operator=(const RankMarker &) = delete;
  /// Writes `text` (synced) as `target`; the second call writes it anew.
  /// Throws std::runtime_error.
  void write(const std::string &text, const std::string &target);

private:
  std::string path_;
  int fd_ = -1;
};

/// Writes rank `rank`'s file `path`: `tensors` (host, contiguous; in this
/// order) with the format, `version`, each tensor's CRC-32 and its CRC-32s
/// per chunk of `chunkBytes` in the safetensors header, synced. Sleeps
/// `slowWriteMs` after each tensor (a test hook). Returns the file's
/// bytes. Throws std::runtime_error.
int64_t writeRankFile(const std::string &path,
                      const std::vector<std::pair<std::string, at::Tensor>> &tensors, int version,
                      int64_t rank, int64_t chunkBytes, int64_t slowWriteMs);

/// Rank 0: waits until each of `worldSize` ranks has its marker in `tmp`
/// (done or failed, at most 30 minutes); returns the bytes of each rank's
/// file, or throws std::runtime_error with the first failed rank's reason.
json waitForRanks(const std::filesystem::path &tmp, int64_t worldSize);

/// Rank 0, once every rank's file is in `tmp` (waitForRanks): writes the
/// model's Hugging Face files (hf/<name>) and checkpoint.json (`metaText`),
/// drops the ranks' .done markers, renames `tmp` to <dir>/step-N and
/// writes COMPLETE (completeLine with checkpoint.json's CRC-32), each
/// synced. A complete step-N already there (a resumed run saved the same
/// step again) is kept and `tmp` removed. Returns the checkpoint's folder.
/// Throws std::runtime_error or std::filesystem::filesystem_error.
std::string commitFolder(const std::string &dir, const std::filesystem::path &tmp, int64_t step,
                         int version, int64_t worldSize, const std::string &metaText,
                         const std::vector<std::pair<std::string, std::string>> &hfFiles);

/// Removes what saves of earlier runs that died left in `dir`: their
/// `step-N.tmp-<run>` folders (not this run's, `nonce`) and the `step-N`
/// folders without a COMPLETE file (renamed but never completed, or a
/// removal by --keep that died half-way). A folder with a COMPLETE file is
/// never removed, whatever its content. Returns the names removed.
std::vector<std::string> removeDeadSaves(const std::string &dir, const std::string &nonce);

/// Removes the oldest complete checkpoints of `dir` beyond the newest
/// `keep` (none when keep <= 0), each COMPLETE file first.
void removeOldCheckpoints(const std::string &dir, int64_t keep);

/// Reads a resume's pieces from the rank files of the checkpoint in
/// `folder` (laid out as `layout`, which must outlive the reader): pieces
/// are queued by request() and read by flush(), whole tensors by
/// readChecked(). Each rank file is opened once, on first use, and its
/// header's checksum tables parsed then.
class CheckpointReader {
public:
  CheckpointReader(std::string folder, const SavedLayout &layout)
      : folder_(std::move(folder)), layout_(layout) {}

  const SavedLayout &layout() const { return layout_; }

  /// Rank `rank`'s file, opened. Throws CheckpointError for a missing
  /// file, one that is not a bmt checkpoint shard, or bad checksum tables.
  SafetensorsFile &file(int64_t rank);

  /// Queues a copy of `numel` elements of field `field` of saved space
  /// `space`, from element `begin` of its flat buffer, to `dst`.
  void request(size_t space, const std::string &field, int64_t begin, int64_t numel,
               char *dst, c10::ScalarType dtype);

  /// Reads every queued piece and checks every byte it reads: the chunks
  /// of the saved tensor that the pieces touch are read (one pread per run
  /// of adjacent chunks, at most 16 MiB at a time) and each is checked
  /// against its CRC-32. A tensor without per-chunk CRC-32s (a checkpoint
  /// written before them) is one chunk: read whole and checked against its
  /// CRC-32. Throws CheckpointError naming the file, the tensor, the
  /// chunk's bytes and the model tensors in them (the destinations then
  /// hold unchecked bytes: the caller discards them with the error).
  void flush();

  /// Tensor `name` of rank `rank`'s file, whole, checked against its CRC-32.
  at::Tensor readChecked(int64_t rank, const std::string &name);

  /// The bytes read from the rank files so far.
  int64_t bytesRead() const;

private:
  struct Piece {
    int64_t offset = 0, nbytes = 0; ///< in the saved tensor
    char *dst = nullptr;
    c10::ScalarType dtype = c10::ScalarType::Float; ///< the reader's
  };
  /// The pieces of one saved tensor (shard `shard` of saved space `space`).
  struct Pending {
    size_t space = 0;
    int64_t shard = 0;
    std::vector<Piece> pieces;
  };
  using Key = std::pair<int64_t, std::string>; ///< (rank file, tensor)

  static uint32_t parseCrc(const std::string &hex);
  /// Parses rank `rank`'s checksum tables from `f`'s header.
  void readChecksums(int64_t rank, const SafetensorsFile &f);
  /// Reads and checks the queued pieces of one saved tensor.
  void flushTensor(const Key &key, Pending &pending, std::vector<char> &span);
  /// The error of chunk `index` of `e` (in `pending`'s file) that failed
  /// its check: the file, the tensor, the chunk's bytes (in the tensor's
  /// data and in the file) and the model tensors whose elements are in it.
  std::string corruption(const SafetensorsFile &f, const Pending &pending,
                         const SafetensorsEntry &e, int64_t index, int64_t chunk,
                         bool legacy) const;

  std::string folder_;
  const SavedLayout &layout_;
  std::map<int64_t, std::unique_ptr<SafetensorsFile>> files_;
  std::map<Key, uint32_t> crcs_; ///< whole tensors'
  std::map<Key, std::vector<uint32_t>> chunkCrcs_;
  std::map<int64_t, int64_t> chunkBytes_; ///< by rank file
  std::map<Key, Pending> pending_;
};

} // namespace bmt::runtime::checkpoint

#endif // BMT_RUNTIME_CHECKPOINT_FILESTORAGE_H
