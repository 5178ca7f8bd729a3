//===- FusionTest.cpp - fused regions against the unfused ATen ops --------===//
//
// Each case is a region body as bmt-opt exports it (a plan function of Aten
// and Constant instructions). The reference runs that same body op by op
// through bmt's Executor (the ATen dispatcher) with autograd; the generator's
// forward graph and its symbolically derived backward are evaluated with
// ATen (fusion::forwardATen / backwardATen) on the same seeded inputs. The
// CUDA source of each graph is compiled with NVRTC where one is installed
// (the CI machines have the CUDA 13 toolkit). FusionCuda.* run the kernels
// on a GPU against the ATen evaluation on the CPU (skipped without one).
//
//===----------------------------------------------------------------------===//

#include "RandomTensor.h"

#include "bmt/Runtime/exec/Executor.h"
#include "bmt/Runtime/fusion/Fused.h"
#include "bmt/Runtime/fusion/Nvrtc.h"
#include "bmt/Runtime/fusion/Region.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <filesystem>
#include <unistd.h>

using namespace bmt;
using plan::Arg;

namespace {

/// Builds a region body instruction by instruction.
struct Body {
  plan::Function f;
  int64_t next = 0;
  Body() { f.name = "region"; }
  int64_t param() {
    f.params.push_back(next);
    return next++;
  }
  int64_t aten(const std::string &op, std::vector<Arg> args) {
    plan::Instruction inst;
    inst.kind = plan::Instruction::Kind::Aten;
    inst.op = op;
    inst.args = std::move(args);
    inst.results = {next};
    f.body.push_back(std::move(inst));
    return next++;
  }
  int64_t instruction(plan::Instruction::Kind kind, Arg arg) {
    plan::Instruction inst;
    inst.kind = kind;
    inst.args = {std::move(arg)};
    inst.results = {next};
    f.body.push_back(std::move(inst));
    return next++;
  }
  int64_t constant(double v) {
    return instruction(plan::Instruction::Kind::Constant,
                       Arg::ofConstant(c10::IValue(at::scalar_tensor(v, at::kDouble))));
  }
  int64_t constantInt(int64_t v) {
    return instruction(plan::Instruction::Kind::Constant,
                       Arg::ofConstant(c10::IValue(at::scalar_tensor(v, at::kLong))));
  }
  int64_t numToTensor(int64_t scalar) {
    return instruction(plan::Instruction::Kind::NumToTensor, Arg::ofRegister(scalar));
  }
  plan::Function done(int64_t result) { return done(std::vector<int64_t>{result}); }
  plan::Function done(std::vector<int64_t> results) {
    f.returns = std::move(results);
    f.numRegisters = next;
    return f;
  }
};

Arg R(int64_t r) { return Arg::ofRegister(r); }
Arg C(c10::IValue v) { return Arg::ofConstant(std::move(v)); }
Arg lastDim() {
  Arg a;
  a.kind = Arg::Kind::List;
  a.elements = {C(int64_t{-1})};
  return a;
}
Arg toDtype(int64_t code) { return C(code); }

/// Runs `body` op by op through the Executor with autograd: the results and
/// the gradient of sum_k sum(result_k * gradOuts[k]) for each input.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> reference(const plan::Function &body,
                                                                       const std::vector<at::Tensor> &inputs,
                                                                       const std::vector<at::Tensor> &gradOuts) {
  plan::Plan p;
  p.functions = {body};
  p.entry = 0;
  runtime::Executor exec(p, {}, at::Device(at::kCPU));
  std::vector<c10::IValue> args;
  std::vector<at::Tensor> leaves;
  for (const at::Tensor &t : inputs) {
    leaves.push_back(t.detach().clone().requires_grad_(true));
    args.emplace_back(leaves.back());
  }
  std::vector<at::Tensor> outs;
  for (const c10::IValue &v : exec.run(args))
    outs.push_back(v.toTensor());
  std::vector<at::Tensor> grads =
      torch::autograd::grad(outs, leaves, gradOuts, /*retain_graph=*/false,
                            /*create_graph=*/false, /*allow_unused=*/true);
  for (at::Tensor &o : outs)
    o = o.detach();
  return {outs, grads};
}

void expectClose(const at::Tensor &actual, const at::Tensor &expected, double tol,
                 const std::string &what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_TRUE(expected.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  double err = (a - e).abs().max().item<double>();
  double scale = std::max(1.0, e.abs().max().item<double>());
  EXPECT_LE(err, tol * scale) << what << ": max abs difference " << err;
}

/// Checks forward and every gradient of `body` against the reference, and
/// that the CUDA source of both graphs compiles.
void check(const plan::Function &body, std::vector<at::Tensor> inputs, double tol,
           const std::string &name) {
  fusion::Region region = fusion::buildRegion(body);
  std::vector<at::Tensor> fused = fusion::forwardATen(region, inputs);
  std::vector<at::Tensor> gradOuts;
  std::vector<c10::ScalarType> resultDtypes, gradDtypes;
  for (size_t k = 0; k < fused.size(); ++k) {
    gradOuts.push_back(test::randomTensor(fused[k].sizes(), fused[k].scalar_type(), 999 + k));
    resultDtypes.push_back(fused[k].scalar_type());
    gradDtypes.push_back(fused[k].scalar_type());
  }
  auto [outs, grads] = reference(body, inputs, gradOuts);
  ASSERT_EQ(outs.size(), fused.size()) << name;
  for (size_t k = 0; k < fused.size(); ++k)
    expectClose(fused[k], outs[k], tol, name + " forward, result " + std::to_string(k));
  std::vector<at::Tensor> fusedGrads = fusion::backwardATen(region, inputs, gradOuts);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!grads[i].defined()) {
      EXPECT_FALSE(fusedGrads[i].defined()) << name << " input " << i;
      continue;
    }
    expectClose(fusedGrads[i], grads[i], tol, name + " gradient of input " + std::to_string(i));
  }

  if (!fusion::nvrtcAvailable())
    return;
  setenv("BMT_KERNEL_CACHE", "", 1); // no cache: every source is compiled here
  std::vector<c10::ScalarType> dtypes;
  for (const at::Tensor &t : inputs)
    dtypes.push_back(t.scalar_type());
  std::string fwd = fusion::cudaSource(region.forward, region.results, name + "_fwd", dtypes, {},
                                       resultDtypes);
  std::vector<int> gradients;
  std::vector<c10::ScalarType> outDtypes;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (region.gradients[i] >= 0) {
      gradients.push_back(region.gradients[i]);
      outDtypes.push_back(inputs[i].scalar_type());
    }
  std::string bwd = fusion::cudaSource(region.backward, gradients, name + "_bwd", dtypes, gradDtypes,
                                       outDtypes);
  std::vector<std::pair<std::string, std::string>> sources{{fwd, name + "_fwd"}, {bwd, name + "_bwd"}};
  if (region.hasReduction) {
    // The 8-wide row kernel too, a norm weight's gradient as column sums.
    std::vector<int64_t> shape = fusion::elementShape(inputs);
    fusion::RowVector forwardRows{std::vector<bool>(fused.size(), false)}, backwardRows;
    std::vector<c10::ScalarType> columnDtypes;
    for (size_t i = 0, o = 0; i < inputs.size(); ++i)
      if (region.gradients[i] >= 0) {
        bool oneRow = inputs[i].numel() == shape.back() && inputs[i].sizes().vec() != shape;
        backwardRows.columnSums.push_back(oneRow);
        columnDtypes.push_back(oneRow ? at::kFloat : outDtypes[o]);
        ++o;
      }
    // Both variants: and with each block's next row loaded while it
    // reduces the current one (RowVector::prefetch).
    for (bool prefetch : {false, true}) {
      forwardRows.prefetch = backwardRows.prefetch = prefetch;
      const std::string suffix = prefetch ? "8p" : "8";
      sources.emplace_back(fusion::cudaSource(region.forward, region.results, name + "_fwd" + suffix,
                                              dtypes, {}, resultDtypes, &forwardRows),
                           name + "_fwd" + suffix);
      sources.emplace_back(fusion::cudaSource(region.backward, gradients, name + "_bwd" + suffix, dtypes,
                                              gradDtypes, columnDtypes, &backwardRows),
                           name + "_bwd" + suffix);
    }
  }
  for (const auto &[source, kernel] : sources) {
    std::string ptx;
    try {
      ptx = fusion::compileCuda(source, kernel, 9, 0, /*cubin=*/false);
    } catch (const fusion::FusionError &e) {
      ADD_FAILURE() << e.what() << "\n" << source;
    }
    EXPECT_NE(ptx.find(".entry " + kernel), std::string::npos) << kernel;
  }
}

