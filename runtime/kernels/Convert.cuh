//===- Convert.cuh - float32 to and from the kernels' element types -*- CUDA -*-===//
//
// Device helpers shared by the runtime's CUDA kernels (exec/kernels,
// objectives/kernels, optim/kernels): toFloat widens float32 / bf16 / fp16,
// fromFloat<T> rounds float32 to T to nearest even (as c10::BFloat16 and
// c10::Half do on CUDA).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_KERNELS_CONVERT_CUH
#define BMT_RUNTIME_KERNELS_CONVERT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace bmt::runtime::kernels {

__device__ __forceinline__ float toFloat(float x) { return x; }
__device__ __forceinline__ float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float toFloat(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T fromFloat(float x);
template <> __device__ __forceinline__ float fromFloat<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half fromFloat<__half>(float x) {
  return __float2half_rn(x);
}

} // namespace bmt::runtime::kernels

#endif // BMT_RUNTIME_KERNELS_CONVERT_CUH
