//===- Region.h - fused regions: expressions, derivatives, CPU and CUDA ---===//
//
// A fused region (bmt.fused, made by bmt-opt --bmt-fuse-elementwise) as an
// expression graph over its inputs: pointwise nodes, dtype casts, at most
// one reduction over the last dimension, and rotate_half's halves of an
// input (an input read at column (j + D/2) mod D of the last dim, and a
// sign per column half), with one or more results (a residual sum that a
// norm reads and later ops read too). From it come
//   - the backward graph, by reverse-mode symbolic differentiation (the
//     adjoint of a value reduced over the row is the row sum of what its
//     users contribute: the chain rule through the reduction);
//   - an evaluation of either graph with ATen ops on any device (the CPU
//     path of the runtime, and the reference of the tests);
//   - CUDA C++ source of one kernel per graph (cudaSource), for NVRTC.
// Semantics follow eager ATen's with fp32 math ("opmath"): inputs are read
// in their dtype and converted to float, every node computes in float, and
// each operator's result is rounded to the dtype eager gives it (ATen's type
// promotion of the inputs, 0-dim constants not promoting; a cast rounds to
// its dtype): a bf16 a + b is rounded to bf16 before the next op reads it,
// as op by op. An operator made of several nodes (layer_norm, softmax,
// mean) rounds once, at its result, as its ATen kernel does.
// Everything is built on c10/ATen only (no MLIR): bmt-run uses it.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_FUSION_REGION_H
#define BMT_RUNTIME_FUSION_REGION_H

#include "bmt/Plan/Plan.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace bmt::fusion {

/// A region the generator cannot take (an op or argument outside
/// FusibleOps.def, a second reduction, a row-valued result beside others);
/// the message names the instruction.
class FusionError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Node kinds. Input: the region's input `index`; Const: `value`;
/// GradOut: the gradient of result `index` (backward graphs only; `value`
/// 1 when that result is row-valued: one gradient per row); RowLen: the
/// length of the last dimension; Pow: args[0] ^ value; Cast: round to
/// `dtype` (then computed on as float); RowSum: the sum of args[0] over the
/// last dimension (a value per row); RowMax: its maximum, only as
/// softmax's stabilising shift exp(x - max): the region's value does not
/// depend on it, so differentiation takes it as a constant; Round: an
/// operator's result rounded to the dtype its inputs promote to (a no-op
/// for float32; resolveRounding() makes it a Cast once the input dtypes
/// are known), the gradient passing through; Step: 1 where args[0] > 0,
/// else 0;
/// GeluErf / GeluTanh: aten::gelu with approximate "none" / "tanh";
/// HalfSign: -1 in the first half of the last dim (column j < D/2), +1 in
/// the second (rotate_half(x) = HalfSign * x read half-swapped).
enum class Op {
  Input, Const, GradOut, RowLen,
  Add, Sub, Mul, Div, Neg, Pow,
  Sqrt, Rsqrt, Exp, Log, Tanh, Sigmoid, Relu, Silu, Erf, Cos, Sin, GeluErf, GeluTanh,
  Step, Cast, Round, RowSum, RowMax, HalfSign,
};

/// Whether `op` reduces over the last dimension (RowSum, RowMax).
inline bool isRowReduction(Op op) { return op == Op::RowSum || op == Op::RowMax; }

struct Node {
  Op op = Op::Const;
  std::vector<int> args; ///< node indices, all smaller than this node's
  double value = 0;      ///< Const: the number; Pow: the exponent
  int index = -1;        ///< Input: the input's position
  c10::ScalarType dtype = c10::ScalarType::Float; ///< Cast: the target
  /// Input / GradOut: read half-swapped, at column (j + D/2) mod D of the
  /// element's last dim (D even) instead of j.
  bool swapped = false;
};