/// LLaMA's RMSNorm as its trace records it after the input cast.
plan::Function rmsNorm(int64_t outCode) {
  Body b;
  int64_t x = b.param(), w = b.param();
  int64_t p = b.aten("aten::pow.Tensor_Scalar", {R(x), C(int64_t{2})});
  int64_t m = b.aten("aten::mean.dim", {R(p), lastDim(), C(true), C(c10::IValue())});
  int64_t eps = b.constant(1e-6);
  int64_t s = b.aten("aten::add.Tensor", {R(m), R(eps), C(int64_t{1})});
  int64_t r = b.aten("aten::rsqrt", {R(s)});
  int64_t n = b.aten("aten::mul.Tensor", {R(x), R(r)});
  int64_t c = b.aten("aten::to.dtype", {R(n), toDtype(outCode), C(false), C(false), C(c10::IValue())});
  return b.done(b.aten("aten::mul.Tensor", {R(w), R(c)}));
}

/// nn.LayerNorm as traced: layer_norm(x, [D], w, b, eps, cudnn_enable);
/// `residual`: of x + y (BERT's post-norm); without `affine`, no weight and
/// no bias.
plan::Function layerNorm(int64_t D, bool residual = false, bool affine = true) {
  Body b;
  int64_t x = b.param();
  if (residual)
    x = b.aten("aten::add.Tensor", {R(x), R(b.param()), C(int64_t{1})});
  Arg shape;
  shape.kind = Arg::Kind::List;
  shape.elements = {C(D)};
  Arg w = affine ? R(b.param()) : C(c10::IValue()), bias = affine ? R(b.param()) : C(c10::IValue());
  return b.done(b.aten("aten::layer_norm", {R(x), shape, w, bias, C(1e-5), C(true)}));
}

/// A residual sum that the norm after it reads and ops after the region
/// read too, so the region returns it as a second result, as the pass makes
/// it: LLaMA's h = x + y, then RMSNorm(h.float()) * w in `outCode`'s dtype;
/// results {norm, h}.
plan::Function residualRmsNorm(int64_t outCode) {
  Body b;
  int64_t x = b.param(), y = b.param(), w = b.param();
  int64_t h = b.aten("aten::add.Tensor", {R(x), R(y), C(int64_t{1})});
  int64_t f = b.aten("aten::to.dtype", {R(h), toDtype(6), C(false), C(false), C(c10::IValue())});
  int64_t p = b.aten("aten::pow.Tensor_Scalar", {R(f), C(int64_t{2})});
  int64_t m = b.aten("aten::mean.dim", {R(p), lastDim(), C(true), C(c10::IValue())});
  int64_t s = b.aten("aten::add.Tensor", {R(m), R(b.constant(1e-6)), C(int64_t{1})});
  int64_t r = b.aten("aten::rsqrt", {R(s)});
  int64_t n = b.aten("aten::mul.Tensor", {R(f), R(r)});
  int64_t c = b.aten("aten::to.dtype", {R(n), toDtype(outCode), C(false), C(false), C(c10::IValue())});
  return b.done({b.aten("aten::mul.Tensor", {R(w), R(c)}), h});
}

/// GPT-2's h = x + y, then layer_norm(h) over D; results {norm, h}.
plan::Function residualLayerNorm(int64_t D) {
  Body b;
  int64_t x = b.param(), y = b.param(), w = b.param(), bias = b.param();
  int64_t h = b.aten("aten::add.Tensor", {R(x), R(y), C(int64_t{1})});
  Arg shape;
  shape.kind = Arg::Kind::List;
  shape.elements = {C(D)};
  return b.done({b.aten("aten::layer_norm", {R(h), shape, R(w), R(bias), C(1e-5), C(true)}), h});
}

/// BERT's attention probabilities as its eager attention writes them:
/// softmax(scores / scale + mask, -1); `dtype`: softmax's dtype argument
/// (a code, or -1 for None); `castFirst`: T5's softmax(scores.float()).
plan::Function attentionSoftmax(double scale, int64_t dtype = -1, bool castFirst = false) {
  Body b;
  int64_t scores = b.param();
  int64_t x = castFirst ? b.aten("aten::to.dtype", {R(scores), toDtype(6), C(false), C(false), C(c10::IValue())})
                        : b.aten("aten::div.Tensor", {R(scores), R(b.constant(scale))});
  if (!castFirst)
    x = b.aten("aten::add.Tensor", {R(x), R(b.param()), C(int64_t{1})});
  return b.done(b.aten("aten::softmax.int",
                       {R(x), C(int64_t{-1}), dtype < 0 ? C(c10::IValue()) : toDtype(dtype)}));
}

} // namespace

TEST(Fusion, RmsNormFp32) {
  check(rmsNorm(6), {test::randomTensor({3, 5, 64}, at::kFloat, 1), test::randomTensor({64}, at::kFloat, 2)},
        2e-6, "rms_norm");
}

TEST(Fusion, RmsNormBf16Output) {
  // fp32 input (the cast residual), bf16 weight, a cast to bf16 in between:
  // the fused math is fp32 with the one rounding the cast asks for, as eager.
  check(rmsNorm(15),
        {test::randomTensor({4, 48}, at::kFloat, 3), test::randomTensor({48}, at::kBFloat16, 4)},
        1e-2, "rms_norm_bf16");
}

TEST(Fusion, SwigluResidual) {
  Body b;
  int64_t g = b.param(), u = b.param(), res = b.param();
  int64_t s = b.aten("aten::silu", {R(g)});
  int64_t m = b.aten("aten::mul.Tensor", {R(s), R(u)});
  int64_t h = b.aten("aten::mul.Scalar", {R(m), C(0.5)});
  int64_t a = b.aten("aten::add.Tensor", {R(h), R(res), C(int64_t{1})});
  int64_t out = b.aten("aten::sub.Scalar", {R(a), C(1.0), C(int64_t{2})});
  check(b.done(out),
        {test::randomTensor({2, 7, 33}, at::kFloat, 5), test::randomTensor({2, 7, 33}, at::kFloat, 6),
         test::randomTensor({2, 7, 33}, at::kFloat, 7)},
        2e-6, "swiglu");
}

