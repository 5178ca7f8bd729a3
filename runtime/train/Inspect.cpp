//===- Inspect.cpp - per-block statistics and the source of a NaN ---------===//
//
// Statistics: each rank adds up what it holds exactly once over all ranks
// (a ZeRO shard on the ranks of the first shard group, a replicated tensor
// on rank 0) and the sums of squares are all-reduced, the max-abs values
// all-reduced with Max; outputs are measured on every rank's own rows.
//
// The source of a non-finite value: the step is replayed with an executor
// observer that checks every instruction's results. A value is blamed on
// the first of (a) a parameter read that is not finite, (b) an operator
// whose results are not finite while all its inputs (registers and
// constants) are; an operator fed by non-finite constants or buffers (a
// mask of -inf) is not blamed, and neither is what follows from it. If the
// forward is finite, the replay runs the backward too, with a post hook on
// every operator's autograd node: the first node whose incoming gradients
// are finite and whose outgoing ones are not is blamed. Every rank replays
// its own rows; instruction executions (and hook firings) are counted in
// the same order on every rank, so the smallest count over ranks names the
// first failure of the step.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/train/Inspect.h"

#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>

using c10::IValue;

namespace bmt::runtime {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool isFloatTensor(const IValue &v) {
  return v.isTensor() && v.toTensor().defined() && at::isFloatingType(v.toTensor().scalar_type());
}

/// Whether `t` holds a NaN or an inf (a host synchronisation).
bool nonFinite(const at::Tensor &t) {
  return t.defined() && at::isFloatingType(t.scalar_type()) && t.numel() > 0 &&
         !at::isfinite(t.detach()).all().item<bool>();
}

/// Whether a value (tensor, float, or a list of them) holds a NaN or inf.
bool nonFiniteValue(const IValue &v) {
  if (v.isTensor())
    return nonFinite(v.toTensor());
  if (v.isDouble())
    return !std::isfinite(v.toDouble());
  if (v.isList()) {
    for (const IValue &e : v.toListRef())
      if (nonFiniteValue(e))
        return true;
  }
  return false;
}

bool nonFiniteArg(const plan::Arg &a, const std::vector<IValue> &regs) {
  switch (a.kind) {
  case plan::Arg::Kind::Register:
    return nonFiniteValue(regs[a.reg]);
  case plan::Arg::Kind::Constant:
    return nonFiniteValue(a.constant);
  case plan::Arg::Kind::List:
    for (const plan::Arg &e : a.elements)
      if (nonFiniteArg(e, regs))
        return true;
  }
  return false;
}

bool usesRegister(const plan::Arg &a, int64_t reg) {
  if (a.kind == plan::Arg::Kind::Register)
    return a.reg == reg;
  for (const plan::Arg &e : a.elements)
    if (usesRegister(e, reg))
      return true;
  return false;
}

/// The `ord`-norms of `ts` (foreach kernels) as float64 tensors of one
/// element, in order; bf16/fp16 tensors accumulate and return in float32.
std::vector<at::Tensor> norms(const std::vector<at::Tensor> &ts, double ord) {
  std::vector<at::Tensor> reduced, full, out(ts.size());
  std::vector<size_t> reducedAt, fullAt;
  for (size_t i = 0; i < ts.size(); ++i) {
    const bool low = ts[i].scalar_type() == at::kHalf || ts[i].scalar_type() == at::kBFloat16;
    (low ? reduced : full).push_back(ts[i]);
    (low ? reducedAt : fullAt).push_back(i);
  }
  if (!reduced.empty()) {
    std::vector<at::Tensor> n = at::_foreach_norm(reduced, ord, at::kFloat);
    for (size_t j = 0; j < n.size(); ++j)
      out[reducedAt[j]] = n[j].to(at::kDouble);
  }
  if (!full.empty()) {
    std::vector<at::Tensor> n = at::_foreach_norm(full, ord);
    for (size_t j = 0; j < n.size(); ++j)
      out[fullAt[j]] = n[j].to(at::kDouble);
  }
  return out;
}

/// A tensor of the communicator's device (the CPU backend's tensors live
/// on the CPU, NCCL's on its GPU).
at::Tensor onCommDevice(const at::Tensor &t, Comm &world) {
  return t.device() != world.device() && world.backend() != "local" ? t.to(world.device()) : t;
}

} // namespace

