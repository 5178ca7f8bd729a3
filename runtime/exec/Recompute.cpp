//===- Recompute.cpp - what a recomputed block need not compute -----------===//

#include "exec/Recompute.h"

#include "bmt/Runtime/Env.h"

#include <ATen/ExpandUtils.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/result_type.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdlib>
#include <functional>
#include <limits>
#include <string>

namespace bmt::runtime {

namespace {

bool isConstantNumber(const plan::Arg &a) {
  return a.kind == plan::Arg::Kind::Constant && (a.constant.isInt() || a.constant.isDouble());
}

bool isRegister(const plan::Arg &a) { return a.kind == plan::Arg::Kind::Register; }

/// Operators whose first argument's value is needed only where theirs is:
/// views of it, and aten::dropout (its input itself, or its input times a
/// random mask; the backward reads only the mask).
bool passesThrough(const plan::Instruction &inst) {
  return inst.op == "aten::view" || inst.op == "aten::reshape" ||
         inst.op == "aten::_unsafe_view" || inst.op == "aten::dropout";
}

bool isTpCollective(const plan::Instruction &inst) {
  using Kind = plan::Instruction::Kind;
  return inst.kind == Kind::TpAllReduce || inst.kind == Kind::TpAllGather ||
         inst.kind == Kind::TpReduceScatter || inst.kind == Kind::TpCopy;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AddWithoutValueFunction : torch::autograd::Function<AddWithoutValueFunction> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &a, const at::Tensor &b,
                            double alpha) {
    ctx->saved_data["a"] = a.sizes().vec();
    ctx->saved_data["b"] = b.sizes().vec();
    ctx->saved_data["alpha"] = alpha;
    return placeholder(at::infer_size(a.sizes(), b.sizes()),
                       a.options().dtype(at::result_type(a, b)));
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    const at::Tensor &g = grads[0];
    if (!g.defined())
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    const double alpha = ctx->saved_data["alpha"].toDouble();
    // ATen's AddBackward0: grad, and maybe_multiply(grad, alpha); the
    // engine then reduces each to its input's shape and casts it.
    at::Tensor gb = alpha == 1.0 ? g : g.mul(alpha);
    return {at::sum_to(g, ctx->saved_data["a"].toIntVector()),
            at::sum_to(gb, ctx->saved_data["b"].toIntVector()), at::Tensor()};
  }
};

} // namespace

const RecomputePlan &RecomputePlans::forResults(size_t function,
                                                const std::vector<bool> &graphOnly) {
  auto key = std::make_pair(function, graphOnly);
  if (auto it = plans_.find(key); it != plans_.end())
    return *it->second;
  const plan::Function &f = plan_.functions.at(function);
  auto out = std::make_unique<RecomputePlan>();
  out->skip.assign(f.body.size(), Skip::None);
  out->callee.assign(f.body.size(), nullptr);

  // Walking backwards, a register's value is needed when a later
  // instruction that runs reads it (or a return whose value is used).
  std::vector<bool> needed(static_cast<size_t>(f.numRegisters), false);
  for (size_t i = 0; i < f.returns.size(); ++i)
    if (i >= graphOnly.size() || !graphOnly[i])
      needed[f.returns[i]] = true;
  std::function<void(const plan::Arg &)> need = [&](const plan::Arg &a) {
    if (isRegister(a))
      needed[a.reg] = true;
    for (const plan::Arg &e : a.elements)
      need(e);
  };
  auto needAll = [&](const plan::Instruction &inst) {
    for (const plan::Arg &a : inst.args)
      need(a);
  };
  for (size_t n = f.body.size(); n-- > 0;) {
    const plan::Instruction &inst = f.body[n];
    bool resultNeeded = false;
    for (int64_t r : inst.results)
      resultNeeded = resultNeeded || needed[r];
    if (inst.kind == plan::Instruction::Kind::Call && inst.blockList.empty() && !resultNeeded &&
        !inst.results.empty()) {
      const RecomputePlan &callee =
          forResults(static_cast<size_t>(inst.target), std::vector<bool>(inst.results.size(), true));
      out->callee[n] = &callee;
      out->skipped += callee.skipped;
      for (size_t i = 0; i < inst.args.size(); ++i)
        if (i >= callee.paramNeedsValue.size() || callee.paramNeedsValue[i])
          need(inst.args[i]);
      continue;
    }
    if (!resultNeeded && inst.results.size() == 1 && isTpCollective(inst)) {
      if (inst.kind != plan::Instruction::Kind::TpCopy) {
        out->skip[n] = Skip::Collective; // its backward reads only the gradient
        ++out->skipped;
      } // else the identity: its input's value is needed only where its own is
      continue;
    }
    if (inst.kind == plan::Instruction::Kind::LoraAdapter && !resultNeeded) {
      out->skip[n] = Skip::LoraAdapter; // its backward reads its input, A and B, not base
      ++out->skipped;
      for (size_t i = 1; i < inst.args.size(); ++i)
        need(inst.args[i]);
      continue;
    }
    if (inst.kind != plan::Instruction::Kind::Aten || resultNeeded || inst.results.size() != 1) {
      needAll(inst);
      continue;
    }
    if (inst.op == "aten::linear" || inst.op == "aten::addmm" || inst.op == "aten::mm") {
      out->skip[n] = Skip::Linear; // its backward reads its input and weight
      ++out->skipped;
      needAll(inst);
    } else if ((inst.op == "aten::add.Tensor" || inst.op == "aten::sub.Tensor") &&
               inst.args.size() == 3 && isRegister(inst.args[0]) && isRegister(inst.args[1]) &&
               isConstantNumber(inst.args[2])) {
      out->skip[n] = Skip::Add; // its backward reads nothing
      ++out->skipped;
    } else if (passesThrough(inst)) {
      for (size_t i = 1; i < inst.args.size(); ++i)
        need(inst.args[i]); // a shape's registers
    } else {
      needAll(inst);
    }
  }
  for (int64_t p : f.params)
    out->paramNeedsValue.push_back(needed[p]);
  return *plans_.emplace(key, std::move(out)).first->second;
}

at::Tensor placeholder(at::IntArrayRef shape, const at::TensorOptions &options) {
  static const bool nan = env::debugRecomputeNan();
  at::Tensor t = at::empty(shape, options);
  return nan ? t.fill_(std::numeric_limits<double>::quiet_NaN()) : t;
}

at::Tensor addWithoutValue(const at::Tensor &a, const at::Tensor &b, double alpha) {
  return AddWithoutValueFunction::apply(a, b, alpha);
}

} // namespace bmt::runtime
