//===- TokenData.cpp - memory-mapped token files --------------------------===//
//
// PREFIX.bin is mmap-ed read-only (MAP_PRIVATE); PREFIX.json is parsed with
// nlohmann::json. Token ids are stored little-endian, which is the host
// order on every machine bmt runs on (x86-64, aarch64).
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/data/TokenData.h"

#include "data/Random.h"
#include "bmt/Plan/Plan.h"

#include <ATen/ops/empty.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <fstream>
#include <limits>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token files are little-endian; a big-endian host needs byte swaps");

namespace bmt::runtime {

namespace {

constexpr const char *kFormat = "bmt-tokens";
constexpr int64_t kOldestVersion = 1, kVersion = 2;

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string errnoText() { return std::strerror(errno); }

/// Copies ids [start, start + n) of a uint16/uint32 array to int64.
void copyIds(const uint8_t *data, int itemSize, int64_t start, int64_t n, int64_t *out) {
  if (itemSize == 2) {
    const uint16_t *src = reinterpret_cast<const uint16_t *>(data) + start;
    for (int64_t i = 0; i < n; ++i)
      out[i] = src[i];
  } else {
    const uint32_t *src = reinterpret_cast<const uint32_t *>(data) + start;
    for (int64_t i = 0; i < n; ++i)
      out[i] = src[i];
  }
}


/// metadata[key] as an int64; `optional`: null or absent gives nullopt.
std::optional<int64_t> readInt(const nlohmann::json &meta, const char *key,
                               const std::string &file, bool optional, int64_t min) {
  auto it = meta.find(key);
  if (it == meta.end() || it->is_null()) {
    if (optional)
      return std::nullopt;
    throw DataError(file + ": metadata lacks \"" + key + "\"");
  }
  if (!it->is_number_integer())
    throw DataError(file + ": metadata \"" + key + "\" must be an integer, got " + it->dump());
  int64_t value = it->is_number_unsigned()
                      ? static_cast<int64_t>(std::min<uint64_t>(
                            it->get<uint64_t>(), std::numeric_limits<int64_t>::max()))
                      : it->get<int64_t>();
  if (value < min)
    throw DataError(file + ": metadata \"" + key + "\" must be >= " + std::to_string(min) +
                    ", got " + std::to_string(value));
  return value;
}

} // namespace

//===----------------------------------------------------------------------===//
// TokenFile
//===----------------------------------------------------------------------===//

TokenFile::TokenFile(const std::string &path) {
  // PREFIX.bin or PREFIX.json; a bare PREFIX is accepted too.
  std::string prefix = path;
  if (endsWith(path, ".bin"))
    prefix = path.substr(0, path.size() - 4);
  else if (endsWith(path, ".json"))
    prefix = path.substr(0, path.size() - 5);
  binPath_ = prefix + ".bin";
  jsonPath_ = prefix + ".json";

  // --- metadata ---
  nlohmann::json meta;
  {
    std::ifstream in(jsonPath_);
    if (!in)
      throw DataError(jsonPath_ + ": cannot open the token metadata (" + errnoText() +
                      "); bmt-prepare-data writes it beside " + binPath_);
    try {
      meta = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception &e) {
      throw DataError(jsonPath_ + ": not valid JSON metadata (" + e.what() + ")");
    }
  }
  if (!meta.is_object())
    throw DataError(jsonPath_ + ": the metadata is not a JSON object");
  auto format = meta.find("format");
  if (format == meta.end() || !format->is_string() || format->get<std::string>() != kFormat)
    throw DataError(jsonPath_ + ": unknown format " +
                    (format == meta.end() ? std::string("(none)") : format->dump()) +
                    ", expected \"" + kFormat + "\"");
  auto version = meta.find("version");
  if (version == meta.end() || !version->is_number_integer() ||
      version->get<int64_t>() < kOldestVersion || version->get<int64_t>() > kVersion)
    throw DataError(jsonPath_ + ": unsupported " + kFormat + " version " +
                    (version == meta.end() ? std::string("(none)") : version->dump()) +
                    ", expected " + std::to_string(kOldestVersion) + " to " +
                    std::to_string(kVersion));
  version_ = version->get<int64_t>();
  auto dtype = meta.find("dtype");
  std::string dtypeName = dtype != meta.end() && dtype->is_string() ? dtype->get<std::string>() : "";
  if (dtypeName == "uint16")
    itemSize_ = 2;
  else if (dtypeName == "uint32")
    itemSize_ = 4;
  else
    throw DataError(jsonPath_ + ": unsupported dtype " +
                    (dtype == meta.end() ? std::string("(none)") : dtype->dump()) +
                    ", expected \"uint16\" or \"uint32\"");
  numTokens_ = *readInt(meta, "num_tokens", jsonPath_, false, 0);
  vocabSize_ = *readInt(meta, "vocab_size", jsonPath_, false, 1);
  eosId_ = *readInt(meta, "eos_id", jsonPath_, false, 0);
  maskId_ = readInt(meta, "mask_id", jsonPath_, true, 0);
  if (eosId_ >= vocabSize_)
    throw DataError(jsonPath_ + ": eos_id " + std::to_string(eosId_) +
                    " is outside the vocabulary (vocab_size " + std::to_string(vocabSize_) + ")");
  if (maskId_ && *maskId_ >= vocabSize_)
    throw DataError(jsonPath_ + ": mask_id " + std::to_string(*maskId_) +
                    " is outside the vocabulary (vocab_size " + std::to_string(vocabSize_) + ")");
  padId_ = readInt(meta, "pad_id", jsonPath_, true, 0);
  if (auto it = meta.find("sentinel_ids"); it != meta.end() && !it->is_null()) {
    if (!it->is_array())
      throw DataError(jsonPath_ + ": metadata \"sentinel_ids\" must be a list of integers, got " +
                      it->dump());
    for (const nlohmann::json &id : *it) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocabSize_)
        throw DataError(jsonPath_ + ": metadata \"sentinel_ids\" holds " + id.dump() +
                        ", not a token id below vocab_size " + std::to_string(vocabSize_));
      sentinelIds_.push_back(id.get<int64_t>());
    }
  }
  if (numTokens_ > std::numeric_limits<int64_t>::max() / itemSize_)
    throw DataError(jsonPath_ + ": num_tokens " + std::to_string(numTokens_) + " is too large");

  // --- token ids ---
  int fd = ::open(binPath_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw DataError(binPath_ + ": cannot open the token file (" + errnoText() + ")");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string why = errnoText();
    ::close(fd);
    throw DataError(binPath_ + ": cannot stat the token file (" + why + ")");
  }
  const int64_t expected = numTokens_ * itemSize_;
  if (static_cast<int64_t>(st.st_size) != expected) {
    ::close(fd);
    throw DataError(binPath_ + ": size is " + std::to_string(st.st_size) + " bytes, but " +
                    jsonPath_ + " says " + std::to_string(numTokens_) + " " + dtypeName +
                    " tokens (" + std::to_string(expected) + " bytes)");
  }
  if (expected > 0) {
    void *map = ::mmap(nullptr, static_cast<size_t>(expected), PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      std::string why = errnoText();
      ::close(fd);
      throw DataError(binPath_ + ": cannot mmap the token file (" + why + ")");
    }
    data_ = static_cast<const uint8_t *>(map);
    mappedBytes_ = static_cast<size_t>(expected);
  }
  ::close(fd); // the mapping keeps the file

  if (version_ >= 2) {
    try {
      readDocuments(meta);
    } catch (...) {
      if (data_)
        ::munmap(const_cast<uint8_t *>(data_), mappedBytes_);
      data_ = nullptr;
      throw;
    }
  }
}

