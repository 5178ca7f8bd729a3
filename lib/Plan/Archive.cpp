//===- Archive.cpp - read and write sharded.pt ----------------------------===//

#include "bmt/Plan/Archive.h"

#include "bmt/Support/ErrorText.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/normal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/crc_alt.h> // header-only; included by this file alone
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <cstdio>
#include <functional>
#include <iterator>
#include <memory>
#include <cstring>
#include <sstream>
#include <cerrno>
#include <cstdlib>
#include <fcntl.h>
#include <unistd.h>

namespace bmt::plan {

uint32_t crc32(const void *data, size_t nbytes) { return crc32_fast(data, nbytes); }
uint32_t crc32(const void *data, size_t nbytes, uint32_t previous) {
  return crc32_fast(data, nbytes, previous);
}

namespace {

const char *kVersionRecord = "bmt/version";
const char *kProgramRecord = "bmt/program.mlir";
const char *kPlanRecord = "bmt/plan.pkl";
const std::string kHfRecordPrefix = "bmt/hf/";
constexpr int64_t kMaxChunkBytes = int64_t(64) << 10;

std::string versionLine(const Plan &plan) {
  return "bmt-sharded " + std::to_string(formatVersionOf(plan)) + "\n";
}

/// Elements [begin, end) of tensor `info`'s flattened value under its init
/// rule, as a 1-D CPU tensor. Normal values are drawn in chunks of 2^20
/// elements, each from a generator seeded by (seed, tensor name, chunk
/// index), so that an element's value does not depend on which range (which
/// rank, how many ranks) reads it. Tensor parallelism: `numel` is the
/// local slice's, `salt` 1 + the TP rank for a split tensor (each slice
/// its own values; 0: replicated, the same values on every TP rank), and a
/// vocab-padded slice keeps zeros in its padding.
at::Tensor initValues(const TensorInfo &info, int64_t begin, int64_t end, uint64_t seed,
                      int64_t numel, uint64_t salt, int64_t tensorParallel = 1,
                      int64_t tpRank = 0) {
  at::TensorOptions options = at::TensorOptions().dtype(info.dtype);
  if (info.init == "zeros")
    return at::zeros({end - begin}, options);
  if (info.init == "ones" && info.split.paddedSize == 0)
    return at::ones({end - begin}, options);
  if (info.split.paddedSize != 0 && (begin != 0 || end != numel)) {
    // A padded split tensor: its whole slice, padding zeroed, then the range.
    return initValues(info, 0, numel, seed, numel, salt, tensorParallel, tpRank)
        .narrow(0, begin, end - begin)
        .clone();
  }
  if (info.init == "ones") {
    at::Tensor out = at::ones(info.localShape(tensorParallel), options);
    int64_t local = out.size(info.split.dim), real = info.shape[info.split.dim];
    int64_t first = tpRank * local; // global index of the slice's first row
    if (first + local > real)
      out.narrow(info.split.dim, std::max<int64_t>(0, real - first),
                 std::min(local, first + local - real)).zero_();
    return out.reshape({-1});
  }
  double stddev = std::stod(info.init.substr(std::string("normal:").size()));
  constexpr int64_t kChunk = int64_t(1) << 20;
  at::Tensor out = at::empty({end - begin}, options);
  uint64_t nameHash = std::hash<std::string>()(info.name) ^ (salt * 0xD6E8FEB86659FD93ull);
  for (int64_t chunk = begin / kChunk; chunk * kChunk < end; ++chunk) {
    int64_t first = chunk * kChunk, last = std::min(first + kChunk, numel);
    uint64_t chunkSeed = (seed * 0x9E3779B97F4A7C15ull) ^ nameHash ^
                         (static_cast<uint64_t>(chunk) * 0xC2B2AE3D27D4EB4Full);
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(chunkSeed);
    at::Tensor values = at::normal(0.0, stddev, {last - first}, generator,
                                   at::TensorOptions().dtype(at::kFloat));
    int64_t from = std::max(begin, first), to = std::min(end, last);
    out.narrow(0, from - begin, to - from).copy_(values.narrow(0, from - first, to - from));
  }
  if (info.split.paddedSize != 0) { // (the whole slice, see above)
    at::Tensor local = out.view(info.localShape(tensorParallel));
    int64_t rows = local.size(info.split.dim), real = info.shape[info.split.dim];
    int64_t first = tpRank * rows;
    if (first + rows > real)
      local.narrow(info.split.dim, std::max<int64_t>(0, real - first),
                   std::min(rows, first + rows - real)).zero_();
  }
  return out;
}

/// initValues of the slice of TP rank `group.tpRank` (the whole tensor
/// when the group has no TP copies).
at::Tensor initValues(const Plan &plan, const StorageGroup &group, const TensorInfo &info,
                      int64_t begin, int64_t end, uint64_t seed) {
  int64_t tp = plan.tensorParallel, tpRank = std::max<int64_t>(0, group.tpRank);
  if (info.split.isExpertSplit() && group.epRank >= 0) {
    // Position p's experts: that range of the whole tensor's values, so a
    // weights-free plan starts from the same values at every E.
    const int64_t first = group.epRank * info.localNumel(1, plan.expertParallel);
    return initValues(info, first + begin, first + end, seed, info.numel(), 0);
  }
  uint64_t salt = info.split.isTensorSplit() && group.tpRank >= 0 ? 1 + group.tpRank : 0;
  return initValues(info, begin, end, seed, info.localNumel(tp), salt, tp, tpRank);
}

/// The archive's file, written past the page cache (O_DIRECT) where the
/// filesystem allows it: on the virtual machines bmt runs on, copying
/// gigabytes into the page cache costs several times the write itself, and
/// a compile's output is not read back soon. Bytes are staged in an aligned
/// buffer and written in whole blocks; the tail goes out without O_DIRECT
/// at close. A filesystem that refuses O_DIRECT (tmpfs) gets plain writes.
class ArchiveFile {
public:
  explicit ArchiveFile(const std::string &path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0666);
    direct_ = fd_ >= 0;
    if (fd_ < 0 && errno == EINVAL)
      fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd_ < 0)
      throw PlanError("cannot write " + path + ": " + std::strerror(errno));
    if (::posix_memalign(reinterpret_cast<void **>(&stage_), kAlign, kStage) != 0) {
      ::close(fd_);
      throw PlanError("cannot write " + path + ": out of memory");
    }
  }
  ~ArchiveFile() {
    if (fd_ >= 0)
      ::close(fd_);
    std::free(stage_);
  }
  /// PyTorchStreamWriter's writer function: n on success, 0 on failure
  /// (the writer then throws; error() says why).
  size_t write(const void *data, size_t n) {
    const char *in = static_cast<const char *>(data);
    size_t left = n;
    while (left > 0) {
      size_t take = std::min(left, kStage - used_);
      std::memcpy(stage_ + used_, in, take);
      used_ += take;
      in += take;
      left -= take;
      if (used_ == kStage && !flush(kStage))
        return 0;
    }
    return n;
  }
  /// Writes what is staged and closes the file; false on failure.
  bool close() {
    size_t blocks = used_ / kAlign * kAlign;
    if (blocks && !flush(blocks))
      return false;
    if (used_ > 0) { // the tail: not a whole block
      if (direct_ && ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT) != 0)
        return fail();
      direct_ = false;
      if (!flush(used_))
        return false;
    }
    int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0 || fail();
  }
  const std::string &error() const { return error_; }

