//===- Archive.h - read and write sharded.pt --------------------*- C++ -*-===//
//
// sharded.pt is a PyTorch zip container (caffe2::serialize::
// PyTorchStreamWriter: records 64-byte aligned, uncompressed, mmap-able)
// holding:
//   bmt/version       "bmt-sharded <version>\n" (the plan's, formatVersionOf)
//   bmt/program.mlir  the compiled program as MLIR text (bmt-opt reads it back)
//   bmt/plan.pkl      the plan (Plan.h), torch::jit::pickle_save format
//   bmt/weights/<i>   raw bytes of tensor i of the plan (little-endian,
//                     row-major), at the offset the plan gives
//   bmt/weights/group<g>[.<k>]  storage group g's flat buffer (part k of it
//                     when the group is split: StorageGroup::parts)
//   bmt/hf/<name>     optional: the model's Hugging Face files (config.json,
//                     generation_config.json), verbatim
// docs/sharded-format.md describes it for readers outside bmt.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PLAN_ARCHIVE_H
#define BMT_PLAN_ARCHIVE_H

#include "bmt/Plan/Plan.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace caffe2::serialize {
class PyTorchStreamReader;
} // namespace caffe2::serialize

namespace bmt::plan {

/// The Hugging Face files a sharded.pt may carry (record bmt/hf/<name>):
/// bmt-export-hf stores them in the model archive as extra files
/// (extra/<name>), bmt-opt copies them, bmt-run copies them into every
/// checkpoint (hf/<name>) and bmt-to-hf into the exported directory. The
/// config, then the tokenizer's files (those of a --checkpoint folder that
/// its tokenizer's save_pretrained writes, with the chat template).
/// Keep in step with python/bmt/export_hf.py and to_hf.py (HF_FILES).
inline constexpr const char *kHfFileNames[] = {
    "config.json",          "generation_config.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja",  "chat_template.json",     "tokenizer.model",
    "spiece.model",         "vocab.json",             "merges.txt",
    "vocab.txt"};

/// A file by name and content (the Hugging Face files above).
using NamedFile = std::pair<std::string, std::string>;

/// Fills `dst` (a contiguous 1-D CPU tensor of the plan's dtype for tensor
/// `index`, `end - begin` elements) with elements [begin, end) of tensor
/// `index`'s row-major value. writeArchive asks for each tensor's ranges in
/// increasing order; it throws what it cannot do (PlanError, ...).
using TensorReader =
    std::function<void(size_t index, int64_t begin, int64_t end, at::Tensor &dst)>;

/// The largest record writeArchive writes for a storage group (64 MiB): a
/// larger group is split into parts of that size (format version 4), so
/// that writing holds one part, not the group, in memory.
constexpr int64_t kMaxGroupRecordBytes = int64_t(64) << 20;

/// What writeArchive did: bytes of tensor data written (storage group
/// buffers with their padding, tensors outside groups) and records written.
struct WriteStats {
  int64_t weightBytes = 0;
  int64_t records = 0;
};

/// Writes `plan`, `programText` and the weights to `path` atomically (the
/// tensors with an init rule get no bytes: a weights-free plan): the
/// archive is written to a temporary file beside `path` and renamed, so a
/// failure leaves no file. The weights come from `read`, a range at a time:
/// at most one storage group part (maxGroupRecordBytes) and one tensor
/// outside groups are in memory at once. Sets each TensorInfo's record,
/// offset and crc32 and each group's record or parts. Tensor parallelism
/// (plan tensorParallel T > 1): `read` still gives the global values; each
/// tp_rank copy of a group gets its TP rank's slices (tpSlice; a split
/// member is read whole, then sliced) and its crc32s; a member's record,
/// offset and crc32 are those of the tp_rank 0 copy. `hfFiles` (names from
/// kHfFileNames) are written as records bmt/hf/<name>. Throws PlanError (or
/// what `read` throws, c10::Error from LibTorch) on failure, and PlanError
/// for a name not in kHfFileNames.
WriteStats writeArchive(const std::string &path, Plan &plan, const std::string &programText,
                        const TensorReader &read, const std::vector<NamedFile> &hfFiles = {},
                        int64_t maxGroupRecordBytes = kMaxGroupRecordBytes);

/// A TensorReader over `weightOf(i)`, tensor i's whole value (any device,
/// any layout; converted to contiguous CPU bytes of the plan's dtype and
/// shape, which must match: a mismatch throws PlanError). It keeps the last
/// tensor asked for, flattened, until another is asked for.
TensorReader readerOfWholeTensors(const Plan &plan,
                                  std::function<at::Tensor(size_t)> weightOf);

/// writeArchive with readerOfWholeTensors(plan, weightOf).
WriteStats writeArchive(const std::string &path, Plan &plan, const std::string &programText,
                        const std::function<at::Tensor(size_t)> &weightOf,
                        const std::vector<NamedFile> &hfFiles = {},
                        int64_t maxGroupRecordBytes = kMaxGroupRecordBytes);

/// An opened sharded.pt. Construction reads and checks the version record
/// and the plan (each against the zip's CRC-32 of its bytes); it throws
/// PlanError naming the file for: a missing file, a file that is not a bmt
/// archive, another format version, a corrupt record or plan.
class Archive {
public:
  explicit Archive(const std::string &path);
  ~Archive();

