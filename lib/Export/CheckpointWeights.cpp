//===- CheckpointWeights.cpp - weights streamed from a checkpoint ---------===//
//
// The record of bmt-export-hf, the safetensors headers (nlohmann-json), and
// pread of tensor ranges. See include/bmt/Export/CheckpointWeights.h.
//
//===----------------------------------------------------------------------===//

#include "bmt/Export/CheckpointWeights.h"

#include "bmt/Support/ErrorText.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

using json = nlohmann::json;

namespace bmt {

namespace {

const char *kRecord = "extra/bmt-checkpoint.json";
const char *kFormat = "bmt-checkpoint-weights";
constexpr int64_t kVersion = 1;
/// The safetensors library's own limit on the header.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
/// O_DIRECT reads: offsets, sizes and the buffer aligned to this; at most
/// kBounceBytes a read.
constexpr int64_t kAlign = 4096, kBounceBytes = int64_t(8) << 20;

[[noreturn]] void fail(const std::string &message) { throw std::runtime_error(message); }

/// A safetensors dtype code as an ATen dtype; false for one ATen lacks.
bool scalarTypeOf(const std::string &code, c10::ScalarType &out) {
  static const std::map<std::string, c10::ScalarType> types = {
      {"F64", c10::ScalarType::Double},       {"F32", c10::ScalarType::Float},
      {"F16", c10::ScalarType::Half},         {"BF16", c10::ScalarType::BFloat16},
      {"I64", c10::ScalarType::Long},         {"I32", c10::ScalarType::Int},
      {"I16", c10::ScalarType::Short},        {"I8", c10::ScalarType::Char},
      {"U8", c10::ScalarType::Byte},          {"BOOL", c10::ScalarType::Bool},
      {"F8_E4M3", c10::ScalarType::Float8_e4m3fn}, {"F8_E5M2", c10::ScalarType::Float8_e5m2}};
  auto it = types.find(code);
  if (it == types.end())
    return false;
  out = it->second;
  return true;
}

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

/// Reads exactly `nbytes` at `offset` of `fd`, or fails naming `path`.
void preadAll(int fd, void *dst, int64_t nbytes, int64_t offset, const std::string &path) {
  char *out = static_cast<char *>(dst);
  int64_t done = 0;
  while (done < nbytes) {
    ssize_t n = ::pread(fd, out + done, static_cast<size_t>(nbytes - done),
                        static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      fail(path + ": cannot read " + std::to_string(nbytes) + " bytes at " +
           std::to_string(offset) + ": " + (n < 0 ? std::strerror(errno) : "unexpected end of file"));
    done += n;
  }
}

/// The record of `modelPath`, or "" when it has none.
std::string recordOf(const std::string &modelPath) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(modelPath);
    if (!reader.hasRecord(kRecord))
      return "";
    auto [data, size] = reader.getRecord(kRecord);
    return std::string(static_cast<const char *>(data.get()), size);
  } catch (const c10::Error &e) {
    fail(modelPath + ": cannot read the archive: " +
         firstErrorLine(e.what_without_backtrace()));
  }
}

/// One file's safetensors header: key -> (dtype code, shape, absolute byte
/// range). Checks that every tensor's data lies inside the file.
struct Header {
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0, end = 0;
  };
  std::map<std::string, Entry> entries;
};

