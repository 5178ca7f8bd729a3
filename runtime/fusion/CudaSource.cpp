//===- CudaSource.cpp - CUDA C++ for a fused region's graph ---------------===//
//
// One kernel per graph, self-contained (no #include: NVRTC compiles it
// without the toolkit's headers). bf16 and fp16 are stored as 16-bit
// integers and converted by bit manipulation (bf16, round to nearest even)
// or PTX cvt (fp16); math is float.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/fusion/Region.h"

#include <cstdio>
#include <algorithm>
#include <functional>
#include <set>
#include <sstream>

namespace bmt::fusion {

namespace {

const char *kPreamble = R"(namespace bmt_fused {
constexpr int kMaxTensors = 16;
constexpr int kMaxDims = 6;
// n: elements (pointwise) or rows (row kernels) of the element shape;
// sizes[0..ndim): the element shape (collapsed); tensors[k]: inputs, then
// a grad_output per result (backward), then outputs; strides[k][d] in elements (outputs
// are contiguous: element-valued ones in the element shape, row-valued ones
// one value per row).
// vec (pointwise kernels; the host checks): 1 when the element shape is one
// dim that every tensor walks with stride 1 or 0 and the stride-1 ones are
// 16-byte aligned; 2 when the last dim's size is a multiple of 8, every
// tensor's last stride is 1 or 0, and the stride-1 ones are 16-byte aligned
// with their other strides multiples of 8. Both move 8 elements a thread
// with 16-byte loads.
struct Args {
  long long n;
  int ndim;
  int vec;
  long long sizes[kMaxDims];
  void *tensors[kMaxTensors];
  long long strides[kMaxTensors][kMaxDims];
};
__device__ __forceinline__ float ld(const float *p, long long o) { return p[o]; }
__device__ __forceinline__ float ld(const unsigned short *p, long long o, int bf16) {
  unsigned short h = p[o];
  if (bf16) return __uint_as_float(((unsigned int)h) << 16);
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
__device__ __forceinline__ unsigned short to_f16(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float round_bf16(float f) { return __uint_as_float(((unsigned int)to_bf16(f)) << 16); }
__device__ __forceinline__ float round_f16(float f) {
  unsigned short h = to_f16(f); float r; asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h)); return r;
}
__device__ __forceinline__ float from_half(unsigned short h, int bf16) {
  if (bf16) return __uint_as_float(((unsigned int)h) << 16);
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
// 8 elements from p + i (s == 1: 16-byte aligned) or p[0] broadcast (s == 0).
__device__ __forceinline__ void ld8(const float *p, long long i, long long s, float *x) {
  if (s == 0) { float v = p[0]; for (int u = 0; u < 8; ++u) x[u] = v; return; }
  float4 a = *(const float4 *)(p + i), b = *(const float4 *)(p + i + 4);
  x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
}
__device__ __forceinline__ void ld8(const unsigned short *p, long long i, long long s, int bf16, float *x) {
  if (s == 0) { float v = from_half(p[0], bf16); for (int u = 0; u < 8; ++u) x[u] = v; return; }
  uint4 w = *(const uint4 *)(p + i);
  unsigned int q[4] = {w.x, w.y, w.z, w.w};
  for (int u = 0; u < 4; ++u) {
    x[2 * u] = from_half((unsigned short)(q[u] & 0xffffu), bf16);
    x[2 * u + 1] = from_half((unsigned short)(q[u] >> 16), bf16);
  }
}
// 8 16-bit values from p + i (s == 1: 16-byte aligned) or p[0] broadcast
// (s == 0), kept packed: two to a word, the first in the low half.
__device__ __forceinline__ void ld8_packed(const unsigned short *p, long long i, long long s, unsigned int *q) {
  if (s == 0) { unsigned int h = p[0]; h |= h << 16; q[0] = q[1] = q[2] = q[3] = h; return; }
  uint4 w = *(const uint4 *)(p + i);
  q[0] = w.x; q[1] = w.y; q[2] = w.z; q[3] = w.w;
}
// Value u of a packed run's word w (w holds values u & ~1 and u | 1).
__device__ __forceinline__ float half_at(unsigned int w, int u, int bf16) {
  return from_half((unsigned short)((u & 1) ? (w >> 16) : (w & 0xffffu)), bf16);
}
__device__ __forceinline__ void st8(float *p, long long i, const float *y) {
  *(float4 *)(p + i) = make_float4(y[0], y[1], y[2], y[3]);
  *(float4 *)(p + i + 4) = make_float4(y[4], y[5], y[6], y[7]);
}
__device__ __forceinline__ void st8(unsigned short *p, long long i, const float *y, int bf16) {
  unsigned int q[4];
  for (int u = 0; u < 4; ++u) {
    unsigned int lo = bf16 ? to_bf16(y[2 * u]) : to_f16(y[2 * u]);
    unsigned int hi = bf16 ? to_bf16(y[2 * u + 1]) : to_f16(y[2 * u + 1]);
    q[u] = lo | (hi << 16);
  }
  *(uint4 *)(p + i) = make_uint4(q[0], q[1], q[2], q[3]);
}
__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float block_sum(float v, float *red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  int warps = (blockDim.x + 31) >> 5;
  v = (int)(threadIdx.x & 31) < warps ? red[threadIdx.x & 31] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float block_max(float v, float *red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  int warps = (blockDim.x + 31) >> 5;
  v = (int)(threadIdx.x & 31) < warps ? red[threadIdx.x & 31] : neg_inf();
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
} // namespace bmt_fused
)";

std::string literal(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9ef", v);
  return buf;
}

std::string ctype(c10::ScalarType t) {
  return t == c10::ScalarType::Float ? "float" : "unsigned short";
}

/// The expression loading tensor slot `k` of dtype `t` at offset `o`.
std::string load(int k, c10::ScalarType t, const std::string &o) {
  std::string p = "((const " + ctype(t) + " *)a.tensors[" + std::to_string(k) + "])";
  if (t == c10::ScalarType::Float)
    return "bmt_fused::ld(" + p + ", " + o + ")";
  return "bmt_fused::ld(" + p + ", " + o + ", " +
         (t == c10::ScalarType::BFloat16 ? "1" : "0") + ")";
}

std::string store(int k, c10::ScalarType t, const std::string &o, const std::string &v) {
  std::string p = "((" + ctype(t) + " *)a.tensors[" + std::to_string(k) + "])[" + o + "]";
  if (t == c10::ScalarType::Float)
    return p + " = " + v + ";";
  if (t == c10::ScalarType::BFloat16)
    return p + " = bmt_fused::to_bf16(" + v + ");";
  return p + " = bmt_fused::to_f16(" + v + ");";
}

/// The C expression of node `i` from its arguments' variables.
std::string expression(const Graph &g, int i, const std::function<std::string(int)> &var,
                       const std::function<std::string(int)> &loadOf) {
  const Node &n = g.nodes[i];
  auto A = [&](int k) { return var(n.args[k]); };
  switch (n.op) {
  case Op::Input:
  case Op::GradOut: return loadOf(i);
  case Op::Const: return literal(n.value);
  case Op::RowLen: return "(float)D";
  case Op::Add: return A(0) + " + " + A(1);
  case Op::Sub: return A(0) + " - " + A(1);
  case Op::Mul: return A(0) + " * " + A(1);
  case Op::Div: return A(0) + " / " + A(1);
  case Op::Neg: return "-" + A(0);
  case Op::Pow:
    if (n.value == 2) return A(0) + " * " + A(0);
    if (n.value == 3) return A(0) + " * " + A(0) + " * " + A(0);
    if (n.value == 0.5) return "sqrtf(" + A(0) + ")";
    return "powf(" + A(0) + ", " + literal(n.value) + ")";
  case Op::Sqrt: return "sqrtf(" + A(0) + ")";
  case Op::Rsqrt: return "rsqrtf(" + A(0) + ")";
  case Op::Exp: return "expf(" + A(0) + ")";
  case Op::Log: return "logf(" + A(0) + ")";
  case Op::Tanh: return "tanhf(" + A(0) + ")";
  case Op::Sigmoid: return "bmt_fused::sigmoidf_(" + A(0) + ")";
  case Op::Relu: return A(0) + " > 0.f ? " + A(0) + " : 0.f";
  case Op::Silu: return A(0) + " * bmt_fused::sigmoidf_(" + A(0) + ")";
  case Op::Erf: return "erff(" + A(0) + ")";
  case Op::Cos: return "cosf(" + A(0) + ")";
  case Op::Sin: return "sinf(" + A(0) + ")";
  case Op::GeluErf: return "0.5f * " + A(0) + " * (1.f + erff(" + A(0) + " * 0.70710678118654752f))";
  case Op::GeluTanh:
    return "0.5f * " + A(0) + " * (1.f + tanhf(0.7978845608028654f * (" + A(0) + " + 0.044715f * " +
           A(0) + " * " + A(0) + " * " + A(0) + ")))";
  case Op::Step: return A(0) + " > 0.f ? 1.f : 0.f";
  case Op::Cast:
    if (n.dtype == c10::ScalarType::BFloat16) return "bmt_fused::round_bf16(" + A(0) + ")";
    if (n.dtype == c10::ScalarType::Half) return "bmt_fused::round_f16(" + A(0) + ")";
    return A(0);
  case Op::Round: return "0.f"; // resolved into a Cast before the source is made
  case Op::RowSum:
  case Op::RowMax: return var(i); // computed by its phase
  case Op::HalfSign: return "sgn";  // the caller's, from the column
  }
  return "0.f";
}

/// Node i's level: how many row reductions lie on its deepest path (inputs 0).
std::vector<int> levels(const Graph &g) {
  std::vector<int> level(g.nodes.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (int a : g.nodes[i].args)
      level[i] = std::max(level[i], level[a]);
    if (isRowReduction(g.nodes[i].op))
      level[i] += 1;
  }
  return level;
}

/// The row reductions of `g` by level: [L - 1] holds those of level L
/// (levels()), each level one pass over the row.
std::vector<std::vector<int>> rowReductionsByLevel(const Graph &g) {
  std::vector<int> level = levels(g);
  std::vector<std::vector<int>> byLevel;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (isRowReduction(g.nodes[i].op)) {
      if (byLevel.size() < static_cast<size_t>(level[i]))
        byLevel.resize(level[i]);
      byLevel[level[i] - 1].push_back(static_cast<int>(i));
    }
  return byLevel;
}

/// A row reduction's accumulator: its start, how a value joins it, and the
/// block-wide combination (max starts at -inf; fmaxf skips a NaN, which
/// the exp(x - max) after it carries on).
std::string accStart(const Node &n) { return n.op == Op::RowMax ? "bmt_fused::neg_inf()" : "0.f"; }
std::string accJoin(const Node &n, const std::string &acc, const std::string &v) {
  return n.op == Op::RowMax ? acc + " = fmaxf(" + acc + ", " + v + ");" : acc + " += " + v + ";";
}
std::string blockReduce(const Node &n) {
  return n.op == Op::RowMax ? "bmt_fused::block_max" : "bmt_fused::block_sum";
}

/// Code computing b<slot>, the offset of row r in each slot's tensor, from
/// the dims before the last.
std::string rowBases(const std::vector<int> &slots, const std::string &row = "r") {
  std::string c;
  for (int k : slots)
    c += "    long long b" + std::to_string(k) + " = 0;\n";
  c += "    long long rem = " + row + ";\n"
       "    for (int d = a.ndim - 2; d >= 0; --d) {\n"
       "      long long idx = rem % a.sizes[d]; rem /= a.sizes[d];\n";
  for (int k : slots)
    c += "      b" + std::to_string(k) + " += idx * a.strides[" + std::to_string(k) + "][d];\n";
  return c + "    }\n";
}

using EmitNodes = std::function<void(std::ostringstream &, const std::vector<int> &, const std::set<int> &,
                                      const std::string &, const std::function<std::string(int)> &)>;

/// The 8-wide row kernel (RowVector): one block per row, thread t holding
/// columns [8 (t + c blockDim), +8) for c < kRowChunks of every input in
/// registers (a 16-bit input packed, two values to a register), loaded once
/// with 16-byte loads; each row-sum level is a pass
/// over the registers and a block sum; element outputs are stored 8 at a
/// time, column sums accumulated over the block's rows and written once.
std::string rowVectorKernel(const Graph &g, const std::vector<int> &outs, const std::string &name,
                            const std::vector<c10::ScalarType> &outDtypes, const RowVector &rv,
                            const std::vector<int> &slots, int firstOut,
                            const std::function<c10::ScalarType(int)> &slotDtype,
                            const std::function<int(const Node &)> &slotOf,
                            const EmitNodes &emitNodes) {
  if (rv.columnSums.size() != outs.size())
    throw FusionError("fused region: RowVector::columnSums needs one entry per output");
  std::vector<bool> row = g.rowValued();
  bool hasGrad = false;
  for (const Node &n : g.nodes)
    hasGrad = hasGrad || n.op == Op::GradOut;
  auto half = [](c10::ScalarType t) { return t == c10::ScalarType::BFloat16 ? "1" : "0"; };
  auto x = [](int k) { return "x" + std::to_string(k); };
  auto var = [](int i) { return "v" + std::to_string(i); };
  // A 16-bit slot stays packed in registers (4 words for 8 values, half a
  // float row's registers: more blocks an SM) and is unpacked where read.
  auto packed = [&](int k) { return slotDtype(k) != c10::ScalarType::Float; };
  auto loader = [&](int i) {
    const int k = slotOf(g.nodes[i]);
    if (!packed(k))
      return x(k) + "[c][u]";
    return "bmt_fused::half_at(" + x(k) + "[c][u >> 1], u, " + half(slotDtype(k)) + ")";
  };
  const std::string C = std::to_string(kRowChunks);
  std::ostringstream s;
  s << "extern \"C\" __global__ void " << name << "(bmt_fused::Args a) {\n"
       "  __shared__ float red[32];\n"
       "  const long long D = a.sizes[a.ndim - 1];\n"
       "  const int D8 = (int)(D >> 3);\n";
  for (size_t k = 0; k < outs.size(); ++k)
    if (rv.columnSums[k])
      s << "  float cs" << k << "[" << C << "][8] = {};\n";
  // The registers of one row's inputs (prefix x: the row computed, n: the
  // next row of the block, loaded while this one is reduced and stored).
  auto declare = [&](const std::string &prefix) {
    std::string c;
    for (int k : slots)
      c += std::string("    ") + (packed(k) ? "unsigned int " : "float ") + prefix + std::to_string(k) +
           "[" + C + "]" + (packed(k) ? "[4]" : "[8]") + ";\n";
    return c;
  };
  auto loadRow = [&](const std::string &row, const std::string &prefix) {
    std::string c = "    {\n" + rowBases(slots, row) +
                    "#pragma unroll\n    for (int c = 0; c < " + C + "; ++c) {\n"
                    "      const int col = threadIdx.x + c * blockDim.x;\n"
                    "      if (col >= D8) continue;\n";
    for (int k : slots) {
      c10::ScalarType t = slotDtype(k);
      c += std::string("      bmt_fused::") + (packed(k) ? "ld8_packed" : "ld8") + "((const " + ctype(t) +
           " *)a.tensors[" + std::to_string(k) + "] + b" + std::to_string(k) +
           ", (long long)col * 8, a.strides[" + std::to_string(k) + "][a.ndim - 1], " + prefix +
           std::to_string(k) + "[c]);\n";
    }
    return c + "    }\n    }\n";
  };
  if (rv.prefetch) {
    // Software pipelining: a block's next row is in flight while this one
    // is reduced and stored (a block walks several rows, and the row sums'
    // block barriers otherwise leave its loads waiting on memory latency).
    s << declare("x") << "  if (blockIdx.x < a.n)\n" << loadRow("blockIdx.x", "x");
    s << "  for (long long r = blockIdx.x; r < a.n; r += gridDim.x) {\n" << declare("n")
      << "    if (r + gridDim.x < a.n)\n" << loadRow("r + gridDim.x", "n");
  } else {
    s << "  for (long long r = blockIdx.x; r < a.n; r += gridDim.x) {\n" << declare("x")
      << loadRow("r", "x");
  }
  std::set<int> done;
  for (const std::vector<int> &sums : rowReductionsByLevel(g)) {
    for (int r : sums)
      s << "    float acc" << r << " = " << accStart(g.nodes[r]) << ";\n";
    s << "#pragma unroll\n    for (int c = 0; c < " << C << "; ++c) {\n"
         "      if (threadIdx.x + c * blockDim.x >= D8) continue;\n"
         "#pragma unroll\n      for (int u = 0; u < 8; ++u) {\n";
    std::ostringstream body;
    emitNodes(body, sums, done, "        ", loader);
    s << body.str();
    for (int r : sums)
      s << "        " << accJoin(g.nodes[r], "acc" + std::to_string(r), var(g.nodes[r].args[0])) << "\n";
    s << "      }\n    }\n";
    for (int r : sums) {
      s << "    const float " << var(r) << " = " << blockReduce(g.nodes[r]) << "(acc" << r << ", red);\n";
      done.insert(r);
    }
  }
  const bool forwardRowResult = !hasGrad && outs.size() == 1 && row[outs[0]];
  if (forwardRowResult) {
    s << "    if (threadIdx.x == 0) {\n";
    emitNodes(s, outs, done, "      ", loader);
    s << "      " << store(firstOut, outDtypes.at(0), "r", var(outs[0])) << "\n    }\n";
  } else {
    s << "#pragma unroll\n    for (int c = 0; c < " << C << "; ++c) {\n"
         "      const int col = threadIdx.x + c * blockDim.x;\n"
         "      if (col >= D8) continue;\n";
    for (size_t k = 0; k < outs.size(); ++k)
      if (!rv.columnSums[k])
        s << "      float y" << k << "[8];\n";
    s << "#pragma unroll\n      for (int u = 0; u < 8; ++u) {\n";
    emitNodes(s, outs, done, "        ", loader);
    for (size_t k = 0; k < outs.size(); ++k)
      s << "        " << (rv.columnSums[k] ? "cs" : "y") << k << (rv.columnSums[k] ? "[c][u] += " : "[u] = ")
        << var(outs[k]) << ";\n";
    s << "      }\n";
    for (size_t k = 0; k < outs.size(); ++k) {
      if (rv.columnSums[k])
        continue;
      c10::ScalarType t = outDtypes.at(k);
      s << "      bmt_fused::st8((" << ctype(t) << " *)a.tensors[" << firstOut + static_cast<int>(k)
        << "], r * D + (long long)col * 8, y" << k
        << (t == c10::ScalarType::Float ? "" : std::string(", ") + half(t)) << ");\n";
    }
    s << "    }\n";
  }
  s << "    __syncthreads();\n";
  if (rv.prefetch) {
    s << "#pragma unroll\n    for (int c = 0; c < " << C << "; ++c) {\n";
    for (int k : slots)
      s << "#pragma unroll\n      for (int w = 0; w < " << (packed(k) ? 4 : 8) << "; ++w) " << x(k)
        << "[c][w] = n" << k << "[c][w];\n";
    s << "    }\n";
  }
  s << "  }\n";
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!rv.columnSums[k])
      continue;
    if (outDtypes.at(k) != c10::ScalarType::Float)
      throw FusionError("fused region: column sums are float32");
    s << "#pragma unroll\n  for (int c = 0; c < " << C << "; ++c) {\n"
         "    const int col = threadIdx.x + c * blockDim.x;\n"
         "    if (col < D8)\n"
         "      bmt_fused::st8((float *)a.tensors[" << firstOut + static_cast<int>(k)
      << "], blockIdx.x * D + (long long)col * 8, cs" << k << "[c]);\n  }\n";
  }
  s << "}\n";
  return s.str();
}

} // namespace