void TokenFile::readDocuments(const nlohmann::json &meta) {
  const int64_t numDocuments = *readInt(meta, "num_documents", jsonPath_, false, 0);
  preparedTruncated_ = readInt(meta, "truncated", jsonPath_, true, 0).value_or(0);
  // Files named relative to the json's folder.
  const std::string::size_type slash = jsonPath_.rfind('/');
  const std::string folder = slash == std::string::npos ? "" : jsonPath_.substr(0, slash + 1);
  auto fileName = [&](const char *key, bool required) -> std::optional<std::string> {
    auto it = meta.find(key);
    if (it == meta.end() || it->is_null()) {
      if (required)
        throw DataError(jsonPath_ + ": version 2 metadata lacks \"" + key + "\"");
      return std::nullopt;
    }
    if (!it->is_string() || it->get<std::string>().empty())
      throw DataError(jsonPath_ + ": metadata \"" + key + "\" must be a file name, got " +
                      it->dump());
    const std::string name = it->get<std::string>();
    return name.front() == '/' ? name : folder + name;
  };
  // Reads exactly `bytes` bytes of `path` into `out`.
  auto readWhole = [&](const std::string &path, void *out, int64_t bytes, const char *what,
                       const std::string &count) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in)
      throw DataError(path + ": cannot open the " + std::string(what) + " (" + errnoText() +
                      "); " + jsonPath_ + " names it");
    const int64_t size = static_cast<int64_t>(in.tellg());
    if (size != bytes)
      throw DataError(path + ": size is " + std::to_string(size) + " bytes, but " + jsonPath_ +
                      " says " + count + " (" + std::to_string(bytes) + " bytes)");
    in.seekg(0);
    if (bytes > 0 && !in.read(static_cast<char *>(out), bytes))
      throw DataError(path + ": cannot read the " + std::string(what));
  };

  const std::string docsPath = *fileName("documents", true);
  if (numDocuments > numTokens_)
    throw DataError(jsonPath_ + ": num_documents " + std::to_string(numDocuments) +
                    " is more than num_tokens " + std::to_string(numTokens_) +
                    " (every document holds a token)");
  documentOffsets_.resize(static_cast<size_t>(numDocuments) + 1);
  readWhole(docsPath, documentOffsets_.data(), (numDocuments + 1) * 8, "document offsets",
            std::to_string(numDocuments) + " documents, " + std::to_string(numDocuments + 1) +
                " int64 offsets");
  if (documentOffsets_.front() != 0)
    throw DataError(docsPath + ": the first document offset is " +
                    std::to_string(documentOffsets_.front()) + ", not 0");
  if (documentOffsets_.back() != numTokens_)
    throw DataError(docsPath + ": the last document offset is " +
                    std::to_string(documentOffsets_.back()) + ", not num_tokens " +
                    std::to_string(numTokens_));
  for (int64_t d = 0; d < numDocuments; ++d)
    if (documentOffsets_[d + 1] <= documentOffsets_[d])
      throw DataError(docsPath + ": document " + std::to_string(d) + " is " +
                      (documentOffsets_[d + 1] < documentOffsets_[d] ? "of negative length"
                                                                      : "empty") +
                      " (offsets " + std::to_string(documentOffsets_[d]) + " then " +
                      std::to_string(documentOffsets_[d + 1]) +
                      "; offsets must increase)");

  auto supervised = meta.find("supervised");
  if (supervised != meta.end() && !supervised->is_null() && !supervised->is_boolean())
    throw DataError(jsonPath_ + ": metadata \"supervised\" must be true or false, got " +
                    supervised->dump());
  const bool isSupervised = supervised != meta.end() && supervised->is_boolean() &&
                            supervised->get<bool>();
  auto maskName = meta.find("loss_mask");
  if (!isSupervised && maskName != meta.end() && !maskName->is_null())
    throw DataError(jsonPath_ + ": metadata names a loss_mask (" + maskName->dump() +
                    ") but \"supervised\" is " +
                    (supervised == meta.end() ? std::string("missing") : supervised->dump()) +
                    "; a mask belongs to supervised data (\"supervised\": true)");
  std::optional<std::string> maskPath = fileName("loss_mask", isSupervised);
  if (!maskPath)
    return;
  lossMask_.resize(static_cast<size_t>(numTokens_));
  readWhole(*maskPath, lossMask_.data(), numTokens_, "loss mask",
            std::to_string(numTokens_) + " uint8 mask values");
  for (int64_t i = 0; i < numTokens_; ++i)
    if (lossMask_[i] > 1)
      throw DataError(*maskPath + ": loss-mask value " + std::to_string(lossMask_[i]) +
                      " at token " + std::to_string(i) + " (values must be 0 or 1)");
  // Every supervised document has a target after its first token (nothing
  // predicts a document's first token): data without one would train on
  // nothing (bmt-prepare-data refuses an empty response).
  for (int64_t d = 0; d + 1 < static_cast<int64_t>(documentOffsets_.size()); ++d) {
    const int64_t begin = documentOffsets_[d], end = documentOffsets_[d + 1];
    if (std::find(lossMask_.begin() + begin + 1, lossMask_.begin() + end, 1) ==
        lossMask_.begin() + end)
      throw DataError(*maskPath + ": document " + std::to_string(d) + " (tokens [" +
                      std::to_string(begin) + ", " + std::to_string(end) +
                      ")) has no target token: its loss mask is 0 after its first token "
                      "(supervised documents need at least one, e.g. a non-empty response)");
  }
  hasLossMask_ = true;
}

