//===- Executor.cpp - run a plan through the ATen dispatcher --------------===//

#include "bmt/Runtime/exec/Executor.h"

#include "bmt/Runtime/comm/Collectives.h"
#include "bmt/Runtime/fusion/Fused.h"
#include "exec/Embedding.h"
#include "exec/Linear.h"
#include "exec/LoraAdapter.h"
#include "exec/Moe.h"
#include "exec/Recompute.h"
#include "exec/Stage.h"
#include "bmt/Support/ErrorText.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ScalarOps.h>
#include <ATen/ops/cat.h>
#include <c10/util/Exception.h>

#include <functional>

using c10::IValue;

namespace bmt::runtime {

namespace {

/// What instruction `inst` is, for a collective that failed inside it:
/// ZeRO's all-gathers run in Gather, Global (a parameter whose group is not
/// gathered yet) and block calls (re-gathers, reduce-scatters of the
/// backward), tensor parallelism's in its own instructions.
std::string collectiveInstruction(const plan::Plan &plan, const plan::Instruction &inst) {
  using Kind = plan::Instruction::Kind;
  switch (inst.kind) {
  case Kind::Gather:
    return "the ZeRO all-gather of storage group " + plan.groups.at(inst.target).name;
  case Kind::Global:
    return "the ZeRO all-gather of " + plan.tensors.at(inst.target).name + "'s storage group";
  case Kind::Call:
    return "the call of " + (inst.blockList.empty() ? std::string("a function")
                                                    : "block " + inst.blockList + "." +
                                                          std::to_string(inst.blockIndex)) +
           " (its ZeRO collectives)";
  case Kind::TpAllReduce:
    return "the tensor-parallel all-reduce";
  case Kind::TpAllGather:
    return "the tensor-parallel all-gather";
  case Kind::TpReduceScatter:
    return "the tensor-parallel reduce-scatter";
  case Kind::TpCopy:
    return "the tensor-parallel copy";
  default:
    return (inst.op.empty() ? std::string("an instruction") : inst.op) + " (a collective in it)";
  }
}


/// Operators TorchScript registers outside the dispatcher.
using Native = std::function<IValue(std::vector<IValue> &)>;

const Native *findNative(const std::string &name) {
  static const std::map<std::string, Native> natives = {
      {"aten::Int.Tensor",
       [](std::vector<IValue> &a) { return IValue(a[0].toTensor().item<int64_t>()); }},
      {"aten::Float.Tensor",
       [](std::vector<IValue> &a) { return IValue(a[0].toTensor().item<double>()); }},
      {"aten::Bool.Tensor",
       [](std::vector<IValue> &a) { return IValue(a[0].toTensor().item<bool>()); }},
      {"aten::ScalarImplicit",
       [](std::vector<IValue> &a) { return IValue(a[0].toTensor().item()); }},
      {"aten::dim",
       [](std::vector<IValue> &a) { return IValue(a[0].toTensor().dim()); }},
  };
  auto it = natives.find(name);
  return it == natives.end() ? nullptr : &it->second;
}

/// The element type of a list schema type (unwrapping Optional), or null.
c10::TypePtr listElementType(const c10::TypePtr &type) {
  c10::TypePtr t = type;
  if (auto optional = t->cast<c10::OptionalType>())
    t = optional->getElementType();
  if (auto list = t->cast<c10::ListType>())
    return list->getElementType();
  return nullptr;
}

/// A list IValue typed as the schema wants it (int[] -> List<int64_t>, ...).
IValue typedList(const std::vector<IValue> &elements, const c10::TypePtr &elementType) {
  switch (elementType->kind()) {
  case c10::TypeKind::IntType:
  case c10::TypeKind::SymIntType: {
    c10::List<int64_t> l;
    for (const IValue &e : elements)
      l.push_back(e.toInt());
    return l;
  }
  case c10::TypeKind::FloatType: {
    c10::List<double> l;
    for (const IValue &e : elements)
      l.push_back(e.toDouble());
    return l;
  }
  case c10::TypeKind::BoolType: {
    c10::List<bool> l;
    for (const IValue &e : elements)
      l.push_back(e.toBool());
    return l;
  }
  case c10::TypeKind::TensorType: {
    c10::List<at::Tensor> l;
    for (const IValue &e : elements)
      l.push_back(e.toTensor());
    return l;
  }
  case c10::TypeKind::OptionalType: {
    c10::List<std::optional<at::Tensor>> l;
    for (const IValue &e : elements)
      l.push_back(e.isNone() ? std::optional<at::Tensor>() : e.toTensor());
    return l;
  }
  default:
    throw ExecutionError("unsupported list element type " + elementType->repr_str());
  }
}

/// A TP instruction's collective (bmt/Runtime/comm/Collectives.h);
/// `computeValue` false: the collective is not run (its result
/// uninitialised, its backward recorded), as Skip::Collective asks.
at::Tensor applyTpInstruction(plan::Instruction::Kind kind, const at::Tensor &x, Comm &tp,
                              int64_t dim, bool computeValue) {
  switch (kind) {
  case plan::Instruction::Kind::TpAllReduce:
    return reduceFromTensorParallel(x, tp, computeValue);
  case plan::Instruction::Kind::TpCopy:
    return copyToTensorParallel(x, tp, computeValue);
  case plan::Instruction::Kind::TpAllGather:
    return gatherFromSequenceParallel(x, tp, dim, computeValue);
  default: // TpReduceScatter
    return reduceScatterToSequenceParallel(x, tp, dim, computeValue);
  }
}

bool hasRegister(const plan::Arg &arg) {
  if (arg.kind == plan::Arg::Kind::Register)
    return true;
  for (const plan::Arg &e : arg.elements)
    if (hasRegister(e))
      return true;
  return false;
}

} // namespace

/// An instruction ready to run: resolved operator, typed constants.
struct Executor::Prepared {
  std::optional<c10::OperatorHandle> op;
  const Native *native = nullptr;
  std::vector<c10::TypePtr> argTypes;   // schema argument types (Aten)
  std::vector<std::optional<IValue>> fixed; // constant args, already typed
  /// aten::to to the run device (a GPU): the index of its non_blocking
  /// argument, and of its target device for to.dtype_layout (-1: none).
  int nonBlocking = -1, targetDevice = -1;
  /// aten::linear / aten::addmm / aten::mm: the weight's layout, for
  /// linearWithGradientSlot (under hooks: the weight gradient into its slot).
  std::optional<LinearLayout> linear;
  /// aten::embedding: under hooks, embeddingWithGradientSlot; it may add
  /// into the slot its weight's other reader was given (markTiedEmbeddings).
  bool embedding = false, addsIntoGivenSlot = false;
  /// Fused: the region (null when the generator does not take its body:
  /// then its ops run one by one).
  std::unique_ptr<fusion::FusedRegion> region;
};

Executor::Executor(const plan::Plan &plan, std::vector<at::Tensor> tensors,
                   at::Device device)
    : plan_(plan), tensors_(std::move(tensors)), device_(device),
      recomputePlans_(std::make_unique<RecomputePlans>(plan)) {
  if (tensors_.size() != plan.tensors.size())
    throw ExecutionError("executor: " + std::to_string(tensors_.size()) +
                         " tensors given, the plan has " +
                         std::to_string(plan.tensors.size()));
  // Constants: device constants become the run device; other values are kept.
  std::function<IValue(const IValue &)> retarget = [&](const IValue &v) -> IValue {
    if (v.isDevice())
      return IValue(device_);
    if (v.isTensor() && v.toTensor().dim() > 0)
      return IValue(v.toTensor().to(device_));
    if (v.isList()) {
      c10::impl::GenericList out(c10::AnyType::get());
      for (const IValue &e : v.toListRef())
        out.push_back(retarget(e));
      return out;
    }
    return v;
  };
  std::function<IValue(const plan::Arg &)> constantValue = [&](const plan::Arg &a) {
    if (a.kind == plan::Arg::Kind::List) {
      c10::impl::GenericList out(c10::AnyType::get());
      for (const plan::Arg &e : a.elements)
        out.push_back(constantValue(e));
      return IValue(out);
    }
    return retarget(a.constant);
  };

  for (const plan::Function &f : plan.functions) {
    prepared_.emplace_back();
    for (const plan::Instruction &inst : f.body) {
      auto p = std::make_unique<Prepared>();
      if (inst.kind == plan::Instruction::Kind::Constant) {
        p->fixed.push_back(constantValue(inst.args.at(0)));
      } else if (inst.kind == plan::Instruction::Kind::Fused) {
        const plan::Function &body = plan.functions.at(inst.target);
        try {
          p->region = std::make_unique<fusion::FusedRegion>(fusion::buildRegion(body), body.name);
        } catch (const fusion::FusionError &) {
          // The body runs op by op (a plan written by another bmt-opt).
        }
      } else if (inst.kind == plan::Instruction::Kind::Aten) {
        size_t ns = inst.op.find("::");
        size_t dot = inst.op.find('.', ns == std::string::npos ? 0 : ns + 2);
        std::string name = inst.op.substr(0, dot);
        std::string overload = dot == std::string::npos ? "" : inst.op.substr(dot + 1);
        p->native = findNative(inst.op);
        if (!p->native) {
          p->op = c10::Dispatcher::singleton().findSchema({name, overload});
          if (!p->op)
            throw ExecutionError("operator " + inst.op + " (in " + f.name +
                                 ") is not available in this LibTorch");
          const auto &args = p->op->schema().arguments();
          if (args.size() != inst.args.size())
            throw ExecutionError("operator " + inst.op + " takes " +
                                 std::to_string(args.size()) + " arguments, the plan gives " +
                                 std::to_string(inst.args.size()));
          for (const c10::Argument &a : args)
            p->argTypes.push_back(a.type());
          if (inst.op == "aten::linear")
            p->linear = LinearLayout::OutIn;
          else if (inst.op == "aten::addmm" || inst.op == "aten::mm")
            p->linear = LinearLayout::InOut;
          p->embedding = inst.op == "aten::embedding";
          // A trace copies host tensors it made (torch.tensor(0.0) in a
          // mask, say) to the device with aten::to; on a GPU that copy is
          // made from pinned memory without blocking (see call()).
          if (device_.is_cuda() && name == "aten::to" &&
              (overload == "device" || overload == "dtype_layout" || overload == "other"))
            for (size_t i = 0; i < args.size(); ++i) {
              if (args[i].name() == "non_blocking")
                p->nonBlocking = static_cast<int>(i);
              if (overload == "dtype_layout" && args[i].name() == "device")
                p->targetDevice = static_cast<int>(i);
            }
        }
        for (size_t i = 0; i < inst.args.size(); ++i) {
          const plan::Arg &a = inst.args[i];
          if (hasRegister(a)) {
            p->fixed.emplace_back();
            continue;
          }
          IValue v = constantValue(a);
          if (v.isList() && !p->argTypes.empty()) {
            if (c10::TypePtr elementType = listElementType(p->argTypes[i])) {
              std::vector<IValue> elements(v.toListRef().begin(), v.toListRef().end());
              v = typedList(elements, elementType);
            }
          }
          p->fixed.push_back(std::move(v));
        }
      }
      prepared_.back().push_back(std::move(p));
    }
  }
  markTiedEmbeddings();
}

void Executor::markTiedEmbeddings() {
  // How many times each function runs in one pass (entry: once).
  const size_t numFunctions = plan_.functions.size();
  std::vector<std::vector<int64_t>> callers(numFunctions); // callee -> calling function, per site
  for (size_t f = 0; f < numFunctions; ++f)
    for (const plan::Instruction &inst : plan_.functions[f].body)
      if (inst.kind == plan::Instruction::Kind::Call || inst.kind == plan::Instruction::Kind::Fused)
        callers.at(inst.target).push_back(static_cast<int64_t>(f));
  std::vector<int64_t> runs(numFunctions, -1);
  std::function<int64_t(size_t)> timesRun = [&](size_t f) -> int64_t {
    if (runs[f] >= 0)
      return runs[f];
    runs[f] = 0; // (a cycle would count as never)
    int64_t n = f == static_cast<size_t>(plan_.entry) ? 1 : 0;
    for (int64_t caller : callers[f])
      n += timesRun(static_cast<size_t>(caller));
    return runs[f] = n;
  };
  // Every read of each Global's register, followed into the functions it
  // is passed to: (function, instruction, argument), instruction -1 for a
  // return (a read the caller makes), argument -1 inside a list.
  struct Read {
    size_t function;
    int64_t instruction, argument;
  };
  std::function<void(size_t, int64_t, std::vector<Read> &)> readsOf =
      [&](size_t f, int64_t reg, std::vector<Read> &out) {
        const plan::Function &fn = plan_.functions[f];
        std::function<bool(const plan::Arg &)> mentions = [&](const plan::Arg &a) {
          if (a.kind == plan::Arg::Kind::Register && a.reg == reg)
            return true;
          for (const plan::Arg &e : a.elements)
            if (mentions(e))
              return true;
          return false;
        };
        for (size_t n = 0; n < fn.body.size(); ++n) {
          const plan::Instruction &inst = fn.body[n];
          for (size_t i = 0; i < inst.args.size(); ++i) {
            const plan::Arg &a = inst.args[i];
            if (!mentions(a))
              continue;
            const bool plain = a.kind == plan::Arg::Kind::Register;
            if (plain && inst.kind == plan::Instruction::Kind::Call)
              readsOf(static_cast<size_t>(inst.target),
                      plan_.functions.at(inst.target).params.at(i), out);
            else
              out.push_back({f, static_cast<int64_t>(n), plain ? static_cast<int64_t>(i) : -1});
          }
        }
        for (int64_t r : fn.returns)
          if (r == reg)
            out.push_back({f, -1, -1});
      };
  std::map<int64_t, std::vector<Read>> reads; // by plan tensor
  for (size_t f = 0; f < numFunctions; ++f)
    for (const plan::Instruction &inst : plan_.functions[f].body)
      if (inst.kind == plan::Instruction::Kind::Global)
        readsOf(f, inst.results.at(0), reads[inst.target]);
  // A weight read, once a pass each, by one aten::embedding (as its weight)
  // and one linear layer (as its weight): the linear layer's backward, which
  // runs first, gets its slot and returns it as the weight's only other
  // gradient, so the embedding's backward may add into it.
  for (const auto &[tensor, list] : reads) {
    if (list.size() != 2)
      continue;
    const Read *embedding = nullptr, *linear = nullptr;
    for (const Read &r : list) {
      if (r.instruction < 0 || timesRun(r.function) != 1)
        break;
      const plan::Instruction &inst = plan_.functions[r.function].body[r.instruction];
      if (inst.kind != plan::Instruction::Kind::Aten)
        break;
      if (inst.op == "aten::embedding" && r.argument == 0)
        embedding = &r;
      else if ((inst.op == "aten::linear" && r.argument == 1) ||
               (inst.op == "aten::addmm" && r.argument == 2))
        linear = &r;
    }
    if (embedding && linear)
      prepared_[embedding->function][embedding->instruction]->addsIntoGivenSlot = true;
  }
}

Executor::~Executor() = default;

std::vector<fusion::FusedRegion *> Executor::fusedRegions() const {
  std::vector<fusion::FusedRegion *> out;
  for (const auto &function : prepared_)
    for (const auto &p : function)
      if (p->region)
        out.push_back(p->region.get());
  return out;
}

ExecutorHooks::~ExecutorHooks() = default;

at::Tensor ExecutorHooks::gradientSlot(const at::Tensor &) { return {}; }

at::Tensor ExecutorHooks::givenGradientSlot(const at::Tensor &) { return {}; }

ExecutorObserver::~ExecutorObserver() = default;

std::vector<IValue> Executor::run(const std::vector<IValue> &inputs) {
  if (!stage_)
    return call(static_cast<size_t>(plan_.entry), inputs);
  if (stage_->stage > 0 && stageInputs.size() != stage_->in.size())
    throw ExecutionError("pipeline stage " + std::to_string(stage_->stage) + " expects " +
                         std::to_string(stage_->in.size()) + " values from the stage before, got " +
                         std::to_string(stageInputs.size()));
  stageOutputs.clear();
  std::vector<IValue> results = call(static_cast<size_t>(plan_.entry), inputs, nullptr, 0);
  stageInputs.clear();
  std::fill(stage_->frames.begin(), stage_->frames.end(), nullptr);
  return results;
}

void Executor::setPipelineStage(int64_t stage, std::vector<bool> heldGroups) {
  setPipelineChunks({stage}, {heldGroups});
}

void Executor::setPipelineChunks(const std::vector<int64_t> &chunks,
                                 const std::vector<std::vector<bool>> &heldGroups) {
  stagePlans_.clear();
  for (size_t i = 0; i < chunks.size(); ++i)
    stagePlans_.push_back(planStage(plan_, chunks[i], heldGroups.at(i)));
  stage_ = stagePlans_.empty() ? nullptr : stagePlans_.front().get();
}

std::vector<IValue> Executor::call(size_t index, std::vector<IValue> args,
                                   const RecomputePlan *graphOnly, int chainDepth) {
  const plan::Function &f = plan_.functions[index];
  if (args.size() != f.params.size())
    throw ExecutionError(f.name + " takes " + std::to_string(f.params.size()) +
                         " arguments, got " + std::to_string(args.size()));
  std::vector<IValue> regs(static_cast<size_t>(f.numRegisters));
  // Expert parallelism: each dispatch's exchange, for the combine that
  // reads its permutation (both are in one function: bmt-moe-layers).
  std::vector<std::pair<at::Tensor, std::shared_ptr<moe::Exchange>>> exchanges;
  for (size_t i = 0; i < args.size(); ++i)
    regs[f.params[i]] = std::move(args[i]);

  std::function<IValue(const plan::Arg &, const c10::TypePtr &)> value =
      [&](const plan::Arg &a, const c10::TypePtr &type) -> IValue {
    switch (a.kind) {
    case plan::Arg::Kind::Register:
      return regs[a.reg];
    case plan::Arg::Kind::Constant:
      return a.constant;
    case plan::Arg::Kind::List: {
      c10::TypePtr elementType = type ? listElementType(type) : nullptr;
      std::vector<IValue> elements;
      for (const plan::Arg &e : a.elements)
        elements.push_back(value(e, elementType));
      if (!elementType)
        throw ExecutionError("a list argument where the schema wants none");
      return typedList(elements, elementType);
    }
    }
    return IValue();
  };

  // A pipeline stage's frame (Stage.h): only its instructions run; the
  // deepest frame takes the values entering the stage and leaves those
  // leaving it.
  const std::vector<char> *stageRuns = nullptr;
  bool deepest = false;
  if (stage_ && chainDepth >= 0) {
    stageRuns = &stage_->runs.at(chainDepth);
    stage_->frames.at(chainDepth) = &regs;
    deepest = static_cast<size_t>(chainDepth) + 1 == stage_->chain.size();
  }
  for (size_t n = 0; n < f.body.size(); ++n) {
    const plan::Instruction &inst = f.body[n];
    Prepared &p = *prepared_[index][n];
    if (deepest && stage_->stage > 0 && n == stage_->inPos)
      for (size_t k = 0; k < stage_->in.size(); ++k)
        (*stage_->frames.at(stage_->in[k].first))[stage_->in[k].second] = stageInputs.at(k);
    if (deepest && n == stage_->outPos)
      for (const auto &[d, r] : stage_->out)
        stageOutputs.push_back((*stage_->frames.at(d))[r]);
    if (stageRuns && !(*stageRuns)[n])
      continue;
    try {
      switch (inst.kind) {
      case plan::Instruction::Kind::Global:
        regs[inst.results[0]] = hooks_ && plan_.tensors[inst.target].group >= 0
                                    ? hooks_->global(inst.target)
                                    : tensors_[inst.target];
        if (observer_ && observer_->checkInstructions)
          observer_->instructionDone(index, n, regs);
        break;
      case plan::Instruction::Kind::Gather:
        if (hooks_)
          hooks_->gather(inst.target);
        break;
      case plan::Instruction::Kind::Release:
        if (hooks_)
          hooks_->release(inst.target);
        break;
      case plan::Instruction::Kind::Constant:
        regs[inst.results[0]] = *p.fixed[0];
        break;
      case plan::Instruction::Kind::TpRank:
        regs[inst.results[0]] = IValue(tensorComm_ ? tensorComm_->rank() : int64_t(0));
        break;
      case plan::Instruction::Kind::TpAllReduce:
      case plan::Instruction::Kind::TpCopy:
      case plan::Instruction::Kind::TpAllGather:
      case plan::Instruction::Kind::TpReduceScatter: {
        const IValue &in = regs[inst.args[0].reg];
        if (!in.isTensor())
          throw ExecutionError(std::string("a tensor-parallel instruction in ") + f.name +
                               (inst.location.empty() ? "" : " (" + inst.location + ")") +
                               " takes a tensor, not a " + in.tagKind());
        const at::Tensor &x = in.toTensor();
        if (!tensorComm_ || tensorComm_->size() == 1) {
          regs[inst.results[0]] = x; // a TP group of one: every one is the identity
          break;
        }
        const int64_t dim = inst.op.empty() ? 0 : std::stoll(inst.op);
        const bool computeValue = !graphOnly || graphOnly->skip[n] != Skip::Collective;
        regs[inst.results[0]] = applyTpInstruction(inst.kind, x, *tensorComm_, dim, computeValue);
        recomputeSkips_ += computeValue ? 0 : 1;
        break;
      }
      case plan::Instruction::Kind::LoraAdapter: {
        std::vector<at::Tensor> t;
        for (size_t i = 0; i < 4; ++i) {
          const IValue &v = regs[inst.args[i].reg];
          if (!v.isTensor())
            throw ExecutionError("lora_adapter in " + f.name +
                                 (inst.location.empty() ? "" : " (" + inst.location + ")") +
                                 " takes tensors, not a " + v.tagKind());
          t.push_back(v.toTensor());
        }
        // A row-parallel layer's input: this TP rank's part of it.
        const int64_t parts = inst.args[6].constant.toInt();
        if (parts > 1 && (!tensorComm_ || tensorComm_->size() != parts))
          throw ExecutionError("lora_adapter in " + f.name + " reads an input split over " +
                               std::to_string(parts) + " TP ranks, but this run's TP group has " +
                               std::to_string(tensorComm_ ? tensorComm_->size() : 1));
        const bool computeValue = !graphOnly || graphOnly->skip[n] != Skip::LoraAdapter;
        regs[inst.results[0]] =
            loraAdapter(hooks_, t[0], t[1], t[2], t[3], inst.args[4].constant.toDouble(),
                        adapterDropout_ ? inst.args[5].constant.toDouble() : 0.0, parts,
                        parts > 1 ? tensorComm_->rank() : 0, computeValue);
        recomputeSkips_ += computeValue ? 0 : 1;
        if (observer_ && observer_->checkInstructions)
          observer_->instructionDone(index, n, regs);
        break;
      }
      case plan::Instruction::Kind::MoeDispatch:
      case plan::Instruction::Kind::MoeCombine: {
        auto tensorArg = [&](size_t i) -> at::Tensor {
          const IValue &v = regs[inst.args.at(i).reg];
          if (!v.isTensor())
            throw ExecutionError(std::string(inst.kind == plan::Instruction::Kind::MoeDispatch
                                                 ? "moe_dispatch"
                                                 : "moe_combine") +
                                 " in " + f.name +
                                 (inst.location.empty() ? "" : " (" + inst.location + ")") +
                                 " takes tensors, not a " + v.tagKind());
          return v.toTensor();
        };
        try {
          if (inst.kind == plan::Instruction::Kind::MoeDispatch) {
            const int64_t numExperts = std::stoll(inst.op);
            const bool parallel = expertComm_ && expertComm_->size() > 1;
            moe::ExpertRange experts =
                parallel ? moe::expertsOfRank(numExperts, expertComm_->size(), expertComm_->rank())
                         : moe::allExperts(numExperts);
            // Expert weights split over the expert group: this rank's only.
            experts.localWeights = parallel && plan_.splitsExperts();
            moe::Dispatched d = moe::dispatch(
                tensorArg(0), tensorArg(1), experts, parallel ? expertComm_ : nullptr,
                inst.args.size() > 2 ? tensorArg(2) : at::Tensor());
            if (parallel && inst.args.size() < 3)
              throw std::invalid_argument(
                  "moe_dispatch without the routing weights under expert parallelism (compile "
                  "with --expert-parallel)");
            regs[inst.results.at(0)] = std::move(d.rows);
            regs[inst.results.at(1)] = std::move(d.sortedIds);
            regs[inst.results.at(2)] = std::move(d.offsets);
            regs[inst.results.at(3)] = d.permutation;
            if (inst.results.size() > 4)
              regs[inst.results.at(4)] = std::move(d.weights);
            if (d.exchange)
              exchanges.emplace_back(std::move(d.permutation), std::move(d.exchange));
            if (expertLoad_ && recomputing_ == 0)
              expertLoad_->add(static_cast<int64_t>(index << 32 | n), d.counts,
                               inst.target >= 0 ? tensors_[inst.target] : at::Tensor());
          } else {
            at::Tensor permutation = tensorArg(1);
            std::shared_ptr<moe::Exchange> exchange;
            for (auto it = exchanges.begin(); it != exchanges.end(); ++it)
              if (it->first.unsafeGetTensorImpl() == permutation.unsafeGetTensorImpl()) {
                exchange = std::move(it->second);
                exchanges.erase(it);
                break;
              }
            if (expertComm_ && expertComm_->size() > 1 && !exchange)
              throw std::invalid_argument(
                  "moe_combine reads a permutation no dispatch of this function exchanged");
            regs[inst.results.at(0)] = moe::combine(tensorArg(0), permutation,
                                                    regs[inst.args.at(2).reg].toInt(),
                                                    exchange.get());
          }
        } catch (const std::invalid_argument &e) {
          throw ExecutionError(std::string(e.what()) + " in " + f.name +
                               (inst.location.empty() ? "" : " (" + inst.location + ")"));
        }
        if (observer_ && observer_->checkInstructions)
          observer_->instructionDone(index, n, regs);
        break;
      }
      case plan::Instruction::Kind::NumToTensor:
        regs[inst.results[0]] =
            at::scalar_to_tensor(regs[inst.args[0].reg].toScalar());
        break;
      case plan::Instruction::Kind::Fused: {
        std::vector<at::Tensor> inputs;
        bool tensors = true;
        for (const plan::Arg &a : inst.args) {
          tensors = tensors && regs[a.reg].isTensor();
          inputs.push_back(tensors ? regs[a.reg].toTensor() : at::Tensor());
        }
        if (p.region && tensors && p.region->accepts(inputs)) {
          std::vector<at::Tensor> results = p.region->run(inputs);
          for (size_t k = 0; k < inst.results.size(); ++k)
            regs[inst.results[k]] = results.at(k);
        } else {
          std::vector<IValue> callArgs;
          for (const plan::Arg &a : inst.args)
            callArgs.push_back(regs[a.reg]);
          std::vector<IValue> results = call(inst.target, std::move(callArgs));
          for (size_t k = 0; k < inst.results.size(); ++k)
            regs[inst.results[k]] = std::move(results.at(k));
        }
        // Checked and hooked as one operator (Inspect's non-finite replay).
        if (observer_ && observer_->checkInstructions)
          observer_->instructionDone(index, n, regs);
        break;
      }
      case plan::Instruction::Kind::Call: {
        std::vector<IValue> callArgs;
        for (const plan::Arg &a : inst.args)
          callArgs.push_back(regs[a.reg]);
        std::vector<IValue> results;
        if (hooks_ && !inst.blockList.empty()) {
          size_t target = static_cast<size_t>(inst.target);
          size_t numResults = inst.results.size();
          results = hooks_->callBlock(
              inst, [this, target](std::vector<IValue> a) { return call(target, std::move(a)); },
              [this, target, numResults](std::vector<IValue> a) {
                ++recomputing_;
                struct Done {
                  int &depth;
                  ~Done() { --depth; }
                } done{recomputing_};
                // Inspect's replay reads every value: then nothing is skipped.
                const RecomputePlan *plan =
                    observer_ && observer_->checkInstructions
                        ? nullptr
                        : &recomputePlans_->forResults(target, std::vector<bool>(numResults, true));
                return call(target, std::move(a), plan);
              },
              std::move(callArgs));
        } else {
          const bool chain = stageRuns && static_cast<size_t>(chainDepth) + 1 <
                                              stage_->chain.size() &&
                             n == stage_->chainCall[chainDepth];
          results = call(inst.target, std::move(callArgs),
                         graphOnly ? graphOnly->callee[n] : nullptr, chain ? chainDepth + 1 : -1);
        }
        if (observer_ && !inst.blockList.empty())
          observer_->blockReturned(inst, results);
        for (size_t i = 0; i < inst.results.size(); ++i)
          regs[inst.results[i]] = std::move(results[i]);
        break;
      }
      case plan::Instruction::Kind::Aten: {
        std::vector<IValue> stack;
        stack.reserve(inst.args.size());
        for (size_t i = 0; i < inst.args.size(); ++i)
          stack.push_back(p.fixed[i] ? *p.fixed[i]
                                     : value(inst.args[i], p.argTypes.empty()
                                                               ? nullptr
                                                               : p.argTypes[i]));
        if (p.native) {
          regs[inst.results.at(0)] = (*p.native)(stack);
          break;
        }
        const Skip skip = graphOnly ? graphOnly->skip[n] : Skip::None;
        if (skip == Skip::Add && stack[0].isTensor() && stack[1].isTensor() &&
            stack[2].isScalar() &&
            stack[0].toTensor().device() == stack[1].toTensor().device()) {
          const double alpha = stack[2].toScalar().toDouble();
          regs[inst.results.at(0)] =
              addWithoutValue(stack[0].toTensor(), stack[1].toTensor(),
                              inst.op == "aten::sub.Tensor" ? -alpha : alpha);
          ++recomputeSkips_;
          break;
        }
        if (p.embedding && hooks_) {
          if (std::optional<at::Tensor> y =
                  embeddingWithGradientSlot(*hooks_, stack, p.addsIntoGivenSlot)) {
            regs[inst.results.at(0)] = *std::move(y);
            if (observer_ && observer_->checkInstructions)
              observer_->instructionDone(index, n, regs);
            break;
          }
        }
        if (p.linear && hooks_) {
          if (std::optional<at::Tensor> y =
                  linearWithGradientSlot(*hooks_, *p.linear, stack, skip != Skip::Linear)) {
            recomputeSkips_ += skip == Skip::Linear ? 1 : 0;
            regs[inst.results.at(0)] = *std::move(y);
            if (observer_ && observer_->checkInstructions)
              observer_->instructionDone(index, n, regs);
            break;
          }
        }
        if (p.nonBlocking >= 0 && stack[0].isTensor() && stack[0].toTensor().is_cpu() &&
            (p.targetDevice < 0 || stack[p.targetDevice].isDevice()) &&
            !stack[0].toTensor().is_pinned()) {
          // A host-to-device copy from pageable memory blocks the host until
          // the device is idle; from pinned memory it is queued (the caching
          // host allocator keeps the block until the copy has run).
          stack[0] = stack[0].toTensor().pin_memory();
          stack[p.nonBlocking] = true;
        }
        p.op->callBoxed(stack);
        if (stack.size() == 1 && stack[0].isTensorList() && inst.results.size() != 1) {
          std::vector<at::Tensor> list = stack[0].toTensorVector();
          if (list.size() != inst.results.size())
            throw ExecutionError(inst.op + " returned " + std::to_string(list.size()) +
                                 " tensors, the program unpacks " +
                                 std::to_string(inst.results.size()));
          for (size_t i = 0; i < list.size(); ++i)
            regs[inst.results[i]] = list[i];
        } else {
          if (stack.size() != inst.results.size())
            throw ExecutionError(inst.op + " returned " + std::to_string(stack.size()) +
                                 " values, the plan expects " +
                                 std::to_string(inst.results.size()));
          for (size_t i = 0; i < stack.size(); ++i)
            regs[inst.results[i]] = std::move(stack[i]);
        }
        if (observer_ && observer_->checkInstructions)
          observer_->instructionDone(index, n, regs);
        break;
      }
      }
    } catch (const ExecutionError &) {
      throw;
    } catch (const CommError &e) {
      // The collective's own message names the rank, the communicator and
      // the collective; this names the instruction that waited for it.
      throw ExecutionError(collectiveInstruction(plan_, inst) + " in " + f.name +
                           (inst.location.empty() ? "" : " (" + inst.location + ")") +
                           " failed: " + e.what());
    } catch (const fusion::FusionError &e) {
      throw ExecutionError("fused region in " + f.name +
                           (inst.location.empty() ? "" : " (" + inst.location + ")") +
                           " failed: " + e.what());
    } catch (const c10::Error &e) {
      throw ExecutionError(
          (inst.op.empty() ? std::string("instruction") : inst.op) + " in " + f.name +
          (inst.location.empty() ? "" : " (" + inst.location + ")") + " failed: " +
          bmt::firstErrorLine(e.what_without_backtrace()));
    }
  }
  std::vector<IValue> results;
  for (int64_t r : f.returns)
    results.push_back(regs[r]);
  return results;
}

} // namespace bmt::runtime
