//===- ShardedArchive.cpp - bmt IR -> plan + weights -> sharded.pt --------===//
//
// Numbers every SSA value of a function as a register (block arguments
// first, then op results in order), turns each op into a plan instruction,
// converts constant attributes to IValues, and writes the archive with the
// weights of the source model.
//
//===----------------------------------------------------------------------===//

#include "bmt/Export/ShardedArchive.h"

#include "bmt/Export/CheckpointWeights.h"
#include "bmt/Import/TorchExportWeights.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/MoeAttrs.h"
#include "bmt/Dialect/TensorSplit.h"
#include "bmt/Plan/Archive.h"
#include "bmt/Plan/Plan.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringSet.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <chrono>
#include <map>
#include <sys/stat.h>

using namespace mlir;
namespace plan = bmt::plan;

namespace {

/// An export failure at an op; caught once in exportShardedArchive.
struct ExportError {
  Location loc;
  std::string message;
};

std::string locationString(Location loc) {
  if (auto flc = dyn_cast<FileLineColLoc>(loc))
    return flc.getFilename().str() + ":" + std::to_string(flc.getLine()) + ":" +
           std::to_string(flc.getColumn());
  return "";
}

c10::ScalarType scalarTypeOf(Type t, Location loc) {
  if (t.isF32()) return c10::ScalarType::Float;
  if (t.isF16()) return c10::ScalarType::Half;
  if (t.isBF16()) return c10::ScalarType::BFloat16;
  if (t.isF64()) return c10::ScalarType::Double;
  if (t.isSignlessInteger(64)) return c10::ScalarType::Long;
  if (t.isSignlessInteger(32)) return c10::ScalarType::Int;
  if (t.isSignlessInteger(16)) return c10::ScalarType::Short;
  if (t.isSignlessInteger(8)) return c10::ScalarType::Char;
  if (t.isUnsignedInteger(8)) return c10::ScalarType::Byte;
  if (t.isSignlessInteger(1)) return c10::ScalarType::Bool;
  std::string name;
  llvm::raw_string_ostream os(name);
  os << t;
  throw ExportError{loc, "element type " + name + " has no PyTorch dtype"};
}

at::Tensor tensorOf(DenseElementsAttr attr, Location loc) {
  auto type = cast<RankedTensorType>(attr.getType());
  c10::ScalarType dtype = scalarTypeOf(type.getElementType(), loc);
  std::vector<int64_t> shape(type.getShape().begin(), type.getShape().end());
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  if (dtype == c10::ScalarType::Bool) {
    bool *data = out.data_ptr<bool>();
    int64_t i = 0;
    for (bool b : attr.getValues<bool>())
      data[i++] = b;
    return out;
  }
  ArrayRef<char> raw = attr.getRawData();
  size_t elementBytes = c10::elementSize(dtype);
  if (attr.isSplat()) {
    // One element stored; repeat it.
    for (int64_t i = 0; i < out.numel(); ++i)
      std::memcpy(static_cast<char *>(out.data_ptr()) + i * elementBytes,
                  raw.data(), elementBytes);
  } else {
    std::memcpy(out.data_ptr(), raw.data(), out.nbytes());
  }
  return out;
}

c10::IValue constantOf(Attribute attr, Location loc) {
  if (isa<bmt::NoneAttr>(attr))
    return c10::IValue();
  if (auto b = dyn_cast<BoolAttr>(attr))
    return b.getValue();
  if (auto i = dyn_cast<IntegerAttr>(attr)) {
    if (i.getType().isInteger(1))
      return i.getValue().getBoolValue();
    return i.getValue().getSExtValue();
  }
  if (auto f = dyn_cast<FloatAttr>(attr))
    return f.getValueAsDouble();
  if (auto s = dyn_cast<StringAttr>(attr))
    return s.getValue().str();
  if (auto d = dyn_cast<bmt::DeviceAttr>(attr))
    return c10::Device(d.getName().str());
  if (auto e = dyn_cast<DenseElementsAttr>(attr))
    return tensorOf(e, loc);
  std::string text;
  llvm::raw_string_ostream os(text);
  os << attr;
  throw ExportError{loc, "constant " + text + " cannot be put in a plan"};
}

class PlanBuilder {
public:
  explicit PlanBuilder(ModuleOp module) : module(module) {}

