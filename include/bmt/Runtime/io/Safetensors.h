//===- Safetensors.h - write tensors in the safetensors format --*- C++ -*-===//
//
// The safetensors format (huggingface/safetensors, docs "Format"): an
// 8-byte little-endian header length N, N bytes of JSON mapping each name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data
// that follows, in bytes), then the raw little-endian tensor bytes. Python
// reads it with safetensors.torch.load_file, transformers with
// from_pretrained.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_IO_SAFETENSORS_H
#define BMT_RUNTIME_IO_SAFETENSORS_H

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace bmt::runtime {

/// Writes `tensors` (any device; copied to CPU, made contiguous) to `path`
/// atomically (a temporary file renamed over it). `metadata` goes into the
/// header's "__metadata__" (string values). Throws std::runtime_error naming
/// the file when it cannot be written or a dtype has no safetensors code.
void saveSafetensors(const std::string &path,
                     const std::vector<std::pair<std::string, at::Tensor>> &tensors,
                     const std::vector<std::pair<std::string, std::string>> &metadata = {});

} // namespace bmt::runtime

#endif // BMT_RUNTIME_IO_SAFETENSORS_H
