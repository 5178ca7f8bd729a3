//===- Pt2Archive.h - the records of a torch.export archive -----*- C++ -*-===//
//
// Internal to lib/Import/TorchExport (LibTorch-facing). A .pt2 written by
// torch.export.save is a PyTorch zip (one top folder, stripped by
// PyTorchStreamReader) holding:
//   models/model.json                     the serialized ExportedProgram
//   data/weights/model_weights_config.json   name -> {path_name, tensor_meta}
//   data/weights/<path_name>              raw bytes of a parameter / buffer
//   data/constants/model_constants_config.json, data/constants/<path_name>
//                                         non-persistent buffers, constants
//
//===----------------------------------------------------------------------===//

#ifndef BMT_LIB_IMPORT_TORCHEXPORT_PT2ARCHIVE_H
#define BMT_LIB_IMPORT_TORCHEXPORT_PT2ARCHIVE_H

#include <ATen/core/Tensor.h>
#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace bmt::pt2 {

/// A stored tensor: its record and how the tensor views the record's bytes.
struct StoredTensor {
  std::string record;       // "data/weights/weight_0"
  int serdeDtype = 0;       // torch._export.serde.schema.ScalarType
  std::vector<int64_t> sizes, strides;
  int64_t storageOffset = 0;
  bool requiresGrad = false;
  bool usePickle = false;
};

struct Archive {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  std::string programRecord; // "models/model.json"
  /// Weights and constants by state-dict name.
  std::map<std::string, StoredTensor> tensors;
};

/// Opens the archive and reads the two tensor configs (not the program).
/// Throws std::runtime_error (bad records) or c10::Error (bad zip).
Archive openArchive(const std::string &path);

/// The text of one record.
std::string readRecord(Archive &archive, const std::string &name);

/// c10::ScalarType for a serde ScalarType; -1 if there is none.
int toC10ScalarType(int serdeDtype);

/// The tensor stored for `t`, as a strided view of its record's bytes.
at::Tensor loadTensor(Archive &archive, const StoredTensor &t);

} // namespace bmt::pt2

#endif