TEST(Fusion, RopeBroadcast) {
  // q [B, H, S, D] * cos [1, 1, S, D] + r [B, H, S, D] * sin [S, D]
  Body b;
  int64_t q = b.param(), cos = b.param(), r = b.param(), sin = b.param();
  int64_t a = b.aten("aten::mul.Tensor", {R(q), R(cos)});
  int64_t c = b.aten("aten::mul.Tensor", {R(r), R(sin)});
  int64_t out = b.aten("aten::add.Tensor", {R(a), R(c), C(int64_t{1})});
  check(b.done(out),
        {test::randomTensor({2, 3, 5, 8}, at::kFloat, 8), test::randomTensor({1, 1, 5, 8}, at::kFloat, 9),
         test::randomTensor({2, 3, 5, 8}, at::kFloat, 10), test::randomTensor({5, 8}, at::kFloat, 11)},
        2e-6, "rope");
}

/// HF LLaMA's apply_rotary_pos_emb for one tensor, q * cos + rotate_half(q)
/// * sin, rotate_half as a trace records it (the half computed from q's
/// size: size.int, NumToTensor, floor_divide, Int.Tensor) or, with
/// `constantHalf` > 0, as torch.export does (constant slice bounds).
plan::Function ropeRotateHalf(int64_t constantHalf, bool negateFirst = true) {
  Body b;
  int64_t q = b.param(), cos = b.param(), sin = b.param();
  auto half = [&]() -> Arg {
    if (constantHalf > 0)
      return C(constantHalf);
    int64_t size = b.aten("aten::size.int", {R(q), C(int64_t{3})});
    int64_t n = b.numToTensor(size);
    return R(b.aten("aten::Int.Tensor", {R(b.aten("aten::floor_divide", {R(n), R(b.constantInt(2))}))}));
  };
  int64_t x1 = b.aten("aten::slice.Tensor", {R(q), C(int64_t{3}), C(int64_t{0}), half(), C(int64_t{1})});
  int64_t x2 = b.aten("aten::slice.Tensor",
                      {R(q), C(int64_t{3}), half(), C(std::numeric_limits<int64_t>::max()), C(int64_t{1})});
  Arg list;
  list.kind = Arg::Kind::List;
  if (negateFirst)
    list.elements = {R(b.aten("aten::neg", {R(x2)})), R(x1)};
  else
    list.elements = {R(x2), R(b.aten("aten::neg", {R(x1)}))};
  int64_t rotated = b.aten("aten::cat", {list, C(int64_t{-1})});
  int64_t a = b.aten("aten::mul.Tensor", {R(q), R(cos)});
  int64_t c = b.aten("aten::mul.Tensor", {R(rotated), R(sin)});
  return b.done(b.aten("aten::add.Tensor", {R(a), R(c), C(int64_t{1})}));
}

TEST(Fusion, RopeRotateHalf) {
  // rotate_half inside the region: q read at its column and half-swapped;
  // the backward sends the rotated part's gradient back swapped.
  std::vector<at::Tensor> inputs{test::randomTensor({2, 3, 5, 8}, at::kFloat, 12),
                                 test::randomTensor({1, 1, 5, 8}, at::kFloat, 13),
                                 test::randomTensor({5, 8}, at::kFloat, 14)};
  check(ropeRotateHalf(0), inputs, 2e-6, "rope_rotate_half_traced");
  check(ropeRotateHalf(4), inputs, 2e-6, "rope_rotate_half_exported");
  check(ropeRotateHalf(0, /*negateFirst=*/false), inputs, 2e-6, "rope_rotate_half_other_sign");
  // A transposed q in bf16, cos/sin broadcast in the last dim too.
  check(ropeRotateHalf(0),
        {test::randomTensor({2, 5, 3, 16}, at::kBFloat16, 15).transpose(1, 2),
         test::randomTensor({1, 1, 5, 1}, at::kBFloat16, 16), test::randomTensor({5, 16}, at::kFloat, 17)},
        1e-2, "rope_rotate_half_bf16");

  // Calls the region does not fit run op by op: an odd last dim, a constant
  // half that is not D / 2, the sliced dim not the last.
  fusion::FusedRegion traced(fusion::buildRegion(ropeRotateHalf(0)), "traced");
  fusion::FusedRegion exported(fusion::buildRegion(ropeRotateHalf(4)), "exported");
  auto call = [](std::vector<int64_t> shape) {
    std::vector<int64_t> row{shape.back()};
    return std::vector<at::Tensor>{test::randomTensor(shape, at::kFloat, 18), test::randomTensor(row, at::kFloat, 19),
                                   test::randomTensor(row, at::kFloat, 20)};
  };
  EXPECT_TRUE(traced.accepts(call({2, 3, 5, 8})));
  EXPECT_TRUE(traced.accepts(call({2, 3, 5, 16})));
  EXPECT_FALSE(traced.accepts(call({2, 3, 5, 7})));
  EXPECT_FALSE(traced.accepts(call({2, 3, 5, 8, 4})));
  EXPECT_TRUE(exported.accepts(call({2, 3, 5, 8})));
  EXPECT_FALSE(exported.accepts(call({2, 3, 5, 16})));
  EXPECT_THROW(fusion::forwardATen(fusion::buildRegion(ropeRotateHalf(4)), call({2, 3, 5, 16})),
               fusion::FusionError);
}

TEST(Fusion, ActivationsAndArithmetic) {
  // Every unary rule and rsub / div / neg / pow, in one chain.
  Body b;
  int64_t x = b.param(), y = b.param();
  int64_t v = b.aten("aten::gelu", {R(x), C(std::string("tanh"))});
  v = b.aten("aten::add.Tensor", {R(v), R(b.aten("aten::gelu", {R(y), C(std::string("none"))})), C(int64_t{1})});
  v = b.aten("aten::mul.Tensor", {R(v), R(b.aten("aten::tanh", {R(x)}))});
  v = b.aten("aten::add.Tensor", {R(v), R(b.aten("aten::sigmoid", {R(y)})), C(0.5)});
  v = b.aten("aten::mul.Tensor", {R(v), R(b.aten("aten::erf", {R(x)}))});
  v = b.aten("aten::add.Tensor", {R(v), R(b.aten("aten::cos", {R(y)})), C(int64_t{1})});
  v = b.aten("aten::add.Tensor", {R(v), R(b.aten("aten::sin", {R(v)})), C(int64_t{1})});
  int64_t pos = b.aten("aten::add.Scalar", {R(b.aten("aten::exp", {R(y)})), C(0.1), C(int64_t{1})});
  v = b.aten("aten::div.Tensor", {R(v), R(b.aten("aten::sqrt", {R(pos)}))});
  v = b.aten("aten::rsub.Scalar", {R(v), C(2.0), C(int64_t{3})});
  v = b.aten("aten::add.Tensor", {R(v), R(b.aten("aten::log", {R(pos)})), C(int64_t{1})});
  v = b.aten("aten::mul.Tensor", {R(v), R(b.aten("aten::relu", {R(x)}))});
  v = b.aten("aten::add.Tensor", {R(b.aten("aten::neg", {R(v)})),
                                  R(b.aten("aten::pow.Tensor_Scalar", {R(pos), C(1.5)})), C(int64_t{1})});
  v = b.aten("aten::div.Scalar", {R(v), C(3.0)});
  check(b.done(v), {test::randomTensor({6, 40}, at::kFloat, 12), test::randomTensor({6, 40}, at::kFloat, 13)},
        1e-5, "activations");
}

