//===- RecomputeTest.cpp - what a recomputed block need not compute --------===//
//
// RecomputePlans (runtime/exec/Recompute.h) on hand-written plan functions:
// which instructions a run for the graph only skips, across calls, and where
// a reader of the value (tanh, a fused region, a second use) keeps them;
// addWithoutValue's gradients against eager autograd's add / sub on the
// same tensors (broadcast, mixed dtypes, alpha), bit for bit.
// Whole models: test_zero_multirank.py checks the count of skipped
// operators and the training against eager PyTorch.
//
//===----------------------------------------------------------------------===//

#include "exec/Recompute.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>

using namespace bmt;
using namespace bmt::runtime;

namespace {

plan::Instruction aten(std::string op, std::vector<plan::Arg> args, int64_t result) {
  plan::Instruction inst;
  inst.op = std::move(op);
  inst.args = std::move(args);
  inst.results = {result};
  return inst;
}

plan::Instruction call(int64_t target, std::vector<plan::Arg> args, int64_t result) {
  plan::Instruction inst;
  inst.kind = plan::Instruction::Kind::Call;
  inst.target = target;
  inst.args = std::move(args);
  inst.results = {result};
  return inst;
}

plan::Arg reg(int64_t r) { return plan::Arg::ofRegister(r); }
plan::Arg num(int64_t v) { return plan::Arg::ofConstant(c10::IValue(v)); }

/// Function 1, an MLP's output layer: r1 = linear(x = r0, W = r2, b) where
/// W comes from a Global, then view(r1) -> r3 returned.
plan::Function outputLayer() {
  plan::Function f;
  f.name = "mlp.c_proj.forward";
  f.numRegisters = 5;
  f.params = {0};
  plan::Instruction global;
  global.kind = plan::Instruction::Kind::Global;
  global.target = 0;
  global.results = {2};
  f.body.push_back(global);
  f.body.push_back(aten("aten::linear", {reg(0), reg(2), plan::Arg::ofConstant(c10::IValue())}, 1));
  f.body.push_back(aten("aten::view", {reg(1), plan::Arg::ofConstant(c10::IValue(std::vector<int64_t>{-1}))}, 3));
  f.returns = {3};
  return f;
}

/// Function 0, a block: r2 = tanh(r0); r3 = call mlp(r2); r4 = add(r0, r3)
/// returned, with `extra` instructions appended before the return.
plan::Plan blockPlan(const std::vector<plan::Instruction> &extra = {}, int64_t ret = 4) {
  plan::Plan p;
  plan::Function block;
  block.name = "h.0.forward";
  block.numRegisters = 8;
  block.params = {0};
  block.body.push_back(aten("aten::tanh", {reg(0)}, 2));
  block.body.push_back(call(1, {reg(2)}, 3));
  block.body.push_back(aten("aten::add.Tensor", {reg(0), reg(3), num(1)}, 4));
  for (const plan::Instruction &inst : extra)
    block.body.push_back(inst);
  block.returns = {ret};
  p.functions = {block, outputLayer()};
  return p;
}

TEST(RecomputePlans, SkipsTheLastMatmulAndTheResidualAdd) {
  plan::Plan p = blockPlan();
  RecomputePlans plans(p);
  const RecomputePlan &r = plans.forResults(0, {true});
  EXPECT_EQ(r.skip, (std::vector<Skip>{Skip::None, Skip::None, Skip::Add}));
  ASSERT_NE(r.callee[1], nullptr);
  EXPECT_EQ(r.callee[1]->skip, (std::vector<Skip>{Skip::None, Skip::Linear, Skip::None}));
  EXPECT_EQ(r.callee[1]->paramNeedsValue, std::vector<bool>{true}); // the linear's input
  EXPECT_EQ(r.skipped, 2);
  // The block's input: tanh reads it (its own input is the add's too).
  EXPECT_EQ(r.paramNeedsValue, std::vector<bool>{true});
  // Asked again: the same plan.
  EXPECT_EQ(&plans.forResults(0, {true}), &r);
}

TEST(RecomputePlans, ResultsWhoseValueIsUsedRunAsUsual) {
  plan::Plan p = blockPlan();
  RecomputePlans plans(p);
  const RecomputePlan &r = plans.forResults(0, {false});
  EXPECT_EQ(r.skip, (std::vector<Skip>(3, Skip::None)));
  EXPECT_EQ(r.callee[1], nullptr);
  EXPECT_EQ(r.skipped, 0);
}

TEST(RecomputePlans, AReaderOfTheValueKeepsItsProducers) {
  // r5 = tanh(r4) returned: tanh's backward reads its result, computed
  // from the add's, which reads the matmul's.
  plan::Plan p = blockPlan({aten("aten::tanh", {reg(4)}, 5)}, 5);
  RecomputePlans plans(p);
  const RecomputePlan &r = plans.forResults(0, {true});
  EXPECT_EQ(r.skip, (std::vector<Skip>(4, Skip::None)));
  EXPECT_EQ(r.skipped, 0);

  // r5 = mul(r3, r0) returned as well as the add: mul reads the MLP's output.
  plan::Instruction mul = aten("aten::mul.Tensor", {reg(3), reg(0)}, 5);
  plan::Plan q = blockPlan({mul});
  q.functions[0].returns = {4, 5};
  RecomputePlans qplans(q);
  const RecomputePlan &s = qplans.forResults(0, {true, true});
  EXPECT_EQ(s.skip[2], Skip::Add);
  EXPECT_EQ(s.callee[1], nullptr); // the call's value is read
  EXPECT_EQ(s.skipped, 1);
}

TEST(RecomputePlans, DropoutAndReshapePassThroughReadersDoNot) {
  // r5 = dropout(r4, 0.1, true); r6 = reshape(r5, [-1]); return r6: the
  // add and the matmul are still skipped (dropout's backward reads its mask).
  plan::Plan p = blockPlan(
      {aten("aten::dropout", {reg(4), plan::Arg::ofConstant(c10::IValue(0.1)),
                              plan::Arg::ofConstant(c10::IValue(true))}, 5),
       aten("aten::reshape", {reg(5), plan::Arg::ofConstant(c10::IValue(std::vector<int64_t>{-1}))}, 6)},
      6);
  RecomputePlans plans(p);
  EXPECT_EQ(plans.forResults(0, {true}).skipped, 2);

  // An in-place reader of the add's result (add_), or a fused region
  // reading it, needs its value: nothing is skipped.
  plan::Plan q = blockPlan({aten("aten::add_.Tensor", {reg(4), reg(0), num(1)}, 5)}, 5);
  RecomputePlans qplans(q);
  EXPECT_EQ(qplans.forResults(0, {true}).skipped, 0);
  plan::Instruction fused;
  fused.kind = plan::Instruction::Kind::Fused;
  fused.target = 1; // (the body is not read by the analysis)
  fused.args = {reg(4)};
  fused.results = {5};
  plan::Plan r = blockPlan({fused}, 5);
  RecomputePlans rplans(r);
  EXPECT_EQ(rplans.forResults(0, {true}).skipped, 0);

  // sub.Tensor is skipped as add.Tensor is.
  plan::Plan s = blockPlan();
  s.functions[0].body[2].op = "aten::sub.Tensor";
  RecomputePlans splans(s);
  EXPECT_EQ(splans.forResults(0, {true}).skip[2], Skip::Add);
}

TEST(RecomputePlans, ARuntimeAlphaIsNotSkipped) {
  plan::Plan p = blockPlan();
  p.functions[0].body[2].args[2] = reg(7);
  RecomputePlans plans(p);
  EXPECT_EQ(plans.forResults(0, {true}).skip[2], Skip::None);
  // Its operands are read: the call runs as usual too.
  EXPECT_EQ(plans.forResults(0, {true}).callee[1], nullptr);
}

/// Gradients of `op` on fresh leaves of a and b (same values), for `g`.
std::vector<at::Tensor> gradients(const at::Tensor &a, const at::Tensor &b, const at::Tensor &g,
                                  const std::function<at::Tensor(at::Tensor, at::Tensor)> &op) {
  at::Tensor la = a.clone().requires_grad_(true), lb = b.clone().requires_grad_(true);
  at::Tensor y = op(la, lb);
  torch::autograd::backward({y}, {g});
  return {la.grad(), lb.grad(), y};
}

TEST(AddWithoutValue, GradientsAreEagerAutogradsBitForBit) {
  at::manual_seed(0);
  struct Case {
    std::vector<int64_t> a, b;
    at::ScalarType da, db;
    double alpha;
    bool sub;
  };
  const std::vector<Case> cases = {
      {{4, 3, 8}, {4, 3, 8}, at::kFloat, at::kFloat, 1.0, false},
      {{4, 3, 8}, {8}, at::kBFloat16, at::kBFloat16, 1.0, false},   // a bias-like broadcast
      {{4, 1, 8}, {4, 3, 1}, at::kFloat, at::kBFloat16, 2.5, false}, // both broadcast, promoted
      {{4, 3, 8}, {3, 8}, at::kBFloat16, at::kFloat, 0.5, true},     // sub, alpha
  };
  for (const Case &c : cases) {
    at::Tensor a = at::randn(c.a).to(c.da), b = at::randn(c.b).to(c.db);
    at::Tensor g = at::randn(at::infer_size(c.a, c.b)).to(at::result_type(a, b));
    auto eager = gradients(a, b, g, [&](at::Tensor x, at::Tensor y) {
      return c.sub ? at::sub(x, y, c.alpha) : at::add(x, y, c.alpha);
    });
    auto ours = gradients(a, b, g, [&](at::Tensor x, at::Tensor y) {
      return addWithoutValue(x, y, c.sub ? -c.alpha : c.alpha);
    });
    EXPECT_EQ(ours[2].sizes(), eager[2].sizes());
    EXPECT_EQ(ours[2].scalar_type(), eager[2].scalar_type());
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(ours[i].defined());
      EXPECT_EQ(ours[i].scalar_type(), eager[i].scalar_type());
      EXPECT_EQ(ours[i].sizes(), eager[i].sizes());
      EXPECT_TRUE(at::equal(ours[i], eager[i])) << "case " << &c - cases.data() << " input " << i;
    }
  }
}

} // namespace
