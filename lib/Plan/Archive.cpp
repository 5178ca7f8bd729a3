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

} // namespace

void writeArchive(const std::string &path, Plan &plan,
                  const std::string &programText,
                  const std::function<at::Tensor(size_t)> &weightOf,
                  const std::vector<NamedFile> &hfFiles) {
  for (const auto &[name, content] : hfFiles)
    if (std::find(std::begin(kHfFileNames), std::end(kHfFileNames), name) ==
        std::end(kHfFileNames))
      throw PlanError("'" + name + "' is not a Hugging Face file an archive carries");
  std::string tmpPath = path + ".tmp." + std::to_string(::getpid());
  try {
    caffe2::serialize::PyTorchStreamWriter writer(tmpPath);
    std::string version = versionLine(plan);
    writer.writeRecord(kVersionRecord, version.data(), version.size());
    auto checkedWeight = [&](size_t i) {
      const TensorInfo &info = plan.tensors[i];
      at::Tensor t = weightOf(i);
      if (t.scalar_type() != info.dtype || t.sizes().vec() != info.shape)
        throw PlanError("weights of " + info.name + " do not match the plan (" +
                        std::string(c10::toString(t.scalar_type())) + " " +
                        c10::str(t.sizes()) + ")");
      return t.contiguous().cpu();
    };
    // Storage groups: one record per group holding its flat buffer (members
    // at their offsets, zeros between), so that a rank reads one range.
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      StorageGroup &group = plan.groups[g];
      at::Tensor buffer = at::zeros({group.size}, at::TensorOptions().dtype(group.dtype));
      group.record = "bmt/weights/group" + std::to_string(g);
      int64_t elementBytes = static_cast<int64_t>(c10::elementSize(group.dtype));
      bool weightsFree = true;
      for (int64_t m : group.members)
        weightsFree = weightsFree && !plan.tensors[m].init.empty();
      if (weightsFree) { // a weights-free group: no record
        group.record.clear();
        for (size_t m = 0; m < group.members.size(); ++m) {
          TensorInfo &info = plan.tensors[group.members[m]];
          info.record.clear();
          info.offset = group.offsets[m] * elementBytes;
          info.crc32 = 0;
        }
        continue;
      }
      for (size_t m = 0; m < group.members.size(); ++m) {
        TensorInfo &info = plan.tensors[group.members[m]];
        at::Tensor t = checkedWeight(group.members[m]);
        buffer.narrow(0, group.offsets[m], t.numel()).copy_(t.reshape({-1}));
        info.record = group.record;
        info.offset = group.offsets[m] * elementBytes;
        info.crc32 = crc32_fast(t.data_ptr(), t.nbytes());
      }
      writer.writeRecord(group.record, buffer.data_ptr(), buffer.nbytes());
    }
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      TensorInfo &info = plan.tensors[i];
      if (info.group != -1)
        continue;
      if (!info.init.empty()) {
        info.record.clear();
        continue;
      }
      at::Tensor t = checkedWeight(i);
      info.record = "bmt/weights/" + std::to_string(i);
      info.offset = 0;
      info.crc32 = crc32_fast(t.data_ptr(), t.nbytes());
      writer.writeRecord(info.record, t.data_ptr(), t.nbytes());
    }
    writer.writeRecord(kProgramRecord, programText.data(), programText.size());
    for (const auto &[name, content] : hfFiles)
      writer.writeRecord(kHfRecordPrefix + name, content.data(), content.size());
    std::vector<char> planBytes = torch::jit::pickle_save(toIValue(plan));
    writer.writeRecord(kPlanRecord, planBytes.data(), planBytes.size());
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
  if (g.record.empty()) { // weights-free: every member by its init rule
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
  readRecordRange(g.record, begin * elementBytes, out.nbytes(), out.data_ptr(),
                  "storage group " + g.name);
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