  plan::Plan build() {
    plan::Plan p;
    if (auto source = module->getAttrOfType<StringAttr>("bmt.source"))
      p.source = source.str();
    p.tensorParallel = bmt::tensorParallelOf(module);
    if (auto ep = module->getAttrOfType<IntegerAttr>("bmt.expert_parallel"))
      p.expertParallel = ep.getInt();
    if (auto pipeline = module->getAttrOfType<DictionaryAttr>("bmt.pipeline")) {
      auto stages = pipeline.getAs<IntegerAttr>("stages");
      auto list = pipeline.getAs<FlatSymbolRefAttr>("block_list");
      auto firsts = pipeline.getAs<DenseI64ArrayAttr>("first_blocks");
      if (!stages || !list || !firsts)
        throw ExportError{module.getLoc(), "bmt.pipeline needs stages, block_list and "
                                           "first_blocks"};
      p.pipelineStages = stages.getInt();
      p.pipelineBlockList = list.getValue().str();
      p.pipelineFirstBlocks.assign(firsts.asArrayRef().begin(), firsts.asArrayRef().end());
      if (auto virtualStages = pipeline.getAs<IntegerAttr>("virtual_stages"))
        p.pipelineVirtualStages = virtualStages.getInt();
    }
    if (auto vocab = module->getAttrOfType<IntegerAttr>("bmt.vocab_size")) {
      p.vocabParallel = true;
      p.vocabSize = vocab.getInt();
    }
    for (Operation &op : module.getBody()->getOperations()) {
      if (auto param = dyn_cast<bmt::ParameterOp>(op))
        addTensor(p, op, param.getSymName(), cast<RankedTensorType>(param.getType()),
                  param.getAliases(), /*isParameter=*/true, param.getRequiresGrad());
      else if (auto buffer = dyn_cast<bmt::BufferOp>(op))
        addTensor(p, op, buffer.getSymName(), cast<RankedTensorType>(buffer.getType()),
                  buffer.getAliases(), /*isParameter=*/false, /*requiresGrad=*/false);
    }
    // Function indices: the entry ("forward") first, then module order.
    SmallVector<func::FuncOp> funcs;
    if (auto entry = module.lookupSymbol<func::FuncOp>("forward"))
      funcs.push_back(entry);
    else
      throw ExportError{module.getLoc(), "the module has no 'forward' function"};
    for (auto f : module.getOps<func::FuncOp>())
      if (f.getSymName() != "forward")
        funcs.push_back(f);
    for (auto g : module.getOps<bmt::StorageGroupOp>())
      addGroup(p, g);
    // Tensor parallelism: every group T times, one copy per TP rank (the
    // same members and offsets, local sizes); members, gathers and
    // releases name the tp_rank 0 copy (docs/sharded-format.md). A group
    // of experts split over the expert group stays one (tp_rank -1): its
    // experts are whole and the same on every TP rank.
    auto expertGroup = [&](const plan::StorageGroup &g) {
      return !g.members.empty() && p.tensors[g.members[0]].split.isExpertSplit();
    };
    if (p.tensorParallel > 1) {
      size_t base = p.groups.size();
      for (size_t g = 0; g < base; ++g)
        if (!expertGroup(p.groups[g]))
          p.groups[g].tpRank = 0;
      for (int64_t t = 1; t < p.tensorParallel; ++t)
        for (size_t g = 0; g < base; ++g) {
          if (expertGroup(p.groups[g]))
            continue;
          plan::StorageGroup copy = p.groups[g];
          copy.tpRank = t;
          p.groups.push_back(std::move(copy));
        }
    }
    // Expert parallelism: a group of parameters split over the expert group
    // (bmt-zero gives them groups of their own) E times, one copy per
    // position in the group; members, gathers and releases name the
    // ep_rank 0 copy (docs/sharded-format.md).
    if (p.expertParallel > 1) {
      size_t base = p.groups.size();
      for (size_t g = 0; g < base; ++g) {
        if (!expertGroup(p.groups[g]))
          continue;
        p.groups[g].epRank = 0;
        for (int64_t e = 1; e < p.expertParallel; ++e) {
          plan::StorageGroup copy = p.groups[g];
          copy.epRank = e;
          p.groups.push_back(std::move(copy));
        }
      }
    }
    if (auto zero = module->getAttrOfType<DictionaryAttr>("bmt.zero")) {
      if (auto stage = zero.getAs<IntegerAttr>("stage"))
        p.zeroStage = stage.getInt();
      if (auto g = zero.getAs<IntegerAttr>("shard_group_size"))
        p.shardGroupSize = g.getInt();
    }
    if (p.groups.empty())
      p.zeroStage = 0;
    else if (p.zeroStage == 0)
      throw ExportError{module.getLoc(), "storage groups without a ZeRO stage (bmt.zero)"};
    // What the passes assumed about the inputs (bmt-causal-attention's
    // assume-unpadded): the runtime must not feed anything else.
    if (auto assumptions = module->getAttr("bmt.assumptions")) {
      auto list = dyn_cast<ArrayAttr>(assumptions);
      if (!list)
        throw ExportError{module.getLoc(), "bmt.assumptions is not a list of strings"};
      for (Attribute a : list) {
        auto text = dyn_cast<StringAttr>(a);
        if (!text || text.getValue() != plan::kAssumeAttentionMaskAllOnes)
          throw ExportError{module.getLoc(), "bmt.assumptions holds an assumption the runtime "
                                             "does not know (it knows \"" +
                                                 std::string(plan::kAssumeAttentionMaskAllOnes) +
                                                 "\")"};
        p.assumptions.push_back(text.str());
      }
    }
    if (auto overlap = module->getAttrOfType<DictionaryAttr>("bmt.overlap"))
      if (auto depth = overlap.getAs<IntegerAttr>("prefetch_depth"))
        p.prefetchDepth = depth.getInt();
    for (size_t i = 0; i < funcs.size(); ++i)
      functionIndex[funcs[i].getSymName()] = static_cast<int64_t>(i);
    firstFusedFunction = static_cast<int64_t>(funcs.size());
    for (func::FuncOp f : funcs)
      p.functions.push_back(buildFunction(f));
    // The bodies of bmt.fused regions, after the module's functions.
    for (plan::Function &body : fusedBodies)
      p.functions.push_back(std::move(body));
    p.entry = 0;
    if (auto type = funcs[0]->getAttrOfType<StringAttr>("bmt.module_type"))
      p.modelType = type.str();
    p.objective = plan::objectiveFor(p);
    return p;
  }

private:
  void addTensor(plan::Plan &p, Operation &op, StringRef name, RankedTensorType type,
                 std::optional<ArrayAttr> aliases, bool isParameter, bool requiresGrad) {
    plan::TensorInfo t;
    t.name = name.str();
    if (aliases)
      for (Attribute a : *aliases)
        t.aliases.push_back(cast<StringAttr>(a).str());
    t.isParameter = isParameter;
    t.requiresGrad = requiresGrad;
    t.dtype = scalarTypeOf(type.getElementType(), op.getLoc());
    t.shape.assign(type.getShape().begin(), type.getShape().end());
    t.split = bmt::parameterSplitOf(&op); // over the TP or the expert group
    tensorIndex[name] = static_cast<int64_t>(p.tensors.size());
    p.tensors.push_back(std::move(t));
  }