TEST(Fusion, LayerNormWithMeanInput) {
  // Written-out LayerNorm where the first mean is outside the region (a
  // row-broadcast input [.., 1]) and the variance's mean inside; weight and
  // bias broadcast over the rows: their gradients are summed over them.
  Body b;
  int64_t x = b.param(), mu = b.param(), w = b.param(), bias = b.param();
  int64_t d = b.aten("aten::sub.Tensor", {R(x), R(mu), C(int64_t{1})});
  int64_t d2 = b.aten("aten::pow.Tensor_Scalar", {R(d), C(2.0)});
  int64_t var = b.aten("aten::mean.dim", {R(d2), lastDim(), C(true), C(c10::IValue())});
  int64_t eps = b.constant(1e-5);
  int64_t r = b.aten("aten::rsqrt", {R(b.aten("aten::add.Tensor", {R(var), R(eps), C(int64_t{1})}))});
  int64_t n = b.aten("aten::mul.Tensor", {R(d), R(r)});
  int64_t out = b.aten("aten::add.Tensor", {R(b.aten("aten::mul.Tensor", {R(n), R(w)})), R(bias), C(int64_t{1})});
  at::Tensor xt = test::randomTensor({3, 4, 24}, at::kFloat, 14);
  check(b.done(out),
        {xt, xt.mean(-1, true), test::randomTensor({24}, at::kFloat, 15),
         test::randomTensor({24}, at::kFloat, 16)},
        1e-5, "layer_norm");
}

TEST(Fusion, LayerNorm) {
  // aten::layer_norm against its own kernel and autograd formula (the
  // reference runs the body op by op): mean, centred variance, affine.
  // Inputs offset from 0 (mean 3) so that a one-pass variance would show.
  at::Tensor x = test::randomTensor({3, 5, 40}, at::kFloat, 70).add(3.0);
  check(layerNorm(40), {x, test::randomTensor({40}, at::kFloat, 71), test::randomTensor({40}, at::kFloat, 72)},
        2e-5, "layer_norm_op");
  check(layerNorm(40, /*residual=*/true, /*affine=*/false),
        {x, test::randomTensor({3, 5, 40}, at::kFloat, 73)}, 2e-5, "add_layer_norm_no_affine");
  // bf16 as a bf16 model runs it: fp32 math inside, the result rounded once
  // (ATen's kernel does the same), so the two agree to a bf16 rounding.
  check(layerNorm(64, /*residual=*/true),
        {test::randomTensor({4, 64}, at::kBFloat16, 74), test::randomTensor({4, 64}, at::kBFloat16, 75),
         test::randomTensor({64}, at::kBFloat16, 76), test::randomTensor({64}, at::kBFloat16, 77)},
        2e-2, "add_layer_norm_bf16");
  // A call whose last dim is not the normalized length is not the region's
  // (the executor runs the body, and ATen reports the mismatch).
  fusion::FusedRegion region(fusion::buildRegion(layerNorm(40)), "ln");
  EXPECT_TRUE(region.accepts({x, test::randomTensor({40}, at::kFloat, 1), test::randomTensor({40}, at::kFloat, 2)}));
  EXPECT_FALSE(region.accepts({test::randomTensor({3, 8}, at::kFloat, 3), test::randomTensor({8}, at::kFloat, 1),
                               test::randomTensor({8}, at::kFloat, 2)}));
  // Normalized over two dims: not the generator's.
  Body two;
  int64_t y = two.param();
  Arg shape;
  shape.kind = Arg::Kind::List;
  shape.elements = {C(int64_t{5}), C(int64_t{40})};
  EXPECT_THROW(fusion::buildRegion(two.done(two.aten(
                   "aten::layer_norm", {R(y), shape, C(c10::IValue()), C(c10::IValue()), C(1e-5), C(true)}))),
               fusion::FusionError);
}

TEST(Fusion, SecondResult) {
  // The residual sum is a result too: its value as eager's, and every
  // input's gradient the sum of both results' terms (the norm's and the
  // sum's own grad_output), as autograd sums them op by op.
  check(residualRmsNorm(6),
        {test::randomTensor({3, 5, 64}, at::kFloat, 110), test::randomTensor({3, 5, 64}, at::kFloat, 111),
         test::randomTensor({64}, at::kFloat, 112)},
        2e-6, "residual_rms_norm");
  // bf16 as LLaMA runs it: h rounded to bf16 once, as eager's add is (the
  // tolerance is bf16's: eager sums the two gradient terms in bf16, the
  // kernel in float32 rounding once).
  check(residualRmsNorm(15),
        {test::randomTensor({4, 64}, at::kBFloat16, 113), test::randomTensor({4, 64}, at::kBFloat16, 114),
         test::randomTensor({64}, at::kBFloat16, 115)},
        2e-2, "residual_rms_norm_bf16");
  at::Tensor x = test::randomTensor({3, 5, 40}, at::kFloat, 116).add(3.0);
  std::vector<at::Tensor> ln{x, test::randomTensor({3, 5, 40}, at::kFloat, 117),
                             test::randomTensor({40}, at::kFloat, 118), test::randomTensor({40}, at::kFloat, 119)};
  check(residualLayerNorm(40), ln, 2e-5, "residual_layer_norm");
  {
    std::vector<at::Tensor> sum = fusion::forwardATen(fusion::buildRegion(residualLayerNorm(40)), ln);
    ASSERT_EQ(sum.size(), 2u);
    EXPECT_TRUE(at::equal(sum[1], ln[0] + ln[1]));
  }
  // On the kernels' path (emulated here) the two operands of the sum get
  // one gradient tensor, equal to the ATen evaluation's; through autograd
  // too, with a gradient for one result only (the other's is zero).
  fusion::Region region = fusion::buildRegion(residualLayerNorm(40));
  fusion::FusedRegion fused(region, "second_result");
  fused.setEmulation(true);
  std::vector<at::Tensor> gradOuts{test::randomTensor({3, 5, 40}, at::kFloat, 120),
                                   test::randomTensor({3, 5, 40}, at::kFloat, 121)};
  std::vector<at::Tensor> expected = fusion::backwardATen(region, ln, gradOuts);
  std::vector<at::Tensor> grads = fused.backward(ln, gradOuts);
  EXPECT_TRUE(grads[0].is_same(grads[1]));
  for (size_t i = 0; i < ln.size(); ++i)
    expectClose(grads[i], expected[i], 1e-6, "shared gradient of input " + std::to_string(i));
  std::vector<at::Tensor> leaves;
  for (const at::Tensor &t : ln)
    leaves.push_back(t.detach().clone().requires_grad_(true));
  std::vector<at::Tensor> outs = fused.run(leaves);
  ASSERT_EQ(outs.size(), 2u);
  outs[0].backward(gradOuts[0]);
  std::vector<at::Tensor> normOnly = fusion::backwardATen(region, ln, {gradOuts[0], at::zeros_like(gradOuts[1])});
  for (size_t i = 0; i < ln.size(); ++i)
    expectClose(leaves[i].grad(), normOnly[i], 1e-6, "autograd gradient of input " + std::to_string(i));
  // A row value beside another result is not the generator's.
  Body b;
  int64_t v = b.param();
  int64_t m = b.aten("aten::mean.dim", {R(v), lastDim(), C(true), C(c10::IValue())});
  int64_t r = b.aten("aten::rsqrt", {R(m)});
  EXPECT_THROW(fusion::buildRegion(b.done({b.aten("aten::mul.Tensor", {R(v), R(r)}), r})), fusion::FusionError);
}