private:
  static constexpr size_t kAlign = 4096, kStage = size_t(8) << 20;
  /// Writes the first n staged bytes (whole blocks while direct_) and moves
  /// the rest to the front.
  bool flush(size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t w = ::write(fd_, stage_ + done, n - done);
      if (w < 0 && errno == EINTR)
        continue;
      if (w < 0 && errno == EINVAL && direct_) { // O_DIRECT refused at write time
        if (::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT) != 0)
          return fail();
        direct_ = false;
        continue;
      }
      if (w <= 0)
        return fail();
      done += static_cast<size_t>(w);
    }
    std::memmove(stage_, stage_ + n, used_ - n);
    used_ -= n;
    return true;
  }
  bool fail() {
    if (error_.empty())
      error_ = "cannot write " + path_ + ": " + std::strerror(errno ? errno : EIO);
    return false;
  }
  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  char *stage_ = nullptr;
  size_t used_ = 0;
  std::string error_;
};

/// A group whose every member has an init rule: it gets no record.
bool weightsFree(const Plan &plan, const StorageGroup &group) {
  for (int64_t m : group.members)
    if (plan.tensors[m].init.empty())
      return false;
  return true;
}

/// The checksummed chunk of a group's buffer of `nbytes` bytes: 64 KiB
/// (as checkpoints), smaller for a small group (about 1/1024 of it, a power
/// of two, at least 64 bytes), so that a rank's range of a small group does
/// not read much more than the range.
int64_t chunkBytesFor(int64_t nbytes) {
  int64_t chunk = 64;
  while (chunk < kMaxChunkBytes && chunk * 1024 < nbytes)
    chunk *= 2;
  return chunk;
}

} // namespace