  void addGroup(plan::Plan &p, bmt::StorageGroupOp op) {
    plan::StorageGroup g;
    g.name = op.getSymName().str();
    g.dtype = scalarTypeOf(op.getElementType(), op.getLoc());
    g.size = static_cast<int64_t>(op.getSize());
    g.frozen = op.getFrozen();
    if (auto block = op.getBlockAttr()) {
      g.blockList = block.getValue().str();
      g.blockIndex = static_cast<int64_t>(*op.getBlockIndex());
    }
    int64_t index = static_cast<int64_t>(p.groups.size());
    for (auto [ref, offset] : llvm::zip(op.getParams(), op.getOffsets())) {
      StringRef name = cast<FlatSymbolRefAttr>(ref).getValue();
      auto it = tensorIndex.find(name);
      if (it == tensorIndex.end())
        throw ExportError{op.getLoc(), "storage group " + g.name + " names unknown " + name.str()};
      if (p.tensors[it->second].group != -1)
        throw ExportError{op.getLoc(), name.str() + " is in two storage groups"};
      p.tensors[it->second].group = index;
      g.members.push_back(it->second);
      g.offsets.push_back(offset);
    }
    groupIndex[g.name] = index;
    p.groups.push_back(std::move(g));
  }

  int64_t groupOf(FlatSymbolRefAttr ref, Location loc) {
    auto it = groupIndex.find(ref.getValue());
    if (it == groupIndex.end())
      throw ExportError{loc, "unknown storage group " + ref.getValue().str()};
    return it->second;
  }