PlanBlocks::PlanBlocks(const plan::Plan &plan) {
  ofFunction.assign(plan.functions.size(), -1);
  ofGroup.assign(plan.groups.size(), -1);
  ofTensor.assign(plan.tensors.size(), -1);
  std::map<std::pair<std::string, int64_t>, int64_t> byKey;
  auto blockOf = [&](const std::string &list, int64_t index, const std::string &name) {
    auto [it, inserted] = byKey.emplace(std::make_pair(list, index),
                                        static_cast<int64_t>(names.size()));
    if (inserted)
      names.push_back(!name.empty() ? name : list + "." + std::to_string(index));
    return it->second;
  };
  // The block calls, in plan order; each block owns the functions its call
  // reaches (a function per submodule), except other blocks' calls.
  std::vector<std::pair<int64_t, int64_t>> roots; // (function, block)
  for (const plan::Function &f : plan.functions)
    for (const plan::Instruction &inst : f.body)
      if (inst.kind == plan::Instruction::Kind::Call && !inst.blockList.empty())
        roots.emplace_back(inst.target,
                           blockOf(inst.blockList, inst.blockIndex,
                                   plan.functions.at(inst.target).modulePath));
  std::function<void(int64_t, int64_t)> mark = [&](int64_t function, int64_t block) {
    if (ofFunction[function] >= 0)
      return;
    ofFunction[function] = block;
    for (const plan::Instruction &inst : plan.functions[function].body)
      if (inst.kind == plan::Instruction::Kind::Call && inst.blockList.empty())
        mark(inst.target, block);
  };
  for (auto [function, block] : roots)
    mark(function, block);
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const plan::StorageGroup &group = plan.groups[g];
    if (!group.blockList.empty())
      ofGroup[g] = blockOf(group.blockList, group.blockIndex, "");
    for (int64_t m : group.members)
      ofTensor.at(m) = ofGroup[g];
  }
  // A tensor outside groups belongs to a block when only that block reads it.
  constexpr int64_t kUnread = -2;
  std::vector<int64_t> reader(plan.tensors.size(), kUnread);
  for (size_t f = 0; f < plan.functions.size(); ++f)
    for (const plan::Instruction &inst : plan.functions[f].body)
      if (inst.kind == plan::Instruction::Kind::Global) {
        int64_t &r = reader.at(inst.target);
        r = r == kUnread || r == ofFunction[f] ? ofFunction[f] : -1;
      }
  for (size_t t = 0; t < plan.tensors.size(); ++t)
    if (plan.tensors[t].group < 0)
      ofTensor[t] = reader[t] == kUnread ? -1 : reader[t];
}

std::string PlanBlocks::name(int64_t b) const {
  return b >= 0 ? names.at(b) : "outside_blocks";
}

/// Records the max-abs of every block's outputs while armed.
struct Inspector::OutputRecorder : ExecutorObserver {
  explicit OutputRecorder(const PlanBlocks &blocks) : blocks(blocks) {}

  void blockReturned(const plan::Instruction &inst, const std::vector<IValue> &results) override {
    if (!armed)
      return;
    const int64_t b = blocks.ofFunction.at(inst.target);
    if (b < 0)
      return;
    c10::NoGradGuard noGrad;
    for (const IValue &r : results) {
      if (!isFloatTensor(r) || r.toTensor().numel() == 0)
        continue;
      at::Tensor v = at::linalg_vector_norm(r.toTensor().detach(), kInf).to(at::kDouble);
      at::Tensor &m = maxAbs.at(b);
      m = m.defined() ? at::maximum(m, v) : v;
    }
  }
  void instructionDone(size_t, size_t, const std::vector<IValue> &) override {}

  const PlanBlocks &blocks;
  bool armed = false;
  std::vector<at::Tensor> maxAbs; ///< by block; undefined: no output yet
};