WriteStats writeArchive(const std::string &path, Plan &plan, const std::string &programText,
                        const TensorReader &read, const std::vector<NamedFile> &hfFiles,
                        int64_t maxGroupRecordBytes) {
  for (const auto &[name, content] : hfFiles)
    if (std::find(std::begin(kHfFileNames), std::end(kHfFileNames), name) ==
        std::end(kHfFileNames))
      throw PlanError("'" + name + "' is not a Hugging Face file an archive carries");
  if (maxGroupRecordBytes <= 0)
    throw PlanError("writeArchive: the largest group record must be positive");
  WriteStats stats;
  std::string tmpPath = path + ".tmp." + std::to_string(::getpid());
  std::unique_ptr<ArchiveFile> file; // outlives the writer, which writes at destruction
  try {
    file = std::make_unique<ArchiveFile>(tmpPath);
    caffe2::serialize::PyTorchStreamWriter writer(
        [&file](const void *data, size_t n) { return file->write(data, n); });
    auto writeRecord = [&](const std::string &name, const void *data, size_t size) {
      writer.writeRecord(name, data, size);
      stats.records += 1;
    };
    // The version depends on whether groups are split: decide that first.
    for (StorageGroup &group : plan.groups) {
      group.parts.clear();
      group.partSize = 0;
      if (!weightsFree(plan, group) && group.nbytes() > maxGroupRecordBytes) {
        group.partSize = std::max<int64_t>(
            1, maxGroupRecordBytes / static_cast<int64_t>(c10::elementSize(group.dtype)));
        group.parts.resize((group.size + group.partSize - 1) / group.partSize);
      }
    }
    std::string version = versionLine(plan);
    writeRecord(kVersionRecord, version.data(), version.size());
    // Storage groups: the flat buffer (members at their offsets, zeros
    // between), in one record or in parts, so that a rank reads one range.
    struct Part {
      size_t group;
      int64_t k, first, last; // part k: elements [first, last) of the buffer
    };
    std::vector<Part> parts;
    std::vector<std::vector<size_t>> order(plan.groups.size()); // members by offset
    std::vector<std::vector<uint32_t>> crc(plan.groups.size());
    int64_t slotBytes = 0;
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      StorageGroup &group = plan.groups[g];
      int64_t elementBytes = static_cast<int64_t>(c10::elementSize(group.dtype));
      bool free = weightsFree(plan, group); // no record
      group.record = free || !group.parts.empty() ? "" : "bmt/weights/group" + std::to_string(g);
      for (size_t m = 0; m < group.members.size(); ++m) {
        TensorInfo &info = plan.tensors[group.members[m]];
        if (group.tpRank <= 0 && group.epRank <= 0) { // a member names the tp/ep_rank 0 copy
          info.record = group.record;
          info.offset = group.offsets[m] * elementBytes;
          info.crc32 = 0;
        }
        order[g].push_back(m);
      }
      std::sort(order[g].begin(), order[g].end(),
                [&](size_t a, size_t b) { return group.offsets[a] < group.offsets[b]; });
      crc[g].assign(group.members.size(), 0);
      group.chunkBytes = free ? 0 : chunkBytesFor(group.nbytes());
      group.chunkCrc32s.clear();
      if (free)
        continue;
      int64_t partSize = group.parts.empty() ? group.size : group.partSize;
      for (int64_t first = 0, k = 0; first < group.size || k == 0; first += partSize, ++k) {
        parts.push_back({g, k, first, std::min(group.size, first + partSize)});
        slotBytes = std::max(slotBytes, (parts.back().last - first) * elementBytes);
        if (!group.parts.empty())
          group.parts[k] = "bmt/weights/group" + std::to_string(g) + "." + std::to_string(k);
      }
    }
    // A helper thread fills the parts (reads, converts, checksums) while
    // this one writes the one before (the zip's checksum, the write), in
    // two buffers in turn: reading overlaps writing, two parts in memory.
    at::Tensor slots[2] = {at::empty({slotBytes}, at::TensorOptions().dtype(at::kByte)),
                           at::empty({slotBytes}, at::TensorOptions().dtype(at::kByte))};
    auto slotOf = [&](size_t i) {
      const Part &p = parts[i];
      const StorageGroup &group = plan.groups[p.group];
      int64_t bytes = (p.last - p.first) * static_cast<int64_t>(c10::elementSize(group.dtype));
      return slots[i % 2].narrow(0, 0, bytes).view(group.dtype);
    };
    // Tensor parallelism: a split member of a tp_rank copy is its TP
    // rank's slice of the global value (read whole, sliced, kept while
    // the parts of that copy are filled).
    std::pair<int64_t, int64_t> slicedKey{-1, -1}; // (tensor, tp rank)
    at::Tensor sliced;
    // A TP-split member's crc32 is the whole value's (the same at any T:
    // checkpoints identify a frozen base by it), taken at its tp_rank 0 copy.
    std::map<int64_t, uint32_t> wholeCrc;
    auto readMember = [&](const StorageGroup &group, int64_t index, int64_t begin, int64_t end,
                          at::Tensor &dst) {
      const TensorInfo &info = plan.tensors[index];
      if (info.split.isExpertSplit() && group.epRank >= 0) {
        // Expert parallelism: position p's experts, a contiguous range of
        // the global value (dim 0 split, no padding), streamed.
        const int64_t first = group.epRank * info.localNumel(1, plan.expertParallel);
        read(static_cast<size_t>(index), first + begin, first + end, dst);
        return;
      }
      if (info.localNumel(plan.tensorParallel) == info.numel() &&
          (group.tpRank < 0 || !info.split.isTensorSplit())) {
        read(static_cast<size_t>(index), begin, end, dst);
        return;
      }
      const int64_t tpRank = std::max<int64_t>(0, group.tpRank);
      if (slicedKey != std::make_pair(index, tpRank)) {
        at::Tensor whole = at::empty({info.numel()}, at::TensorOptions().dtype(info.dtype));
        read(static_cast<size_t>(index), 0, info.numel(), whole);
        if (tpRank == 0 && info.split.isTensorSplit())
          wholeCrc[index] = crc32_fast(whole.data_ptr(), whole.nbytes());
        sliced = tpSlice(whole.view(info.shape), info.split, plan.tensorParallel, tpRank)
                     .reshape({-1});
        slicedKey = {index, tpRank};
      }
      dst.copy_(sliced.narrow(0, begin, end - begin));
    };
    auto fill = [&](size_t i) {
      const Part &p = parts[i];
      const StorageGroup &group = plan.groups[p.group];
      at::Tensor part = slotOf(i);
      int64_t cursor = p.first; // zeros between the members (alignment padding)
      for (size_t m : order[p.group]) {
        const TensorInfo &info = plan.tensors[group.members[m]];
        int64_t begin = std::max(p.first, group.offsets[m]);
        int64_t end = std::min(p.last, group.offsets[m] + info.localNumel(plan.tensorParallel,
                                                                           plan.expertParallel));
        if (begin >= end)
          continue;
        if (begin > cursor)
          part.narrow(0, cursor - p.first, begin - cursor).zero_();
        at::Tensor dst = part.narrow(0, begin - p.first, end - begin);
        readMember(group, group.members[m], begin - group.offsets[m], end - group.offsets[m], dst);
        crc[p.group][m] = crc32_fast(dst.data_ptr(), dst.nbytes(), crc[p.group][m]);
        cursor = end;
      }
      if (p.last > cursor)
        part.narrow(0, cursor - p.first, p.last - cursor).zero_();
      // The buffer's chunk checksums (a chunk may span two parts).
      StorageGroup &writing = plan.groups[p.group];
      const int64_t elementBytes = static_cast<int64_t>(c10::elementSize(writing.dtype));
      const char *bytes = static_cast<const char *>(part.data_ptr());
      const int64_t at = p.first * elementBytes, n = (p.last - p.first) * elementBytes;
      for (int64_t done = 0; done < n;) {
        int64_t inChunk = (at + done) % writing.chunkBytes;
        int64_t take = std::min(n - done, writing.chunkBytes - inChunk);
        uint32_t previous = inChunk == 0 ? 0 : static_cast<uint32_t>(writing.chunkCrc32s.back());
        uint32_t sum = crc32_fast(bytes + done, static_cast<size_t>(take), previous);
        if (inChunk == 0)
          writing.chunkCrc32s.push_back(sum);
        else
          writing.chunkCrc32s.back() = sum;
        done += take;
      }
    };
    std::mutex mutex;
    std::condition_variable changed;
    size_t filled = 0, written = 0;
    bool stop = false;
    std::exception_ptr fillError;
    std::thread filler([&] {
      try {
        for (size_t i = 0; i < parts.size(); ++i) {
          {
            std::unique_lock<std::mutex> lock(mutex);
            changed.wait(lock, [&] { return stop || i < written + 2; });
            if (stop)
              return;
          }
          fill(i);
          std::lock_guard<std::mutex> lock(mutex);
          filled = i + 1;
          changed.notify_all();
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        fillError = std::current_exception();
        changed.notify_all();
      }
    });
    try {
      for (size_t i = 0; i < parts.size(); ++i) {
        {
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(lock, [&] { return fillError || filled > i; });
          if (filled <= i)
            break; // the filler failed: its error is rethrown below
        }
        const StorageGroup &group = plan.groups[parts[i].group];
        at::Tensor part = slotOf(i);
        writeRecord(group.parts.empty() ? group.record : group.parts[parts[i].k],
                    part.data_ptr(), part.nbytes());
        stats.weightBytes += part.nbytes();
        std::lock_guard<std::mutex> lock(mutex);
        written = i + 1;
        changed.notify_all();
      }
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        stop = true;
        changed.notify_all();
      }
      filler.join();
      throw;
    }
    filler.join();
    if (fillError)
      std::rethrow_exception(fillError);
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      StorageGroup &group = plan.groups[g];
      group.crc32s.clear();
      for (size_t m = 0; m < group.members.size(); ++m) {
        if (group.tpRank >= 0 && !weightsFree(plan, group))
          group.crc32s.push_back(crc[g][m]); // the copy's slice
        if (group.tpRank <= 0 && group.epRank <= 0) {
          // The tp/ep_rank 0 copy's slice; a TP-split member's whole value.
          auto whole = wholeCrc.find(group.members[m]);
          plan.tensors[group.members[m]].crc32 = whole != wholeCrc.end() ? whole->second : crc[g][m];
        }
      }
    }
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      TensorInfo &info = plan.tensors[i];
      if (info.group != -1)
        continue;
      if (!info.init.empty()) {
        info.record.clear();
        continue;
      }
      at::Tensor t = at::empty({info.numel()}, at::TensorOptions().dtype(info.dtype));
      read(i, 0, info.numel(), t);
      info.record = "bmt/weights/" + std::to_string(i);
      info.offset = 0;
      info.crc32 = crc32_fast(t.data_ptr(), t.nbytes());
      writeRecord(info.record, t.data_ptr(), t.nbytes());
      stats.weightBytes += t.nbytes();
    }
    writeRecord(kProgramRecord, programText.data(), programText.size());
    for (const auto &[name, content] : hfFiles)
      writeRecord(kHfRecordPrefix + name, content.data(), content.size());
    std::vector<char> planBytes = torch::jit::pickle_save(toIValue(plan));
    writeRecord(kPlanRecord, planBytes.data(), planBytes.size());
    writer.writeEndOfFile();
    if (!file->close())
      throw PlanError(file->error());
  } catch (const c10::Error &e) {
    std::string why = file && !file->error().empty()
                          ? file->error()
                          : "cannot write " + path + ": " +
                                bmt::firstErrorLine(e.what_without_backtrace());
    file.reset();
    std::remove(tmpPath.c_str());
    throw PlanError(why);
  } catch (...) {
    file.reset();
    std::remove(tmpPath.c_str());
    throw;
  }
  if (std::rename(tmpPath.c_str(), path.c_str()) != 0) {
    std::string reason = std::strerror(errno);
    std::remove(tmpPath.c_str());
    throw PlanError("cannot rename " + tmpPath + " to " + path + ": " + reason);
  }
  return stats;
}

