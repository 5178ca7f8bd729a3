//===- Plan.cpp - the Plan, and its encoding as an IValue ----------------===//
//
// Encoding (decoded by PlanDecode.cpp; read by docs/sharded-format.md's readers too):
//   plan       dict  {version, source, model_type, objective, entry, tensors, functions,
//                     zero_stage, shard_group_size, prefetch_depth, groups,
//                     assumptions (version 3 on), tensor_parallel, vocab_parallel,
//                     vocab_size (version 6 on), pipeline {stages, block_list, first_blocks,
//                     virtual_stages (version 10, only when > 1)} (version 8 on)}
//   tensor     dict  {name, aliases, is_parameter, requires_grad, dtype, shape, record,
//                     offset, crc32, group, init,
//                     split (version 6, only when not the default)}
//   split      dict  {dim, chunks, padded_size, reduce_grad,
//                     over (version 8, only when "expert"; else the TP group)}
//                     (rule: bmt/Plan/SplitRule.h)
//   group      dict  {name, dtype, members, offsets, size, block_list, block_index, record,
//                     parts, part_size (version 4 on), tp_rank, crc32s (version 6 on),
//                     ep_rank (version 8 on), frozen (version 9 on),
//                     chunk_bytes, chunk_crc32s (any version; absent in older archives)}
//   function   dict  {name, module_path, num_registers, params, returns,
//                     param_names, result_names, body}
//   instruction tuple (kind, op, args, target, results, location, block_list,
//                      block_index, checkpoint)
//   arg        tuple ("r", register) | ("c", constant) | ("l", [arg, ...])
//
//===----------------------------------------------------------------------===//

#include "bmt/Plan/Plan.h"
#include "PlanKinds.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <map>

using c10::IValue;