TEST(Fusion, Softmax) {
  // Against ATen's softmax kernel and its autograd formula (the reference
  // runs the body op by op). Scores up to about +-100 would overflow exp()
  // without the max shift; the mask is HF's (0 or a large negative number,
  // broadcast over heads and queries), so masked columns get 0 and a zero
  // gradient.
  at::Tensor scores = test::randomTensor({2, 3, 7, 40}, at::kFloat, 90).mul(100.0);
  at::Tensor mask = at::where(test::randomTensor({2, 1, 1, 40}, at::kFloat, 91) > 0.5,
                              at::full({}, -1e9), at::zeros({}));
  check(attentionSoftmax(0.5), {scores, mask}, 1e-5, "bert_softmax");
  // T5: softmax(scores.float()) of bf16 scores (a float32 result), and
  // softmax's own dtype argument; an odd row length (the scalar row kernel).
  // The gradient of a bf16 input is rounded to bf16 in both, from float32
  // values a rounding apart: they may be one bf16 rounding (2^-8 of the
  // largest gradient) apart.
  at::Tensor bf16 = test::randomTensor({2, 3, 5, 33}, at::kBFloat16, 92).mul(8.0);
  check(attentionSoftmax(1.0, -1, /*castFirst=*/true), {bf16}, 1e-2, "t5_softmax");
  {
    Body b;
    int64_t s = b.param();
    check(b.done(b.aten("aten::softmax.int", {R(s), C(int64_t{-1}), toDtype(6)})), {bf16}, 1e-2,
          "softmax_dtype_float");
  }
  // T5's attention: softmax((scores + position_bias).float()) with bf16
  // scores of magnitude up to ~50 (T5 does not scale them): eager rounds the
  // sum to bf16 (steps of 0.25 there) before the cast, and so does the
  // region, so the float32 probabilities agree to float32's precision.
  // Summed unrounded they would move by up to ~10 % (checked).
  {
    Body b;
    int64_t sc = b.param(), bias = b.param();
    int64_t sum = b.aten("aten::add.Tensor", {R(sc), R(bias), C(int64_t{1})});
    int64_t f = b.aten("aten::to.dtype", {R(sum), toDtype(6), C(false), C(false), C(c10::IValue())});
    plan::Function t5 = b.done(b.aten("aten::softmax.int", {R(f), C(int64_t{-1}), C(c10::IValue())}));
    at::Tensor big = test::randomTensor({2, 3, 8, 48}, at::kBFloat16, 97).mul(50.0);
    at::Tensor posBias = test::randomTensor({1, 3, 8, 48}, at::kBFloat16, 98).mul(3.0);
    check(t5, {big, posBias}, 1e-5, "t5_position_bias_softmax");
    at::Tensor eager = at::softmax((big + posBias).to(at::kFloat), -1);
    at::Tensor unrounded = at::softmax(big.to(at::kFloat) + posBias.to(at::kFloat), -1);
    EXPECT_GT((unrounded - eager).abs().max().item<double>(), 1e-2) << "the inputs do not tell the roundings apart";
    EXPECT_LE((fusion::forwardATen(fusion::buildRegion(t5), {big, posBias})[0] - eager).abs().max().item<double>(), 1e-5);
  }
  // LLaMA's eager attention: softmax in float32, then cast to q's dtype.
  {
    Body b;
    int64_t s = b.param();
    int64_t p = b.aten("aten::softmax.int", {R(s), C(int64_t{-1}), toDtype(6)});
    check(b.done(b.aten("aten::to.dtype", {R(p), toDtype(15), C(false), C(false), C(c10::IValue())})), {bf16},
          1e-2, "softmax_then_cast");
  }
  // All bf16: x / 2 + mask is rounded to bf16 by both, and softmax in
  // float32 rounded once, as ATen's kernel does; the probabilities may
  // differ by a bf16 rounding where the float32 values land on either side
  // of a rounding boundary.
  check(attentionSoftmax(2.0), {bf16, test::randomTensor({33}, at::kBFloat16, 94)}, 2e-2, "softmax_bf16");
  // The value does not depend on the shift: a row shifted by a constant
  // gives the same probabilities, and their gradient sums to 0 per row.
  fusion::Region region = fusion::buildRegion(attentionSoftmax(1.0, -1, /*castFirst=*/true));
  // (x in steps of 1/256, so that x + 64 is exact and so is the shifted
  // row's x - max.)
  at::Tensor x = test::randomTensor({4, 24}, at::kFloat, 95).mul(256.0).round().div(256.0);
  at::Tensor p = fusion::forwardATen(region, {x})[0];
  EXPECT_TRUE(at::equal(fusion::forwardATen(region, {x.add(64.0)})[0], p));
  at::Tensor g = fusion::backwardATen(region, {x}, {test::randomTensor({4, 24}, at::kFloat, 96)})[0];
  EXPECT_LE(g.sum(-1).abs().max().item<double>(), 1e-6);
}

TEST(Fusion, EndsInReduction) {
  // sum(x * y, -1, keepdim): the result is one value per row.
  Body b;
  int64_t x = b.param(), y = b.param();
  int64_t m = b.aten("aten::mul.Tensor", {R(x), R(y)});
  int64_t s = b.aten("aten::sum.dim_IntList", {R(m), lastDim(), C(true), C(c10::IValue())});
  check(b.done(s), {test::randomTensor({5, 16}, at::kFloat, 17), test::randomTensor({16}, at::kFloat, 18)},
        2e-6, "row_sum");
}

TEST(Fusion, RoundsEachOpAsEager) {
  // bf16 (a + b) * c - d, exact in float32 before each rounding: rounded
  // after every op, as eager is, the forward is bit-identical to eager's;
  // rounded once at the end it would not be (checked on the same inputs).
  Body b;
  int64_t x = b.param(), y = b.param(), z = b.param(), w = b.param();
  int64_t s = b.aten("aten::add.Tensor", {R(x), R(y), C(int64_t{1})});
  int64_t m = b.aten("aten::mul.Tensor", {R(s), R(z)});
  plan::Function f = b.done(b.aten("aten::sub.Tensor", {R(m), R(w), C(int64_t{1})}));
  std::vector<at::Tensor> in;
  for (int k = 0; k < 4; ++k)
    in.push_back(test::randomTensor({16, 64}, at::kBFloat16, 300 + k).mul(4.0));
  fusion::Region region = fusion::buildRegion(f);
  at::Tensor fused = fusion::forwardATen(region, in)[0];
  at::Tensor eager = (in[0] + in[1]) * in[2] - in[3];
  EXPECT_TRUE(at::equal(fused, eager));
  at::Tensor once = ((in[0].to(at::kFloat) + in[1].to(at::kFloat)) * in[2].to(at::kFloat) -
                     in[3].to(at::kFloat)).to(at::kBFloat16);
  EXPECT_FALSE(at::equal(once, eager)) << "the inputs do not tell one rounding from three";
  // Float32 inputs: the Round nodes resolve to no-op casts.
  std::vector<at::Tensor> f32;
  for (const at::Tensor &t : in)
    f32.push_back(t.to(at::kFloat));
  EXPECT_TRUE(at::equal(fusion::forwardATen(region, f32)[0], (f32[0] + f32[1]) * f32[2] - f32[3]));
  // The per-node dtypes: inputs' promotion, a number does not promote.
  std::vector<c10::ScalarType> t =
      fusion::valueDtypes(region.forward, {at::kBFloat16, at::kFloat, at::kBFloat16, at::kBFloat16});
  EXPECT_EQ(t.at(region.results.at(0)), at::kFloat);
  EXPECT_THROW(fusion::valueDtypes(region.forward, {at::kLong, at::kFloat, at::kFloat, at::kFloat}),
               fusion::FusionError);
}