Header readHeader(int fd, const std::string &path, int64_t fileSize) {
  uint64_t length = 0;
  if (fileSize < 8)
    fail(path + ": not a safetensors file (" + std::to_string(fileSize) + " bytes)");
  preadAll(fd, &length, 8, 0, path); // little-endian, as the machines bmt runs on
  if (length > kMaxHeaderBytes || static_cast<int64_t>(length) > fileSize - 8)
    fail(path + ": not a safetensors file (header length " + std::to_string(length) + " of a " +
         std::to_string(fileSize) + "-byte file)");
  std::string text(length, '\0');
  preadAll(fd, text.data(), static_cast<int64_t>(length), 8, path);
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception &e) {
    fail(path + ": not a safetensors file (its header is not JSON: " + e.what() + ")");
  }
  if (!header.is_object())
    fail(path + ": not a safetensors file (its header is not a JSON object)");
  Header out;
  int64_t dataStart = 8 + static_cast<int64_t>(length);
  for (auto &[key, value] : header.items()) {
    if (key == "__metadata__")
      continue;
    try {
      Header::Entry e;
      e.dtype = value.at("dtype").get<std::string>();
      e.shape = value.at("shape").get<std::vector<int64_t>>();
      auto offsets = value.at("data_offsets").get<std::vector<int64_t>>();
      if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] < offsets[0])
        fail(path + ": tensor " + key + " has bad data_offsets");
      e.begin = dataStart + offsets[0];
      e.end = dataStart + offsets[1];
      if (e.end > fileSize)
        fail(path + " is truncated: tensor " + key + " ends at byte " + std::to_string(e.end) +
             ", the file has " + std::to_string(fileSize));
      out.entries[key] = std::move(e);
    } catch (const json::exception &err) {
      fail(path + ": tensor " + key + " has a malformed header entry (" + err.what() + ")");
    }
  }
  return out;
}

} // namespace

int64_t CheckpointWeights::Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

