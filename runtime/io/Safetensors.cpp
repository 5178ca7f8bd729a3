//===- Safetensors.cpp - write tensors in the safetensors format ----------===//

#include "bmt/Runtime/io/Safetensors.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <unistd.h>

namespace bmt::runtime {

namespace {

std::string dtypeCode(c10::ScalarType t) {
  switch (t) {
  case c10::ScalarType::Float: return "F32";
  case c10::ScalarType::Half: return "F16";
  case c10::ScalarType::BFloat16: return "BF16";
  case c10::ScalarType::Double: return "F64";
  case c10::ScalarType::Long: return "I64";
  case c10::ScalarType::Int: return "I32";
  case c10::ScalarType::Short: return "I16";
  case c10::ScalarType::Char: return "I8";
  case c10::ScalarType::Byte: return "U8";
  case c10::ScalarType::Bool: return "BOOL";
  default:
    throw std::runtime_error(std::string("no safetensors dtype for ") + c10::toString(t));
  }
}

} // namespace

void saveSafetensors(const std::string &path,
                     const std::vector<std::pair<std::string, at::Tensor>> &tensors,
                     const std::vector<std::pair<std::string, std::string>> &metadata) {
  std::vector<at::Tensor> data;
  nlohmann::json header = nlohmann::json::object();
  int64_t offset = 0;
  for (const auto &[name, tensor] : tensors) {
    at::Tensor t = tensor.detach().cpu().contiguous();
    header[name] = {{"dtype", dtypeCode(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + static_cast<int64_t>(t.nbytes())}}};
    offset += static_cast<int64_t>(t.nbytes());
    data.push_back(t);
  }
  if (!metadata.empty()) {
    nlohmann::json meta = nlohmann::json::object();
    for (const auto &[k, v] : metadata)
      meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' '); // align the data to 8 bytes
  uint64_t length = text.size();
  unsigned char lengthBytes[8];
  for (int i = 0; i < 8; ++i)
    lengthBytes[i] = static_cast<unsigned char>(length >> (8 * i));

  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      throw std::runtime_error(path + ": cannot write");
    out.write(reinterpret_cast<const char *>(lengthBytes), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const at::Tensor &t : data)
      out.write(static_cast<const char *>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    if (!out) {
      std::remove(tmp.c_str());
      throw std::runtime_error(path + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot write");
  }
}

} // namespace bmt::runtime