TEST(Fusion, HalfAndBf16Inputs) {
  // bf16 / fp16 activations: both round after every op; silu's float32
  // value may differ from eager's by an ulp of float32 before its rounding,
  // so they agree to the dtype's precision.
  Body b;
  int64_t g = b.param(), u = b.param();
  int64_t out = b.aten("aten::mul.Tensor", {R(b.aten("aten::silu", {R(g)})), R(u)});
  plan::Function f = b.done(out);
  check(f, {test::randomTensor({8, 64}, at::kBFloat16, 19), test::randomTensor({8, 64}, at::kBFloat16, 20)},
        2e-2, "swiglu_bf16");
  check(f, {test::randomTensor({8, 64}, at::kHalf, 21), test::randomTensor({8, 64}, at::kHalf, 22)},
        4e-3, "swiglu_f16");
}

TEST(Fusion, RejectsWhatItCannotFuse) {
  // softmax over another dim than the last, or not as the region's result.
  Body b;
  int64_t x = b.param();
  int64_t v = b.aten("aten::softmax.int", {R(x), C(int64_t{1}), C(c10::IValue())});
  EXPECT_THROW(fusion::buildRegion(b.done(v)), fusion::FusionError);
  Body after;
  int64_t x2 = after.param();
  int64_t sm = after.aten("aten::softmax.int", {R(x2), C(int64_t{-1}), C(c10::IValue())});
  EXPECT_THROW(fusion::buildRegion(after.done(after.aten("aten::mul.Tensor", {R(sm), R(x2)}))),
               fusion::FusionError);

  Body two;
  int64_t y = two.param();
  int64_t m1 = two.aten("aten::mean.dim", {R(y), lastDim(), C(true), C(c10::IValue())});
  int64_t m2 = two.aten("aten::mean.dim", {R(two.aten("aten::mul.Tensor", {R(y), R(m1)})), lastDim(),
                                           C(true), C(c10::IValue())});
  EXPECT_THROW(fusion::buildRegion(two.done(m2)), fusion::FusionError);

  // Slices and cats other than rotate_half's two halves of an input.
  {
    Body c;
    int64_t p = c.param(), q = c.param();
    Arg list;
    list.kind = Arg::Kind::List;
    list.elements = {R(p), R(q)};
    int64_t cat = c.aten("aten::cat", {list, C(int64_t{-1})});
    EXPECT_THROW(fusion::buildRegion(c.done(c.aten("aten::neg", {R(cat)}))), fusion::FusionError);
  }
  {
    Body c;
    int64_t p = c.param();
    int64_t sl = c.aten("aten::slice.Tensor", {R(p), C(int64_t{1}), C(int64_t{0}), C(int64_t{2}), C(int64_t{1})});
    EXPECT_THROW(fusion::buildRegion(c.done(c.aten("aten::exp", {R(sl)}))), fusion::FusionError);
  }
  {
    Body c; // a slice with a step, and halves of a computed value
    int64_t p = c.param();
    int64_t e = c.aten("aten::exp", {R(p)});
    EXPECT_THROW(fusion::buildRegion(c.done(c.aten(
                     "aten::slice.Tensor", {R(e), C(int64_t{-1}), C(int64_t{0}), C(int64_t{2}), C(int64_t{1})}))),
                 fusion::FusionError);
    Body d;
    int64_t p2 = d.param();
    EXPECT_THROW(fusion::buildRegion(d.done(d.aten(
                     "aten::slice.Tensor", {R(p2), C(int64_t{-1}), C(int64_t{0}), C(int64_t{2}), C(int64_t{2})}))),
                 fusion::FusionError);
  }

  // Integer inputs are not the generator's: resultDtypes says so.
  fusion::Region region = fusion::buildRegion(rmsNorm(6));
  EXPECT_TRUE(fusion::resultDtypes(region, {at::kLong, at::kFloat}).empty());
  EXPECT_EQ(fusion::resultDtypes(region, {at::kFloat, at::kBFloat16}), std::vector<c10::ScalarType>{at::kFloat});
}

TEST(Fusion, OnlyWantedGradients) {
  // The autograd node asks only for the gradients autograd needs: RMSNorm
  // whose weight does not require grad still gets its input's gradient (the
  // reference's: the mask is indexed by input), and backward with a mask
  // leaves the unwanted gradient undefined.
  fusion::Region region = fusion::buildRegion(rmsNorm(6));
  fusion::FusedRegion fused(region, "wanted");
  at::Tensor x = test::randomTensor({3, 64}, at::kFloat, 80).requires_grad_();
  at::Tensor w = test::randomTensor({64}, at::kFloat, 81);
  at::Tensor gradOut = test::randomTensor({3, 64}, at::kFloat, 82);
  fused.run({x, w}).at(0).backward(gradOut);
  std::vector<at::Tensor> expected = fusion::backwardATen(region, {x.detach(), w}, {gradOut});
  ASSERT_TRUE(x.grad().defined());
  expectClose(x.grad(), expected[0], 1e-6, "input gradient");
  std::vector<at::Tensor> grads = fused.backward({x.detach(), w}, {gradOut}, {true, false});
  EXPECT_TRUE(grads[0].defined());
  EXPECT_FALSE(grads[1].defined());
}

TEST(Fusion, KernelCache) {
  if (!fusion::nvrtcAvailable())
    GTEST_SKIP() << "no NVRTC library";
  std::string dir = testing::TempDir() + "/bmt-kernel-cache-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  setenv("BMT_KERNEL_CACHE", dir.c_str(), 1);
  fusion::Region region = fusion::buildRegion(rmsNorm(6));
  std::string source = fusion::cudaSource(region.forward, region.results, "cached", {at::kFloat, at::kFloat},
                                          {}, {at::kFloat});
  std::string first = fusion::compileCuda(source, "cached", 9, 0, /*cubin=*/true);
  ASSERT_FALSE(first.empty());
  size_t files = 0;
  for (const auto &e : std::filesystem::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(e.path().extension(), ".cubin");
  }
  EXPECT_EQ(files, 1u);
  EXPECT_EQ(fusion::compileCuda(source, "cached", 9, 0, true), first);
  // A source that does not compile: one error with NVRTC's log.
  try {
    fusion::compileCuda("extern \"C\" __global__ void broken() { undefined_name; }", "broken", 9, 0, false);
    ADD_FAILURE() << "no error";
  } catch (const fusion::FusionError &e) {
    EXPECT_NE(std::string(e.what()).find("undefined_name"), std::string::npos) << e.what();
  }
  setenv("BMT_KERNEL_CACHE", "", 1);
  std::filesystem::remove_all(dir);
}

