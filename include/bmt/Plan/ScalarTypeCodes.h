//===- ScalarTypeCodes.h - dtype codes as programs write them ---*- C++ -*-===//
//
// A dtype argument of an ATen call (aten::to.dtype's `dtype`, softmax's
// `dtype`) is an integer: c10::ScalarType's numbering, which TorchScript
// programs, bmt.aten ops and plans carry as is. The compiler has no
// LibTorch, so the codes it reads are named here; the runtime checks them
// against c10::ScalarType at compile time (runtime/fusion/Region.cpp).
// Free of MLIR, LLVM and LibTorch.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PLAN_SCALARTYPECODES_H
#define BMT_PLAN_SCALARTYPECODES_H

#include <cstdint>

namespace bmt::scalar_type {

inline constexpr int64_t kByte = 0;
inline constexpr int64_t kChar = 1;
inline constexpr int64_t kShort = 2;
inline constexpr int64_t kInt = 3;
inline constexpr int64_t kLong = 4;
inline constexpr int64_t kHalf = 5;
inline constexpr int64_t kFloat = 6;
inline constexpr int64_t kDouble = 7;
inline constexpr int64_t kBool = 11;
inline constexpr int64_t kBFloat16 = 15;

/// Whether `code` is a floating dtype: float16, float32, float64, bfloat16.
inline constexpr bool isFloating(int64_t code) {
  return code == kHalf || code == kFloat || code == kDouble || code == kBFloat16;
}

} // namespace bmt::scalar_type

#endif // BMT_PLAN_SCALARTYPECODES_H