Inspector::Inspector(Model &model, int64_t every)
    : model_(model), every_(every), blocks_(model.plan()) {
  if (every < 0)
    throw std::invalid_argument("inspecting every " + std::to_string(every) +
                                " steps: the interval must be at least 1 (0: never)");
  const plan::Plan &p = model.plan();
  const size_t entries = blocks_.names.size() + 1; // the blocks, then outside blocks
  contributions_.resize(entries);
  std::map<std::string, int64_t> groupByName;
  if (p.zeroStage != 0)
    for (size_t g = 0; g < p.groups.size(); ++g)
      groupByName[p.groups[g].name] = static_cast<int64_t>(g);
  Comm &world = model.world();
  const int64_t shardRanks = p.shardGroupSize > 0 ? p.shardGroupSize : world.size();
  for (size_t k = 0; k < model.parameters().size(); ++k) {
    const std::string &name = model.parameterNames().at(k);
    int64_t block = -1;
    bool sharded = false;
    if (auto it = groupByName.find(name); it != groupByName.end()) {
      block = blocks_.ofGroup[it->second];
      sharded = true;
    } else if (int64_t t = p.findTensor(name); t >= 0) {
      block = blocks_.ofTensor[t];
    }
    const size_t entry = block >= 0 ? static_cast<size_t>(block) : entries - 1;
    entryOfParameter_.push_back(static_cast<int64_t>(entry));
    // Each element once over all ranks: a shard on the first shard group's
    // ranks (the others under hybrid sharding hold copies), a replicated
    // tensor on rank 0.
    if (sharded ? world.rank() < shardRanks : world.rank() == 0)
      contributions_[entry].push_back(k);
  }
  recorder_ = std::make_unique<OutputRecorder>(blocks_);
  if (every_ > 0)
    model_.setObserver(recorder_.get());
  if (every_ > 0 && model_.device().is_cuda())
    for (at::Tensor &b : hostBuffers_) // allocated before any step: no allocation inside one
      b = at::empty({static_cast<int64_t>(entries), 5},
                    at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
}

Inspector::~Inspector() { model_.setObserver(nullptr); }

void Inspector::beginStep(int64_t step) {
  recorder_->armed = every_ > 0 && step % every_ == 0;
  if (recorder_->armed)
    recorder_->maxAbs.assign(blocks_.names.size(), at::Tensor());
}

void Inspector::afterGradients(int64_t step) {
  if (!recorder_->armed)
    return;
  recorder_->armed = false;
  c10::NoGradGuard noGrad;
  const at::TensorOptions doubles = at::TensorOptions().dtype(at::kDouble).device(model_.device());
  const at::Tensor zero = at::zeros({}, doubles), none = at::full({}, -1.0, doubles);
  const std::vector<at::Tensor> &params = model_.parameters();
  const size_t entries = contributions_.size();
  // One foreach call per statistic over this rank's tensors, entry by entry.
  std::vector<at::Tensor> values, grads;
  std::vector<size_t> valueEnd(entries), gradEnd(entries);
  for (size_t e = 0; e < entries; ++e) {
    for (size_t k : contributions_[e]) {
      values.push_back(params[k].detach());
      if (params[k].grad().defined())
        grads.push_back(params[k].grad());
    }
    valueEnd[e] = values.size();
    gradEnd[e] = grads.size();
  }
  // Per entry: sum of squares (col 0) and max-abs (col 1) of `ts`.
  auto reduce = [&](const std::vector<at::Tensor> &ts, const std::vector<size_t> &end,
                    std::vector<at::Tensor> &sums, std::vector<at::Tensor> &maxes) {
    std::vector<at::Tensor> squares, maxAbs = norms(ts, kInf);
    for (const at::Tensor &n : norms(ts, 2))
      squares.push_back(n.pow(2));
    size_t begin = 0;
    for (size_t e = 0; e < entries; ++e) {
      if (end[e] == begin) {
        sums.push_back(zero);
        maxes.push_back(zero);
        continue;
      }
      std::vector<at::Tensor> sq(squares.begin() + begin, squares.begin() + end[e]);
      std::vector<at::Tensor> mx(maxAbs.begin() + begin, maxAbs.begin() + end[e]);
      sums.push_back(at::stack(sq).sum());
      maxes.push_back(at::stack(mx).max());
      begin = end[e];
    }
  };
  std::vector<at::Tensor> paramSums, paramMax, gradSums, gradMax, outputMax;
  reduce(values, valueEnd, paramSums, paramMax);
  reduce(grads, gradEnd, gradSums, gradMax);
  for (size_t e = 0; e < entries; ++e) {
    const bool block = e < recorder_->maxAbs.size();
    outputMax.push_back(block && recorder_->maxAbs[e].defined() ? recorder_->maxAbs[e] : none);
  }
  at::Tensor sums = at::stack({at::stack(paramSums), at::stack(gradSums)}, 1);
  at::Tensor maxes = at::stack({at::stack(paramMax), at::stack(gradMax), at::stack(outputMax)}, 1);
  Comm &world = model_.world();
  if (world.size() > 1) {
    sums = onCommDevice(sums, world);
    maxes = onCommDevice(maxes, world);
    world.allReduce(sums, ReduceOp::Sum)->wait();
    world.allReduce(maxes, ReduceOp::Max)->wait();
    sums = sums.to(model_.device());
    maxes = maxes.to(model_.device());
  }
  at::Tensor roots = sums.sqrt();
  at::Tensor table = at::stack({roots.select(1, 0), maxes.select(1, 0), roots.select(1, 1),
                                maxes.select(1, 1), maxes.select(1, 2)},
                               1);
  Record record;
  record.step = step;
  if (table.is_cuda()) {
    // Read when the step is reported, after its event (recorded later on
    // the same stream) says the device has run it; by then the record
    // before it (the other buffer) has been reported.
    record.values = hostBuffers_[nextBuffer_++ % hostBuffers_.size()];
    record.values.copy_(table, /*non_blocking=*/true);
  } else {
    record.values = table.cpu().contiguous();
  }
  records_.push_back(std::move(record));
}

bool Inspector::report(int64_t step, MetricsWriter *metrics) {
  while (!records_.empty() && records_.front().step < step)
    records_.pop_front();
  if (records_.empty() || records_.front().step != step)
    return false;
  Record record = std::move(records_.front());
  records_.pop_front();
  const double *v = record.values.const_data_ptr<double>();
  last_.clear();
  for (int64_t e = 0; e < record.values.size(0); ++e) {
    const double *row = v + 5 * e;
    BlockInspection b;
    b.name = blocks_.name(e < static_cast<int64_t>(blocks_.names.size()) ? e : -1);
    b.paramNorm = row[0];
    b.paramMaxAbs = row[1];
    b.gradNorm = row[2];
    b.gradMaxAbs = row[3];
    b.outputMaxAbs = row[4] < 0 ? std::nan("") : row[4];
    last_.push_back(std::move(b));
  }
  if (metrics)
    metrics->inspection(step, last_);
  return true;
}

at::Tensor Inspector::haltOnNonFinite(const at::Tensor &gradNorm) {
  c10::NoGradGuard noGrad;
  at::Tensor bad = gradNorm.reshape({1}).isfinite().logical_not().to(at::kFloat);
  halted_ = halted_.defined() ? at::maximum(halted_, bad) : bad;
  return halted_;
}

//===----------------------------------------------------------------------===//
// The source of a non-finite value
//===----------------------------------------------------------------------===//

namespace {

/// What the replay found first on this rank.
struct Finding {
  enum Kind : int64_t {
    None = -1,
    Parameter,     ///< a parameter read holds NaN/inf
    Operator,      ///< an operator with finite inputs gave NaN/inf
    FromConstants, ///< an operator fed by non-finite constants or buffers gave NaN/inf
    Loss,          ///< the outputs were finite, the loss is not
    Gradient,      ///< an operator's backward with finite incoming gradients gave NaN/inf
    IncomingGradient, ///< the first non-finite gradient an operator's backward received
  };
  int64_t order = -1; ///< the instruction count (or hook firing) where found; -1: nothing
  int64_t kind = None, micro = -1, function = -1, index = -1;

  static constexpr int kFields = 5;
};

/// Checks every instruction (forward) or hooks every operator's backward.
struct NonFiniteFinder : ExecutorObserver {
  NonFiniteFinder(const plan::Plan &plan) : plan(plan) { checkInstructions = true; }

  void blockReturned(const plan::Instruction &, const std::vector<IValue> &) override {}

  void instructionDone(size_t function, size_t index, const std::vector<IValue> &regs) override {
    ++count;
    const plan::Instruction &inst = plan.functions[function].body[index];
    if (backward) {
      if (c10::GradMode::is_enabled())
        hook(function, index, inst, regs);
      return;
    }
    if (first.order >= 0)
      return;
    if (inst.kind == plan::Instruction::Kind::Global) {
      const plan::TensorInfo &info = plan.tensors.at(inst.target);
      if (info.isParameter && nonFiniteValue(regs[inst.results.at(0)]))
        found(first, Finding::Parameter, function, index);
      return;
    }
    bool bad = false;
    for (int64_t r : inst.results)
      bad = bad || (isFloatTensor(regs[r]) && nonFinite(regs[r].toTensor()));
    if (!bad)
      return;
    bool badInput = false;
    for (const plan::Arg &a : inst.args)
      badInput = badInput || nonFiniteArg(a, regs);
    if (!badInput)
      found(first, Finding::Operator, function, index);
    else if (fromConstants.order < 0)
      found(fromConstants, Finding::FromConstants, function, index);
  }

  void found(Finding &f, int64_t kind, size_t function, size_t index, int64_t order = -1) {
    f.order = order >= 0 ? order : count;
    f.kind = kind;
    f.micro = micro;
    f.function = static_cast<int64_t>(function);
    f.index = static_cast<int64_t>(index);
  }

  /// A post hook on the autograd node of an operator's results.
  struct Hook : torch::autograd::FunctionPostHook {
    Hook(NonFiniteFinder &finder, size_t function, size_t index)
        : finder(finder), function(function), index(index) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list &outputs,
                                              const torch::autograd::variable_list &inputs) override {
      const int64_t order = ++finder.fired;
      if (finder.first.order >= 0)
        return outputs;
      bool badOut = false, badIn = false;
      for (const at::Tensor &g : outputs)
        badOut = badOut || nonFinite(g);
      if (!badOut)
        return outputs;
      for (const at::Tensor &g : inputs)
        badIn = badIn || nonFinite(g);
      if (!badIn)
        finder.found(finder.first, Finding::Gradient, function, index, order);
      else if (finder.fromConstants.order < 0)
        finder.found(finder.fromConstants, Finding::IncomingGradient, function, index, order);
      return outputs;
    }
    NonFiniteFinder &finder;
    size_t function, index;
  };

  void hook(size_t function, size_t index, const plan::Instruction &inst,
            const std::vector<IValue> &regs) {
    // A fused region is one autograd node (fusion::FusedRegion), hooked as
    // an operator is.
    if (inst.kind != plan::Instruction::Kind::Aten && inst.kind != plan::Instruction::Kind::Fused)
      return;
    for (int64_t r : inst.results) {
      if (!regs[r].isTensor() || !regs[r].toTensor().defined())
        continue;
      const std::shared_ptr<torch::autograd::Node> &node = regs[r].toTensor().grad_fn();
      if (!node)
        continue;
      bool hooked = false; // (results of one operator share a node)
      for (const auto &h : node->post_hooks())
        hooked = hooked || dynamic_cast<const Hook *>(h.get()) != nullptr;
      if (!hooked)
        node->add_post_hook(std::make_unique<Hook>(*this, function, index));
    }
  }

  const plan::Plan &plan;
  bool backward = false;
  int64_t count = 0, fired = 0, micro = 0;
  Finding first, fromConstants;
};

/// The first finding over all ranks (the smallest order; the same on every
/// rank). Collective.
Finding firstOverRanks(const Finding &mine, Comm &world) {
  if (world.size() == 1)
    return mine;
  at::TensorOptions doubles = at::TensorOptions().dtype(at::kDouble);
  // Max of -order: the smallest order wins.
  at::Tensor order = at::full({1}, mine.order >= 0 ? -static_cast<double>(mine.order) : -kInf,
                              doubles);
  order = onCommDevice(order, world);
  world.allReduce(order, ReduceOp::Max)->wait();
  const double best = -order.cpu().item<double>();
  if (!std::isfinite(best))
    return Finding{};
  const bool winner = mine.order >= 0 && static_cast<double>(mine.order) == best;
  at::Tensor fields = at::full({Finding::kFields}, -1.0, doubles);
  if (winner) {
    double *f = fields.mutable_data_ptr<double>();
    f[0] = static_cast<double>(mine.kind);
    f[1] = static_cast<double>(mine.micro);
    f[2] = static_cast<double>(mine.function);
    f[3] = static_cast<double>(mine.index);
    f[4] = 0;
  }
  fields = onCommDevice(fields, world);
  world.allReduce(fields, ReduceOp::Max)->wait();
  fields = fields.cpu();
  const double *f = fields.const_data_ptr<double>();
  Finding out;
  out.order = static_cast<int64_t>(best);
  out.kind = static_cast<int64_t>(f[0]);
  out.micro = static_cast<int64_t>(f[1]);
  out.function = static_cast<int64_t>(f[2]);
  out.index = static_cast<int64_t>(f[3]);
  return out;
}

/// "aten::addmm in transformer.h.1.mlp.c_fc.forward (file.py:119:1)".
std::string describeInstruction(const plan::Plan &plan, int64_t function, int64_t index) {
  const plan::Function &f = plan.functions.at(function);
  const plan::Instruction &inst = f.body.at(index);
  std::string what = inst.op.empty() ? std::string("an instruction") : inst.op;
  if (inst.kind == plan::Instruction::Kind::Fused) {
    // "the fused pointwise region of aten::sqrt, aten::mul.Tensor, ...": the
    // operators of its body, each once, in order.
    std::vector<std::string> ops;
    for (const plan::Instruction &op : plan.functions.at(inst.target).body)
      if (op.kind == plan::Instruction::Kind::Aten &&
          std::find(ops.begin(), ops.end(), op.op) == ops.end())
        ops.push_back(op.op);
    what = "the fused " + inst.op + " region of ";
    for (size_t i = 0; i < ops.size(); ++i)
      what += (i ? ", " : "") + ops[i];
  }
  return what + " in " + f.name + (inst.location.empty() ? "" : " (" + inst.location + ")");
}

/// The first operator that reads register `reg` of `function` after
/// instruction `after`, following it into called functions.
std::optional<std::pair<int64_t, int64_t>> firstUser(const plan::Plan &plan, int64_t function,
                                                     int64_t reg, int64_t after, int depth = 0) {
  const plan::Function &f = plan.functions.at(function);
  for (size_t n = static_cast<size_t>(after) + 1; n < f.body.size(); ++n) {
    const plan::Instruction &inst = f.body[n];
    for (size_t a = 0; a < inst.args.size(); ++a) {
      if (!usesRegister(inst.args[a], reg))
        continue;
      if (inst.kind == plan::Instruction::Kind::Aten || inst.kind == plan::Instruction::Kind::Fused)
        return std::make_pair(function, static_cast<int64_t>(n));
      if (inst.kind == plan::Instruction::Kind::Call && depth < 8 &&
          inst.args[a].kind == plan::Arg::Kind::Register) {
        const plan::Function &callee = plan.functions.at(inst.target);
        if (a < callee.params.size())
          if (auto user = firstUser(plan, inst.target, callee.params[a], -1, depth + 1))
            return user;
      }
    }
  }
  return std::nullopt;
}

} // namespace