  const Plan &plan() const { return plan_; }
  const std::string &path() const { return path_; }
  /// The compiled program as MLIR text.
  std::string programText();
  /// The Hugging Face files the archive carries (bmt/hf/<name>, in
  /// kHfFileNames order; none for a model traced without them). Throws
  /// PlanError naming a corrupt record.
  std::vector<NamedFile> hfFiles();
  /// Reads tensor `index` of the plan into a new CPU tensor (its dtype and
  /// shape); a tensor with an init rule is generated instead (initValues).
  /// A member of a storage group is read from the group (readGroupRange).
  /// Throws PlanError if the record is missing or too short.
  at::Tensor readTensor(size_t index);
  /// Reads elements [begin, end) of storage group `group`'s flat buffer
  /// (with tensor parallelism: of that tp_rank copy, members of local size,
  /// checked against the copy's crc32s; init rules give the copy's slices)
  /// into a new 1-D CPU tensor of the group's dtype, reading only those
  /// bytes from the file (rank-local loading; from each part the range
  /// covers, for a group split into parts). Every byte read is checked:
  /// the read is widened to the checksummed chunks covering the range
  /// (StorageGroup::chunkBytes) and each chunk checked against its CRC-32;
  /// in an archive without chunk checksums, to the members the range
  /// touches, each read whole and checked against its crc32 (crc32s).
  /// Throws PlanError for a missing or short record, a range outside the
  /// buffer, or a checksum mismatch (naming the record, the group, the
  /// bytes and the members they hold).
  /// Members with an init rule are generated, not read.
  at::Tensor readGroupRange(size_t group, int64_t begin, int64_t end);
  /// Seed of the init rules of a weights-free plan (default 0). The values
  /// depend on the seed, the tensor and the element, not on the ranges read.
  void setInitSeed(uint64_t seed) { initSeed_ = seed; }
  /// Bytes of tensor data read from the file so far (readTensor and
  /// readGroupRange; the plan and other records are not counted).
  int64_t bytesRead() const { return bytesRead_; }

private:
  std::string path_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
  Plan plan_;
  int fd_ = -1; ///< the file, for reading byte ranges of records
  int64_t bytesRead_ = 0;
  uint64_t initSeed_ = 0;
  /// Record `record` whole (the version, the plan, the program, the
  /// Hugging Face files), checked against the zip's CRC-32 of it. Throws
  /// PlanError naming the record for a mismatch or a record that cannot
  /// be read.
  std::string checkedRecord(const std::string &record);
  /// Copies `nbytes` bytes at byte `at` of the file to `dst` (PlanError
  /// naming `record` at the end of the file).
  void readFileBytes(int64_t at, int64_t nbytes, void *dst, const std::string &record);
  /// Copies bytes [from, to) of storage group `g`'s flat buffer to `dst`
  /// (from each part the range covers, for a group split into parts).
  void readBufferBytes(const StorageGroup &g, int64_t from, int64_t to, char *dst);
  /// The record holding byte `at` of `g`'s buffer (its part, if split).
  std::string recordOfByte(const StorageGroup &g, int64_t at) const;
  /// Copies `nbytes` bytes at `offset` of record `record` to `dst`.
  void readRecordRange(const std::string &record, int64_t offset, int64_t nbytes,
                       void *dst, const std::string &what);
};

/// The LoRA settings of a compiled program: the text of its
/// `bmt.lora = {...}` attribute (bmt-opt --lora: rank, alpha, dropout,
/// targets; docs/passes/lora.md), "" when it has none.
std::string adapterSettings(const std::string &programText);

} // namespace bmt::plan

#endif // BMT_PLAN_ARCHIVE_H
