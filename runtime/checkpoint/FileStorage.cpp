//===- FileStorage.cpp - checkpoint folders on a file system --------------===//
//
// Synced writes, the folder protocol of a save, the complete checkpoints
// of a folder (docs/checkpoint-format.md), and CheckpointReader: a resume's
// reads of the rank files, checked against their CRC-32s.
//
//===----------------------------------------------------------------------===//

#include "FileStorage.h"

#include "bmt/Plan/Plan.h"
#include "bmt/Runtime/io/Safetensors.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace bmt::runtime::checkpoint {

std::string systemError() { return std::strerror(errno); }

/// Writes `text` to `path` and fsyncs it. Throws std::runtime_error.
void writeSynced(const std::string &path, const std::string &text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error(path + ": cannot write (" + systemError() + ")");
  const char *p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      std::string reason = systemError();
      ::close(fd);
      throw std::runtime_error(path + ": write failed (" + reason + ")");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    std::string reason = systemError();
    ::close(fd);
    throw std::runtime_error(path + ": fsync failed (" + reason + ")");
  }
  ::close(fd);
}

void syncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string readText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

CompleteFile readComplete(const fs::path &folder) {
  std::error_code ec;
  if (!fs::is_regular_file(folder / "COMPLETE", ec))
    return CompleteFile();
  return parseComplete(readText((folder / "COMPLETE").string()));
}

/// The step of a checkpoint folder that this bmt-run reads, by its COMPLETE
/// file, or -1.
int64_t completeStepOf(const fs::path &folder) {
  const CompleteFile c = readComplete(folder);
  return readableVersion(c.version) ? c.step : -1;
}

/// The step of a checkpoint that a save of this run manages in its
/// --checkpoint-dir (`--resume auto`, --keep): a folder named
/// step-<8 digits> whose COMPLETE file this bmt-run reads and says the same
/// step; else -1. (A checkpoint resumed by name may be called anything.)
int64_t completeStep(const fs::path &folder) {
  const std::string name = folder.filename().string();
  if (name.size() != 13 || name.rfind("step-", 0) != 0 ||
      !std::all_of(name.begin() + 5, name.end(), ::isdigit))
    return -1;
  const int64_t step = completeStepOf(folder);
  return step == std::stoll(name.substr(5)) ? step : -1;
}

/// The checkpoints in `dir` that saves of a run starting at `step` would
/// replace or mix with: the folders step-<8 digits> of a later step with a
/// COMPLETE file (of any format version), by step.
std::vector<std::string> checkpointsAfter(const std::string &dir, int64_t step) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto &entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() == 13 && name.rfind("step-", 0) == 0 &&
        std::all_of(name.begin() + 5, name.end(), ::isdigit) &&
        std::stoll(name.substr(5)) > step && readComplete(entry.path()).present)
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

FolderLock::~FolderLock() {
  if (fd_ >= 0)
    ::close(fd_);
}

bool FolderLock::acquire(const std::string &dir) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0)
    return true;
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0)
    return true;
  const bool held = errno == EWOULDBLOCK;
  ::close(fd_);
  fd_ = -1;
  return !held;
}

RankMarker::RankMarker(const fs::path &folder, int64_t rank)
    : path_((folder / rankName(rank, ".marker")).string()) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ >= 0 && ::posix_fallocate(fd_, 0, 4096) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

RankMarker::~RankMarker() {
  if (fd_ >= 0)
    ::close(fd_);
}

void RankMarker::write(const std::string &text, const std::string &target) {
  if (fd_ < 0) {
    writeSynced(target, text);
    return;
  }
  const int fd = fd_;
  fd_ = -1;
  const bool ok = ::pwrite(fd, text.data(), text.size(), 0) ==
                      static_cast<ssize_t>(text.size()) &&
                  ::ftruncate(fd, static_cast<off_t>(text.size())) == 0 && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(path_.c_str(), target.c_str()) != 0)
    throw std::runtime_error(target + ": cannot write (" + systemError() + ")");
}

