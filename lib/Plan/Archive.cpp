//===- Archive.cpp - read and write sharded.pt ----------------------------===//

#include "bmt/Plan/Archive.h"

#include "bmt/Support/ErrorText.h"

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
#include <cstdio>
#include <functional>
#include <iterator>
#include <cstring>
#include <sstream>
#include <cerrno>
#include <fcntl.h>
#include <unistd.h>

namespace bmt::plan {

uint32_t crc32(const void *data, size_t nbytes) { return crc32_fast(data, nbytes); }

namespace {

const char *kVersionRecord = "bmt/version";
const char *kProgramRecord = "bmt/program.mlir";
const char *kPlanRecord = "bmt/plan.pkl";
const std::string kHfRecordPrefix = "bmt/hf/";

std::string versionLine(const Plan &plan) {
  return "bmt-sharded " + std::to_string(formatVersionOf(plan)) + "\n";
}

/// Elements [begin, end) of tensor `info`'s flattened value under its init
/// rule, as a 1-D CPU tensor. Normal values are drawn in chunks of 2^20
/// elements, each from a generator seeded by (seed, tensor name, chunk
/// index), so that an element's value does not depend on which range (which
/// rank, how many ranks) reads it.
at::Tensor initValues(const TensorInfo &info, int64_t begin, int64_t end, uint64_t seed) {
  at::TensorOptions options = at::TensorOptions().dtype(info.dtype);
  if (info.init == "zeros")
    return at::zeros({end - begin}, options);
  if (info.init == "ones")
    return at::ones({end - begin}, options);
  double stddev = std::stod(info.init.substr(std::string("normal:").size()));
  constexpr int64_t kChunk = int64_t(1) << 20;
  at::Tensor out = at::empty({end - begin}, options);
  uint64_t nameHash = std::hash<std::string>()(info.name);
  for (int64_t chunk = begin / kChunk; chunk * kChunk < end; ++chunk) {
    int64_t first = chunk * kChunk, last = std::min(first + kChunk, info.numel());
    uint64_t chunkSeed = (seed * 0x9E3779B97F4A7C15ull) ^ nameHash ^
                         (static_cast<uint64_t>(chunk) * 0xC2B2AE3D27D4EB4Full);
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(chunkSeed);
    at::Tensor values = at::normal(0.0, stddev, {last - first}, generator,
                                   at::TensorOptions().dtype(at::kFloat));
    int64_t from = std::max(begin, first), to = std::min(end, last);
    out.narrow(0, from - begin, to - from).copy_(values.narrow(0, from - first, to - from));
  }
  return out;
}

/// A group whose every member has an init rule: it gets no record.
bool weightsFree(const Plan &plan, const StorageGroup &group) {
  for (int64_t m : group.members)
    if (plan.tensors[m].init.empty())
      return false;
  return true;
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
  try {
    caffe2::serialize::PyTorchStreamWriter writer(tmpPath);
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
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      StorageGroup &group = plan.groups[g];
      std::string record = "bmt/weights/group" + std::to_string(g);
      int64_t elementBytes = static_cast<int64_t>(c10::elementSize(group.dtype));
      bool free = weightsFree(plan, group);
      group.record = free || !group.parts.empty() ? "" : record;
      for (size_t m = 0; m < group.members.size(); ++m) {
        TensorInfo &info = plan.tensors[group.members[m]];
        info.record = group.record;
        info.offset = group.offsets[m] * elementBytes;
        info.crc32 = 0;
      }
      if (free) // a weights-free group: no record
        continue;
      // Members in buffer order; each part takes the pieces it covers.
      std::vector<size_t> order(group.members.size());
      for (size_t m = 0; m < order.size(); ++m)
        order[m] = m;
      std::sort(order.begin(), order.end(),
                [&](size_t a, size_t b) { return group.offsets[a] < group.offsets[b]; });
      int64_t partSize = group.parts.empty() ? group.size : group.partSize;
      int64_t numParts = group.parts.empty() ? 1 : static_cast<int64_t>(group.parts.size());
      at::Tensor buffer = at::empty({std::min(partSize, group.size)},
                                    at::TensorOptions().dtype(group.dtype));
      std::vector<uint32_t> crc(group.members.size(), 0);
      for (int64_t k = 0; k < numParts; ++k) {
        int64_t first = k * partSize, last = std::min(group.size, first + partSize);
        at::Tensor part = buffer.narrow(0, 0, last - first);
        part.zero_();
        for (size_t m : order) {
          const TensorInfo &info = plan.tensors[group.members[m]];
          int64_t begin = std::max(first, group.offsets[m]);
          int64_t end = std::min(last, group.offsets[m] + info.numel());
          if (begin >= end)
            continue;
          at::Tensor dst = part.narrow(0, begin - first, end - begin);
          read(group.members[m], begin - group.offsets[m], end - group.offsets[m], dst);
          crc[m] = crc32_fast(dst.data_ptr(), dst.nbytes(), crc[m]);
        }
        std::string name = group.parts.empty() ? record : record + "." + std::to_string(k);
        if (!group.parts.empty())
          group.parts[k] = name;
        writeRecord(name, part.data_ptr(), part.nbytes());
        stats.weightBytes += part.nbytes();
      }
      for (size_t m = 0; m < group.members.size(); ++m)
        plan.tensors[group.members[m]].crc32 = crc[m];
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
  } catch (...) {
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

WriteStats writeArchive(const std::string &path, Plan &plan, const std::string &programText,
                        const std::function<at::Tensor(size_t)> &weightOf,
                        const std::vector<NamedFile> &hfFiles, int64_t maxGroupRecordBytes) {
  // Ranges of one tensor come in order: keep its flattened value between them.
  size_t current = SIZE_MAX;
  at::Tensor flat;
  auto read = [&](size_t i, int64_t begin, int64_t end, at::Tensor &dst) {
    if (i != current) {
      const TensorInfo &info = plan.tensors[i];
      at::Tensor t = weightOf(i);
      if (t.scalar_type() != info.dtype || t.sizes().vec() != info.shape)
        throw PlanError("weights of " + info.name + " do not match the plan (" +
                        std::string(c10::toString(t.scalar_type())) + " " +
                        c10::str(t.sizes()) + ")");
      flat = t.contiguous().cpu().reshape({-1});
      current = i;
    }
    dst.copy_(flat.narrow(0, begin, end - begin));
  };
  return writeArchive(path, plan, programText, TensorReader(read), hfFiles, maxGroupRecordBytes);
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
    auto [data, size] = reader_->getRecord(kVersionRecord);
    std::string version(static_cast<const char *>(data.get()), size);
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
    auto [planData, planSize] = reader_->getRecord(kPlanRecord);
    const char *bytes = static_cast<const char *>(planData.get());
    plan_ = fromIValue(torch::jit::pickle_load(std::vector<char>(bytes, bytes + planSize)));
    if (plan_.version != number)
      throw PlanError("the version record says " + std::to_string(number) +
                      " but the plan is version " + std::to_string(plan_.version));
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

std::string Archive::programText() {
  try {
    auto [data, size] = reader_->getRecord(kProgramRecord);
    return std::string(static_cast<const char *>(data.get()), size);
  } catch (const c10::Error &e) {
    throw PlanError(path_ + ": corrupt record " + kProgramRecord + ": " +
                    bmt::firstErrorLine(e.what_without_backtrace()));
  }
}

std::vector<NamedFile> Archive::hfFiles() {
  std::vector<NamedFile> files;
  for (const char *name : kHfFileNames) {
    const std::string record = kHfRecordPrefix + name;
    if (!reader_->hasRecord(record))
      continue;
    try {
      auto [data, size] = reader_->getRecord(record);
      files.emplace_back(name, std::string(static_cast<const char *>(data.get()), size));
    } catch (const c10::Error &e) {
      throw PlanError(path_ + ": corrupt record " + record + ": " +
                      bmt::firstErrorLine(e.what_without_backtrace()));
    }
  }
  return files;
}

at::Tensor Archive::readTensor(size_t index) {
  const TensorInfo &info = plan_.tensors.at(index);
  if (!info.init.empty())
    return initValues(info, 0, info.numel(), initSeed_).view(info.shape);
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
      int64_t last = std::min(end, g.offsets[m] + info.numel());
      if (first < last)
        out.narrow(0, first - begin, last - first)
            .copy_(initValues(info, first - g.offsets[m], last - g.offsets[m], initSeed_));
    }
    return out;
  }
  at::Tensor out = at::empty({end - begin}, at::TensorOptions().dtype(g.dtype));
  if (g.parts.empty()) {
    readRecordRange(g.record, begin * elementBytes, out.nbytes(), out.data_ptr(),
                    "storage group " + g.name);
  } else {
    // The range across the parts it covers (part k: [k * partSize, ...)).
    char *dst = static_cast<char *>(out.data_ptr());
    for (int64_t k = begin / g.partSize; k * g.partSize < end; ++k) {
      int64_t first = std::max(begin, k * g.partSize);
      int64_t last = std::min(end, (k + 1) * g.partSize);
      readRecordRange(g.parts.at(k), (first - k * g.partSize) * elementBytes,
                      (last - first) * elementBytes, dst + (first - begin) * elementBytes,
                      "storage group " + g.name);
    }
  }
  for (size_t m = 0; m < g.members.size(); ++m) {
    const TensorInfo &info = plan_.tensors[g.members[m]];
    int64_t first = g.offsets[m], last = first + info.numel();
    if (first < begin || last > end)
      continue;
    const char *bytes = static_cast<const char *>(out.data_ptr()) + (first - begin) * elementBytes;
    if (static_cast<int64_t>(crc32_fast(bytes, info.nbytes())) != info.crc32)
      throw PlanError(path_ + ": corrupt record " + g.record + " of " + info.name +
                      " (checksum mismatch)");
  }
  return out;
}

} // namespace bmt::plan