  plan::Arg argOf(const bmt::AtenArg &arg, Location loc) {
    if (arg.isOperand())
      return plan::Arg::ofRegister(reg(arg.getOperand()));
    if (arg.isList()) {
      plan::Arg a;
      a.kind = plan::Arg::Kind::List;
      for (const bmt::AtenArg &e : arg.getElements())
        a.elements.push_back(argOf(e, loc));
      return a;
    }
    return plan::Arg::ofConstant(constantOf(arg.getAttr(), loc));
  }

  int64_t reg(Value v) {
    auto it = registers.find(v);
    if (it == registers.end()) {
      int64_t r = static_cast<int64_t>(registers.size());
      registers[v] = r;
      return r;
    }
    return it->second;
  }

  std::vector<int64_t> regs(ValueRange values) {
    std::vector<int64_t> out;
    for (Value v : values)
      out.push_back(reg(v));
    return out;
  }

  plan::Function buildFunction(func::FuncOp f) {
    registers.clear();
    plan::Function out;
    out.name = f.getSymName().str();
    if (auto path = f->getAttrOfType<StringAttr>("bmt.module_path"))
      out.modulePath = path.str();
    if (f.getBody().getBlocks().size() != 1)
      throw ExportError{f.getLoc(), "function " + out.name + " must have one block"};
    Block &body = f.getBody().front();
    out.params = regs(body.getArguments());
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      auto name = f.getArgAttrOfType<StringAttr>(i, "bmt.name");
      out.paramNames.push_back(name ? name.str() : "");
    }
    for (unsigned i = 0; i < f.getNumResults(); ++i) {
      auto name = f.getResultAttrOfType<StringAttr>(i, "bmt.name");
      out.resultNames.push_back(name ? name.str() : "");
    }
    for (Operation &op : body.getOperations()) {
      plan::Instruction inst;
      inst.location = locationString(op.getLoc());
      if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        out.returns = regs(ret.getOperands());
        continue;
      }
      if (auto aten = dyn_cast<bmt::AtenOp>(op)) {
        inst.kind = plan::Instruction::Kind::Aten;
        inst.op = aten.getName().str();
        for (const bmt::AtenArg &a : bmt::getAtenArgs(aten))
          inst.args.push_back(argOf(a, op.getLoc()));
      } else if (auto call = dyn_cast<func::CallOp>(op)) {
        inst.kind = plan::Instruction::Kind::Call;
        auto it = functionIndex.find(call.getCallee());
        if (it == functionIndex.end())
          throw ExportError{op.getLoc(), "call of unknown function " + call.getCallee().str()};
        inst.target = it->second;
        for (Value v : call.getOperands())
          inst.args.push_back(plan::Arg::ofRegister(reg(v)));
        if (auto list = call->getAttrOfType<FlatSymbolRefAttr>("bmt.block")) {
          inst.blockList = list.getValue().str();
          if (auto index = call->getAttrOfType<IntegerAttr>("bmt.block_index"))
            inst.blockIndex = index.getInt();
          if (auto checkpoint = call->getAttrOfType<BoolAttr>("bmt.checkpoint"))
            inst.checkpoint = checkpoint.getValue();
        }
      } else if (auto fused = dyn_cast<bmt::FusedOp>(op)) {
        // The body becomes a function of its own (params: the block
        // arguments; the ops; one return), run as one kernel by the
        // runtime; its registers are its own.
        inst.kind = plan::Instruction::Kind::Fused;
        inst.op = fused.getKind().str();
        for (Value v : fused.getInputs())
          inst.args.push_back(plan::Arg::ofRegister(reg(v)));
        inst.target = firstFusedFunction + static_cast<int64_t>(fusedBodies.size());
        fusedBodies.push_back(buildFusedBody(fused, out.name));
      } else if (auto gather = dyn_cast<bmt::AllGatherOp>(op)) {
        inst.kind = plan::Instruction::Kind::Gather;
        inst.target = groupOf(gather.getGroupAttr(), op.getLoc());
      } else if (auto release = dyn_cast<bmt::ReleaseOp>(op)) {
        inst.kind = plan::Instruction::Kind::Release;
        inst.target = groupOf(release.getGroupAttr(), op.getLoc());
      } else if (auto copy = dyn_cast<bmt::TpCopyOp>(op)) {
        inst.kind = plan::Instruction::Kind::TpCopy;
        inst.args.push_back(plan::Arg::ofRegister(reg(copy.getInput())));
      } else if (auto gather = dyn_cast<bmt::TpAllGatherOp>(op)) {
        inst.kind = plan::Instruction::Kind::TpAllGather;
        inst.op = std::to_string(gather.getDim());
        inst.args.push_back(plan::Arg::ofRegister(reg(gather.getInput())));
      } else if (auto scatter = dyn_cast<bmt::TpReduceScatterOp>(op)) {
        inst.kind = plan::Instruction::Kind::TpReduceScatter;
        inst.op = std::to_string(scatter.getDim());
        inst.args.push_back(plan::Arg::ofRegister(reg(scatter.getInput())));
      } else if (auto dispatch = dyn_cast<bmt::MoeDispatchOp>(op)) {
        inst.kind = plan::Instruction::Kind::MoeDispatch;
        inst.op = std::to_string(dispatch.getNumExperts());
        if (auto bias = dispatch->getAttrOfType<FlatSymbolRefAttr>(bmt::kRouterBiasAttr)) {
          auto it = tensorIndex.find(bias.getValue());
          if (it == tensorIndex.end())
            throw ExportError{op.getLoc(), "unknown router bias " + bias.getValue().str()};
          inst.target = it->second;
        }
        inst.args.push_back(plan::Arg::ofRegister(reg(dispatch.getHidden())));
        inst.args.push_back(plan::Arg::ofRegister(reg(dispatch.getExpertIds())));
        if (dispatch.getWeights())
          inst.args.push_back(plan::Arg::ofRegister(reg(dispatch.getWeights())));
      } else if (auto combine = dyn_cast<bmt::MoeCombineOp>(op)) {
        inst.kind = plan::Instruction::Kind::MoeCombine;
        inst.args.push_back(plan::Arg::ofRegister(reg(combine.getRows())));
        inst.args.push_back(plan::Arg::ofRegister(reg(combine.getPermutation())));
        inst.args.push_back(plan::Arg::ofRegister(reg(combine.getTopK())));
      } else if (auto adapter = dyn_cast<bmt::LoraAdapterOp>(op)) {
        inst.kind = plan::Instruction::Kind::LoraAdapter;
        for (Value v : {adapter.getBase(), adapter.getInput(), adapter.getLoraA(),
                        adapter.getLoraB()})
          inst.args.push_back(plan::Arg::ofRegister(reg(v)));
        inst.args.push_back(plan::Arg::ofConstant(adapter.getScale().convertToDouble()));
        inst.args.push_back(plan::Arg::ofConstant(adapter.getDropout().convertToDouble()));
        inst.args.push_back(plan::Arg::ofConstant(static_cast<int64_t>(adapter.getInputParts())));
      } else if (isa<bmt::TpRankOp>(op)) {
        inst.kind = plan::Instruction::Kind::TpRank;
      } else if (auto sum = dyn_cast<bmt::TpAllReduceOp>(op)) {
        inst.kind = plan::Instruction::Kind::TpAllReduce;
        inst.args.push_back(plan::Arg::ofRegister(reg(sum.getInput())));
      } else if (auto global = dyn_cast<bmt::GetGlobalOp>(op)) {
        inst.kind = plan::Instruction::Kind::Global;
        auto it = tensorIndex.find(global.getGlobal());
        if (it == tensorIndex.end())
          throw ExportError{op.getLoc(), "unknown global " + global.getGlobal().str()};
        inst.target = it->second;
      } else if (auto constant = dyn_cast<bmt::ConstantOp>(op)) {
        inst.kind = plan::Instruction::Kind::Constant;
        inst.args.push_back(plan::Arg::ofConstant(constantOf(constant.getValue(), op.getLoc())));
      } else if (auto n = dyn_cast<bmt::NumToTensorOp>(op)) {
        inst.kind = plan::Instruction::Kind::NumToTensor;
        inst.args.push_back(plan::Arg::ofRegister(reg(n.getInput())));
      } else {
        throw ExportError{op.getLoc(), "op '" + op.getName().getStringRef().str() +
                                           "' cannot be put in a runtime plan"};
      }
      inst.results = regs(op.getResults());
      out.body.push_back(std::move(inst));
    }
    out.numRegisters = static_cast<int64_t>(registers.size());
    return out;
  }

  /// The plan function of a bmt.fused body, named "<caller>.fused<k>".
  plan::Function buildFusedBody(bmt::FusedOp fused, const std::string &caller) {
    llvm::DenseMap<Value, int64_t> outer;
    std::swap(outer, registers);
    plan::Function out;
    out.name = caller + ".fused" + std::to_string(fusedBodies.size());
    Block &body = fused.getBody().front();
    out.params = regs(body.getArguments());
    out.paramNames.assign(body.getNumArguments(), "");
    out.resultNames = {""};
    for (Operation &op : body.getOperations()) {
      if (auto yield = dyn_cast<bmt::YieldOp>(op)) {
        out.returns = regs(yield.getValues());
        continue;
      }
      plan::Instruction inst;
      inst.location = locationString(op.getLoc());
      if (auto aten = dyn_cast<bmt::AtenOp>(op)) {
        inst.kind = plan::Instruction::Kind::Aten;
        inst.op = aten.getName().str();
        for (const bmt::AtenArg &a : bmt::getAtenArgs(aten))
          inst.args.push_back(argOf(a, op.getLoc()));
      } else if (auto constant = dyn_cast<bmt::ConstantOp>(op)) {
        inst.kind = plan::Instruction::Kind::Constant;
        inst.args.push_back(plan::Arg::ofConstant(constantOf(constant.getValue(), op.getLoc())));
      } else if (auto n = dyn_cast<bmt::NumToTensorOp>(op)) { // rotate_half's half size
        inst.kind = plan::Instruction::Kind::NumToTensor;
        inst.args.push_back(plan::Arg::ofRegister(reg(n.getInput())));
      } else {
        throw ExportError{op.getLoc(), "op '" + op.getName().getStringRef().str() +
                                           "' cannot be in a bmt.fused body"};
      }
      inst.results = regs(op.getResults());
      out.body.push_back(std::move(inst));
    }
    out.numRegisters = static_cast<int64_t>(registers.size());
    std::swap(outer, registers);
    return out;
  }

  ModuleOp module;
  int64_t firstFusedFunction = 0;
  std::vector<plan::Function> fusedBodies;
  llvm::DenseMap<Value, int64_t> registers;
  llvm::StringMap<int64_t> tensorIndex;
  llvm::StringMap<int64_t> functionIndex;
  llvm::StringMap<int64_t> groupIndex;
};