std::string TokenFile::fingerprint() const {
  const size_t bytes = static_cast<size_t>(numTokens_) * itemSize_;
  const size_t edge = std::min<size_t>(bytes, size_t(1) << 20);
  std::vector<uint8_t> ends(data_, data_ + edge);
  ends.insert(ends.end(), data_ + (bytes - edge), data_ + bytes);
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08x", plan::crc32(ends.data(), ends.size()));
  return std::to_string(numTokens_) + " tokens, " + std::to_string(numDocuments()) +
         " documents, " + (itemSize_ == 2 ? "uint16" : "uint32") + ", crc32 " + crc;
}

int64_t TokenFile::documentStart(int64_t d) const {
  if (d < 0 || d >= numDocuments())
    throw std::out_of_range(binPath_ + ": document " + std::to_string(d) + " is outside [0, " +
                            std::to_string(numDocuments()) + ")");
  return documentOffsets_[d];
}

int64_t TokenFile::documentEnd(int64_t d) const {
  documentStart(d);
  return documentOffsets_[d + 1];
}

bool TokenFile::isTarget(int64_t i) const {
  if (i < 0 || i >= numTokens_)
    throw std::out_of_range(binPath_ + ": token index " + std::to_string(i) +
                            " is outside [0, " + std::to_string(numTokens_) + ")");
  return !hasLossMask_ || lossMask_[i] != 0;
}