namespace bmt::plan {

static const std::map<c10::ScalarType, std::string> &dtypeNames() {
  static const std::map<c10::ScalarType, std::string> names = {
      {c10::ScalarType::Float, "float32"},   {c10::ScalarType::Half, "float16"},
      {c10::ScalarType::BFloat16, "bfloat16"}, {c10::ScalarType::Double, "float64"},
      {c10::ScalarType::Long, "int64"},      {c10::ScalarType::Int, "int32"},
      {c10::ScalarType::Short, "int16"},     {c10::ScalarType::Char, "int8"},
      {c10::ScalarType::Byte, "uint8"},      {c10::ScalarType::Bool, "bool"}};
  return names;
}

std::string dtypeName(c10::ScalarType t) {
  auto it = dtypeNames().find(t);
  if (it == dtypeNames().end())
    throw PlanError(std::string("plan: unsupported dtype ") + c10::toString(t));
  return it->second;
}

c10::ScalarType dtypeFromName(const std::string &name) {
  for (const auto &[type, n] : dtypeNames())
    if (n == name)
      return type;
  throw PlanError("plan: unknown dtype '" + name + "'");
}


namespace {

c10::impl::GenericList anyList() { return c10::impl::GenericList(c10::AnyType::get()); }

template <typename T> IValue listOf(const std::vector<T> &values) {
  c10::impl::GenericList list = anyList();
  for (const T &v : values)
    list.push_back(IValue(v));
  return list;
}

// --- args and instructions --------------------------------------------------

IValue encodeArg(const Arg &arg) {
  switch (arg.kind) {
  case Arg::Kind::Register:
    return c10::ivalue::Tuple::create({IValue("r"), IValue(arg.reg)});
  case Arg::Kind::Constant:
    return c10::ivalue::Tuple::create({IValue("c"), arg.constant});
  case Arg::Kind::List: {
    c10::impl::GenericList elements = anyList();
    for (const Arg &e : arg.elements)
      elements.push_back(encodeArg(e));
    return c10::ivalue::Tuple::create({IValue("l"), IValue(elements)});
  }
  }
  throw PlanError("plan: bad argument kind");
}

} // namespace

// --- instruction kinds (PlanKinds.h) ---------------------------------------

const char *kindName(Instruction::Kind kind) {
  switch (kind) {
  case Instruction::Kind::Aten: return "aten";
  case Instruction::Kind::Call: return "call";
  case Instruction::Kind::Global: return "global";
  case Instruction::Kind::Constant: return "constant";
  case Instruction::Kind::NumToTensor: return "num_to_tensor";
  case Instruction::Kind::Gather: return "gather";
  case Instruction::Kind::Release: return "release";
  case Instruction::Kind::Fused: return "fused";
  case Instruction::Kind::TpAllReduce: return "tp_all_reduce";
  case Instruction::Kind::TpCopy: return "tp_copy";
  case Instruction::Kind::TpRank: return "tp_rank";
  case Instruction::Kind::TpAllGather: return "tp_all_gather";
  case Instruction::Kind::TpReduceScatter: return "tp_reduce_scatter";
  case Instruction::Kind::MoeDispatch: return "moe_dispatch";
  case Instruction::Kind::MoeCombine: return "moe_combine";
  case Instruction::Kind::LoraAdapter: return "lora_adapter";
  }
  return "?";
}

Instruction::Kind kindFromName(const std::string &name) {
  for (auto kind : {Instruction::Kind::Aten, Instruction::Kind::Call,
                    Instruction::Kind::Global, Instruction::Kind::Constant,
                    Instruction::Kind::NumToTensor, Instruction::Kind::Gather,
                    Instruction::Kind::Release, Instruction::Kind::Fused,
                    Instruction::Kind::TpAllReduce, Instruction::Kind::TpCopy,
                    Instruction::Kind::TpRank, Instruction::Kind::TpAllGather,
                    Instruction::Kind::TpReduceScatter, Instruction::Kind::MoeDispatch,
                    Instruction::Kind::MoeCombine, Instruction::Kind::LoraAdapter})
    if (name == kindName(kind))
      return kind;
  throw PlanError("plan: unknown instruction kind '" + name + "'");
}

bool isMoeKind(Instruction::Kind kind) {
  return kind == Instruction::Kind::MoeDispatch || kind == Instruction::Kind::MoeCombine;
}

bool isTpKind(Instruction::Kind kind) {
  return kind == Instruction::Kind::TpAllReduce || kind == Instruction::Kind::TpCopy ||
         kind == Instruction::Kind::TpRank || kind == Instruction::Kind::TpAllGather ||
         kind == Instruction::Kind::TpReduceScatter;
}


int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

int64_t TensorInfo::nbytes() const {
  return numel() * static_cast<int64_t>(c10::elementSize(dtype));
}

std::vector<int64_t> TensorInfo::localShape(int64_t tensorParallel, int64_t expertParallel) const {
  return split::localShape(shape, split, split.isExpertSplit() ? expertParallel : tensorParallel);
}

int64_t TensorInfo::localNumel(int64_t tensorParallel, int64_t expertParallel) const {
  return split::localNumel(shape, split, split.isExpertSplit() ? expertParallel : tensorParallel);
}

at::Tensor tpSlice(const at::Tensor &global, const TensorSplit &split, int64_t tensorParallel,
                   int64_t tpRank) {
  if (split.dim < 0 || (tensorParallel == 1 && split.paddedSize == 0))
    return global;
  if (split.dim >= global.dim() || tpRank < 0 || tpRank >= tensorParallel)
    throw PlanError("tpSlice: split dim " + std::to_string(split.dim) + " of a " +
                    std::to_string(global.dim()) + "-d tensor, TP rank " + std::to_string(tpRank) +
                    " of " + std::to_string(tensorParallel));
  const int64_t size = global.size(split.dim);
  std::string why = split::check(split, global.dim(), size, tensorParallel);
  if (!why.empty())
    throw PlanError("tpSlice: the split does not fit a tensor of dim " + std::to_string(split.dim) +
                    " of size " + std::to_string(size) + ": " + why);
  std::vector<int64_t> shape = split::localShape(global.sizes().vec(), split, tensorParallel);
  at::Tensor local = at::zeros(shape, global.options()); // the padding stays zero
  for (const split::Range &r : split::tpRanges(split, size, tensorParallel, tpRank))
    local.narrow(split.dim, r.local, r.length).copy_(global.narrow(split.dim, r.global, r.length));
  return local;
}

at::Tensor tpUnslice(const std::vector<at::Tensor> &slices, const TensorSplit &split,
                     const std::vector<int64_t> &shape) {
  if (split.dim < 0)
    return slices.at(0).contiguous();
  const int64_t tp = static_cast<int64_t>(slices.size());
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (tp == 0 || split.dim >= rank || !split::check(split, rank, shape[split.dim], tp).empty())
    throw PlanError("tpUnslice: " + std::to_string(tp) + " slices do not fit the split");
  const std::vector<int64_t> local = split::localShape(shape, split, tp);
  for (const at::Tensor &s : slices)
    if (s.sizes().vec() != local)
      throw PlanError("tpUnslice: " + std::to_string(tp) + " slices do not fit the split");
  at::Tensor global = at::empty(shape, slices[0].options());
  for (int64_t t = 0; t < tp; ++t)
    for (const split::Range &r : split::tpRanges(split, shape[split.dim], tp, t))
      global.narrow(split.dim, r.global, r.length).copy_(slices[t].narrow(split.dim, r.local, r.length));
  return global;
}

Arg Arg::ofRegister(int64_t r) {
  Arg a;
  a.kind = Kind::Register;
  a.reg = r;
  return a;
}

Arg Arg::ofConstant(IValue v) {
  Arg a;
  a.kind = Kind::Constant;
  a.constant = std::move(v);
  return a;
}

ShardRange shardRange(int64_t size, int64_t rank, int64_t shards) {
  if (shards <= 0 || rank < 0 || rank >= shards || size < 0)
    throw PlanError("shardRange: rank " + std::to_string(rank) + " of " +
                    std::to_string(shards) + " shards");
  ShardRange r;
  r.shardSize = (size + shards - 1) / shards;
  r.begin = std::min(size, rank * r.shardSize);
  r.end = std::min(size, (rank + 1) * r.shardSize);
  return r;
}

int64_t Plan::findTensor(const std::string &name) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name)
      return static_cast<int64_t>(i);
    for (const std::string &alias : tensors[i].aliases)
      if (alias == name)
        return static_cast<int64_t>(i);
  }
  return -1;
}