TensorReader readerOfWholeTensors(const Plan &plan,
                                  std::function<at::Tensor(size_t)> weightOf) {
  struct Current {
    size_t index = SIZE_MAX;
    at::Tensor flat;
  };
  auto current = std::make_shared<Current>();
  return [&plan, weightOf = std::move(weightOf), current](size_t i, int64_t begin, int64_t end,
                                                          at::Tensor &dst) {
    if (i != current->index) {
      const TensorInfo &info = plan.tensors[i];
      at::Tensor t = weightOf(i);
      if (t.scalar_type() != info.dtype || t.sizes().vec() != info.shape)
        throw PlanError("weights of " + info.name + " do not match the plan (" +
                        std::string(c10::toString(t.scalar_type())) + " " +
                        c10::str(t.sizes()) + ")");
      current->flat = t.contiguous().cpu().reshape({-1});
      current->index = i;
    }
    dst.copy_(current->flat.narrow(0, begin, end - begin));
  };
}

WriteStats writeArchive(const std::string &path, Plan &plan, const std::string &programText,
                        const std::function<at::Tensor(size_t)> &weightOf,
                        const std::vector<NamedFile> &hfFiles, int64_t maxGroupRecordBytes) {
  return writeArchive(path, plan, programText, readerOfWholeTensors(plan, weightOf), hfFiles,
                      maxGroupRecordBytes);
}