TokenFile::~TokenFile() {
  if (data_)
    ::munmap(const_cast<uint8_t *>(data_), mappedBytes_);
}

int64_t TokenFile::token(int64_t i) const {
  if (i < 0 || i >= numTokens_)
    throw std::out_of_range(binPath_ + ": token index " + std::to_string(i) +
                            " is outside [0, " + std::to_string(numTokens_) + ")");
  if (itemSize_ == 2)
    return reinterpret_cast<const uint16_t *>(data_)[i];
  return reinterpret_cast<const uint32_t *>(data_)[i];
}

void TokenFile::checkIds(int64_t modelVocab) const {
  if (modelVocab < 1)
    throw std::invalid_argument("checkIds: the model's vocabulary size must be >= 1, got " +
                                std::to_string(modelVocab));
  auto report = [&](int64_t position, int64_t id) {
    throw DataError(binPath_ + ": token id " + std::to_string(id) + " at position " +
                    std::to_string(position) + " is outside the model's vocabulary (size " +
                    std::to_string(modelVocab) + ")");
  };
  if (itemSize_ == 2) {
    if (modelVocab > std::numeric_limits<uint16_t>::max())
      return;
    const uint16_t *ids = reinterpret_cast<const uint16_t *>(data_);
    const uint16_t limit = static_cast<uint16_t>(modelVocab);
    for (int64_t i = 0; i < numTokens_; ++i)
      if (ids[i] >= limit)
        report(i, ids[i]);
  } else {
    if (modelVocab > std::numeric_limits<uint32_t>::max())
      return;
    const uint32_t *ids = reinterpret_cast<const uint32_t *>(data_);
    const uint32_t limit = static_cast<uint32_t>(modelVocab);
    for (int64_t i = 0; i < numTokens_; ++i)
      if (ids[i] >= limit)
        report(i, ids[i]);
  }
}