namespace {

/// The region's CUDA kernels (forward and backward) on `inputs` moved to the
/// GPU against its ATen evaluation on the CPU. The caching allocator's free
/// blocks are filled with NaN first, so an element a kernel leaves unwritten
/// fails the comparison.
void checkCuda(const plan::Function &body, const std::vector<at::Tensor> &inputs, double tol,
               const std::string &name) {
  fusion::Region region = fusion::buildRegion(body);
  fusion::FusedRegion fused(region, name);
  std::vector<at::Tensor> expected = fusion::forwardATen(region, inputs);
  std::vector<at::Tensor> gradOuts, gradOutsOnGpu;
  for (size_t k = 0; k < expected.size(); ++k) {
    gradOuts.push_back(test::randomTensor(expected[k].sizes(), expected[k].scalar_type(), 777 + k));
    gradOutsOnGpu.push_back(gradOuts.back().to(at::kCUDA));
  }
  std::vector<at::Tensor> expectedGrads = fusion::backwardATen(region, inputs, gradOuts);
  std::vector<at::Tensor> onGpu;
  for (const at::Tensor &t : inputs)
    onGpu.push_back(t.to(at::kCUDA));
  at::full({int64_t{1} << 24}, std::nan(""), at::TensorOptions().device(at::kCUDA));
  std::vector<at::Tensor> out = fused.forward(onGpu);
  ASSERT_EQ(out.size(), expected.size()) << name;
  for (size_t k = 0; k < out.size(); ++k)
    expectClose(out[k].cpu(), expected[k], tol, name + " forward (CUDA), result " + std::to_string(k));
  at::full({int64_t{1} << 24}, std::nan(""), at::TensorOptions().device(at::kCUDA));
  std::vector<at::Tensor> grads = fused.backward(onGpu, gradOutsOnGpu);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!expectedGrads[i].defined()) {
      EXPECT_FALSE(grads[i].defined()) << name << " input " << i;
      continue;
    }
    ASSERT_TRUE(grads[i].defined()) << name << " input " << i;
    expectClose(grads[i].cpu(), expectedGrads[i], tol, name + " CUDA gradient of input " + std::to_string(i));
  }
  // Without the last input's gradient (a kernel with one output fewer).
  std::vector<bool> needed(inputs.size(), true);
  needed.back() = false;
  std::vector<at::Tensor> some = fused.backward(onGpu, gradOutsOnGpu, needed);
  EXPECT_FALSE(some.back().defined()) << name;
  for (size_t i = 0; i + 1 < inputs.size(); ++i)
    if (expectedGrads[i].defined())
      expectClose(some[i].cpu(), expectedGrads[i], tol, name + " CUDA gradient of input " + std::to_string(i) +
                                                            " (not the last input's)");
}

bool cudaKernels() {
  return torch::cuda::is_available() && fusion::FusedRegion::usesKernels(at::Device(at::kCUDA, 0));
}

plan::Function swigluResidual() {
  Body b;
  int64_t g = b.param(), u = b.param(), res = b.param();
  int64_t m = b.aten("aten::mul.Tensor", {R(b.aten("aten::silu", {R(g)})), R(u)});
  return b.done(b.aten("aten::add.Tensor", {R(m), R(res), C(int64_t{1})}));
}

} // namespace

TEST(FusionCuda, PointwiseContiguousAndStrided) {
  if (!cudaKernels())
    GTEST_SKIP() << "no CUDA device or no NVRTC";
  plan::Function f = swigluResidual();
  // Contiguous bf16 and fp32 with a tail (7 * 1001 = 875 vectors of 8 + 7):
  // the 16-byte path.
  for (at::ScalarType t : {at::kBFloat16, at::kFloat, at::kHalf})
    checkCuda(f, {test::randomTensor({7, 1001}, t, 30), test::randomTensor({7, 1001}, t, 31),
                  test::randomTensor({7, 1001}, t, 32)},
              t == at::kFloat ? 1e-5 : 2e-2, std::string("swiglu_") + c10::toString(t));
  // A scalar broadcast (stride 0) stays on that path.
  checkCuda(f, {test::randomTensor({4, 4096}, at::kBFloat16, 33), test::randomTensor({4, 4096}, at::kBFloat16, 34),
                test::randomTensor({1}, at::kBFloat16, 35)},
            2e-2, "swiglu_scalar_residual");
  // Not 16-byte aligned (a view one element in): the strided path.
  at::Tensor base = test::randomTensor({4097}, at::kBFloat16, 36);
  checkCuda(f, {base.narrow(0, 1, 4096).view({4, 1024}), test::randomTensor({4, 1024}, at::kBFloat16, 37),
                test::randomTensor({4, 1024}, at::kBFloat16, 38)},
            2e-2, "swiglu_unaligned");
  // Transposed and row-broadcast inputs: the strided path in 32-bit indices.
  checkCuda(f, {test::randomTensor({64, 48}, at::kFloat, 39).t(), test::randomTensor({48, 64}, at::kFloat, 40),
                test::randomTensor({64}, at::kFloat, 41)},
            1e-5, "swiglu_transposed");
}

TEST(FusionCuda, RopeAndRmsNorm) {
  if (!cudaKernels())
    GTEST_SKIP() << "no CUDA device or no NVRTC";
  Body b;
  int64_t q = b.param(), cos = b.param(), r = b.param(), sin = b.param();
  int64_t a = b.aten("aten::mul.Tensor", {R(q), R(cos)});
  int64_t c = b.aten("aten::mul.Tensor", {R(r), R(sin)});
  plan::Function rope = b.done(b.aten("aten::add.Tensor", {R(a), R(c), C(int64_t{1})}));
  // Broadcast over the batch and heads: two dims, the last in runs of 8.
  checkCuda(rope,
            {test::randomTensor({2, 4, 16, 64}, at::kBFloat16, 42), test::randomTensor({1, 1, 16, 64}, at::kFloat, 43),
             test::randomTensor({2, 4, 16, 64}, at::kBFloat16, 44), test::randomTensor({16, 64}, at::kFloat, 45)},
            2e-2, "rope_cuda");
  // q as the attention makes it, [B, S, H, D] transposed to [B, H, S, D].
  checkCuda(rope,
            {test::randomTensor({2, 16, 4, 64}, at::kBFloat16, 48).transpose(1, 2),
             test::randomTensor({1, 1, 16, 64}, at::kBFloat16, 49), test::randomTensor({2, 4, 16, 64}, at::kBFloat16, 50),
             test::randomTensor({1, 1, 16, 64}, at::kBFloat16, 51)},
            2e-2, "rope_transposed_q");
  // A last dim that is no multiple of 8: the element-by-element path.
  checkCuda(rope,
            {test::randomTensor({2, 3, 5, 12}, at::kBFloat16, 52), test::randomTensor({1, 1, 5, 12}, at::kFloat, 53),
             test::randomTensor({2, 3, 5, 12}, at::kBFloat16, 54), test::randomTensor({5, 12}, at::kFloat, 55)},
            2e-2, "rope_d12");
  checkCuda(rmsNorm(15), {test::randomTensor({33, 2048}, at::kFloat, 46), test::randomTensor({2048}, at::kBFloat16, 47)},
            2e-2, "rms_norm_cuda");
}