/// A DAG of nodes in topological order; equal nodes are shared (add()
/// returns the existing index), so a backward graph reuses forward values.
struct Graph {
  std::vector<Node> nodes;
  int add(Node node);
  int constant(double v);
  int input(int index);
  int unary(Op op, int a);
  int binary(Op op, int a, int b);
  /// Whether node `n` holds one value per row: a row reduction, or computed from
  /// row values and constants only (never from an input directly).
  std::vector<bool> rowValued() const;
  /// The node whose value at column j is node `n`'s at column
  /// (j + D/2) mod D: `n` with its inputs and grad_output read half-swapped
  /// (swapping twice is the identity), HalfSign negated, row values kept.
  int swapped(int n);
  /// Whether a node reads an input or grad_output half-swapped or is a
  /// HalfSign: kernels then keep the last dim apart (column index needed).
  bool usesHalves() const;
};

/// rotate_half's slices of an input, as the region body takes them
/// (slice.Tensor of the input's dim `dim` at `half`, cat along `catDim`):
/// a call fits only where `dim` and `catDim` are the input's last dim, of
/// size D = the element shape's last dim, even, and D / 2 == `half`
/// (`half` < 0: the body computed it as size(dim) // 2).
struct HalfSplit {
  int input = -1;
  int64_t dim = -1, catDim = -1, half = -1;
};

/// A region's forward graph and its derived backward.
struct Region {
  int numInputs = 0;
  Graph forward;
  /// The forward result nodes, in the body's return order. More than one
  /// only where every result is element-valued.
  std::vector<int> results;
  bool hasReduction = false;
  std::vector<HalfSplit> halves; ///< rotate_half's slices, checked per call
  /// layer_norm's normalized length (-1: none): a call fits only where the
  /// element shape's last dim is this long.
  int64_t rowLength = -1;
  /// Backward: the forward graph extended by a GradOut per result and the
  /// adjoints; gradients[i] is the node of input i's gradient, the sum over
  /// results of GradOut_k * d result_k / d input i (broadcast to the
  /// region's element shape), or -1 where no result depends on i.
  Graph backward;
  std::vector<int> gradients;
};

/// The region of a plan function holding a bmt.fused body: params are the
/// inputs, the body Aten instructions of FusibleOps.def and Constant
/// instructions (0-dim numbers), the returned registers (layer_norm becomes
/// its mean, centred variance, rsqrt and affine nodes; softmax over the
/// last dim exp(x - max) / sum); and rotate_half of
/// an input, cat([-x[..., h:], x[..., :h]], -1) (either sign on either
/// half), with h a constant or size(x, dim) // 2 computed in the body
/// (aten::size.int, NumToTensor, aten::floor_divide by 2, aten::Int.Tensor)
/// and no reduction in the region. Derives the backward too. Throws
/// FusionError for anything else.
Region buildRegion(const plan::Function &body);

/// The dtype of every node of `g` for inputs of `inputDtypes`: ATen's
/// promotion over a node's arguments, a Cast's dtype, Undefined for numbers
/// and values computed from numbers only (they do not promote) and for
/// grad_output. Throws FusionError for an input dtype that is not float32,
/// bfloat16 or float16.
std::vector<c10::ScalarType> valueDtypes(const Graph &g,
                                         const std::vector<c10::ScalarType> &inputDtypes);

/// `g` with each Round node made a Cast to its valueDtypes() dtype (a
/// float32 Cast, which rounds nothing, where that is float32 or none): the
/// graph cudaSource and evaluate compute, same node indices.
Graph resolveRounding(const Graph &g, const std::vector<c10::ScalarType> &inputDtypes);

/// Whether inputs whose broadcast is `shape` fit the region's HalfSplits
/// and its layer_norm's normalized length (else the body runs op by op).
bool callFits(const Region &region, const std::vector<at::Tensor> &inputs,
               const std::vector<int64_t> &shape);

/// The dtype of each of the region's results for inputs of `inputDtypes`
/// (ATen's promotion, casts; 0-dim constants do not promote), or empty when
/// the generator does not take these dtypes (an input that is not floating).
std::vector<c10::ScalarType> resultDtypes(const Region &region,
                                          const std::vector<c10::ScalarType> &inputDtypes);