bool Plan::assumes(const std::string &assumption) const {
  return std::find(assumptions.begin(), assumptions.end(), assumption) != assumptions.end();
}

int64_t Plan::tpGroup(int64_t group, int64_t tpRank) const {
  if (tensorParallel == 1 || group < 0 || group >= static_cast<int64_t>(groups.size()) ||
      groups[group].tpRank < 0)
    return group;
  for (size_t i = 0; i < groups.size(); ++i)
    if (groups[i].tpRank == tpRank && groups[i].name == groups[group].name)
      return static_cast<int64_t>(i);
  throw PlanError("plan: storage group " + groups[group].name + " has no copy for TP rank " +
                  std::to_string(tpRank));
}

int64_t Plan::epGroup(int64_t group, int64_t epRank) const {
  if (group < 0 || group >= static_cast<int64_t>(groups.size()) || groups[group].epRank < 0)
    return group;
  for (size_t i = 0; i < groups.size(); ++i)
    if (groups[i].epRank == epRank && groups[i].name == groups[group].name)
      return static_cast<int64_t>(i);
  throw PlanError("plan: storage group " + groups[group].name +
                  " has no copy for expert group position " + std::to_string(epRank));
}

bool Plan::splitsExperts() const {
  for (const TensorInfo &t : tensors)
    if (t.split.isExpertSplit())
      return true;
  return false;
}

int64_t formatVersionOf(const Plan &plan) {
  for (const Function &f : plan.functions)
    for (const Instruction &inst : f.body)
      if (inst.kind == Instruction::Kind::LoraAdapter)
        return 11;
  if (plan.pipelineVirtualStages != 1)
    return 10;
  for (const StorageGroup &g : plan.groups)
    if (g.frozen)
      return 9;
  if (plan.pipelineStages != 1)
    return 8;
  if (plan.splitsExperts())
    return 8;
  for (const StorageGroup &g : plan.groups)
    if (g.epRank != -1)
      return 8;
  for (const Function &f : plan.functions)
    for (const Instruction &inst : f.body)
      if (isMoeKind(inst.kind))
        return 7;
  if (plan.tensorParallel != 1 || plan.vocabParallel || plan.vocabSize != 0)
    return 6;
  for (const TensorInfo &t : plan.tensors)
    if (!t.split.isDefault())
      return 6;
  for (const StorageGroup &g : plan.groups)
    if (g.tpRank != -1)
      return 6;
  for (const Function &f : plan.functions)
    for (const Instruction &inst : f.body)
      if (isTpKind(inst.kind))
        return 6;
  for (const Function &f : plan.functions)
    for (const Instruction &inst : f.body)
      if (inst.kind == Instruction::Kind::Fused)
        return 5;
  for (const StorageGroup &g : plan.groups)
    if (!g.parts.empty())
      return 4;
  return plan.assumptions.empty() ? 2 : 3;
}

std::string objectiveFor(const Plan &plan) {
  if (plan.entry >= 0 && plan.entry < static_cast<int64_t>(plan.functions.size())) {
    const std::vector<std::string> &inputs = plan.functions[plan.entry].paramNames;
    if (std::find(inputs.begin(), inputs.end(), "decoder_input_ids") != inputs.end())
      return "span-corruption";
  }
  if (plan.modelType.find("ForMaskedLM") != std::string::npos ||
      plan.modelType.find("ForPreTraining") != std::string::npos)
    return "masked-lm";
  return "causal-lm";
}