std::string Inspector::locateNonFinite(const StepReplay &replay) {
  const plan::Plan &plan = model_.plan();
  Comm &world = model_.world();
  NonFiniteFinder finder(plan);
  recorder_->armed = false;
  model_.setObserver(&finder);
  struct Restore {
    Model &model;
    ExecutorObserver *observer;
    ~Restore() { model.setObserver(observer); }
  } restore{model_, every_ > 0 ? recorder_.get() : nullptr};
  const bool several = replay.microBatches > 1;
  auto ofMicro = [&](int64_t micro) {
    return several ? " of micro-batch " + std::to_string(micro + 1) : std::string();
  };
  auto blockOf = [&](int64_t function) {
    const int64_t b = blocks_.ofFunction.at(function);
    return b >= 0 ? "block " + blocks_.names[b] : std::string("outside blocks");
  };

  try {
    // 1. The forward, every instruction checked.
    {
      c10::NoGradGuard noGrad;
      std::mt19937_64 rng = replay.rng;
      for (int64_t m = 0; m < replay.microBatches; ++m) {
        finder.micro = m;
        at::Tensor loss = replay.loss(m, rng);
        ++finder.count;
        if (finder.first.order < 0 && finder.fromConstants.order < 0 && nonFinite(loss))
          finder.found(finder.first, Finding::Loss, 0, 0);
      }
    }
    Finding f = firstOverRanks(finder.first, world);
    if (f.order < 0)
      f = firstOverRanks(finder.fromConstants, world);
    const std::string inForward = "the first non-finite value in the forward" + ofMicro(f.micro);
    switch (f.kind) {
    case Finding::Parameter: {
      const plan::Instruction &inst = plan.functions.at(f.function).body.at(f.index);
      std::string text = inForward + " is the parameter " + plan.tensors.at(inst.target).name +
                         " of " + blockOf(f.function);
      if (auto user = firstUser(plan, f.function, inst.results.at(0), f.index))
        text += ", read by " + describeInstruction(plan, user->first, user->second);
      return text;
    }
    case Finding::Operator:
      return inForward + " comes from " + blockOf(f.function) + ": " +
             describeInstruction(plan, f.function, f.index) + ", whose inputs are finite";
    case Finding::FromConstants:
      return inForward + " comes from " + blockOf(f.function) + ": " +
             describeInstruction(plan, f.function, f.index) +
             ", from non-finite constants or buffers";
    case Finding::Loss:
      return "the model's outputs in the forward" + ofMicro(f.micro) +
             " are finite; the loss computed from them is not";
    default:
      break;
    }

    // 2. The forward is finite: the backward, every operator's gradients
    // checked, then the gradients of each block.
    replay.zeroGrad();
    finder.backward = true;
    {
      std::mt19937_64 rng = replay.rng;
      for (int64_t m = 0; m < replay.microBatches; ++m) {
        finder.micro = m;
        replay.loss(m, rng).div(static_cast<double>(replay.microBatches)).backward();
      }
      model_.synchronizeGradients();
    }
    f = firstOverRanks(finder.first, world);
    if (f.order < 0)
      f = firstOverRanks(finder.fromConstants, world);
    const size_t entries = contributions_.size();
    at::Tensor flags = at::zeros({static_cast<int64_t>(entries)}, at::TensorOptions().dtype(at::kDouble));
    for (size_t k = 0; k < model_.parameters().size(); ++k)
      if (nonFinite(model_.parameters()[k].grad()))
        flags.mutable_data_ptr<double>()[entryOfParameter_[k]] = 1;
    if (world.size() > 1) {
      flags = onCommDevice(flags, world);
      world.allReduce(flags, ReduceOp::Max)->wait();
      flags = flags.cpu();
    }
    replay.zeroGrad();
    std::vector<std::string> bad;
    for (size_t e = entries; e-- > 0;) // the backward's order: last block first
      if (flags.const_data_ptr<double>()[e] != 0)
        bad.push_back(e + 1 == entries ? "outside blocks" : "block " + blocks_.names[e]);
    std::string gradients;
    if (!bad.empty()) { // at most three named, in the backward's order
      const size_t named = bad.size() <= 3 ? bad.size() : 2;
      gradients = "the gradients of " + bad[0];
      for (size_t i = 1; i < named; ++i)
        gradients += (i + 1 == bad.size() ? " and " : ", ") + bad[i];
      if (named < bad.size())
        gradients += " and " + std::to_string(bad.size() - named) + " more blocks";
      gradients += " are not finite";
    }
    if (f.kind == Finding::Gradient)
      return "the forward is finite; the first non-finite gradient of the backward" + ofMicro(f.micro) +
             " comes from " + blockOf(f.function) + ": the backward of " +
             describeInstruction(plan, f.function, f.index) + ", whose incoming gradients are finite" +
             (gradients.empty() ? "" : " (" + gradients + ")");
    if (f.kind == Finding::IncomingGradient)
      return "the forward is finite; the first non-finite gradient of the backward" + ofMicro(f.micro) +
             " reaches " + blockOf(f.function) + " at " + describeInstruction(plan, f.function, f.index) +
             " from outside the program's operators (the loss or the parameters' storage)" +
             (gradients.empty() ? "" : " (" + gradients + ")");
    if (!gradients.empty())
      return "the forward is finite; " + gradients;
    return "replaying the step with the weights it ran with gives finite values and gradients "
           "(the failure did not recur)";
  } catch (const std::exception &e) {
    return std::string("looking for the first non-finite value failed: ") + e.what();
  }
}

} // namespace bmt::runtime