/// Every tensor of a TorchScript archive by dotted name: parameters,
/// buffers and plain tensor attributes of all submodules.
std::map<std::string, at::Tensor> loadTorchScriptTensors(const std::string &path) {
  std::map<std::string, at::Tensor> out;
  torch::jit::Module root = torch::jit::load(path);
  for (const auto &p : root.named_parameters(/*recurse=*/true))
    out[p.name] = p.value;
  for (const auto &b : root.named_buffers(/*recurse=*/true))
    out[b.name] = b.value;
  for (const auto &a : root.named_attributes(/*recurse=*/true))
    if (a.value.isTensor() && !out.count(a.name))
      out[a.name] = a.value.toTensor();
  return out;
}

/// For each tensor of the plan, the checkpoint tensor it is streamed from
/// (found by its name or an alias), or null: read from the model file
/// (buffers the checkpoint does not hold, plans without a checkpoint).
/// Checks, before anything is written, that every parameter that needs
/// bytes is in the checkpoint with the plan's shape and a dtype that
/// converts to the plan's (floating to floating, else the same).
std::vector<const bmt::CheckpointWeights::Tensor *>
checkpointTensors(const plan::Plan &p, const bmt::CheckpointWeights *checkpoint, Location loc,
                  const std::map<std::string, std::string> &generated) {
  std::vector<const bmt::CheckpointWeights::Tensor *> stored(p.tensors.size(), nullptr);
  if (!checkpoint)
    return stored;
  auto shapeText = [](const std::vector<int64_t> &shape) {
    std::string text = "[";
    for (size_t i = 0; i < shape.size(); ++i)
      text += (i ? ", " : "") + std::to_string(shape[i]);
    return text + "]";
  };
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const plan::TensorInfo &info = p.tensors[i];
    const bmt::CheckpointWeights::Tensor *t = checkpoint->find(info.name);
    for (size_t a = 0; !t && a < info.aliases.size(); ++a)
      t = checkpoint->find(info.aliases[a]);
    std::string what = (info.isParameter ? "parameter " : "buffer ") + info.name;
    if (!t) {
      if (info.isParameter && info.init.empty() && !generated.count(info.name))
        throw ExportError{loc, p.source + " records the checkpoint " + checkpoint->directory() +
                                   " but no tensor of it for " + what};
      continue;
    }
    std::string file = checkpoint->files()[t->file];
    if (t->shape != info.shape)
      throw ExportError{loc, "checkpoint tensor " + t->key + " (" + file + ") has shape " +
                                 shapeText(t->shape) + ", the program's " + what + " has " +
                                 shapeText(info.shape)};
    bool floats = c10::isFloatingType(t->dtype) && c10::isFloatingType(info.dtype);
    if (!floats && t->dtype != info.dtype)
      throw ExportError{loc, "checkpoint tensor " + t->key + " (" + file + ") is " +
                                 std::string(c10::toString(t->dtype)) + ", the program's " +
                                 what + " is " + std::string(c10::toString(info.dtype))};
    if (info.init.empty())
      stored[i] = t;
  }
  return stored;
}