int64_t writeRankFile(const std::string &path,
                      const std::vector<std::pair<std::string, at::Tensor>> &tensors, int version,
                      int64_t rank, int64_t chunkBytes, int64_t slowWriteMs) {
  std::vector<SafetensorsEntry> entries;
  json crcs = json::object(), chunkCrcs = json::object();
  for (const auto &[name, host] : tensors) {
    entries.push_back({name, host.scalar_type(), host.sizes().vec()});
    const char *bytes = static_cast<const char *>(host.data_ptr());
    const int64_t nbytes = static_cast<int64_t>(host.nbytes());
    crcs[name] = crcHex(plan::crc32(bytes, static_cast<size_t>(nbytes)));
    std::string chunks;
    for (int64_t at = 0; at < nbytes; at += chunkBytes)
      chunks += crcHex(plan::crc32(bytes + at, static_cast<size_t>(
                                                   std::min(chunkBytes, nbytes - at))));
    chunkCrcs[name] = chunks;
  }
  SafetensorsWriter writer(path, entries,
                           {{"format", kFormat},
                            {"version", std::to_string(version)},
                            {"rank", std::to_string(rank)},
                            {"crc32", crcs.dump()},
                            {"crc32_chunk_bytes", std::to_string(chunkBytes)},
                            {"crc32_chunks", chunkCrcs.dump()}});
  for (const auto &[name, host] : tensors) {
    writer.write(host.data_ptr(), static_cast<int64_t>(host.nbytes()));
    if (slowWriteMs > 0) // test hook: a save that lasts long enough to be killed
      std::this_thread::sleep_for(std::chrono::milliseconds(slowWriteMs));
  }
  writer.close();
  return writer.bytesWritten();
}

json waitForRanks(const fs::path &tmp, int64_t worldSize) {
  using Clock = std::chrono::steady_clock;
  json rankBytes = json::array();
  std::string failure;
  const auto deadline = Clock::now() + std::chrono::minutes(30);
  for (int64_t r = 0; r < worldSize; ++r) {
    std::error_code ec;
    for (;;) {
      if (fs::exists(tmp / rankName(r, ".done"), ec) ||
          fs::exists(tmp / rankName(r, ".failed"), ec))
        break;
      if (Clock::now() > deadline)
        throw std::runtime_error("rank " + std::to_string(r) + " did not write its file "
                                 "within 30 minutes");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (fs::exists(tmp / rankName(r, ".done"), ec)) {
      rankBytes.push_back(std::stoll(readText((tmp / rankName(r, ".done")).string())));
      continue;
    }
    std::string why = readText((tmp / rankName(r, ".failed")).string());
    while (!why.empty() && why.back() == '\n')
      why.pop_back();
    if (failure.empty())
      failure = "rank " + std::to_string(r) + ": " +
                (why.empty() ? "could not write its file (no reason recorded: the disk may be "
                               "full; the rank's own warning says why)"
                             : why);
  }
  if (!failure.empty())
    throw std::runtime_error(failure);
  return rankBytes;
}

std::string commitFolder(const std::string &dir, const fs::path &tmp, int64_t step,
                         int version, int64_t worldSize, const std::string &metaText,
                         const std::vector<std::pair<std::string, std::string>> &hfFiles) {
  if (!hfFiles.empty()) {
    fs::create_directories(tmp / "hf");
    for (const auto &[name, content] : hfFiles)
      writeSynced((tmp / "hf" / name).string(), content);
    syncDirectory((tmp / "hf").string());
  }
  writeSynced((tmp / "checkpoint.json").string(), metaText);
  for (int64_t r = 0; r < worldSize; ++r)
    fs::remove(tmp / rankName(r, ".done"));
  syncDirectory(tmp.string());
  const fs::path final = fs::path(dir) / stepName(step);
  std::error_code ec;
  if (completeStep(final) == step) {
    // A resumed run saved the same step again: keep the one there.
    fs::remove_all(tmp, ec);
  } else {
    fs::remove_all(final, ec); // an incomplete one
    fs::rename(tmp, final);
    syncDirectory(dir);
    writeSynced((final / "COMPLETE").string(),
                completeLine(step, version, true, plan::crc32(metaText.data(), metaText.size())));
    syncDirectory(final.string());
  }
  return final.string();
}

std::vector<std::string> removeDeadSaves(const std::string &dir, const std::string &nonce) {
  std::error_code ec;
  std::vector<fs::path> dead;
  for (const auto &entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 13 || name.rfind("step-", 0) != 0 ||
        !std::all_of(name.begin() + 5, name.begin() + 13, ::isdigit) ||
        !entry.is_directory(ec) || entry.is_symlink(ec))
      continue;
    const std::string rest = name.substr(13);
    const bool deadTmp = rest.rfind(".tmp-", 0) == 0 && rest != ".tmp-" + nonce;
    const bool uncommitted = rest.empty() && !fs::exists(entry.path() / "COMPLETE", ec) && !ec;
    if (deadTmp || uncommitted)
      dead.push_back(entry.path());
  }
  std::sort(dead.begin(), dead.end());
  std::vector<std::string> removed;
  for (const fs::path &folder : dead) {
    fs::remove_all(folder, ec);
    if (!ec)
      removed.push_back(folder.filename().string());
  }
  return removed;
}

