//===- Evaluate.cpp - fused regions evaluated with ATen ops ---------------===//
//
// evaluate, forwardATen and backwardATen (Region.h): a region's graph
// computed with ATen ops on any device, the reference of the generated
// kernels and the path where none is compiled.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/fusion/Region.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

namespace bmt::fusion {

namespace {

std::vector<at::Tensor> evaluateAll(const Graph &graph, const std::vector<int> &outs,
                                    const std::vector<at::Tensor> &inputs,
                                    const std::vector<at::Tensor> &gradOuts) {
  std::vector<c10::ScalarType> dtypes;
  for (const at::Tensor &t : inputs)
    dtypes.push_back(t.scalar_type());
  const Graph g = resolveRounding(graph, dtypes);
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), gradOuts.begin(), gradOuts.end());
  std::vector<int64_t> shape = elementShape(all);
  int last = 0;
  for (int o : outs)
    last = std::max(last, o);
  auto options = at::TensorOptions().dtype(at::kFloat).device(inputs.at(0).device());
  // Half-swapped: column j reads (j + D/2) mod D, torch.roll by D/2 (a
  // broadcast last dim of 1 reads the same value at every column).
  auto halfSwap = [&](const at::Tensor &t) {
    if (shape.empty() || shape.back() % 2 != 0)
      throw FusionError("fused region: rotate_half needs an even last dim");
    return t.dim() == 0 || t.size(-1) == 1 ? t : at::roll(t, {shape.back() / 2}, {-1});
  };
  std::vector<at::Tensor> v(g.nodes.size());
  for (int i = 0; i <= last; ++i) {
    const Node &n = g.nodes[i];
    auto arg = [&](int k) { return v[n.args[k]]; };
    switch (n.op) {
    case Op::Input:
      v[i] = inputs.at(n.index).to(at::kFloat);
      if (n.swapped)
        v[i] = halfSwap(v[i]);
      break;
    case Op::GradOut:
      if (n.index >= static_cast<int>(gradOuts.size()) || !gradOuts[n.index].defined())
        throw FusionError("fused region: the backward graph needs a grad_output per result");
      v[i] = gradOuts[n.index].to(at::kFloat);
      if (n.swapped)
        v[i] = halfSwap(v[i]);
      break;
    case Op::HalfSign: {
      if (shape.empty() || shape.back() % 2 != 0)
        throw FusionError("fused region: rotate_half needs an even last dim");
      at::Tensor ones = at::ones({shape.back() / 2}, options);
      v[i] = at::cat({-ones, ones});
      break;
    }
    case Op::Const: v[i] = at::scalar_tensor(n.value, options); break;
    case Op::RowLen:
      if (shape.empty())
        throw FusionError("fused region: a reduction over the last dim of a 0-dim tensor");
      v[i] = at::scalar_tensor(static_cast<double>(shape.back()), options);
      break;
    case Op::Add: v[i] = arg(0) + arg(1); break;
    case Op::Sub: v[i] = arg(0) - arg(1); break;
    case Op::Mul: v[i] = arg(0) * arg(1); break;
    case Op::Div: v[i] = arg(0) / arg(1); break;
    case Op::Neg: v[i] = -arg(0); break;
    case Op::Pow: v[i] = at::pow(arg(0), n.value); break;
    case Op::Sqrt: v[i] = at::sqrt(arg(0)); break;
    case Op::Rsqrt: v[i] = at::rsqrt(arg(0)); break;
    case Op::Exp: v[i] = at::exp(arg(0)); break;
    case Op::Log: v[i] = at::log(arg(0)); break;
    case Op::Tanh: v[i] = at::tanh(arg(0)); break;
    case Op::Sigmoid: v[i] = at::sigmoid(arg(0)); break;
    case Op::Relu: v[i] = at::relu(arg(0)); break;
    case Op::Silu: v[i] = at::silu(arg(0)); break;
    case Op::Erf: v[i] = at::erf(arg(0)); break;
    case Op::Cos: v[i] = at::cos(arg(0)); break;
    case Op::Sin: v[i] = at::sin(arg(0)); break;
    case Op::GeluErf: v[i] = at::gelu(arg(0), "none"); break;
    case Op::GeluTanh: v[i] = at::gelu(arg(0), "tanh"); break;
    case Op::Step: v[i] = (arg(0) > 0).to(at::kFloat); break;
    case Op::Cast: v[i] = arg(0).to(n.dtype).to(at::kFloat); break;
    case Op::Round: throw FusionError("fused region: an unresolved Round node");
    case Op::RowSum: {
      if (shape.empty())
        throw FusionError("fused region: a reduction over the last dim of a 0-dim tensor");
      // Over the row of the element shape (a broadcast argument counts once
      // per element, as the unfused program's broadcast result does).
      v[i] = arg(0).expand(shape).sum(-1, /*keepdim=*/true);
      break;
    }
    case Op::RowMax:
      if (shape.empty())
        throw FusionError("fused region: a reduction over the last dim of a 0-dim tensor");
      v[i] = arg(0).expand(shape).amax(-1, /*keepdim=*/true);
      break;
    }
  }
  std::vector<at::Tensor> out;
  for (int o : outs)
    out.push_back(v[o]);
  return out;
}

/// The shape of value `node`: the element shape, or its last dim 1 for a
/// row value.
std::vector<int64_t> valueShape(const Graph &g, int node, std::vector<int64_t> shape) {
  if (g.rowValued()[node] && !shape.empty())
    shape.back() = 1;
  return shape;
}

} // namespace

at::Tensor evaluate(const Graph &g, int out, const std::vector<at::Tensor> &inputs,
                    const std::vector<at::Tensor> &gradOuts) {
  return evaluateAll(g, {out}, inputs, gradOuts).at(0);
}

std::vector<at::Tensor> forwardATen(const Region &region, const std::vector<at::Tensor> &inputs) {
  std::vector<c10::ScalarType> dtypes;
  for (const at::Tensor &t : inputs)
    dtypes.push_back(t.scalar_type());
  std::vector<c10::ScalarType> outDtypes = resultDtypes(region, dtypes);
  if (outDtypes.empty())
    throw FusionError("fused region: inputs must be float32, bfloat16 or float16");
  if (!callFits(region, inputs, elementShape(inputs)))
    throw FusionError("fused region: rotate_half's input does not fit (halves of its last dim)");
  std::vector<at::Tensor> values = evaluateAll(region.forward, region.results, inputs, {});
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < values.size(); ++k) {
    std::vector<int64_t> shape = valueShape(region.forward, region.results[k], elementShape(inputs));
    out.push_back(values[k].expand(shape).to(outDtypes[k]).contiguous());
  }
  return out;
}

std::vector<at::Tensor> backwardATen(const Region &region, const std::vector<at::Tensor> &inputs,
                                     const std::vector<at::Tensor> &gradOuts) {
  std::vector<int> outs;
  for (int n : region.gradients)
    if (n >= 0)
      outs.push_back(n);
  if (!callFits(region, inputs, elementShape(inputs)))
    throw FusionError("fused region: rotate_half's input does not fit (halves of its last dim)");
  std::vector<at::Tensor> values = evaluateAll(region.backward, outs, inputs, gradOuts);
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), gradOuts.begin(), gradOuts.end());
  std::vector<int64_t> shape = elementShape(all);
  std::vector<at::Tensor> grads(inputs.size());
  size_t k = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (region.gradients[i] < 0)
      continue;
    at::Tensor g = values[k++].expand(shape);
    grads[i] = at::sum_to(g, inputs[i].sizes()).to(inputs[i].scalar_type());
  }
  return grads;
}


} // namespace bmt::fusion