at::Tensor TokenFile::slice(int64_t start, int64_t length) const {
  if (start < 0 || length < 0 || start > numTokens_ || length > numTokens_ - start)
    throw std::out_of_range(binPath_ + ": slice [" + std::to_string(start) + ", " +
                            std::to_string(start) + " + " + std::to_string(length) +
                            ") is outside the " + std::to_string(numTokens_) + " tokens");
  at::Tensor out = at::empty({length}, at::kLong);
  if (length > 0)
    copyIds(data_, itemSize_, start, length, out.data_ptr<int64_t>());
  return out;
}

//===----------------------------------------------------------------------===//
// BatchSampler
//===----------------------------------------------------------------------===//

BatchSampler::BatchSampler(const TokenFile &file, int64_t batch, int64_t seqLen, uint64_t seed,
                           int64_t part, int64_t numParts)
    : file_(file), batch_(batch), seqLen_(seqLen), begin_(0), end_(0), rng_(seed) {
  if (batch < 1 || seqLen < 1)
    throw std::invalid_argument("BatchSampler: batch and sequence length must be >= 1, got " +
                                std::to_string(batch) + " and " + std::to_string(seqLen));
  if (numParts < 1 || part < 0 || part >= numParts)
    throw std::invalid_argument("BatchSampler: part " + std::to_string(part) + " of " +
                                std::to_string(numParts) + " parts");
  const int64_t n = file.numTokens();
  // n * part fits in int64 for any real file (n < 2^40, parts < 2^20).
  begin_ = n * part / numParts;
  end_ = n * (part + 1) / numParts;
  if (end_ - begin_ < seqLen + 1)
    throw DataError(file.binPath() + ": " +
                    (numParts > 1 ? "part " + std::to_string(part) + " of " +
                                        std::to_string(numParts) + " holds "
                                  : std::string("holds ")) +
                    std::to_string(end_ - begin_) + " tokens, fewer than one sequence (" +
                    std::to_string(seqLen) + " + 1 tokens)");
}

at::Tensor BatchSampler::next() {
  const int64_t window = seqLen_ + 1;
  const uint64_t offsets = static_cast<uint64_t>(end_ - begin_ - window + 1);
  at::Tensor out = at::empty({batch_, window}, at::kLong);
  int64_t *dst = out.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t start = begin_ + static_cast<int64_t>(uniformBelow(rng_, offsets));
    at::Tensor row = file_.slice(start, window);
    std::memcpy(dst + b * window, row.const_data_ptr<int64_t>(), window * sizeof(int64_t));
  }
  return out;
}

int64_t BatchSampler::numSequentialBatches() const {
  return (end_ - begin_) / (seqLen_ + 1) / batch_;
}

at::Tensor BatchSampler::sequential(int64_t i) const {
  if (i < 0 || i >= numSequentialBatches())
    throw std::out_of_range(file_.binPath() + ": sequential batch " + std::to_string(i) +
                            " is outside [0, " + std::to_string(numSequentialBatches()) + ")");
  const int64_t window = seqLen_ + 1;
  // The batch's windows are consecutive: one contiguous run of tokens.
  at::Tensor flat = file_.slice(begin_ + i * batch_ * window, batch_ * window);
  return flat.view({batch_, window});
}

std::string BatchSampler::generatorState() const {
  std::ostringstream out;
  out << rng_;
  return out.str();
}

void BatchSampler::setGeneratorState(const std::string &state) {
  std::istringstream in(state);
  std::mt19937_64 rng;
  in >> rng;
  if (in.fail())
    throw std::invalid_argument("not a std::mt19937_64 state: '" + state.substr(0, 40) + "...'");
  rng_ = rng;
}

} // namespace bmt::runtime