void removeOldCheckpoints(const std::string &dir, int64_t keep) {
  if (keep <= 0)
    return;
  std::vector<std::pair<int64_t, fs::path>> complete;
  std::error_code ec;
  for (const auto &entry : fs::directory_iterator(dir, ec)) {
    int64_t step = completeStep(entry.path());
    if (step >= 0)
      complete.emplace_back(step, entry.path());
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < complete.size(); ++i) {
    // COMPLETE first: a removal that dies half-way leaves no checkpoint
    // that looks complete.
    fs::remove(complete[i].second / "COMPLETE", ec);
    fs::remove_all(complete[i].second, ec);
  }
}

// --- reading a resume's pieces -----------------------------------------------

SafetensorsFile &CheckpointReader::file(int64_t rank) {
  auto it = files_.find(rank);
  if (it != files_.end())
    return *it->second;
  const std::string path = (fs::path(folder_) / rankName(rank, ".safetensors")).string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw CheckpointError(path + ": missing (the checkpoint of " + std::to_string(layout_.worldSize()) +
                          " ranks has no file of rank " + std::to_string(rank) + ")");
  std::unique_ptr<SafetensorsFile> f;
  try {
    f = std::make_unique<SafetensorsFile>(path);
  } catch (const std::runtime_error &e) {
    throw CheckpointError(e.what());
  }
  if (f->metadata().count("format") == 0 || f->metadata().at("format") != kFormat ||
      f->metadata().count("crc32") == 0)
    throw CheckpointError(path + ": not a bmt checkpoint shard");
  try {
    readChecksums(rank, *f);
  } catch (const std::exception &e) {
    throw CheckpointError(path + ": bad checksums in its header (" + e.what() + ")");
  }
  return *files_.emplace(rank, std::move(f)).first->second;
}

void CheckpointReader::readChecksums(int64_t rank, const SafetensorsFile &f) {
  const json table = json::parse(f.metadata().at("crc32"));
  for (const auto &[name, value] : table.items())
    crcs_[{rank, name}] = parseCrc(value.get<std::string>());
  // Per-chunk CRC-32s (checkpoints written before them have none: a
  // tensor is then one chunk, checked by its whole CRC-32).
  auto chunkBytes = f.metadata().find("crc32_chunk_bytes");
  auto chunks = f.metadata().find("crc32_chunks");
  if ((chunkBytes == f.metadata().end()) != (chunks == f.metadata().end()))
    throw std::invalid_argument("half a chunk table");
  if (chunks != f.metadata().end()) {
    chunkBytes_[rank] = std::stoll(chunkBytes->second);
    if (chunkBytes_[rank] <= 0)
      throw std::invalid_argument("chunk size");
    const json chunkTable = json::parse(chunks->second);
    for (const auto &[name, value] : chunkTable.items()) {
      const std::string hex = value.get<std::string>();
      const SafetensorsEntry *e = f.find(name);
      const int64_t n = e ? (e->nbytes() + chunkBytes_[rank] - 1) / chunkBytes_[rank] : 0;
      if (!e || static_cast<int64_t>(hex.size()) != 8 * n)
        throw std::invalid_argument("chunk count of " + name);
      std::vector<uint32_t> &list = chunkCrcs_[{rank, name}];
      for (int64_t i = 0; i < n; ++i)
        list.push_back(parseCrc(hex.substr(static_cast<size_t>(8 * i), 8)));
    }
  }
  for (const SafetensorsEntry &e : f.entries())
    if (!crcs_.count({rank, e.name}) ||
        (chunks != f.metadata().end() && !chunkCrcs_.count({rank, e.name})))
      throw std::invalid_argument("no checksum of " + e.name);
}