/// The init rule of each trainable parameter for a weights-free plan (see
/// ExportOptions::randomInit), by symbol name.
std::map<std::string, std::string> initRules(ModuleOp module) {
  llvm::StringSet<> scales;
  module.walk([&](bmt::AtenOp aten) {
    StringRef name = aten.getName();
    bool norm = name.starts_with("aten::layer_norm") || name.starts_with("aten::rms_norm") ||
                name.starts_with("aten::native_layer_norm");
    bool mul = name.starts_with("aten::mul");
    if (!norm && !mul)
      return;
    for (auto [i, operand] : llvm::enumerate(aten.getOperands())) {
      // Inside a bmt.fused body, a block argument stands for the fused
      // op's operand of the same position.
      Value v = operand;
      if (auto arg = dyn_cast<BlockArgument>(v))
        if (auto fused = dyn_cast<bmt::FusedOp>(arg.getOwner()->getParentOp()))
          v = fused.getInputs()[arg.getArgNumber()];
      auto global = v.getDefiningOp<bmt::GetGlobalOp>();
      // layer_norm(input, shape, weight, bias, ...): the weight is the
      // second operand (the shape is a constant); mul: either operand.
      if (global && (mul || i == 1))
        scales.insert(global.getGlobal());
    }
  });
  std::map<std::string, std::string> rules;
  for (auto param : module.getOps<bmt::ParameterOp>()) {
    // Frozen parameters keep the source's values; bmt-lora's adapters
    // their own (bmt.generated_init: B zero, so step 0 is the base).
    if (!param.getRequiresGrad() || param->hasAttr("bmt.generated_init"))
      continue;
    auto type = cast<RankedTensorType>(param.getType());
    std::string name = param.getSymName().str();
    if (type.getRank() >= 2)
      rules[name] = "normal:0.02";
    else
      rules[name] = scales.contains(name) ? "ones" : "zeros";
  }
  return rules;
}

