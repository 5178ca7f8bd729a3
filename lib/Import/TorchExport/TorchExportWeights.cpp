//===- TorchExportWeights.cpp - the records of a .pt2 archive -------------===//

#include "Pt2Archive.h"

#include "bmt/Import/TorchExportWeights.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>

#include <cstring>

using json = nlohmann::json;

namespace bmt::pt2 {

int toC10ScalarType(int serde) {
  switch (serde) {
  case 1: return static_cast<int>(at::kByte);
  case 2: return static_cast<int>(at::kChar);
  case 3: return static_cast<int>(at::kShort);
  case 4: return static_cast<int>(at::kInt);
  case 5: return static_cast<int>(at::kLong);
  case 6: return static_cast<int>(at::kHalf);
  case 7: return static_cast<int>(at::kFloat);
  case 8: return static_cast<int>(at::kDouble);
  case 9: return static_cast<int>(at::kComplexHalf);
  case 10: return static_cast<int>(at::kComplexFloat);
  case 11: return static_cast<int>(at::kComplexDouble);
  case 12: return static_cast<int>(at::kBool);
  case 13: return static_cast<int>(at::kBFloat16);
  default: return -1;
  }
}

static std::vector<int64_t> symInts(const json &list) {
  std::vector<int64_t> out;
  for (const json &e : list) {
    if (!e.contains("as_int"))
      throw std::runtime_error("a stored tensor has a symbolic size or stride");
    out.push_back(e["as_int"].get<int64_t>());
  }
  return out;
}

std::string readRecord(Archive &archive, const std::string &name) {
  auto [data, size] = archive.reader->getRecord(name);
  return std::string(static_cast<const char *>(data.get()), size);
}

static void readConfig(Archive &archive, const std::string &folder,
                       const std::string &configName) {
  std::string record = folder + configName;
  if (!archive.reader->hasRecord(record))
    return;
  json config = json::parse(readRecord(archive, record));
  if (!config.contains("config"))
    throw std::runtime_error(record + " has no 'config'");
  for (auto &[name, entry] : config["config"].items()) {
    StoredTensor t;
    t.record = folder + entry.at("path_name").get<std::string>();
    t.usePickle = entry.value("use_pickle", false);
    const json &meta = entry.at("tensor_meta");
    t.serdeDtype = meta.at("dtype").get<int>();
    t.sizes = symInts(meta.at("sizes"));
    t.strides = symInts(meta.at("strides"));
    t.storageOffset = meta.at("storage_offset").at("as_int").get<int64_t>();
    t.requiresGrad = meta.value("requires_grad", false);
    archive.tensors[name] = t;
  }
}

Archive openArchive(const std::string &path) {
  Archive archive;
  archive.reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  for (const std::string &r : archive.reader->getAllRecords())
    if (r.rfind("models/", 0) == 0 && r.size() > 12 &&
        r.compare(r.size() - 5, 5, ".json") == 0 &&
        (archive.programRecord.empty() || r == "models/model.json"))
      archive.programRecord = r;
  if (archive.programRecord.empty())
    throw std::runtime_error("not a torch.export archive (no models/*.json record)");
  readConfig(archive, "data/weights/", "model_weights_config.json");
  readConfig(archive, "data/constants/", "model_constants_config.json");
  return archive;
}

at::Tensor loadTensor(Archive &archive, const StoredTensor &t) {
  if (t.usePickle)
    throw std::runtime_error(t.record + " is a pickled tensor (use_pickle); "
                             "only raw tensor records are supported");
  int dtype = toC10ScalarType(t.serdeDtype);
  if (dtype < 0)
    throw std::runtime_error(t.record + ": unsupported dtype " +
                             std::to_string(t.serdeDtype));
  auto scalar = static_cast<at::ScalarType>(dtype);
  auto [data, size] = archive.reader->getRecord(t.record);
  int64_t elem = static_cast<int64_t>(c10::elementSize(scalar));
  int64_t needed = t.storageOffset;
  for (size_t i = 0; i < t.sizes.size(); ++i)
    if (t.sizes[i] > 0)
      needed += (t.sizes[i] - 1) * t.strides[i];
  bool empty = false;
  for (int64_t s : t.sizes)
    empty |= s == 0;
  if (!empty && static_cast<int64_t>(size) < (needed + 1) * elem)
    throw std::runtime_error(t.record + " holds " + std::to_string(size) +
                             " bytes, too few for its tensor");
  at::Tensor storage =
      at::empty({static_cast<int64_t>(size) / elem}, at::TensorOptions().dtype(scalar));
  if (size)
    std::memcpy(storage.data_ptr(), data.get(), size);
  return storage.as_strided(t.sizes, t.strides, t.storageOffset);
}

} // namespace bmt::pt2

std::map<std::string, at::Tensor>
bmt::loadTorchExportTensors(const std::string &path) {
  pt2::Archive archive = pt2::openArchive(path);
  std::map<std::string, at::Tensor> out;
  std::map<std::string, at::Tensor> storageOf; // record -> storage view
  for (const auto &[name, t] : archive.tensors) {
    at::Tensor tensor = pt2::loadTensor(archive, t);
    // Names that share a record share the storage (ties stay ties).
    if (auto it = storageOf.find(t.record); it != storageOf.end() &&
        it->second.scalar_type() == tensor.scalar_type())
      tensor = it->second.as_strided(t.sizes, t.strides, t.storageOffset);
    else
      storageOf[t.record] = tensor;
    out[name] = tensor;
  }
  return out;
}
