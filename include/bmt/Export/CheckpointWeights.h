//===- CheckpointWeights.h - weights streamed from a checkpoint -*- C++ -*-===//
//
// LibTorch-facing (includes ATen): for the exporter. A model archive that
// `bmt-export-hf --checkpoint DIR` wrote holds no weights (its parameters
// are placeholders) but the record extra/bmt-checkpoint.json, which names
// DIR's safetensors files (with their size and modification time) and, for
// every parameter and persistent buffer by state-dict name, the file, key,
// dtype and shape of its tensor. docs/hf-checkpoints.md has the record's
// format; the safetensors format is huggingface/safetensors' "Format": an
// 8-byte little-endian header length N, N bytes of JSON {key: {dtype, shape,
// data_offsets: [begin, end]}} (offsets into the data after the header),
// then the little-endian tensor bytes.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_EXPORT_CHECKPOINTWEIGHTS_H
#define BMT_EXPORT_CHECKPOINTWEIGHTS_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace bmt {

/// The safetensors files of a checkpoint, read a tensor range at a time with
/// pread (never mapped, never read whole): past the page cache (O_DIRECT,
/// through an aligned 8 MiB buffer) where the filesystem allows it, as a
/// compile reads each byte once.
class CheckpointWeights {
public:
  /// One tensor of the checkpoint, as its file's header gives it.
  struct Tensor {
    std::string key;  ///< the name in the file
    size_t file = 0;  ///< index into files()
    c10::ScalarType dtype = c10::ScalarType::Float;
    std::vector<int64_t> shape;
    int64_t offset = 0; ///< byte offset of its data from the start of the file
    int64_t numel() const;
  };

  /// The checkpoint the model archive `modelPath` records, every recorded
  /// file's header read and checked against the record; null when the
  /// archive records none (its weights are inside it). Throws
  /// std::runtime_error with one line naming the file or tensor for: a
  /// record of another format or version, a file that is missing or whose
  /// size or modification time changed since bmt-export-hf recorded it, a
  /// header that is not safetensors, data beyond the end of the file (a
  /// truncated file), a recorded tensor the file does not hold or holds with
  /// another dtype or shape, a dtype bmt has no ATen type for.
  static std::unique_ptr<CheckpointWeights> open(const std::string &modelPath);
  ~CheckpointWeights();
  CheckpointWeights(const CheckpointWeights &) = delete;
  CheckpointWeights &operator=(const CheckpointWeights &) = delete;

  /// The tensor recorded for state-dict name `name`, or null.
  const Tensor *find(const std::string &name) const;
  /// Copies elements [begin, end) of `tensor`'s row-major value into `dst`
  /// (a contiguous 1-D CPU tensor of end - begin elements), converted to
  /// dst's dtype as Tensor::to converts (round to nearest even). Throws
  /// std::runtime_error naming the file when it cannot be read.
  void read(const Tensor &tensor, int64_t begin, int64_t end, at::Tensor &dst);

  const std::string &directory() const { return directory_; }
  /// The files' paths (directory + name).
  const std::vector<std::string> &files() const { return paths_; }
  /// Bytes of tensor data read so far.
  int64_t bytesRead() const { return bytesRead_; }
  /// The sum of the files' sizes.
  int64_t totalBytes() const { return totalBytes_; }

private:
  CheckpointWeights() = default;
  /// Copies `nbytes` at byte `offset` of file `file` to `dst`.
  void readBytes(size_t file, int64_t offset, int64_t nbytes, void *dst);
  std::string directory_;
  std::vector<std::string> paths_;
  std::vector<int> fds_;
  std::vector<int> directFds_; ///< the files opened with O_DIRECT, or -1
  char *bounce_ = nullptr;     ///< aligned buffer of the O_DIRECT reads
  std::map<std::string, Tensor> byName_;
  int64_t bytesRead_ = 0;
  int64_t totalBytes_ = 0;
};

} // namespace bmt

#endif // BMT_EXPORT_CHECKPOINTWEIGHTS_H
