//===- TorchExportWeights.h - tensors of a .pt2 archive ---------*- C++ -*-===//
//
// LibTorch-facing (includes ATen): for the exporter, which takes the weights
// of a model imported by importTorchExport from its .pt2 archive.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_IMPORT_TORCHEXPORTWEIGHTS_H
#define BMT_IMPORT_TORCHEXPORTWEIGHTS_H

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace bmt {

/// Every parameter, buffer and tensor constant stored in the torch.export
/// archive at `path`, by state-dict name (tied names map to one tensor).
/// Throws std::runtime_error or c10::Error on a bad archive.
std::map<std::string, at::Tensor> loadTorchExportTensors(const std::string &path);

} // namespace bmt

#endif // BMT_IMPORT_TORCHEXPORTWEIGHTS_H