uint32_t CheckpointReader::parseCrc(const std::string &hex) {
  if (hex.size() != 8 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    throw std::invalid_argument("not a CRC-32: " + hex);
  return static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
}

void CheckpointReader::request(size_t space, const std::string &field, int64_t begin,
                               int64_t numel, char *dst, c10::ScalarType dtype) {
  const int64_t elementSize = static_cast<int64_t>(c10::elementSize(dtype));
  for (const SavedLayout::ShardRead &r : layout_.shardReads(space, begin, numel, elementSize)) {
    Piece p;
    p.offset = r.offset;
    p.nbytes = r.nbytes;
    p.dst = dst + r.dst;
    p.dtype = dtype;
    Pending &pending = pending_[{r.rank, fieldName(static_cast<int64_t>(space), field)}];
    pending.space = space;
    pending.shard = r.shard;
    pending.pieces.push_back(p);
  }
}

void CheckpointReader::flush() {
  std::vector<char> span;
  for (auto &[key, pending] : pending_)
    flushTensor(key, pending, span);
  pending_.clear();
}

namespace {

/// The runs [first, last] of adjacent chunks (of `chunk` bytes) that
/// `pieces` (sorted by offset) touch.
template <typename Piece>
std::vector<std::pair<int64_t, int64_t>> chunkRuns(const std::vector<Piece> &pieces,
                                                   int64_t chunk) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const Piece &p : pieces) {
    if (p.nbytes <= 0)
      continue;
    const int64_t first = p.offset / chunk, last = (p.offset + p.nbytes - 1) / chunk;
    if (!runs.empty() && first <= runs.back().second + 1)
      runs.back().second = std::max(runs.back().second, last);
    else
      runs.emplace_back(first, last);
  }
  return runs;
}

/// Copies the bytes of `pieces` (sorted by offset; those before
/// `firstPiece` are done) that lie in the tensor's bytes [at, at + n),
/// held by `span`.
template <typename Piece>
void copyPieces(const std::vector<Piece> &pieces, size_t &firstPiece, int64_t at, int64_t n,
                const char *span) {
  while (firstPiece < pieces.size() &&
         pieces[firstPiece].offset + pieces[firstPiece].nbytes <= at)
    ++firstPiece;
  for (size_t i = firstPiece; i < pieces.size() && pieces[i].offset < at + n; ++i) {
    const Piece &p = pieces[i];
    const int64_t from = std::max(at, p.offset);
    const int64_t to = std::min(at + n, p.offset + p.nbytes);
    if (from < to)
      std::memcpy(p.dst + (from - p.offset), span + (from - at), static_cast<size_t>(to - from));
  }
}

} // namespace

