//===- Archive.cpp - read and write sharded.pt ----------------------------===//

#include "bmt/Plan/Archive.h"

#include "bmt/Support/ErrorText.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/crc_alt.h> // header-only; included by this file alone
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdio>
#include <cstring>
#include <sstream>
#include <unistd.h>

namespace bmt::plan {

namespace {

const char *kVersionRecord = "bmt/version";
const char *kProgramRecord = "bmt/program.mlir";
const char *kPlanRecord = "bmt/plan.pkl";

std::string versionLine() {
  return "bmt-sharded " + std::to_string(kPlanFormatVersion) + "\n";
}

} // namespace

void writeArchive(const std::string &path, Plan &plan,
                  const std::string &programText,
                  const std::function<at::Tensor(size_t)> &weightOf) {
  std::string tmpPath = path + ".tmp." + std::to_string(::getpid());
  try {
    caffe2::serialize::PyTorchStreamWriter writer(tmpPath);
    std::string version = versionLine();
    writer.writeRecord(kVersionRecord, version.data(), version.size());
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      TensorInfo &info = plan.tensors[i];
      at::Tensor t = weightOf(i);
      if (t.scalar_type() != info.dtype || t.sizes().vec() != info.shape)
        throw PlanError("weights of " + info.name + " do not match the plan (" +
                        std::string(c10::toString(t.scalar_type())) + " " +
                        c10::str(t.sizes()) + ")");
      t = t.contiguous().cpu();
      info.record = "bmt/weights/" + std::to_string(i);
      info.offset = 0;
      info.crc32 = crc32_fast(t.data_ptr(), t.nbytes());
      writer.writeRecord(info.record, t.data_ptr(), t.nbytes());
    }
    writer.writeRecord(kProgramRecord, programText.data(), programText.size());
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
    if (number != kPlanFormatVersion)
      throw PlanError(path + ": archive format version " + std::to_string(number) +
                      " is not supported (this bmt reads version " +
                      std::to_string(kPlanFormatVersion) + "); recompile with this bmt-opt");
    auto [planData, planSize] = reader_->getRecord(kPlanRecord);
    const char *bytes = static_cast<const char *>(planData.get());
    plan_ = fromIValue(torch::jit::pickle_load(std::vector<char>(bytes, bytes + planSize)));
  } catch (const PlanError &e) {
    std::string message = e.what();
    if (message.rfind(path, 0) == 0)
      throw;
    throw PlanError(path + ": " + message);
  } catch (const c10::Error &e) {
    throw PlanError(path + ": corrupt archive: " + bmt::firstErrorLine(e.what_without_backtrace()));
  }
}

Archive::~Archive() = default;

std::string Archive::programText() {
  try {
    auto [data, size] = reader_->getRecord(kProgramRecord);
    return std::string(static_cast<const char *>(data.get()), size);
  } catch (const c10::Error &e) {
    throw PlanError(path_ + ": corrupt record " + kProgramRecord + ": " +
                    bmt::firstErrorLine(e.what_without_backtrace()));
  }
}

at::Tensor Archive::readTensor(size_t index) {
  const TensorInfo &info = plan_.tensors.at(index);
  if (!reader_->hasRecord(info.record))
    throw PlanError(path_ + ": missing record " + info.record + " of " + info.name);
  at::Tensor out = at::empty(info.shape, at::TensorOptions().dtype(info.dtype));
  try {
    auto [data, size] = reader_->getRecord(info.record);
    if (static_cast<int64_t>(size) < info.offset + info.nbytes())
      throw PlanError(path_ + ": record " + info.record + " is too short for " +
                      info.name);
    std::memcpy(out.data_ptr(), static_cast<const char *>(data.get()) + info.offset,
                info.nbytes());
    if (static_cast<int64_t>(crc32_fast(out.data_ptr(), info.nbytes())) != info.crc32)
      throw PlanError(path_ + ": corrupt record " + info.record + " of " + info.name +
                      " (checksum mismatch)");
    bytesRead_ += info.nbytes();
  } catch (const c10::Error &e) {
    throw PlanError(path_ + ": corrupt record " + info.record + " of " + info.name +
                    ": " + bmt::firstErrorLine(e.what_without_backtrace()));
  }
  return out;
}

} // namespace bmt::plan