std::string cudaSource(const Graph &graph, const std::vector<int> &outs, const std::string &name,
                       const std::vector<c10::ScalarType> &inputDtypes,
                       const std::vector<c10::ScalarType> &gradDtypes,
                       const std::vector<c10::ScalarType> &outDtypes, const RowVector *rowVector) {
  const Graph g = resolveRounding(graph, inputDtypes);
  const int numInputs = static_cast<int>(inputDtypes.size());
  const int numGrads = static_cast<int>(gradDtypes.size());
  bool hasGrad = false;
  for (const Node &n : g.nodes) {
    if (n.op != Op::GradOut)
      continue;
    hasGrad = true;
    if (n.index < 0 || n.index >= numGrads)
      throw FusionError("fused region: a grad_output dtype per result is needed");
  }
  // Slots: the inputs, a grad_output per result, the outputs.
  auto slotOf = [numInputs](const Node &n) { return n.op == Op::GradOut ? numInputs + n.index : n.index; };
  auto slotDtype = [&](int k) { return k >= numInputs ? gradDtypes.at(k - numInputs) : inputDtypes.at(k); };
  const int firstOut = numInputs + numGrads;
  if (firstOut + static_cast<int>(outs.size()) > kMaxTensors)
    throw FusionError("fused region: more than " + std::to_string(kMaxTensors) + " tensors");
  std::vector<bool> row = g.rowValued();
  bool rowKernel = false;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    rowKernel = rowKernel || isRowReduction(g.nodes[i].op);

  std::ostringstream s;
  s << kPreamble;
  auto var = [](int i) { return "v" + std::to_string(i); };
  auto loadOf = [&](int i) -> std::string {
    int k = slotOf(g.nodes[i]);
    return load(k, slotDtype(k), "o" + std::to_string(k));
  };
  // The slots whose offsets a loop body needs.
  std::vector<int> slots;
  for (int k = 0; k < numInputs + (hasGrad ? numGrads : 0); ++k)
    slots.push_back(k);

  // Emits the definitions of every node `targets` need, in topological
  // order, skipping nodes in `done` (row sums of earlier phases).
  auto emitNodes = [&](std::ostringstream &o, const std::vector<int> &targets,
                       const std::set<int> &done, const std::string &indent,
                       const std::function<std::string(int)> &loader) {
    std::vector<bool> need(g.nodes.size(), false);
    std::function<void(int)> mark = [&](int i) {
      if (need[i] || done.count(i))
        return;
      need[i] = true;
      if (isRowReduction(g.nodes[i].op))
        return; // a row reduction of this phase is accumulated, not recomputed
      for (int a : g.nodes[i].args)
        mark(a);
    };
    for (int t : targets)
      for (int a : isRowReduction(g.nodes[t].op) && !done.count(t) ? g.nodes[t].args
                                                                  : std::vector<int>{t})
        mark(a);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (!need[i] || isRowReduction(g.nodes[i].op))
        continue;
      std::string e = expression(g, static_cast<int>(i), var, loader);
      o << indent << "float " << var(static_cast<int>(i)) << " = " << e << ";\n";
    }
  };

  const bool halves = g.usesHalves();
  if (!rowKernel) {
    // The element values as a function of the loaded inputs (x<slot>, and
    // xs<slot> read half-swapped; sgn: HalfSign at the element's column),
    // called by each of the kernel's loops; loads only the slots it uses.
    std::vector<bool> need(g.nodes.size(), false);
    std::function<void(int)> mark = [&](int i) {
      if (need[i])
        return;
      need[i] = true;
      for (int a : g.nodes[i].args)
        mark(a);
    };
    for (int o : outs)
      mark(o);
    std::vector<int> used, usedSwapped;
    bool sign = false;
    for (size_t i = 0; i < g.nodes.size(); ++i)
      sign = sign || (need[i] && g.nodes[i].op == Op::HalfSign);
    for (bool swapped : {false, true})
      for (int k : slots) {
        bool u = false;
        for (size_t i = 0; i < g.nodes.size(); ++i)
          u = u || (need[i] && g.nodes[i].swapped == swapped &&
                    (g.nodes[i].op == Op::GradOut || g.nodes[i].op == Op::Input) &&
                    slotOf(g.nodes[i]) == k);
        if (u)
          (swapped ? usedSwapped : used).push_back(k);
      }
    std::vector<int> loaded = used; // the slots whose offsets the loops compute
    for (int k : usedSwapped)
      if (std::find(used.begin(), used.end(), k) == used.end())
        loaded.push_back(k);
    auto x = [](int k) { return "x" + std::to_string(k); };
    auto xs = [](int k) { return "xs" + std::to_string(k); };
    auto y = [](size_t k) { return "y" + std::to_string(k); };
    auto half = [](c10::ScalarType t) { return t == c10::ScalarType::BFloat16 ? "1" : "0"; };
    auto ptr = [&](int k, c10::ScalarType t, bool out) {
      return std::string("((") + (out ? "" : "const ") + ctype(t) + " *)a.tensors[" +
             std::to_string(k) + "])";
    };
    s << "__device__ __forceinline__ void bmt_body_" << name << "(";
    std::string sep;
    for (int k : used) {
      s << sep << "float " << x(k);
      sep = ", ";
    }
    for (int k : usedSwapped) {
      s << sep << "float " << xs(k);
      sep = ", ";
    }
    if (sign) {
      s << sep << "float sgn";
      sep = ", ";
    }
    for (size_t k = 0; k < outs.size(); ++k) {
      s << sep << "float &" << y(k);
      sep = ", ";
    }
    s << ") {\n";
    auto bodyLoad = [&](int i) -> std::string {
      const Node &n = g.nodes[i];
      int k = slotOf(n);
      return n.swapped ? xs(k) : x(k);
    };
    emitNodes(s, outs, {}, "  ", bodyLoad);
    for (size_t k = 0; k < outs.size(); ++k)
      s << "  " << y(k) << " = " << var(outs[k]) << ";\n";
    s << "}\n";
    // With halves: the column j of element i and what it gives, the
    // partner's offset dsw (times a tensor's last stride) and sgn.
    auto column = [&](const std::string &indent, const std::string &j) {
      if (!halves)
        return std::string();
      return indent + "const long long H = a.sizes[a.ndim - 1] >> 1, jc = " + j + ";\n" + indent +
             "const long long dsw = jc < H ? H : -H;\n" + indent +
             "const float sgn = jc < H ? -1.f : 1.f; (void)sgn;\n";
    };
    auto swappedOffset = [](int k) {
      std::string ks = std::to_string(k);
      return "o" + ks + " + dsw * a.strides[" + ks + "][a.ndim - 1]";
    };
    // One call of the body at element i with offsets o<slot>.
    auto call = [&](const std::string &indent, const std::string &elem) {
      std::string c;
      for (size_t k = 0; k < outs.size(); ++k)
        c += indent + "float " + y(k) + ";\n";
      c += indent + "bmt_body_" + name + "(";
      std::string sp;
      for (int k : used) {
        c += sp + load(k, slotDtype(k), "o" + std::to_string(k));
        sp = ", ";
      }
      for (int k : usedSwapped) {
        c += sp + load(k, slotDtype(k), swappedOffset(k));
        sp = ", ";
      }
      if (sign) {
        c += sp + "sgn";
        sp = ", ";
      }
      for (size_t k = 0; k < outs.size(); ++k) {
        c += sp + y(k);
        sp = ", ";
      }
      c += ");\n";
      for (size_t k = 0; k < outs.size(); ++k)
        c += indent + store(firstOut + static_cast<int>(k), outDtypes.at(k), elem, y(k)) + "\n";
      return c;
    };
    s << "extern \"C\" __global__ void " << name << "(bmt_fused::Args a) {\n"
         "  const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
         "  const long long step = (long long)gridDim.x * blockDim.x;\n";
    // 8 elements a thread from element i: a 16-byte load of each input
    // (ld8 of base(k) + offset, its stride along the last dim `stride(k)`,
    // 0: broadcast), the body 8 times, a 16-byte store of each output.
    auto eight = [&](const std::function<std::string(int)> &base, const std::string &offset,
                     const std::function<std::string(int)> &stride) {
      std::string c;
      auto ld8 = [&](int k, const std::string &var, const std::string &at) {
        c10::ScalarType t = slotDtype(k);
        return "      float " + var + "[8]; bmt_fused::ld8(" + base(k) + ", " + at + ", " + stride(k) +
               ", " + (t == c10::ScalarType::Float ? "" : std::string(half(t)) + ", ") + var + ");\n";
      };
      for (int k : used)
        c += ld8(k, x(k), offset);
      for (int k : usedSwapped) // a run of 8 stays in its half (D / 2 % 8 == 0)
        c += ld8(k, xs(k), offset + " + dsw * " + stride(k));
      for (size_t k = 0; k < outs.size(); ++k)
        c += "      float " + y(k) + "[8];\n";
      c += "#pragma unroll\n      for (int u = 0; u < 8; ++u)\n        bmt_body_" + name + "(";
      std::string sp;
      for (int k : used) {
        c += sp + x(k) + "[u]";
        sp = ", ";
      }
      for (int k : usedSwapped) {
        c += sp + xs(k) + "[u]";
        sp = ", ";
      }
      if (sign) {
        c += sp + "sgn";
        sp = ", ";
      }
      for (size_t k = 0; k < outs.size(); ++k) {
        c += sp + y(k) + "[u]";
        sp = ", ";
      }
      c += ");\n";
      for (size_t k = 0; k < outs.size(); ++k) {
        c10::ScalarType t = outDtypes.at(k);
        c += "      bmt_fused::st8(" + ptr(firstOut + static_cast<int>(k), t, true) + ", i, " +
             y(k) + (t == c10::ScalarType::Float ? "" : std::string(", ") + half(t)) + ");\n";
      }
      return c;
    };
    auto strideOf = [](const std::string &dim) {
      return [dim](int k) { return "a.strides[" + std::to_string(k) + "][" + dim + "]"; };
    };
    // Contiguous (or scalar-broadcast) 1-D: 8 elements a thread, 16-byte
    // loads and stores, then the tail one by one.
    s << "  if (a.vec == 1) {\n"
         "    const long long nv = a.n >> 3;\n"
         "    for (long long v = first; v < nv; v += step) {\n"
         "      const long long i = v << 3;\n";
    s << column("      ", "i");
    s << eight([&](int k) { return ptr(k, slotDtype(k), false); }, "i", strideOf("0"));
    s << "    }\n"
         "    for (long long i = (nv << 3) + first; i < a.n; i += step) {\n";
    for (int k : loaded)
      s << "      const long long o" << k << " = i * a.strides[" << k << "][0];\n";
    s << column("      ", "i") << call("      ", "i") << "    }\n    return;\n  }\n";
    // Last dim in runs of 8 (vec == 2: its size a multiple of 8, every
    // tensor's last stride 1 or 0, the stride-1 ones' row offsets and bases
    // 16-byte aligned): one offset computation and 16-byte accesses per 8.
    // The offsets in 32-bit division where the element count allows (64-bit
    // division per dim made RoPE's kernel bound by its index arithmetic).
    auto runsOfEight = [&](const std::string &index) {
      std::string c = "    for (long long v = first; v < nv; v += step) {\n"
                      "      const long long i = v << 3;\n";
      for (int k : loaded)
        c += "      long long o" + std::to_string(k) + " = 0;\n";
      c += "      " + index + " rem = (" + index + ")i;\n"
           "      for (int d = a.ndim - 1; d >= 0; --d) {\n"
           "        const " + index + " size = (" + index + ")a.sizes[d];\n"
           "        const " + index + " idx = rem % size; rem /= size;\n";
      for (int k : loaded)
        c += "        o" + std::to_string(k) + " += (long long)idx * a.strides[" + std::to_string(k) + "][d];\n";
      c += "      }\n" + column("      ", "(long long)((" + index + ")i % (" + index + ")a.sizes[a.ndim - 1])");
      c += eight([&](int k) { return ptr(k, slotDtype(k), false) + " + o" + std::to_string(k); }, "0",
                 strideOf("a.ndim - 1"));
      return c + "    }\n";
    };
    s << "  if (a.vec == 2) {\n"
         "    const long long nv = a.n >> 3;\n"
         "    if (a.n <= 0x7fffffffLL) {\n"
      << runsOfEight("unsigned int") << "      return;\n    }\n"
      << runsOfEight("long long") << "    return;\n  }\n";
    // General strides: the offsets from the element index, in 32-bit
    // arithmetic where the element count allows (64-bit division is slow).
    auto general = [&](const std::string &index) {
      std::string c = "    for (" + index + " i = first; i < a.n; i += step) {\n";
      for (int k : loaded)
        c += "      long long o" + std::to_string(k) + " = 0;\n";
      c += "      " + index + " rem = i;\n"
           "      for (int d = a.ndim - 1; d >= 0; --d) {\n"
           "        const " + index + " size = (" + index + ")a.sizes[d];\n"
           "        const " + index + " idx = rem % size; rem /= size;\n";
      for (int k : loaded)
        c += "        o" + std::to_string(k) + " += (long long)idx * a.strides[" + std::to_string(k) + "][d];\n";
      c += "      }\n" + column("      ", "(long long)(i % (" + index + ")a.sizes[a.ndim - 1])") +
           call("      ", "i") + "    }\n";
      return c;
    };
    s << "  if (a.n <= 0x7fffffffLL) {\n" << general("unsigned int") << "    return;\n  }\n"
      << "  {\n" << general("long long") << "  }\n}\n";
    return s.str();
  }

  if (halves)
    throw FusionError("fused region: rotate_half in a region with a reduction");
  if (rowVector)
    return s.str() + rowVectorKernel(g, outs, name, outDtypes, *rowVector, slots, firstOut,
                                     slotDtype, slotOf, emitNodes);
  s << "extern \"C\" __global__ void " << name << "(bmt_fused::Args a) {\n";
  // Row kernel: one block per row (grid-stride over rows).
  s << "  __shared__ float red[32];\n"
       "  const long long D = a.sizes[a.ndim - 1];\n"
       "  for (long long r = blockIdx.x; r < a.n; r += gridDim.x) {\n"
    << rowBases(slots);
  auto columnOffsets = [&](const std::string &indent) {
    std::string o;
    for (int k : slots)
      o += indent + "long long o" + std::to_string(k) + " = b" + std::to_string(k) + " + j * a.strides[" +
           std::to_string(k) + "][a.ndim - 1];\n";
    return o;
  };
  std::set<int> done;
  for (const std::vector<int> &sums : rowReductionsByLevel(g)) {
    for (int r : sums)
      s << "    float acc" << r << " = " << accStart(g.nodes[r]) << ";\n";
    s << "    for (long long j = threadIdx.x; j < D; j += blockDim.x) {\n" << columnOffsets("      ");
    std::ostringstream body;
    emitNodes(body, sums, done, "      ", loadOf);
    s << body.str();
    for (int r : sums)
      s << "      " << accJoin(g.nodes[r], "acc" + std::to_string(r), var(g.nodes[r].args[0])) << "\n";
    s << "    }\n";
    for (int r : sums) {
      s << "    const float " << var(r) << " = " << blockReduce(g.nodes[r]) << "(acc" << r << ", red);\n";
      done.insert(r);
    }
  }
  // Outputs: element-valued ones per column, row-valued ones once per row.
  std::vector<int> elementOuts, rowOuts;
  for (size_t k = 0; k < outs.size(); ++k)
    (row[outs[k]] && g.nodes[outs[k]].op != Op::GradOut ? rowOuts : elementOuts)
        .push_back(static_cast<int>(k));
  // A row-valued gradient of an input is still stored per element.
  bool forwardRowResult = !hasGrad && outs.size() == 1 && row[outs[0]];
  if (!forwardRowResult) {
    elementOuts.clear();
    rowOuts.clear();
    for (size_t k = 0; k < outs.size(); ++k)
      elementOuts.push_back(static_cast<int>(k));
  }
  if (!elementOuts.empty()) {
    s << "    for (long long j = threadIdx.x; j < D; j += blockDim.x) {\n" << columnOffsets("      ");
    std::vector<int> targets;
    for (int k : elementOuts)
      targets.push_back(outs[k]);
    emitNodes(s, targets, done, "      ", loadOf);
    for (int k : elementOuts)
      s << "      " << store(firstOut + k, outDtypes.at(k), "r * D + j", var(outs[k])) << "\n";
    s << "    }\n";
  }
  if (!rowOuts.empty()) {
    s << "    if (threadIdx.x == 0) {\n";
    std::vector<int> targets;
    for (int k : rowOuts)
      targets.push_back(outs[k]);
    emitNodes(s, targets, done, "      ", loadOf);
    for (int k : rowOuts)
      s << "      " << store(firstOut + k, outDtypes.at(k), "r", var(outs[k])) << "\n";
    s << "    }\n";
  }
  s << "    __syncthreads();\n  }\n}\n";
  return s.str();
}

} // namespace bmt::fusion
