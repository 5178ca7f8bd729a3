//===- Safetensors.cpp - read and write the safetensors format ------------===//

#include "bmt/Runtime/io/Safetensors.h"

#include <ATen/ops/empty.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

namespace bmt::runtime {

namespace {

const std::vector<std::pair<c10::ScalarType, const char *>> &dtypeCodes() {
  static const std::vector<std::pair<c10::ScalarType, const char *>> codes = {
      {c10::ScalarType::Float, "F32"}, {c10::ScalarType::Half, "F16"},
      {c10::ScalarType::BFloat16, "BF16"}, {c10::ScalarType::Double, "F64"},
      {c10::ScalarType::Long, "I64"}, {c10::ScalarType::Int, "I32"},
      {c10::ScalarType::Short, "I16"}, {c10::ScalarType::Char, "I8"},
      {c10::ScalarType::Byte, "U8"}, {c10::ScalarType::Bool, "BOOL"}};
  return codes;
}

std::string dtypeCode(c10::ScalarType t) {
  for (const auto &[type, code] : dtypeCodes())
    if (type == t)
      return code;
  throw std::runtime_error(std::string("no safetensors dtype for ") + c10::toString(t));
}

std::string systemError() { return std::strerror(errno); }

/// The header text: JSON padded with spaces to a multiple of 8 bytes, so
/// that the data is aligned (as the safetensors library writes it).
std::string headerText(const std::vector<SafetensorsEntry> &entries,
                       const std::map<std::string, std::string> &metadata, int64_t dataStart) {
  nlohmann::json header = nlohmann::json::object();
  for (const SafetensorsEntry &e : entries)
    header[e.name] = {{"dtype", dtypeCode(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {e.begin - dataStart, e.end - dataStart}}};
  if (!metadata.empty())
    header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

int64_t entryBytes(const SafetensorsEntry &e) {
  int64_t n = static_cast<int64_t>(c10::elementSize(e.dtype));
  for (int64_t d : e.shape)
    n *= d;
  return n;
}

} // namespace

// --- SafetensorsWriter ------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(const std::string &path,
                                     std::vector<SafetensorsEntry> entries,
                                     const std::map<std::string, std::string> &metadata)
    : path_(path), entries_(std::move(entries)) {
  // Offsets relative to the data; the header's length depends on them only
  // through their digits, so lay the data out first, then place it.
  int64_t offset = 0;
  for (SafetensorsEntry &e : entries_) {
    e.begin = offset;
    e.end = offset + entryBytes(e);
    offset = e.end;
  }
  std::string text = headerText(entries_, metadata, 0);
  const int64_t dataStart = 8 + static_cast<int64_t>(text.size());
  for (SafetensorsEntry &e : entries_) {
    e.begin += dataStart;
    e.end += dataStart;
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw std::runtime_error(path + ": cannot write (" + systemError() + ")");
  unsigned char lengthBytes[8];
  const uint64_t length = text.size();
  for (int i = 0; i < 8; ++i)
    lengthBytes[i] = static_cast<unsigned char>(length >> (8 * i));
  writeAll(lengthBytes, 8);
  writeAll(text.data(), static_cast<int64_t>(text.size()));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0)
    ::close(fd_);
}

void SafetensorsWriter::writeAll(const void *data, int64_t nbytes) {
  const char *p = static_cast<const char *>(data);
  while (nbytes > 0) {
    ssize_t n = ::write(fd_, p, static_cast<size_t>(std::min<int64_t>(nbytes, 1 << 30)));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      throw std::runtime_error(path_ + ": write failed (" +
                               (n < 0 ? systemError() : std::string("no progress")) + ")");
    p += n;
    nbytes -= n;
    written_ += n;
  }
}

void SafetensorsWriter::write(const void *data, int64_t nbytes) {
  if (next_ >= entries_.size() || entries_[next_].nbytes() != nbytes)
    throw std::runtime_error(path_ + ": write of " + std::to_string(nbytes) + " bytes does not "
                             "match the next entry");
  writeAll(data, nbytes);
  ++next_;
}

void SafetensorsWriter::close() {
  if (next_ != entries_.size())
    throw std::runtime_error(path_ + ": closed after " + std::to_string(next_) + " of " +
                             std::to_string(entries_.size()) + " tensors");
  if (::fsync(fd_) != 0)
    throw std::runtime_error(path_ + ": fsync failed (" + systemError() + ")");
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0)
    throw std::runtime_error(path_ + ": close failed (" + systemError() + ")");
}

// --- SafetensorsFile --------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string &path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    throw std::runtime_error(path + ": cannot open (" + systemError() + ")");
  struct stat st {};
  ::fstat(fd_, &st);
  const int64_t fileSize = st.st_size;
  unsigned char lengthBytes[8];
  if (fileSize < 8 || ::pread(fd_, lengthBytes, 8, 0) != 8)
    throw std::runtime_error(path + ": not a safetensors file (shorter than its header)");
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= static_cast<uint64_t>(lengthBytes[i]) << (8 * i);
  if (length > static_cast<uint64_t>(fileSize - 8) || length > (100u << 20))
    throw std::runtime_error(path + ": not a safetensors file (header length " +
                             std::to_string(length) + " for a file of " +
                             std::to_string(fileSize) + " bytes)");
  std::string text(length, '\0');
  if (::pread(fd_, text.data(), length, 8) != static_cast<ssize_t>(length))
    throw std::runtime_error(path + ": cannot read the header (" + systemError() + ")");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception &) {
    throw std::runtime_error(path + ": not a safetensors file (its header is not JSON)");
  }
  if (!header.is_object())
    throw std::runtime_error(path + ": not a safetensors file (its header is not an object)");
  const int64_t dataStart = 8 + static_cast<int64_t>(length);
  try {
    for (const auto &[name, value] : header.items()) {
      if (name == "__metadata__") {
        for (const auto &[k, v] : value.items())
          metadata_[k] = v.get<std::string>();
        continue;
      }
      SafetensorsEntry e;
      e.name = name;
      const std::string code = value.at("dtype").get<std::string>();
      bool known = false;
      for (const auto &[type, c] : dtypeCodes())
        if (code == c) {
          e.dtype = type;
          known = true;
        }
      if (!known)
        throw std::runtime_error(path + ": tensor " + name + " has an unknown dtype " + code);
      e.shape = value.at("shape").get<std::vector<int64_t>>();
      auto offsets = value.at("data_offsets").get<std::vector<int64_t>>();
      if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] - offsets[0] != entryBytes(e))
        throw std::runtime_error(path + ": tensor " + name + " has bad data offsets");
      e.begin = dataStart + offsets[0];
      e.end = dataStart + offsets[1];
      if (e.end > fileSize)
        throw std::runtime_error(path + ": truncated (tensor " + name + " ends at byte " +
                                 std::to_string(e.end) + ", the file has " +
                                 std::to_string(fileSize) + ")");
      index_[name] = entries_.size();
      entries_.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception &ex) {
    throw std::runtime_error(path + ": bad safetensors header (" + ex.what() + ")");
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0)
    ::close(fd_);
}

