//===- ColumnSum.cu - sums over the rows of a matrix ----------------------===//
//
// A bias's gradient (the sum over tokens of the output gradient, [tokens,
// out] -> [out]) and the column partials of a fused row kernel's norm
// weight ([blocks, D] -> [D]). A block covers a tile of 32 * kVec columns
// and a range of rows: 32 threads across the tile, each with kVec adjacent
// columns read by one 16-byte load (scalar loads where the pointer or the
// width does not allow it), 8 threads down the rows; the 8 partial sums of
// a column are added in shared memory. Where one range of rows would leave
// the device with too few blocks, the rows are split and a second kernel
// adds the splits' float32 partials in split order. Every order is fixed:
// the result does not depend on timing.
//
//===----------------------------------------------------------------------===//

#include "ColumnSumKernels.h"
#include "kernels/Convert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace bmt::runtime::kernels {

namespace {

constexpr int kLanes = 32; ///< threads across a tile
constexpr int kRowsPerBlock = 8; ///< threads down the rows

/// Block (x, y) sums rows [y * rowsPerSplit, min(rows, (y + 1) * rowsPerSplit))
/// of columns [x * kLanes * Vec, ...): into out (splits == 1, type Out) or
/// into partials[y * cols + c] (float32).
template <typename In, typename Out, int Vec>
__global__ void __launch_bounds__(kLanes * kRowsPerBlock)
    columnSumKernel(const In *__restrict__ in, int64_t rows, int64_t cols, int64_t rowsPerSplit,
                    Out *__restrict__ out, float *__restrict__ partials) {
  __shared__ float shared[kRowsPerBlock][kLanes * Vec];
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) * kLanes + threadIdx.x) * Vec;
  const int64_t rowBegin = static_cast<int64_t>(blockIdx.y) * rowsPerSplit;
  const int64_t rowEnd = rowBegin + rowsPerSplit < rows ? rowBegin + rowsPerSplit : rows;
  float acc[Vec];
#pragma unroll
  for (int v = 0; v < Vec; ++v)
    acc[v] = 0.f;
  if (col0 < cols) {
    for (int64_t r = rowBegin + threadIdx.y; r < rowEnd; r += kRowsPerBlock) {
      const In *p = in + r * cols + col0;
      if constexpr (Vec * sizeof(In) == 16) {
        // cols % Vec == 0 and a 16-byte aligned base (the launcher checks).
        union {
          uint4 raw;
          In e[Vec];
        } u;
        u.raw = __ldg(reinterpret_cast<const uint4 *>(p));
#pragma unroll
        for (int v = 0; v < Vec; ++v)
          acc[v] += toFloat(u.e[v]);
      } else {
#pragma unroll
        for (int v = 0; v < Vec; ++v)
          if (col0 + v < cols)
            acc[v] += toFloat(p[v]);
      }
    }
  }
#pragma unroll
  for (int v = 0; v < Vec; ++v)
    shared[threadIdx.y][threadIdx.x * Vec + v] = acc[v];
  __syncthreads();
  // Thread (x, y) adds the 8 partials of columns y, y + 8, ... of its tile.
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * kLanes * Vec;
  for (int c = threadIdx.y * kLanes + threadIdx.x; c < kLanes * Vec; c += kLanes * kRowsPerBlock) {
    if (tile0 + c >= cols)
      continue;
    float s = shared[0][c];
#pragma unroll
    for (int y = 1; y < kRowsPerBlock; ++y)
      s += shared[y][c];
    if (partials)
      partials[static_cast<int64_t>(blockIdx.y) * cols + tile0 + c] = s;
    else
      out[tile0 + c] = fromFloat<Out>(s);
  }
}

/// out[c] = sum over s of partials[s * cols + c], in split order.
template <typename Out>
__global__ void addSplitsKernel(const float *__restrict__ partials, int64_t splits, int64_t cols,
                                Out *__restrict__ out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols)
    return;
  float s = 0.f;
  for (int64_t k = 0; k < splits; ++k)
    s += partials[k * cols + c];
  out[c] = fromFloat<Out>(s);
}

int elementBytes(SumElement e) { return e == SumElement::Float32 ? 4 : 2; }

template <typename In, typename Out>
int launchTyped(const void *in, int64_t rows, int64_t cols, void *out, float *workspace,
                int64_t splits, cudaStream_t stream) {
  constexpr int Vec = 16 / sizeof(In);
  const int64_t rowsPerSplit = (rows + splits - 1) / splits;
  float *partials = splits > 1 ? workspace : nullptr;
  const dim3 threads(kLanes, kRowsPerBlock);
  const bool vector = cols % Vec == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0;
  const int64_t tile = kLanes * (vector ? Vec : 1);
  const dim3 blocks(static_cast<unsigned>((cols + tile - 1) / tile), static_cast<unsigned>(splits));
  if (vector)
    columnSumKernel<In, Out, Vec><<<blocks, threads, 0, stream>>>(
        static_cast<const In *>(in), rows, cols, rowsPerSplit, static_cast<Out *>(out), partials);
  else
    columnSumKernel<In, Out, 1><<<blocks, threads, 0, stream>>>(
        static_cast<const In *>(in), rows, cols, rowsPerSplit, static_cast<Out *>(out), partials);
  if (splits > 1)
    addSplitsKernel<Out><<<static_cast<unsigned>((cols + 255) / 256), 256, 0, stream>>>(
        workspace, splits, cols, static_cast<Out *>(out));
  return static_cast<int>(cudaGetLastError());
}

template <typename In>
int launchIn(const void *in, int64_t rows, int64_t cols, void *out, SumElement outType,
             float *workspace, int64_t splits, cudaStream_t stream) {
  switch (outType) {
  case SumElement::Float32:
    return launchTyped<In, float>(in, rows, cols, out, workspace, splits, stream);
  case SumElement::BFloat16:
    return launchTyped<In, __nv_bfloat16>(in, rows, cols, out, workspace, splits, stream);
  case SumElement::Float16:
    return launchTyped<In, __half>(in, rows, cols, out, workspace, splits, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

} // namespace

int64_t columnSumSplits(int64_t rows, int64_t cols, SumElement in, int sms) {
  // About 4 blocks a multiprocessor (one block's share of the bandwidth
  // reads only some 30 KB a microsecond), each over at least 64 rows.
  const int64_t tile = kLanes * (16 / elementBytes(in));
  const int64_t tiles = (cols + tile - 1) / tile;
  const int64_t wanted = (4 * static_cast<int64_t>(std::max(sms, 1)) + tiles - 1) / tiles;
  return std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, rows / 64));
}

int columnSum(const void *in, SumElement inType, int64_t rows, int64_t cols, void *out,
              SumElement outType, float *workspace, int64_t splits, cudaStream_t stream) {
  if (rows < 1 || cols < 1 || splits < 1)
    return static_cast<int>(cudaErrorInvalidValue);
  if (splits > 1 && !workspace)
    return static_cast<int>(cudaErrorInvalidValue);
  switch (inType) {
  case SumElement::Float32:
    return launchIn<float>(in, rows, cols, out, outType, workspace, splits, stream);
  case SumElement::BFloat16:
    return launchIn<__nv_bfloat16>(in, rows, cols, out, outType, workspace, splits, stream);
  case SumElement::Float16:
    return launchIn<__half>(in, rows, cols, out, outType, workspace, splits, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

} // namespace bmt::runtime::kernels