Archive::Archive(const std::string &path) : path_(path) {
  if (::access(path.c_str(), F_OK) != 0)
    throw PlanError(path + ": no such file");
  try {
    reader_ = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const c10::Error &e) {
    throw PlanError(path + ": not a bmt archive (" +
                    bmt::firstErrorLine(e.what_without_backtrace()) + ")");
  }
  if (!reader_->hasRecord(kVersionRecord))
    throw PlanError(path + ": not a bmt archive (no " + kVersionRecord +
                    " record; compile the model with bmt-opt MODEL -o " + path + ")");
  try {
    std::string version = checkedRecord(kVersionRecord);
    std::istringstream in(version);
    std::string magic;
    int64_t number = -1;
    in >> magic >> number;
    if (magic != "bmt-sharded")
      throw PlanError(path + ": not a bmt archive (bad version record)");
    if (number < kOldestPlanFormatVersion || number > kPlanFormatVersion)
      throw PlanError(path + ": archive format version " + std::to_string(number) +
                      " is not supported (this bmt reads version " +
                      std::to_string(kOldestPlanFormatVersion) + " to " +
                      std::to_string(kPlanFormatVersion) +
                      "); recompile with this bmt-opt, or run a newer bmt-run");
    const std::string planBytes = checkedRecord(kPlanRecord);
    plan_ = fromIValue(torch::jit::pickle_load(std::vector<char>(planBytes.begin(), planBytes.end())));
    if (plan_.version != number)
      throw PlanError("the version record says " + std::to_string(number) +
                      " but the plan is version " + std::to_string(plan_.version));
    // The other whole records, checked now: a damaged program text or
    // Hugging Face file is found at load, whatever reads it later.
    checkedRecord(kProgramRecord);
    hfFiles();
  } catch (const PlanError &e) {
    std::string message = e.what();
    if (message.rfind(path, 0) == 0)
      throw;
    throw PlanError(path + ": " + message);
  } catch (const c10::Error &e) {
    throw PlanError(path + ": corrupt archive: " + bmt::firstErrorLine(e.what_without_backtrace()));
  }
}