/// The Hugging Face files (plan::kHfFileNames) that the model archive at
/// `source` carries as extra files ("extra/config.json": TorchScript's
/// _extra_files, torch.export.save's extra_files; bmt-export-hf writes
/// them). None for an archive without them; a file that cannot be read as
/// a zip has none either (reading its weights reports it).
std::vector<plan::NamedFile> hfFilesOf(const std::string &source) {
  std::vector<plan::NamedFile> files;
  try {
    caffe2::serialize::PyTorchStreamReader reader(source);
    for (const char *name : plan::kHfFileNames) {
      std::string record = std::string("extra/") + name;
      if (!reader.hasRecord(record))
        continue;
      auto [data, size] = reader.getRecord(record);
      files.emplace_back(name, std::string(static_cast<const char *>(data.get()), size));
    }
  } catch (const c10::Error &) {
    return {};
  }
  return files;
}

/// The value of a parameter with a bmt.generated_init rule: "zeros", or
/// "uniform:<bound>": uniform in [-bound, bound) drawn by a CPU generator
/// seeded with the CRC-32 of the parameter's name (so Python reproduces it:
/// torch.empty(shape).uniform_(-bound, bound,
/// generator=torch.Generator().manual_seed(zlib.crc32(name.encode())))).
at::Tensor generatedTensor(const plan::TensorInfo &info, const std::string &rule) {
  at::Tensor t = at::zeros(info.shape, at::TensorOptions().dtype(at::kFloat));
  if (llvm::StringRef(rule).starts_with("uniform:")) {
    double bound = std::stod(rule.substr(8));
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
        static_cast<uint64_t>(plan::crc32(info.name.data(), info.name.size())));
    t.uniform_(-bound, bound, gen);
  } else if (rule != "zeros") {
    throw plan::PlanError("unknown generated_init rule '" + rule + "' of " + info.name);
  }
  return t.to(info.dtype);
}

} // namespace