IValue toIValue(const Plan &plan) {
  c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
  int64_t version = formatVersionOf(plan);
  root.insert("version", version);
  root.insert("source", plan.source);
  root.insert("model_type", plan.modelType);
  root.insert("objective", plan.objective);
  root.insert("entry", plan.entry);

  c10::impl::GenericList tensors = anyList();
  for (const TensorInfo &t : plan.tensors) {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("name", t.name);
    d.insert("aliases", listOf(t.aliases));
    d.insert("is_parameter", t.isParameter);
    d.insert("requires_grad", t.requiresGrad);
    d.insert("dtype", dtypeName(t.dtype));
    d.insert("shape", listOf(t.shape));
    d.insert("record", t.record);
    d.insert("offset", t.offset);
    d.insert("crc32", t.crc32);
    d.insert("group", t.group);
    d.insert("init", t.init);
    if (!t.split.isDefault()) {
      c10::impl::GenericDict split(c10::StringType::get(), c10::AnyType::get());
      split.insert("dim", t.split.dim);
      split.insert("chunks", t.split.chunks);
      split.insert("padded_size", t.split.paddedSize);
      split.insert("reduce_grad", t.split.reduceGrad);
      if (t.split.over == SplitGroup::Expert)
        split.insert("over", std::string("expert"));
      d.insert("split", split);
    }
    tensors.push_back(d);
  }
  root.insert("tensors", tensors);
  root.insert("zero_stage", plan.zeroStage);
  root.insert("shard_group_size", plan.shardGroupSize);
  root.insert("prefetch_depth", plan.prefetchDepth);
  c10::impl::GenericList groups = anyList();
  for (const StorageGroup &g : plan.groups) {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("name", g.name);
    d.insert("dtype", dtypeName(g.dtype));
    d.insert("members", listOf(g.members));
    d.insert("offsets", listOf(g.offsets));
    d.insert("size", g.size);
    d.insert("block_list", g.blockList);
    d.insert("block_index", g.blockIndex);
    d.insert("record", g.record);
    if (version >= 4) {
      d.insert("parts", listOf(g.parts));
      d.insert("part_size", g.partSize);
    }
    if (version >= 6) {
      d.insert("tp_rank", g.tpRank);
      d.insert("crc32s", listOf(g.crc32s));
    }
    if (version >= 8)
      d.insert("ep_rank", g.epRank);
    if (version >= 9)
      d.insert("frozen", g.frozen);
    if (g.chunkBytes > 0) { // any version: readers before them ignore them
      d.insert("chunk_bytes", g.chunkBytes);
      d.insert("chunk_crc32s", listOf(g.chunkCrc32s));
    }
    groups.push_back(d);
  }
  root.insert("groups", groups);
  if (version >= 3)
    root.insert("assumptions", listOf(plan.assumptions));
  if (version >= 6) {
    root.insert("tensor_parallel", plan.tensorParallel);
    root.insert("vocab_parallel", plan.vocabParallel);
    root.insert("vocab_size", plan.vocabSize);
  }
  if (plan.expertParallel != 1)
    root.insert("expert_parallel", plan.expertParallel);
  if (plan.pipelineStages != 1) {
    c10::impl::GenericDict pipeline(c10::StringType::get(), c10::AnyType::get());
    pipeline.insert("stages", plan.pipelineStages);
    pipeline.insert("block_list", plan.pipelineBlockList);
    pipeline.insert("first_blocks", listOf(plan.pipelineFirstBlocks));
    if (plan.pipelineVirtualStages != 1)
      pipeline.insert("virtual_stages", plan.pipelineVirtualStages);
    root.insert("pipeline", pipeline);
  }

  c10::impl::GenericList functions = anyList();
  for (const Function &f : plan.functions) {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("name", f.name);
    d.insert("module_path", f.modulePath);
    d.insert("num_registers", f.numRegisters);
    d.insert("params", listOf(f.params));
    d.insert("returns", listOf(f.returns));
    d.insert("param_names", listOf(f.paramNames));
    d.insert("result_names", listOf(f.resultNames));
    c10::impl::GenericList body = anyList();
    for (const Instruction &inst : f.body) {
      c10::impl::GenericList args = anyList();
      for (const Arg &a : inst.args)
        args.push_back(encodeArg(a));
      body.push_back(c10::ivalue::Tuple::create(
          {IValue(kindName(inst.kind)), IValue(inst.op), IValue(args),
           IValue(inst.target), listOf(inst.results), IValue(inst.location),
           IValue(inst.blockList), IValue(inst.blockIndex), IValue(inst.checkpoint)}));
    }
    d.insert("body", body);
    functions.push_back(d);
  }
  root.insert("functions", functions);
  return root;
}

} // namespace bmt::plan