void CheckpointReader::flushTensor(const Key &key, Pending &pending, std::vector<char> &span) {
  constexpr int64_t kSpan = 16 << 20;
  const auto &[rank, name] = key;
  std::vector<Piece> &pieces = pending.pieces;
  SafetensorsFile &f = file(rank);
  const SafetensorsEntry *e = f.find(name);
  if (!e)
    throw CheckpointError(f.path() + ": has no tensor " + name);
  if (e->dtype != pieces.front().dtype)
    throw CheckpointError(f.path() + ": tensor " + name + " is " + c10::toString(e->dtype) +
                          ", this run keeps it in " + c10::toString(pieces.front().dtype));
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece &a, const Piece &b) { return a.offset < b.offset; });
  const auto chunked = chunkCrcs_.find(key);
  const bool legacy = chunked == chunkCrcs_.end();
  const int64_t size = e->nbytes();
  const int64_t chunk = legacy ? std::max<int64_t>(size, 1) : chunkBytes_.at(rank);
  size_t firstPiece = 0;
  try {
    for (const auto &[firstChunk, lastChunk] : chunkRuns(pieces, chunk)) {
      const int64_t runEnd = std::min(size, (lastChunk + 1) * chunk);
      // Whole chunks per read where a chunk fits in a span.
      const int64_t step = chunk <= kSpan ? kSpan / chunk * chunk : kSpan;
      uint32_t crc = 0; // of the current chunk's bytes so far
      for (int64_t at = firstChunk * chunk; at < runEnd;) {
        const int64_t n = std::min(step, runEnd - at);
        span.resize(static_cast<size_t>(n));
        f.read(name, at, n, span.data());
        // Check each chunk that ends in this span.
        for (int64_t c = at; c < at + n;) {
          const int64_t index = c / chunk;
          const int64_t chunkEnd = std::min(size, (index + 1) * chunk);
          const int64_t upTo = std::min(chunkEnd, at + n);
          crc = plan::crc32(span.data() + (c - at), static_cast<size_t>(upTo - c), crc);
          if (upTo == chunkEnd) {
            const uint32_t want = legacy ? crcs_.at(key) : chunked->second.at(index);
            if (crc != want)
              throw CheckpointError(corruption(f, pending, *e, index, chunk, legacy));
            crc = 0;
          }
          c = upTo;
        }
        copyPieces(pieces, firstPiece, at, n, span.data());
        at += n;
      }
    }
  } catch (const CheckpointError &) {
    throw;
  } catch (const std::exception &ex) {
    throw CheckpointError(ex.what());
  }
}

at::Tensor CheckpointReader::readChecked(int64_t rank, const std::string &name) {
  SafetensorsFile &f = file(rank);
  at::Tensor t;
  try {
    t = f.readTensor(name);
  } catch (const std::runtime_error &e) {
    throw CheckpointError(e.what());
  }
  auto crc = crcs_.find({rank, name});
  if (crc == crcs_.end() || plan::crc32(t.data_ptr(), t.nbytes()) != crc->second)
    throw CheckpointError(f.path() + ": corrupt tensor " + name + " (checksum mismatch)");
  return t;
}

int64_t CheckpointReader::bytesRead() const {
  int64_t n = 0;
  for (const auto &[rank, f] : files_)
    n += f->bytesRead();
  return n;
}

std::string CheckpointReader::corruption(const SafetensorsFile &f, const Pending &pending,
                                         const SafetensorsEntry &e, int64_t index,
                                         int64_t chunk, bool legacy) const {
  const int64_t begin = index * chunk, end = std::min(e.nbytes(), begin + chunk);
  const int64_t elementSize = static_cast<int64_t>(c10::elementSize(e.dtype));
  const SavedSpace &s = layout_.spaces().at(pending.space);
  const int64_t first = pending.shard * s.shardSize + begin / elementSize;
  const int64_t last = pending.shard * s.shardSize + (end + elementSize - 1) / elementSize;
  std::string inside;
  for (size_t m = 0; m < s.members.size(); ++m)
    if (s.members[m].first < last && s.members[m].first + s.members[m].second > first)
      inside += (inside.empty() ? "" : ", ") + s.names[m];
  const int64_t chunks = (e.nbytes() + chunk - 1) / chunk;
  return f.path() + ": corrupt tensor " + e.name + " (" +
         (legacy ? std::string("checked whole: a checkpoint without per-chunk checksums")
                 : "chunk " + std::to_string(index) + " of " + std::to_string(chunks)) +
         ", bytes [" + std::to_string(begin) + ", " + std::to_string(end) +
         ") of its data, file bytes [" + std::to_string(e.begin + begin) + ", " +
         std::to_string(e.begin + end) + "), holding " +
         (inside.empty() ? std::string("padding only") : inside) +
         "): checksum mismatch; resume another checkpoint";
}

} // namespace bmt::runtime::checkpoint

namespace bmt::runtime {

std::optional<std::string> latestCheckpoint(const std::string &dir) {
  std::error_code ec;
  int64_t best = -1;
  fs::path bestPath;
  for (const auto &entry : fs::directory_iterator(dir, ec)) {
    int64_t step = checkpoint::completeStep(entry.path());
    if (step > best) {
      best = step;
      bestPath = entry.path();
    }
  }
  if (best < 0)
    return std::nullopt;
  return bestPath.string();
}

} // namespace bmt::runtime