const SafetensorsEntry *SafetensorsFile::find(const std::string &name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

void SafetensorsFile::read(const std::string &name, int64_t offset, int64_t nbytes, void *dst) {
  const SafetensorsEntry *e = find(name);
  if (!e)
    throw std::runtime_error(path_ + ": has no tensor " + name);
  if (offset < 0 || nbytes < 0 || offset + nbytes > e->nbytes())
    throw std::runtime_error(path_ + ": bytes [" + std::to_string(offset) + ", " +
                             std::to_string(offset + nbytes) + ") are outside tensor " + name);
  char *p = static_cast<char *>(dst);
  int64_t at = e->begin + offset, left = nbytes;
  while (left > 0) {
    ssize_t n = ::pread(fd_, p, static_cast<size_t>(std::min<int64_t>(left, 1 << 30)), at);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      throw std::runtime_error(path_ + ": cannot read tensor " + name + " (" +
                               (n < 0 ? systemError() : std::string("truncated")) + ")");
    p += n;
    at += n;
    left -= n;
  }
  bytesRead_ += nbytes;
}

at::Tensor SafetensorsFile::readTensor(const std::string &name) {
  const SafetensorsEntry *e = find(name);
  if (!e)
    throw std::runtime_error(path_ + ": has no tensor " + name);
  at::Tensor t = at::empty(e->shape, at::TensorOptions().dtype(e->dtype));
  read(name, 0, e->nbytes(), t.data_ptr());
  return t;
}

} // namespace bmt::runtime