TEST(FusionCuda, SecondResult) {
  if (!cudaKernels())
    GTEST_SKIP() << "no CUDA device or no NVRTC";
  // The 8-wide row kernel with two outputs (LLaMA's and GPT-2's widths),
  // then the scalar one (a width not a multiple of 8).
  checkCuda(residualRmsNorm(15),
            {test::randomTensor({33, 2048}, at::kBFloat16, 130), test::randomTensor({33, 2048}, at::kBFloat16, 131),
             test::randomTensor({2048}, at::kBFloat16, 132)},
            2e-2, "residual_rms_norm_cuda");
  checkCuda(residualLayerNorm(2048),
            {test::randomTensor({17, 2048}, at::kBFloat16, 133), test::randomTensor({17, 2048}, at::kBFloat16, 134),
             test::randomTensor({2048}, at::kBFloat16, 135), test::randomTensor({2048}, at::kBFloat16, 136)},
            2e-2, "residual_layer_norm_cuda");
  checkCuda(residualLayerNorm(100),
            {test::randomTensor({7, 100}, at::kFloat, 137), test::randomTensor({7, 100}, at::kFloat, 138),
             test::randomTensor({100}, at::kFloat, 139), test::randomTensor({100}, at::kFloat, 140)},
            1e-5, "residual_layer_norm_scalar_cuda");
  fusion::FusedRegion fused(fusion::buildRegion(residualLayerNorm(2048)), "second_result_shared");
  std::vector<at::Tensor> in;
  for (int k = 0; k < 2; ++k)
    in.push_back(test::randomTensor({5, 2048}, at::kBFloat16, 141 + k).cuda());
  for (int k = 0; k < 2; ++k)
    in.push_back(test::randomTensor({2048}, at::kBFloat16, 143 + k).cuda());
  std::vector<at::Tensor> out = fused.forward(in);
  std::vector<at::Tensor> grads = fused.backward(in, {at::ones_like(out[0]), at::ones_like(out[1])});
  EXPECT_TRUE(grads[0].is_same(grads[1]));
}

TEST(FusionCuda, RopeRotateHalf) {
  if (!cudaKernels())
    GTEST_SKIP() << "no CUDA device or no NVRTC";
  // LLaMA's shape: q [B, S, H, 64] transposed to [B, H, S, 64], cos/sin
  // [1, 1, S, 64] bf16: the 8-wide path with halves of 32.
  checkCuda(ropeRotateHalf(0),
            {test::randomTensor({2, 16, 4, 64}, at::kBFloat16, 90).transpose(1, 2),
             test::randomTensor({1, 1, 16, 64}, at::kBFloat16, 91), test::randomTensor({1, 1, 16, 64}, at::kBFloat16, 92)},
            2e-2, "rope_rotate_half_cuda");
  // The result and q's gradient keep q's layout ([B, S, H, D] in memory),
  // so that the attention's transpose + reshape after it copies nothing.
  {
    fusion::FusedRegion fused(fusion::buildRegion(ropeRotateHalf(0)), "rope_layout");
    std::vector<at::Tensor> in{test::randomTensor({2, 16, 4, 64}, at::kBFloat16, 99).cuda().transpose(1, 2),
                               test::randomTensor({1, 1, 16, 64}, at::kBFloat16, 100).cuda(),
                               test::randomTensor({1, 1, 16, 64}, at::kBFloat16, 101).cuda()};
    at::Tensor out = fused.forward(in).at(0);
    EXPECT_TRUE(out.transpose(1, 2).is_contiguous()) << out.strides();
    std::vector<at::Tensor> grads = fused.backward(in, {at::ones_like(out)});
    ASSERT_TRUE(grads[0].defined());
    EXPECT_TRUE(grads[0].transpose(1, 2).is_contiguous()) << grads[0].strides();
  }
  // Contiguous fp32 (dims that would merge but for the halves), exported
  // bounds; then halves of 4 (no 8-wide path).
  checkCuda(ropeRotateHalf(32),
            {test::randomTensor({2, 3, 5, 64}, at::kFloat, 93), test::randomTensor({5, 64}, at::kFloat, 94),
             test::randomTensor({5, 64}, at::kFloat, 95)},
            1e-5, "rope_rotate_half_contiguous");
  checkCuda(ropeRotateHalf(0),
            {test::randomTensor({2, 3, 5, 8}, at::kFloat, 96), test::randomTensor({5, 8}, at::kFloat, 97),
             test::randomTensor({5, 8}, at::kFloat, 98)},
            1e-5, "rope_rotate_half_d8");
}

TEST(FusionCuda, RowKernelPaths) {
  if (!cudaKernels())
    GTEST_SKIP() << "no CUDA device or no NVRTC";
  // The 8-wide row kernel: more rows than blocks (each block strides over
  // rows and sums the weight's gradient over them), and the widest row two
  // runs of 8 a thread cover (1024 threads: where the kernel's registers do
  // not allow that many, the scalar kernel runs).
  checkCuda(rmsNorm(15), {test::randomTensor({1500, 256}, at::kBFloat16, 60), test::randomTensor({256}, at::kBFloat16, 61)},
            2e-2, "rms_norm_many_rows");
  checkCuda(rmsNorm(6), {test::randomTensor({3, 5, 16384}, at::kFloat, 62), test::randomTensor({16384}, at::kFloat, 63)},
            1e-5, "rms_norm_widest_vector_row");
  // The scalar row kernel: a row too wide, one that is no multiple of 8,
  // and a transposed input.
  checkCuda(rmsNorm(6), {test::randomTensor({4, 16392}, at::kFloat, 64), test::randomTensor({16392}, at::kFloat, 65)},
            1e-5, "rms_norm_too_wide");
  checkCuda(rmsNorm(6), {test::randomTensor({7, 100}, at::kFloat, 66), test::randomTensor({100}, at::kFloat, 67)},
            1e-5, "rms_norm_d100");
  checkCuda(rmsNorm(6), {test::randomTensor({64, 40}, at::kFloat, 68).t(), test::randomTensor({64}, at::kFloat, 69)},
            1e-5, "rms_norm_transposed");
}

TEST(FusionCuda, Softmax) {
  if (!cudaKernels())
    GTEST_SKIP() << "no CUDA device or no NVRTC";
  // A row max, then a row sum, on both row kernels: BERT's shapes in bf16
  // (rows of 128, 8 wide), and an odd row length in float32 with T5's cast.
  at::Tensor mask = at::where(test::randomTensor({8, 1, 1, 128}, at::kFloat, 101) > 0.7,
                              at::full({}, -1e9), at::zeros({}))
                        .to(at::kBFloat16);
  checkCuda(attentionSoftmax(8.0), {test::randomTensor({8, 12, 128, 128}, at::kBFloat16, 100).mul(50.0), mask},
            2e-2, "bert_softmax_row8");
  checkCuda(attentionSoftmax(1.0, -1, /*castFirst=*/true),
            {test::randomTensor({3, 4, 9, 77}, at::kFloat, 102).mul(30.0)}, 1e-5, "t5_softmax_d77");
}

TEST(FusionCuda, LayerNorm) {
  if (!cudaKernels())
    GTEST_SKIP() << "no CUDA device or no NVRTC";
  // Two row-sum levels (the mean, then the centred variance) on both row
  // kernels; the weight's and the bias's gradients as column sums.
  checkCuda(layerNorm(2048), {test::randomTensor({300, 2048}, at::kBFloat16, 80).add(2.0),
                              test::randomTensor({2048}, at::kBFloat16, 81), test::randomTensor({2048}, at::kBFloat16, 82)},
            2e-2, "layer_norm_gpt2_row");
  checkCuda(layerNorm(100, /*residual=*/true), {test::randomTensor({7, 100}, at::kFloat, 83),
                                                 test::randomTensor({7, 100}, at::kFloat, 84),
                                                 test::randomTensor({100}, at::kFloat, 85),
                                                 test::randomTensor({100}, at::kFloat, 86)},
            1e-5, "add_layer_norm_d100");
}