LogicalResult bmt::exportShardedArchive(ModuleOp module, llvm::StringRef path,
                                        llvm::StringRef programText,
                                        ExportStats *stats, const ExportOptions &options) {
  try {
    plan::Plan p = PlanBuilder(module).build();
    if (options.randomInit)
      for (const auto &[name, rule] : initRules(module))
        p.tensors[p.findTensor(name)].init = rule;
    auto format = module->getAttrOfType<StringAttr>("bmt.source_format");
    if (p.source.empty() || !format)
      throw ExportError{module.getLoc(),
                        "the module names no source model (bmt.source) to take the weights from"};
    if (format.getValue() != "torchscript" && format.getValue() != "torch.export")
      throw ExportError{module.getLoc(), "weights of source format '" + format.str() +
                                             "' cannot be read yet"};
    // Parameters a pass added (bmt-lora's adapters): no bytes in the
    // source; their values are made here by the rule of bmt.generated_init.
    std::map<std::string, std::string> generated;
    for (auto param : module.getOps<bmt::ParameterOp>())
      if (auto rule = param->getAttrOfType<StringAttr>("bmt.generated_init"))
        generated[param.getSymName().str()] = rule.str();
    std::map<std::string, at::Tensor> weights;
    std::unique_ptr<bmt::CheckpointWeights> checkpoint;
    try {
      checkpoint = bmt::CheckpointWeights::open(p.source);
    } catch (const std::runtime_error &e) {
      throw ExportError{module.getLoc(), e.what()};
    }
    try {
      weights = format.getValue() == "torch.export" ? bmt::loadTorchExportTensors(p.source)
                                                    : loadTorchScriptTensors(p.source);
    } catch (const std::runtime_error &e) {
      throw ExportError{module.getLoc(), "cannot read the weights from " + p.source +
                                             ": " + e.what()};
    } catch (const c10::Error &e) {
      std::string what = e.what_without_backtrace();
      throw ExportError{module.getLoc(), "cannot read the weights from " + p.source +
                                             ": " + what.substr(0, what.find('\n'))};
    }
    std::vector<const bmt::CheckpointWeights::Tensor *> stored =
        checkpointTensors(p, checkpoint.get(), module.getLoc(), generated);
    auto weightOf = [&](size_t i) -> at::Tensor {
      const plan::TensorInfo &info = p.tensors[i];
      if (!info.init.empty())
        throw plan::PlanError("no weights for " + info.name + " in a weights-free plan");
      auto it = weights.find(info.name);
      if (it == weights.end() && generated.count(info.name))
        return generatedTensor(info, generated.at(info.name));
      if (it == weights.end())
        throw plan::PlanError("the source model " + p.source + " has no tensor " + info.name);
      return it->second;
    };
    plan::TensorReader fromModel = plan::readerOfWholeTensors(p, weightOf);
    auto read = [&](size_t i, int64_t begin, int64_t end, at::Tensor &dst) {
      if (stored[i])
        checkpoint->read(*stored[i], begin, end, dst);
      else
        fromModel(i, begin, end, dst);
    };
    auto start = std::chrono::steady_clock::now();
    plan::writeArchive(path.str(), p, programText.str(), read, hfFilesOf(p.source));
    if (stats) {
      stats->seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      struct stat st;
      if (::stat(path.str().c_str(), &st) == 0)
        stats->bytesWritten = st.st_size;
      if (checkpoint) {
        stats->checkpoint = checkpoint->directory();
        stats->checkpointFiles = static_cast<int64_t>(checkpoint->files().size());
        stats->bytesRead = checkpoint->bytesRead();
      }
    }
    if (stats) {
      stats->numTensors = static_cast<int64_t>(p.tensors.size());
      for (const auto &t : p.tensors)
        if (t.init.empty())
          stats->weightBytes += t.nbytes();
      stats->numFunctions = static_cast<int64_t>(p.functions.size());
      for (const auto &f : p.functions)
        stats->numInstructions += static_cast<int64_t>(f.body.size());
    }
    return success();
  } catch (const ExportError &e) {
    emitError(e.loc) << path << ": " << e.message;
  } catch (const plan::PlanError &e) {
    emitError(module.getLoc()) << path << ": " << e.what();
  } catch (const c10::Error &e) {
    std::string what = e.what_without_backtrace();
    emitError(module.getLoc()) << path << ": " << what.substr(0, what.find('\n'));
  } catch (const std::exception &e) {
    emitError(module.getLoc()) << path << ": " << e.what();
  }
  return failure();
}