Archive::~Archive() {
  if (fd_ >= 0)
    ::close(fd_);
}

void Archive::readRecordRange(const std::string &record, int64_t offset, int64_t nbytes,
                              void *dst, const std::string &what) {
  if (!reader_->hasRecord(record))
    throw PlanError(path_ + ": missing record " + record + " of " + what);
  int64_t start = 0, size = 0;
  try {
    size = static_cast<int64_t>(reader_->getRecordSize(record));
    start = static_cast<int64_t>(reader_->getRecordOffset(record));
  } catch (const c10::Error &e) {
    throw PlanError(path_ + ": corrupt record " + record + " of " + what + ": " +
                    bmt::firstErrorLine(e.what_without_backtrace()));
  }
  if (offset < 0 || nbytes < 0 || offset + nbytes > size)
    throw PlanError(path_ + ": record " + record + " is too short for " + what);
  if (fd_ < 0 && (fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC)) < 0)
    throw PlanError(path_ + ": cannot open: " + std::strerror(errno));
  char *out = static_cast<char *>(dst);
  int64_t done = 0;
  while (done < nbytes) {
    ssize_t n = ::pread(fd_, out + done, static_cast<size_t>(nbytes - done),
                        static_cast<off_t>(start + offset + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      throw PlanError(path_ + ": cannot read record " + record + " of " + what + ": " +
                      (n < 0 ? std::strerror(errno) : "unexpected end of file"));
    done += n;
  }
  bytesRead_ += nbytes;
}

std::string Archive::programText() { return checkedRecord(kProgramRecord); }

std::string adapterSettings(const std::string &programText) {
  const std::string key = "bmt.lora = {";
  const size_t at = programText.find(key);
  if (at == std::string::npos)
    return "";
  const size_t end = programText.find('}', at + key.size());
  return end == std::string::npos ? programText.substr(at) : programText.substr(at, end + 1 - at);
}

std::string Archive::checkedRecord(const std::string &record) {
  std::string bytes;
  int64_t start = 0, header = 0;
  try {
    auto [data, size] = reader_->getRecord(record);
    bytes.assign(static_cast<const char *>(data.get()), size);
    start = static_cast<int64_t>(reader_->getRecordOffset(record));
    header = static_cast<int64_t>(reader_->getRecordHeaderOffset(record));
  } catch (const c10::Error &e) {
    throw PlanError(path_ + ": corrupt record " + record + ": " +
                    bmt::firstErrorLine(e.what_without_backtrace()));
  }
  // The zip's CRC-32 of the record: in its local header, or, when the
  // header's flag bit 3 says so (PyTorchStreamWriter's records), in the
  // data descriptor after its data (an optional "PK\7\8" signature, then
  // the CRC-32).
  auto u32 = [](const unsigned char *p) {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
           static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  };
  unsigned char local[30], descriptor[8];
  readFileBytes(header, sizeof local, local, record);
  if (u32(local) != 0x04034b50u)
    throw PlanError(path_ + ": corrupt record " + record + " (no zip header at byte " +
                    std::to_string(header) + ")");
  uint32_t expected = u32(local + 14);
  if (local[6] & 8) {
    readFileBytes(start + static_cast<int64_t>(bytes.size()), sizeof descriptor, descriptor, record);
    expected = u32(descriptor) == 0x08074b50u ? u32(descriptor + 4) : u32(descriptor);
  }
  const uint32_t actual = crc32(bytes.data(), bytes.size());
  if (actual != expected) {
    char text[64];
    std::snprintf(text, sizeof text, "CRC-32 %08x, the zip says %08x", actual, expected);
    throw PlanError(path_ + ": corrupt record " + record + " (bytes [" + std::to_string(start) +
                    ", " + std::to_string(start + static_cast<int64_t>(bytes.size())) +
                    ") of the file: " + text + "); recompile it with bmt-opt");
  }
  return bytes;
}

void Archive::readFileBytes(int64_t at, int64_t nbytes, void *dst, const std::string &record) {
  if (fd_ < 0 && (fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC)) < 0)
    throw PlanError(path_ + ": cannot open: " + std::strerror(errno));
  char *out = static_cast<char *>(dst);
  for (int64_t done = 0; done < nbytes;) {
    ssize_t n = ::pread(fd_, out + done, static_cast<size_t>(nbytes - done),
                        static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      throw PlanError(path_ + ": corrupt record " + record + " (the file ends at byte " +
                      std::to_string(at + done) + ")");
    done += n;
  }
}

std::vector<NamedFile> Archive::hfFiles() {
  std::vector<NamedFile> files;
  for (const char *name : kHfFileNames) {
    const std::string record = kHfRecordPrefix + name;
    if (!reader_->hasRecord(record))
      continue;
    files.emplace_back(name, checkedRecord(record));
  }
  return files;
}

at::Tensor Archive::readTensor(size_t index) {
  const TensorInfo &info = plan_.tensors.at(index);
  if (info.split.isExpertSplit() && info.group >= 0) {
    // Expert parallelism: the whole tensor, the experts of each ep_rank
    // copy in turn.
    const StorageGroup &g = plan_.groups.at(info.group);
    const size_t m = static_cast<size_t>(
        std::find(g.members.begin(), g.members.end(), static_cast<int64_t>(index)) -
        g.members.begin());
    const int64_t local = info.localNumel(1, plan_.expertParallel);
    std::vector<at::Tensor> parts;
    for (int64_t e = 0; e < plan_.expertParallel; ++e)
      parts.push_back(readGroupRange(static_cast<size_t>(plan_.epGroup(info.group, e)),
                                     g.offsets.at(m), g.offsets.at(m) + local));
    return at::cat(parts).view(info.shape);
  }
  if (info.group >= 0 && plan_.groups.at(info.group).tpRank >= 0) {
    // Tensor parallelism: the slice of TP rank 0 (its group's copy).
    int64_t first = plan_.groups[info.group].offsets.at(static_cast<size_t>(
        std::find(plan_.groups[info.group].members.begin(),
                  plan_.groups[info.group].members.end(), static_cast<int64_t>(index)) -
        plan_.groups[info.group].members.begin()));
    return readGroupRange(info.group, first, first + info.localNumel(plan_.tensorParallel))
        .view(info.localShape(plan_.tensorParallel));
  }
  if (!info.init.empty())
    return initValues(info, 0, info.numel(), initSeed_, info.numel(), 0).view(info.shape);
  if (info.group >= 0 && !plan_.groups.at(info.group).parts.empty()) {
    int64_t first = info.offset / static_cast<int64_t>(c10::elementSize(info.dtype));
    return readGroupRange(info.group, first, first + info.numel()).view(info.shape);
  }
  at::Tensor out = at::empty(info.shape, at::TensorOptions().dtype(info.dtype));
  readRecordRange(info.record, info.offset, info.nbytes(), out.data_ptr(), info.name);
  if (static_cast<int64_t>(crc32_fast(out.data_ptr(), info.nbytes())) != info.crc32)
    throw PlanError(path_ + ": corrupt record " + info.record + " of " + info.name +
                    " (checksum mismatch)");
  return out;
}

at::Tensor Archive::readGroupRange(size_t group, int64_t begin, int64_t end) {
  const StorageGroup &g = plan_.groups.at(group);
  if (begin < 0 || end < begin || end > g.size)
    throw PlanError(path_ + ": range [" + std::to_string(begin) + ", " + std::to_string(end) +
                    ") is outside storage group " + g.name);
  int64_t elementBytes = static_cast<int64_t>(c10::elementSize(g.dtype));
  if (g.record.empty() && g.parts.empty()) { // weights-free: every member by its init rule
    at::Tensor out = at::zeros({end - begin}, at::TensorOptions().dtype(g.dtype));
    for (size_t m = 0; m < g.members.size(); ++m) {
      const TensorInfo &info = plan_.tensors[g.members[m]];
      int64_t first = std::max(begin, g.offsets[m]);
      int64_t last = std::min(end, g.offsets[m] + info.localNumel(plan_.tensorParallel,
                                                                  plan_.expertParallel));
      if (first < last)
        out.narrow(0, first - begin, last - first)
            .copy_(initValues(plan_, g, info, first - g.offsets[m], last - g.offsets[m], initSeed_));
    }
    return out;
  }
  // The bytes read: the range widened to whole checked units, the chunks
  // that cover it (or, in an archive without chunk checksums, the members
  // it touches, read whole), so that every byte read is checked.
  int64_t from = begin * elementBytes, to = end * elementBytes;
  if (g.chunkBytes > 0) {
    from = from / g.chunkBytes * g.chunkBytes;
    to = std::min(g.nbytes(), (to + g.chunkBytes - 1) / g.chunkBytes * g.chunkBytes);
  } else {
    for (size_t m = 0; m < g.members.size(); ++m) {
      int64_t first = g.offsets[m];
      int64_t last = first + plan_.tensors[g.members[m]].localNumel(plan_.tensorParallel,
                                                                    plan_.expertParallel);
      if (first < end && last > begin) {
        from = std::min(from, first * elementBytes);
        to = std::max(to, last * elementBytes);
      }
    }
  }
  if (begin == end)
    return at::empty({0}, at::TensorOptions().dtype(g.dtype));
  at::Tensor read = at::empty({(to - from) / elementBytes}, at::TensorOptions().dtype(g.dtype));
  readBufferBytes(g, from, to, static_cast<char *>(read.data_ptr()));
  const char *bytes = static_cast<const char *>(read.data_ptr());
  if (g.chunkBytes > 0) {
    const int64_t chunks = static_cast<int64_t>(g.chunkCrc32s.size());
    for (int64_t at = from; at < to; at += g.chunkBytes) {
      int64_t k = at / g.chunkBytes, last = std::min(to, at + g.chunkBytes);
      if (static_cast<int64_t>(crc32_fast(bytes + (at - from), static_cast<size_t>(last - at))) ==
          g.chunkCrc32s[k])
        continue;
      std::string holding;
      for (size_t m = 0; m < g.members.size(); ++m) {
        int64_t first = g.offsets[m] * elementBytes;
        int64_t past = first + plan_.tensors[g.members[m]].localNumel(plan_.tensorParallel) *
                                   elementBytes;
        if (first < last && past > at)
          holding += (holding.empty() ? "" : ", ") + plan_.tensors[g.members[m]].name;
      }
      throw PlanError(path_ + ": corrupt record " + recordOfByte(g, at) + " of storage group " +
                      g.name + " (chunk " + std::to_string(k) + " of " + std::to_string(chunks) +
                      ", bytes [" + std::to_string(at) + ", " + std::to_string(last) +
                      ") of its buffer, holding " + (holding.empty() ? "padding" : holding) +
                      "): checksum mismatch; recompile it with bmt-opt");
    }
  } else {
    for (size_t m = 0; m < g.members.size(); ++m) {
      const TensorInfo &info = plan_.tensors[g.members[m]];
      int64_t numel = info.localNumel(plan_.tensorParallel);
      int64_t first = g.offsets[m] * elementBytes, past = first + numel * elementBytes;
      if (first < from || past > to)
        continue;
      int64_t expected = g.crc32s.empty() ? info.crc32 : g.crc32s[m];
      if (static_cast<int64_t>(crc32_fast(bytes + (first - from),
                                          static_cast<size_t>(past - first))) != expected)
        throw PlanError(path_ + ": corrupt record " + recordOfByte(g, first) + " of " + info.name +
                        " (bytes [" + std::to_string(first) + ", " + std::to_string(past) +
                        ") of storage group " + g.name +
                        "'s buffer, read whole: an archive without chunk checksums): checksum "
                        "mismatch; recompile it with bmt-opt");
    }
  }
  if (from == begin * elementBytes && to == end * elementBytes)
    return read;
  return read.narrow(0, begin - from / elementBytes, end - begin).clone();
}

std::string Archive::recordOfByte(const StorageGroup &g, int64_t at) const {
  if (g.parts.empty())
    return g.record;
  int64_t partBytes = g.partSize * static_cast<int64_t>(c10::elementSize(g.dtype));
  return g.parts.at(static_cast<size_t>(std::min<int64_t>(
      at / partBytes, static_cast<int64_t>(g.parts.size()) - 1)));
}

void Archive::readBufferBytes(const StorageGroup &g, int64_t from, int64_t to, char *dst) {
  if (g.parts.empty()) {
    readRecordRange(g.record, from, to - from, dst, "storage group " + g.name);
    return;
  }
  // The range across the parts it covers (part k: bytes [k * partBytes, ...)).
  const int64_t partBytes = g.partSize * static_cast<int64_t>(c10::elementSize(g.dtype));
  for (int64_t k = from / partBytes; k * partBytes < to; ++k) {
    int64_t first = std::max(from, k * partBytes), last = std::min(to, (k + 1) * partBytes);
    readRecordRange(g.parts.at(static_cast<size_t>(k)), first - k * partBytes, last - first,
                    dst + (first - from), "storage group " + g.name);
  }
}

} // namespace bmt::plan
