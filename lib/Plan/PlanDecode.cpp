//===- PlanDecode.cpp - IValue -> Plan ------------------------------------===//
//
// fromIValue: the plan dict of docs/sharded-format.md (its encoding is in
// Plan.cpp's header) back into a Plan, with every field checked against
// the format version and against each other; each mismatch is one
// PlanError naming the field.
//
//===----------------------------------------------------------------------===//

#include "bmt/Plan/Plan.h"
#include "PlanKinds.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

using c10::IValue;

namespace bmt::plan {

namespace {

// --- decoding helpers: every mismatch is a PlanError naming the field. ------

const IValue &field(const c10::impl::GenericDict &dict, const char *key) {
  auto it = dict.find(IValue(std::string(key)));
  if (it == dict.end())
    throw PlanError(std::string("plan: missing field '") + key + "'");
  return it->value();
}

c10::impl::GenericDict asDict(const IValue &v, const char *what) {
  if (!v.isGenericDict())
    throw PlanError(std::string("plan: ") + what + " is not a dict");
  return v.toGenericDict();
}

std::vector<IValue> asList(const IValue &v, const char *what) {
  if (!v.isList())
    throw PlanError(std::string("plan: ") + what + " is not a list");
  std::vector<IValue> out;
  for (const IValue &e : v.toListRef())
    out.push_back(e);
  return out;
}

int64_t asInt(const IValue &v, const char *what) {
  if (!v.isInt())
    throw PlanError(std::string("plan: ") + what + " is not an int");
  return v.toInt();
}

std::string asString(const IValue &v, const char *what) {
  if (!v.isString())
    throw PlanError(std::string("plan: ") + what + " is not a string");
  return v.toStringRef();
}

bool asBool(const IValue &v, const char *what) {
  if (!v.isBool())
    throw PlanError(std::string("plan: ") + what + " is not a bool");
  return v.toBool();
}

std::vector<int64_t> asInts(const IValue &v, const char *what) {
  std::vector<int64_t> out;
  for (const IValue &e : asList(v, what))
    out.push_back(asInt(e, what));
  return out;
}

std::vector<std::string> asStrings(const IValue &v, const char *what) {
  std::vector<std::string> out;
  for (const IValue &e : asList(v, what))
    out.push_back(asString(e, what));
  return out;
}

// --- args -------------------------------------------------------------------

Arg decodeArg(const IValue &v) {
  if (!v.isTuple() || v.toTupleRef().elements().size() != 2)
    throw PlanError("plan: an instruction argument is not a (kind, value) pair");
  const auto &elements = v.toTupleRef().elements();
  std::string kind = asString(elements[0], "argument kind");
  if (kind == "r")
    return Arg::ofRegister(asInt(elements[1], "register"));
  if (kind == "c")
    return Arg::ofConstant(elements[1]);
  if (kind == "l") {
    Arg list;
    list.kind = Arg::Kind::List;
    for (const IValue &e : asList(elements[1], "list argument"))
      list.elements.push_back(decodeArg(e));
    return list;
  }
  throw PlanError("plan: unknown argument kind '" + kind + "'");
}

/// The copies of one storage group per TP or expert rank (`rankOf`): one
/// for each of the n ranks, each laid out alike; a PlanError naming the
/// field otherwise.
void checkCopies(const std::string &name, const std::vector<const StorageGroup *> &list, int64_t n,
                 const char *field, const char *size, int64_t StorageGroup::*rankOf) {
  std::vector<bool> seen(n, false);
  for (const StorageGroup *g : list) {
    const int64_t rank = g->*rankOf;
    if (seen[rank] || g->members != list[0]->members || g->offsets != list[0]->offsets ||
        g->size != list[0]->size || g->dtype != list[0]->dtype)
      throw PlanError("plan: storage group " + name + ": its " + field +
                      " copies differ or repeat (" + field + " " + std::to_string(rank) + ")");
    seen[rank] = true;
  }
  if (static_cast<int64_t>(list.size()) != n)
    throw PlanError("plan: storage group " + name + " has " + std::to_string(list.size()) + " " +
                    field + " copies, not " + size + " = " + std::to_string(n));
}

/// The version 8 fields against expert_parallel (E): an expert split is of
/// a trainable parameter, fits E, and its tensor, if in a storage group,
/// is in one of ep_rank copies, which hold only such tensors and come E
/// times alike. Each error names the field.
void checkExpertSplits(const Plan &plan) {
  const int64_t ep = plan.expertParallel;
  for (const TensorInfo &t : plan.tensors) {
    if (!t.split.isExpertSplit() && t.split.over != SplitGroup::Tensor)
      throw PlanError("plan: tensor " + t.name + ": split over the expert group without a split dim");
    if (!t.split.isExpertSplit())
      continue;
    if (ep < 2)
      throw PlanError("plan: tensor " + t.name +
                      ": split over the expert group, but expert_parallel is " + std::to_string(ep) +
                      " (it needs at least 2)");
    if (!t.isParameter)
      throw PlanError("plan: tensor " + t.name +
                      ": split over the expert group, but it is a buffer (only expert parameters are)");
    if (t.group >= 0 && t.group < static_cast<int64_t>(plan.groups.size()) &&
        plan.groups[t.group].epRank != 0)
      throw PlanError("plan: tensor " + t.name + ": split over the expert group, but its storage group " +
                      plan.groups[t.group].name + " is not an ep_rank 0 copy");
  }
  std::map<std::string, std::vector<const StorageGroup *>> copies;
  for (const StorageGroup &g : plan.groups) {
    if (g.epRank == -1)
      continue;
    if (g.epRank < 0 || g.epRank >= ep || ep < 2)
      throw PlanError("plan: storage group " + g.name + ": ep_rank " + std::to_string(g.epRank) +
                      (ep < 2 ? " without expert parallelism (it must be -1)"
                              : " is not in 0.." + std::to_string(ep - 1)));
    if (g.tpRank != -1)
      throw PlanError("plan: storage group " + g.name + ": both ep_rank and tp_rank");
    for (int64_t m : g.members)
      if (m >= 0 && m < static_cast<int64_t>(plan.tensors.size()) &&
          !plan.tensors[m].split.isExpertSplit())
        throw PlanError("plan: storage group " + g.name + " (ep_rank " + std::to_string(g.epRank) +
                        ") holds " + plan.tensors[m].name + ", which is not split over the expert group");
    copies[g.name].push_back(&g);
  }
  for (const auto &[name, list] : copies)
    checkCopies(name, list, ep, "ep_rank", "expert_parallel", &StorageGroup::epRank);
  for (const TensorInfo &t : plan.tensors)
    if (t.group >= 0 && t.group < static_cast<int64_t>(plan.groups.size()) &&
        !t.split.isExpertSplit() && plan.groups[t.group].epRank != -1)
      throw PlanError("plan: tensor " + t.name + " is in storage group " + plan.groups[t.group].name +
                      " of ep_rank " + std::to_string(plan.groups[t.group].epRank) +
                      " without a split over the expert group");
}

/// The version 6 fields against tensor_parallel; each error names the field.
void checkTensorParallel(const Plan &plan) {
  const int64_t tp = plan.tensorParallel;
  if (tp < 1)
    throw PlanError("plan: tensor_parallel must be at least 1, not " + std::to_string(tp));
  for (const TensorInfo &t : plan.tensors) {
    int64_t rank = static_cast<int64_t>(t.shape.size());
    int64_t dim = t.split.dim;
    // An expert split's group is the expert group (E ranks).
    std::string why = split::check(t.split, rank, dim >= 0 && dim < rank ? t.shape[dim] : -1,
                                   t.split.isExpertSplit() ? plan.expertParallel : tp);
    if (!why.empty())
      throw PlanError("plan: tensor " + t.name + ": split " + why);
  }
  checkExpertSplits(plan);
  // Storage group copies: tp_rank -1 when T == 1; else each name has the
  // copies 0..T-1, alike but for their records, except the expert-group
  // positions' copies of split experts (whole on every TP rank: tp_rank -1).
  std::map<std::string, std::vector<const StorageGroup *>> copies;
  for (const StorageGroup &g : plan.groups) {
    if (g.epRank >= 0 && g.tpRank == -1)
      continue; // checkExpertSplits checked it
    if (tp == 1 ? g.tpRank != -1 : (g.tpRank < 0 || g.tpRank >= tp))
      throw PlanError("plan: storage group " + g.name + ": tp_rank " + std::to_string(g.tpRank) +
                      (tp == 1 ? " without tensor parallelism (it must be -1)"
                               : " is not in 0.." + std::to_string(tp - 1)));
    if (!g.crc32s.empty() && g.crc32s.size() != g.members.size())
      throw PlanError("plan: storage group " + g.name + ": crc32s has " +
                      std::to_string(g.crc32s.size()) + " entries for " +
                      std::to_string(g.members.size()) + " members");
    copies[g.name].push_back(&g);
  }
  if (tp > 1)
    for (const auto &[name, list] : copies)
      checkCopies(name, list, tp, "tp_rank", "tensor_parallel", &StorageGroup::tpRank);
  for (const TensorInfo &t : plan.tensors)
    if (t.group >= 0 && t.group < static_cast<int64_t>(plan.groups.size()) &&
        plan.groups[t.group].tpRank > 0)
      throw PlanError("plan: tensor " + t.name + ": group names the copy of tp_rank " +
                      std::to_string(plan.groups[t.group].tpRank) + " (it must name tp_rank 0)");
  if (plan.vocabParallel) {
    if (plan.vocabSize <= 0)
      throw PlanError("plan: vocab_parallel needs vocab_size > 0 (it is " +
                      std::to_string(plan.vocabSize) + ")");
    const std::vector<std::string> &results = plan.functions[plan.entry].resultNames;
    if (std::find(results.begin(), results.end(), "logits") == results.end())
      throw PlanError("plan: vocab_parallel, but the entry function returns no logits");
  } else if (plan.vocabSize != 0) {
    throw PlanError("plan: vocab_size " + std::to_string(plan.vocabSize) +
                    " without vocab_parallel (it must be 0)");
  }
}

} // namespace

Plan fromIValue(const IValue &value) {
  c10::impl::GenericDict root = asDict(value, "the plan");
  Plan plan;
  plan.version = asInt(field(root, "version"), "version");
  if (plan.version < kOldestPlanFormatVersion || plan.version > kPlanFormatVersion)
    throw PlanError("plan format version " + std::to_string(plan.version) +
                    " is not supported (this bmt reads version " +
                    std::to_string(kOldestPlanFormatVersion) + " to " +
                    std::to_string(kPlanFormatVersion) + ")");
  plan.source = asString(field(root, "source"), "source");
  plan.modelType = asString(field(root, "model_type"), "model_type");
  plan.objective = asString(field(root, "objective"), "objective");
  plan.entry = asInt(field(root, "entry"), "entry");

  for (const IValue &tv : asList(field(root, "tensors"), "tensors")) {
    c10::impl::GenericDict d = asDict(tv, "a tensor");
    TensorInfo t;
    t.name = asString(field(d, "name"), "tensor name");
    t.aliases = asStrings(field(d, "aliases"), "tensor aliases");
    t.isParameter = asBool(field(d, "is_parameter"), "is_parameter");
    t.requiresGrad = asBool(field(d, "requires_grad"), "requires_grad");
    t.dtype = dtypeFromName(asString(field(d, "dtype"), "dtype"));
    t.shape = asInts(field(d, "shape"), "shape");
    for (int64_t dim : t.shape)
      if (dim < 0)
        throw PlanError("plan: tensor " + t.name + " has a negative dimension");
    t.record = asString(field(d, "record"), "record");
    t.offset = asInt(field(d, "offset"), "offset");
    t.crc32 = asInt(field(d, "crc32"), "crc32");
    t.group = asInt(field(d, "group"), "tensor group");
    t.init = asString(field(d, "init"), "tensor init");
    if (!t.init.empty() && t.init != "zeros" && t.init != "ones" && t.init.rfind("normal:", 0) != 0)
      throw PlanError("plan: tensor " + t.name + " has an unknown init rule '" + t.init + "'");
    if (plan.version >= 6 && d.contains("split")) {
      c10::impl::GenericDict split = asDict(d.at("split"), "tensor split");
      t.split.dim = asInt(field(split, "dim"), "split dim");
      t.split.chunks = asInt(field(split, "chunks"), "split chunks");
      t.split.paddedSize = asInt(field(split, "padded_size"), "split padded_size");
      t.split.reduceGrad = asBool(field(split, "reduce_grad"), "split reduce_grad");
      if (split.contains("over")) {
        const std::string over = asString(split.at("over"), "split over");
        if (plan.version < 8 || (over != "expert" && over != "tensor"))
          throw PlanError("plan: tensor " + t.name + ": split over '" + over + "' in a version " +
                          std::to_string(plan.version) +
                          " plan (version 8 splits over \"tensor\" or \"expert\")");
        t.split.over = over == "expert" ? SplitGroup::Expert : SplitGroup::Tensor;
      }
    }
    plan.tensors.push_back(std::move(t));
  }

  plan.zeroStage = asInt(field(root, "zero_stage"), "zero_stage");
  plan.shardGroupSize = asInt(field(root, "shard_group_size"), "shard_group_size");
  plan.prefetchDepth = asInt(field(root, "prefetch_depth"), "prefetch_depth");
  if (plan.zeroStage != 0 && plan.zeroStage != 2 && plan.zeroStage != 3)
    throw PlanError("plan: zero_stage must be 0, 2 or 3");
  if (plan.shardGroupSize < 0 || plan.prefetchDepth < 0)
    throw PlanError("plan: shard_group_size and prefetch_depth must not be negative");
  for (const IValue &gv : asList(field(root, "groups"), "groups")) {
    c10::impl::GenericDict d = asDict(gv, "a storage group");
    StorageGroup g;
    g.name = asString(field(d, "name"), "group name");
    g.dtype = dtypeFromName(asString(field(d, "dtype"), "group dtype"));
    g.members = asInts(field(d, "members"), "group members");
    g.offsets = asInts(field(d, "offsets"), "group offsets");
    g.size = asInt(field(d, "size"), "group size");
    g.blockList = asString(field(d, "block_list"), "group block_list");
    g.blockIndex = asInt(field(d, "block_index"), "group block_index");
    g.record = asString(field(d, "record"), "group record");
    if (plan.version >= 4) {
      g.parts = asStrings(field(d, "parts"), "group parts");
      g.partSize = asInt(field(d, "part_size"), "group part_size");
    }
    if (plan.version >= 6) {
      g.tpRank = asInt(field(d, "tp_rank"), "group tp_rank");
      g.crc32s = asInts(field(d, "crc32s"), "group crc32s");
    }
    if (plan.version >= 8)
      g.epRank = asInt(field(d, "ep_rank"), "group ep_rank");
    if (plan.version >= 9)
      g.frozen = asBool(field(d, "frozen"), "group frozen");
    if (d.contains("chunk_bytes")) {
      g.chunkBytes = asInt(field(d, "chunk_bytes"), "group chunk_bytes");
      g.chunkCrc32s = asInts(field(d, "chunk_crc32s"), "group chunk_crc32s");
      int64_t elementBytes = static_cast<int64_t>(c10::elementSize(g.dtype));
      if (g.chunkBytes <= 0 || g.chunkBytes % elementBytes != 0 ||
          static_cast<int64_t>(g.chunkCrc32s.size()) !=
              (g.nbytes() + g.chunkBytes - 1) / g.chunkBytes)
        throw PlanError("plan: storage group " + g.name + ": chunk_bytes " +
                        std::to_string(g.chunkBytes) + " and " +
                        std::to_string(g.chunkCrc32s.size()) +
                        " chunk_crc32s do not fit its buffer of " + std::to_string(g.nbytes()) +
                        " bytes");
    }
    plan.groups.push_back(std::move(g));
  }

  if (plan.version >= 3) {
    plan.assumptions = asStrings(field(root, "assumptions"), "assumptions");
    for (const std::string &a : plan.assumptions)
      if (a != kAssumeAttentionMaskAllOnes)
        throw PlanError("plan: unknown assumption '" + a + "' (this bmt knows '" +
                        kAssumeAttentionMaskAllOnes + "'); it needs a newer bmt-run");
  }
  if (plan.version >= 6) {
    plan.tensorParallel = asInt(field(root, "tensor_parallel"), "tensor_parallel");
    plan.vocabParallel = asBool(field(root, "vocab_parallel"), "vocab_parallel");
    plan.vocabSize = asInt(field(root, "vocab_size"), "vocab_size");
  }
  if (root.contains("expert_parallel")) {
    plan.expertParallel = asInt(field(root, "expert_parallel"), "expert_parallel");
    if (plan.version < 7 || plan.expertParallel < 2)
      throw PlanError("plan: expert_parallel " + std::to_string(plan.expertParallel) +
                      " needs a version 7 plan and at least 2");
  }
  if (root.contains("pipeline")) {
    c10::impl::GenericDict pipeline = asDict(field(root, "pipeline"), "pipeline");
    plan.pipelineStages = asInt(field(pipeline, "stages"), "pipeline stages");
    plan.pipelineBlockList = asString(field(pipeline, "block_list"), "pipeline block_list");
    plan.pipelineFirstBlocks = asInts(field(pipeline, "first_blocks"), "pipeline first_blocks");
    if (pipeline.contains("virtual_stages")) {
      plan.pipelineVirtualStages =
          asInt(field(pipeline, "virtual_stages"), "pipeline virtual_stages");
      if (plan.version < 10 || plan.pipelineVirtualStages < 2)
        throw PlanError("plan: pipeline virtual_stages " +
                        std::to_string(plan.pipelineVirtualStages) +
                        " needs a version 10 plan and at least 2");
    }
    const std::vector<int64_t> &firsts = plan.pipelineFirstBlocks;
    bool ordered = !firsts.empty() && firsts[0] == 0;
    for (size_t s = 1; s < firsts.size(); ++s)
      ordered = ordered && firsts[s] > firsts[s - 1];
    if (plan.version < 8 || plan.pipelineStages < 2 ||
        static_cast<int64_t>(firsts.size()) !=
            plan.pipelineStages * plan.pipelineVirtualStages ||
        !ordered ||
        plan.pipelineBlockList.empty() || plan.expertParallel != 1)
      throw PlanError("plan: pipeline of " + std::to_string(plan.pipelineStages) +
                      " stages needs a version 8 plan, at least 2 stages, one increasing "
                      "first block per stage (per chunk with virtual stages) from 0, a block "
                      "list, and no expert "
                      "parallelism");
  }

  for (const IValue &fv : asList(field(root, "functions"), "functions")) {
    c10::impl::GenericDict d = asDict(fv, "a function");
    Function f;
    f.name = asString(field(d, "name"), "function name");
    f.modulePath = asString(field(d, "module_path"), "module_path");
    f.numRegisters = asInt(field(d, "num_registers"), "num_registers");
    f.params = asInts(field(d, "params"), "params");
    f.returns = asInts(field(d, "returns"), "returns");
    f.paramNames = asStrings(field(d, "param_names"), "param_names");
    f.resultNames = asStrings(field(d, "result_names"), "result_names");
    for (const IValue &iv : asList(field(d, "body"), "body")) {
      if (!iv.isTuple() || iv.toTupleRef().elements().size() != 9)
        throw PlanError("plan: an instruction of " + f.name + " is malformed");
      const auto &e = iv.toTupleRef().elements();
      Instruction inst;
      inst.kind = kindFromName(asString(e[0], "instruction kind"));
      inst.op = asString(e[1], "instruction op");
      for (const IValue &a : asList(e[2], "instruction args"))
        inst.args.push_back(decodeArg(a));
      inst.target = asInt(e[3], "instruction target");
      inst.results = asInts(e[4], "instruction results");
      inst.location = asString(e[5], "instruction location");
      inst.blockList = asString(e[6], "instruction block_list");
      inst.blockIndex = asInt(e[7], "instruction block_index");
      inst.checkpoint = asBool(e[8], "instruction checkpoint");
      f.body.push_back(std::move(inst));
    }
    plan.functions.push_back(std::move(f));
  }

  // Structural checks, so that the executor can index without checking.
  int64_t numFunctions = static_cast<int64_t>(plan.functions.size());
  int64_t numTensors = static_cast<int64_t>(plan.tensors.size());
  if (plan.entry < 0 || plan.entry >= numFunctions)
    throw PlanError("plan: entry function index out of range");
  auto checkReg = [](const Function &f, int64_t r) {
    if (r < 0 || r >= f.numRegisters)
      throw PlanError("plan: register " + std::to_string(r) +
                      " out of range in " + f.name);
  };
  std::function<void(const Function &, const Arg &)> checkArg =
      [&](const Function &f, const Arg &a) {
        if (a.kind == Arg::Kind::Register)
          checkReg(f, a.reg);
        for (const Arg &e : a.elements)
          checkArg(f, e);
      };
  int64_t numGroups = static_cast<int64_t>(plan.groups.size());
  checkTensorParallel(plan); // before the groups' checks, which use local sizes
  for (const StorageGroup &g : plan.groups) {
    if (g.members.size() != g.offsets.size() || g.size < 0)
      throw PlanError("plan: storage group " + g.name + " is malformed");
    if (!g.parts.empty() &&
        (!g.record.empty() || g.partSize <= 0 ||
         static_cast<int64_t>(g.parts.size()) != (g.size + g.partSize - 1) / g.partSize))
      throw PlanError("plan: the parts of storage group " + g.name + " do not cover it");
    for (size_t i = 0; i < g.members.size(); ++i) {
      if (g.members[i] < 0 || g.members[i] >= numTensors)
        throw PlanError("plan: storage group " + g.name + " names a tensor out of range");
      const TensorInfo &t = plan.tensors[g.members[i]];
      if (t.dtype != g.dtype || g.offsets[i] < 0 ||
          g.offsets[i] + t.localNumel(plan.tensorParallel, plan.expertParallel) > g.size)
        throw PlanError("plan: tensor " + t.name + " does not fit storage group " + g.name);
      // A trainable parameter in a frozen group would never train, a frozen
      // one in a trainable group would (groups before version 9 hold only
      // trainable parameters: frozen is false there).
      if (!t.isParameter || t.requiresGrad == g.frozen)
        throw PlanError("plan: storage group " + g.name + " (" +
                        (g.frozen ? "frozen" : "trainable") + ") holds " + t.name + ", " +
                        (!t.isParameter ? "a buffer"
                                        : t.requiresGrad ? "a trainable parameter"
                                                         : "a frozen parameter"));
    }
  }
  for (const TensorInfo &t : plan.tensors)
    if (t.group < -1 || t.group >= numGroups)
      throw PlanError("plan: tensor " + t.name + " names a storage group out of range");
  for (const Function &f : plan.functions) {
    for (int64_t r : f.params)
      checkReg(f, r);
    for (int64_t r : f.returns)
      checkReg(f, r);
    for (const Instruction &inst : f.body) {
      for (int64_t r : inst.results)
        checkReg(f, r);
      for (const Arg &a : inst.args)
        checkArg(f, a);
      if (inst.kind == Instruction::Kind::Call &&
          (inst.target < 0 || inst.target >= numFunctions))
        throw PlanError("plan: call target out of range in " + f.name);
      if (inst.kind == Instruction::Kind::Global &&
          (inst.target < 0 || inst.target >= numTensors))
        throw PlanError("plan: tensor index out of range in " + f.name);
      if ((inst.kind == Instruction::Kind::Gather ||
           inst.kind == Instruction::Kind::Release) &&
          (inst.target < 0 || inst.target >= numGroups))
        throw PlanError("plan: storage group index out of range in " + f.name);
      if (isTpKind(inst.kind)) {
        if (plan.version < 6)
          throw PlanError("plan: a " + std::string(kindName(inst.kind)) + " instruction in a version " +
                          std::to_string(plan.version) + " plan (" + f.name + ")");
        bool takesArg = inst.kind != Instruction::Kind::TpRank;
        if (inst.results.size() != 1 || inst.args.size() != (takesArg ? 1u : 0u) ||
            (takesArg && inst.args[0].kind != Arg::Kind::Register))
          throw PlanError("plan: malformed " + std::string(kindName(inst.kind)) +
                          " instruction in " + f.name);
        if ((inst.kind == Instruction::Kind::TpAllGather ||
             inst.kind == Instruction::Kind::TpReduceScatter) &&
            (inst.op.empty() || inst.op.size() > 2 ||
             !std::all_of(inst.op.begin(), inst.op.end(), [](char c) { return c >= '0' && c <= '9'; })))
          throw PlanError("plan: the op of a " + std::string(kindName(inst.kind)) + " instruction in " +
                          f.name + " must be its dim as a decimal number, not '" + inst.op + "'");
      }
      if ((inst.kind == Instruction::Kind::Gather ||
           inst.kind == Instruction::Kind::Release) &&
          plan.groups[inst.target].epRank > 0)
        throw PlanError("plan: a gather or release in " + f.name +
                        " names a storage group copy of ep_rank " +
                        std::to_string(plan.groups[inst.target].epRank) + " (it must name ep_rank 0)");
      if ((inst.kind == Instruction::Kind::Gather ||
           inst.kind == Instruction::Kind::Release) &&
          plan.groups[inst.target].tpRank > 0)
        throw PlanError("plan: a gather or release in " + f.name +
                        " names a storage group copy of tp_rank " +
                        std::to_string(plan.groups[inst.target].tpRank) + " (it must name tp_rank 0)");
      if (inst.kind == Instruction::Kind::LoraAdapter) {
        if (plan.version < 11)
          throw PlanError("plan: a lora_adapter instruction in a version " +
                          std::to_string(plan.version) + " plan (" + f.name + ")");
        bool wellFormed = inst.results.size() == 1u && inst.args.size() == 7u;
        for (size_t i = 0; wellFormed && i < 7; ++i)
          wellFormed = i < 4 ? inst.args[i].kind == Arg::Kind::Register
                             : inst.args[i].kind == Arg::Kind::Constant &&
                                   (i < 6 ? inst.args[i].constant.isDouble()
                                          : inst.args[i].constant.isInt());
        if (wellFormed) {
          const double p = inst.args[5].constant.toDouble();
          wellFormed = std::isfinite(inst.args[4].constant.toDouble()) && p >= 0 && p < 1 &&
                       inst.args[6].constant.toInt() >= 1 &&
                       inst.args[6].constant.toInt() <= std::max<int64_t>(plan.tensorParallel, 1);
        }
        if (!wellFormed)
          throw PlanError("plan: malformed lora_adapter instruction in " + f.name +
                          " (it takes base, input, A and B, a finite scale, a dropout in "
                          "[0, 1) and its input's parts, 1 or tensor_parallel; gives one result)");
      }
      if (isMoeKind(inst.kind)) {
        if (plan.version < 7)
          throw PlanError("plan: a " + std::string(kindName(inst.kind)) + " instruction in a version " +
                          std::to_string(plan.version) + " plan (" + f.name + ")");
        const bool dispatch = inst.kind == Instruction::Kind::MoeDispatch;
        // A dispatch with routing weights (expert parallelism) takes them
        // third and gives them fifth.
        const bool weighted = dispatch && inst.args.size() == 3u;
        bool wellFormed = inst.results.size() == (dispatch ? (weighted ? 5u : 4u) : 1u) &&
                          (dispatch ? inst.args.size() == 2u || weighted : inst.args.size() == 3u);
        for (const Arg &a : inst.args)
          wellFormed = wellFormed && a.kind == Arg::Kind::Register;
        if (dispatch)
          wellFormed = wellFormed && !inst.op.empty() && inst.op.size() <= 9 && inst.op[0] != '0' &&
                       std::all_of(inst.op.begin(), inst.op.end(),
                                   [](char c) { return c >= '0' && c <= '9'; });
        if (!wellFormed)
          throw PlanError("plan: malformed " + std::string(kindName(inst.kind)) +
                          " instruction in " + f.name +
                          (dispatch ? " (it takes hidden, expert ids and optionally routing weights, gives "
                                      "four results and the routed weights with them, and "
                                      "its op is the expert count)"
                                    : " (it takes rows, the permutation and K, gives one result)"));
        // A dispatch's target: its router's score-correction bias, a
        // buffer of one float per expert (-1: none).
        if (dispatch && inst.target != -1) {
          const bool known = inst.target >= 0 && inst.target < static_cast<int64_t>(plan.tensors.size());
          const TensorInfo *bias = known ? &plan.tensors[inst.target] : nullptr;
          if (!bias || bias->isParameter || !c10::isFloatingType(bias->dtype) ||
              bias->shape != std::vector<int64_t>{std::stoll(inst.op)})
            throw PlanError("plan: the router bias of a moe_dispatch instruction in " + f.name +
                            (bias ? " is " + bias->name + ", not a float buffer of " + inst.op +
                                        " values (one per expert)"
                                  : " is tensor " + std::to_string(inst.target) +
                                        ", which the plan does not have"));
        }
      }
      if (inst.kind == Instruction::Kind::Fused) {
        if (plan.version < 5)
          throw PlanError("plan: a fused instruction in a version " + std::to_string(plan.version) +
                          " plan (" + f.name + ")");
        if (inst.target < 0 || inst.target >= numFunctions || inst.results.empty() ||
            plan.functions[inst.target].params.size() != inst.args.size() ||
            plan.functions[inst.target].returns.size() != inst.results.size())
          throw PlanError("plan: malformed fused instruction in " + f.name);
        for (const Arg &a : inst.args)
          if (a.kind != Arg::Kind::Register)
            throw PlanError("plan: a fused instruction's inputs must be registers in " + f.name);
      }
      if ((inst.kind == Instruction::Kind::Global ||
           inst.kind == Instruction::Kind::Constant ||
           inst.kind == Instruction::Kind::NumToTensor) &&
          inst.results.size() != 1)
        throw PlanError("plan: malformed instruction in " + f.name);
    }
  }
  return plan;
}

} // namespace bmt::plan