std::unique_ptr<CheckpointWeights> CheckpointWeights::open(const std::string &modelPath) {
  std::string text = recordOf(modelPath);
  if (text.empty())
    return nullptr;
  std::string where = " (recorded in " + modelPath + " by bmt-export-hf)";
  json record;
  try {
    record = json::parse(text);
  } catch (const json::exception &e) {
    fail(modelPath + ": corrupt record " + kRecord + ": " + e.what());
  }
  if (record.value("format", "") != kFormat || !record.contains("version"))
    fail(modelPath + ": the record " + kRecord + " is not a " + kFormat + " record");
  if (record["version"] != kVersion)
    fail(modelPath + ": its checkpoint record is version " + record["version"].dump() +
         "; this bmt-opt reads version " + std::to_string(kVersion) +
         ": use the bmt-opt of the bmt-export-hf that wrote it");
  std::unique_ptr<CheckpointWeights> out(new CheckpointWeights());
  std::vector<Header> headers;
  try {
    out->directory_ = record.at("directory").get<std::string>();
    for (const json &file : record.at("files")) {
      std::string path = out->directory_ + "/" + file.at("name").get<std::string>();
      int64_t size = file.at("size").get<int64_t>();
      int64_t mtime = file.at("mtime_ns").get<int64_t>();
      struct stat st;
      if (::stat(path.c_str(), &st) != 0)
        fail("checkpoint file " + path + where + ": " + std::strerror(errno) +
             "; was the checkpoint moved? export it again");
      int64_t nowMtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 +
                         static_cast<int64_t>(st.st_mtim.tv_nsec);
      if (st.st_size != size)
        fail("checkpoint file " + path + " has changed since bmt-export-hf recorded it in " +
             modelPath + " (" + std::to_string(size) + " bytes then, " +
             std::to_string(st.st_size) + " now); export it again");
      if (nowMtime != mtime)
        fail("checkpoint file " + path + " has changed since bmt-export-hf recorded it in " +
             modelPath + " (modified since); export it again");
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        fail("checkpoint file " + path + where + ": cannot open: " + std::strerror(errno));
      out->fds_.push_back(fd);
      out->directFds_.push_back(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
      out->paths_.push_back(path);
      out->totalBytes_ += size;
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
      headers.push_back(readHeader(fd, path, size));
    }
    for (auto &[name, entry] : record.at("tensors").items()) {
      Tensor t;
      t.key = entry.at("key").get<std::string>();
      t.file = entry.at("file").get<size_t>();
      if (t.file >= headers.size())
        fail(modelPath + ": corrupt record " + kRecord + " (tensor " + name +
             " names file " + std::to_string(t.file) + ")");
      const std::string &path = out->paths_[t.file];
      auto it = headers[t.file].entries.find(t.key);
      if (it == headers[t.file].entries.end())
        fail("checkpoint file " + path + " does not hold tensor " + t.key + " (" + name +
             ")" + where);
      const Header::Entry &h = it->second;
      std::string dtype = entry.at("dtype").get<std::string>();
      t.shape = entry.at("shape").get<std::vector<int64_t>>();
      if (h.dtype != dtype || h.shape != t.shape)
        fail("checkpoint file " + path + " has changed since bmt-export-hf recorded it in " +
             modelPath + ": tensor " + t.key + " is " + h.dtype + " " + shapeText(h.shape) +
             ", was " + dtype + " " + shapeText(t.shape) + "; export it again");
      if (!scalarTypeOf(h.dtype, t.dtype))
        fail("checkpoint tensor " + t.key + " (" + path + ") has dtype " + h.dtype +
             ", which bmt cannot read");
      t.offset = h.begin;
      if (h.end - h.begin != t.numel() * static_cast<int64_t>(c10::elementSize(t.dtype)))
        fail("checkpoint file " + path + ": tensor " + t.key + " holds " +
             std::to_string(h.end - h.begin) + " bytes, not those of " + h.dtype + " " +
             shapeText(h.shape));
      out->byName_[name] = std::move(t);
    }
  } catch (const json::exception &e) {
    fail(modelPath + ": corrupt record " + kRecord + ": " + e.what());
  }
  if (::posix_memalign(reinterpret_cast<void **>(&out->bounce_), kAlign,
                       kBounceBytes + 2 * kAlign) != 0)
    fail("out of memory for the checkpoint's read buffer");
  return out;
}

CheckpointWeights::~CheckpointWeights() {
  for (int fd : fds_)
    ::close(fd);
  for (int fd : directFds_)
    if (fd >= 0)
      ::close(fd);
  std::free(bounce_);
}

void CheckpointWeights::readBytes(size_t file, int64_t offset, int64_t nbytes, void *dst) {
  const std::string &path = paths_[file];
  char *out = static_cast<char *>(dst);
  int64_t done = 0;
  while (done < nbytes && directFds_[file] >= 0) {
    // The aligned window around the next piece, read into the buffer.
    int64_t start = offset + done, first = start / kAlign * kAlign;
    int64_t take = std::min(nbytes - done, kBounceBytes - (start - first));
    int64_t last = (start + take + kAlign - 1) / kAlign * kAlign, got = 0;
    while (got < start - first + take) {
      ssize_t n = ::pread(directFds_[file], bounce_ + got, static_cast<size_t>(last - first - got),
                          static_cast<off_t>(first + got));
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && errno == EINVAL) { // O_DIRECT refused: read through the page cache
        ::close(directFds_[file]);
        directFds_[file] = -1;
        break;
      }
      if (n <= 0)
        fail(path + ": cannot read " + std::to_string(take) + " bytes at " +
             std::to_string(start) + ": " + (n < 0 ? std::strerror(errno) : "unexpected end of file"));
      got += n;
    }
    if (directFds_[file] < 0)
      break;
    std::memcpy(out + done, bounce_ + (start - first), static_cast<size_t>(take));
    done += take;
  }
  if (done < nbytes)
    preadAll(fds_[file], out + done, nbytes - done, offset + done, path);
}

const CheckpointWeights::Tensor *CheckpointWeights::find(const std::string &name) const {
  auto it = byName_.find(name);
  return it == byName_.end() ? nullptr : &it->second;
}

void CheckpointWeights::read(const Tensor &tensor, int64_t begin, int64_t end, at::Tensor &dst) {
  int64_t elementBytes = static_cast<int64_t>(c10::elementSize(tensor.dtype));
  int64_t offset = tensor.offset + begin * elementBytes, nbytes = (end - begin) * elementBytes;
  if (begin < 0 || end > tensor.numel() || dst.numel() != end - begin || !dst.is_contiguous())
    fail("internal error: bad range [" + std::to_string(begin) + ", " + std::to_string(end) +
         ") of checkpoint tensor " + tensor.key);
  if (dst.scalar_type() == tensor.dtype) {
    readBytes(tensor.file, offset, nbytes, dst.data_ptr());
  } else {
    at::Tensor stored = at::empty({end - begin}, at::TensorOptions().dtype(tensor.dtype));
    readBytes(tensor.file, offset, nbytes, stored.data_ptr());
    dst.copy_(stored);
  }
  bytesRead_ += nbytes;
}

} // namespace bmt
