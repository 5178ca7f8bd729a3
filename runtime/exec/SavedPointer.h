//===- SavedPointer.h - a pointer in an autograd function's saved data -*- C++ -*-===//
//
// An autograd function's backward may need an object that outlives the
// graph (the executor's hooks, a fused region, the ZeRO storage, a
// communicator). AutogradContext::saved_data holds IValues, which have no
// raw pointer type, so the pointer is stored as an int64.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_SAVEDPOINTER_H
#define BMT_RUNTIME_EXEC_SAVEDPOINTER_H

#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <string>

namespace bmt::runtime {

/// Stores `p` under `key` in ctx->saved_data; the caller keeps *p alive
/// until the backward ran.
inline void savePointer(torch::autograd::AutogradContext *ctx, const std::string &key, void *p) {
  ctx->saved_data[key] = static_cast<int64_t>(reinterpret_cast<intptr_t>(p));
}

/// The pointer savePointer stored under `key`.
template <typename T>
T *savedPointer(torch::autograd::AutogradContext *ctx, const std::string &key) {
  return reinterpret_cast<T *>(static_cast<intptr_t>(ctx->saved_data[key].toInt()));
}

} // namespace bmt::runtime

#endif // BMT_RUNTIME_EXEC_SAVEDPOINTER_H