/// The element shape of a call: the broadcast of the inputs' shapes (the
/// result's shape, but for the result of a region ending in its reduction,
/// whose last dim is 1). Throws FusionError when they do not broadcast, or
/// for a region with a reduction whose element shape has no dimension.
std::vector<int64_t> elementShape(const std::vector<at::Tensor> &inputs);

/// Evaluates graph `g` at node `out` with ATen ops in float32 on the inputs'
/// device: `inputs` (any floating dtype, broadcastable), `gradOuts` (one per
/// result) for a backward graph. Returns a float32 tensor of the element
/// shape (or with last dim 1 for a row value).
at::Tensor evaluate(const Graph &g, int out, const std::vector<at::Tensor> &inputs,
                    const std::vector<at::Tensor> &gradOuts = {});

/// Forward on ATen: each result in its resultDtypes(...) dtype, of the
/// element shape (last dim 1 for a row value).
std::vector<at::Tensor> forwardATen(const Region &region, const std::vector<at::Tensor> &inputs);

/// Backward on ATen from `gradOuts` (one per result, each of its result's
/// shape): per input its gradient (summed to the input's shape, in the
/// input's dtype), or an undefined tensor where there is none.
std::vector<at::Tensor> backwardATen(const Region &region, const std::vector<at::Tensor> &inputs,
                                     const std::vector<at::Tensor> &gradOuts);

/// The 8-wide row kernel of cudaSource, for a launch where the last dim D
/// is a multiple of 8 and at most 8 * kRowChunks * 1024, every tensor walks
/// it with stride 1 (16-byte aligned, its other strides multiples of 8) or
/// 0, and the block has at least D / (8 * kRowChunks) threads.
/// columnSums[k]: output k is the gradient of an input broadcast over the
/// rows (a norm's weight), written in float32 as one row of column sums per
/// thread block (shape [gridDim.x, D]) for the caller to sum.
struct RowVector {
  std::vector<bool> columnSums;
  /// Each block loads its next row while it reduces and stores the current
  /// one (software pipelining; about 32 more registers a thread).
  bool prefetch = false;
};
constexpr int kRowChunks = 2;

/// CUDA C++ source of the kernel computing graph `g` at nodes `outs`
/// (forward: the results; backward: the gradients), named `name`, for
/// inputs of `inputDtypes` (and for backward a grad_output per result, of
/// `gradDtypes`; empty for forward), storing outs[k] in outDtypes[k]. Elementwise graphs get a grid-stride kernel over
/// the element count (8 elements a thread with 16-byte accesses where the
/// launch's `Args::vec` says the strides and alignment allow, else offsets
/// from the element index), graphs with a reduction one block per row with a
/// block reduction per row sum or max (each pass over the row recomputes the
/// element values it needs instead of keeping them; with `rowVector`, the
/// 8-wide kernel above keeps the row's inputs in registers). The kernel's
/// parameters are one `bmt_fused::Args` (its layout is in the source's
/// preamble, see docs/runtime/fusion.md). A graph that usesHalves() reads the
/// half-swapped inputs at their column's partner (pointwise kernels only;
/// the host keeps the last dim apart and takes the 8-wide paths only where
/// D / 2 is a multiple of 8). Compiles with NVRTC (no headers needed).
std::string cudaSource(const Graph &g, const std::vector<int> &outs, const std::string &name,
                       const std::vector<c10::ScalarType> &inputDtypes,
                       const std::vector<c10::ScalarType> &gradDtypes,
                       const std::vector<c10::ScalarType> &outDtypes,
                       const RowVector *rowVector = nullptr);

/// The most inputs + grad_outputs + outputs a kernel takes, and the most
/// dims of its (collapsed) element shape.
constexpr int kMaxTensors = 16;
constexpr int kMaxDims = 6;

} // namespace bmt::fusion

#endif // BMT_RUNTIME_FUSION_REGION_H
