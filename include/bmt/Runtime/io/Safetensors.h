//===- Safetensors.h - read and write the safetensors format ----*- C++ -*-===//
//
// The safetensors format (huggingface/safetensors, docs "Format"): an
// 8-byte little-endian header length N, N bytes of JSON mapping each name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data
// that follows, in bytes) and an optional "__metadata__" of strings, then
// the raw little-endian tensor bytes. Python reads it with
// safetensors.torch.load_file, transformers with from_pretrained.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_IO_SAFETENSORS_H
#define BMT_RUNTIME_IO_SAFETENSORS_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace bmt::runtime {

/// One tensor of a safetensors file: its dtype, shape and the byte range of
/// its data from the start of the file.
struct SafetensorsEntry {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0; ///< bytes from the start of the file
  int64_t nbytes() const { return end - begin; }
};

/// Writes a safetensors file tensor by tensor, never holding more than the
/// caller's buffers: the constructor writes the header for `entries` (their
/// names, dtypes and shapes, in the order their data will follow), then
/// write() appends each entry's bytes in that order and close() fsyncs.
/// Not atomic by itself (the checkpoint writer renames a whole folder).
/// Throws std::runtime_error naming the file and the system's reason (e.g.
/// "No space left on device") on any failure; the destructor closes an
/// unclosed file without syncing.
class SafetensorsWriter {
public:
  SafetensorsWriter(const std::string &path, std::vector<SafetensorsEntry> entries,
                    const std::map<std::string, std::string> &metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter &) = delete;
  SafetensorsWriter &operator=(const SafetensorsWriter &) = delete;

  /// Appends the next entry's `nbytes` bytes (must be its size).
  void write(const void *data, int64_t nbytes);
  /// After the last write: flushes and fsyncs the file, and closes it.
  void close();
  /// Bytes written so far (header included).
  int64_t bytesWritten() const { return written_; }

private:
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  size_t next_ = 0;
  int fd_ = -1;
  int64_t written_ = 0;
  void writeAll(const void *data, int64_t nbytes);
};

/// An opened safetensors file, read by byte ranges (pread): a reader of a
/// slice reads only its bytes. The constructor reads and checks the header:
/// it throws std::runtime_error naming the file for a missing file, a file
/// that is not safetensors, an unknown dtype, or data offsets beyond the
/// end of the file (a truncated file).
class SafetensorsFile {
public:
  explicit SafetensorsFile(const std::string &path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile &) = delete;
  SafetensorsFile &operator=(const SafetensorsFile &) = delete;

  const std::string &path() const { return path_; }
  /// The entry named `name`, or null.
  const SafetensorsEntry *find(const std::string &name) const;
  const std::vector<SafetensorsEntry> &entries() const { return entries_; }
  const std::map<std::string, std::string> &metadata() const { return metadata_; }
  /// Copies `nbytes` bytes at `offset` of entry `name`'s data to `dst`.
  /// Throws std::runtime_error for an unknown name or a range outside it.
  void read(const std::string &name, int64_t offset, int64_t nbytes, void *dst);
  /// Entry `name` as a new CPU tensor of its dtype and shape.
  at::Tensor readTensor(const std::string &name);
  /// Tensor bytes read so far (header not counted).
  int64_t bytesRead() const { return bytesRead_; }

private:
  std::string path_;
  int fd_ = -1;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  int64_t bytesRead_ = 0;
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_IO_SAFETENSORS_H
