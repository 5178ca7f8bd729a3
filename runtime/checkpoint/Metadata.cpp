//===- Metadata.cpp - checkpoint.json, COMPLETE and names -----------------===//
//
// What a checkpoint says about itself (docs/checkpoint-format.md): the
// names of its folders and files, the COMPLETE line, the run's identity,
// and checkpoint.json, built by rank 0's save and read back by a resume.
//
//===----------------------------------------------------------------------===//

#include "Metadata.h"
#include "FileStorage.h"

#include "bmt/Plan/Plan.h"
#include "bmt/Runtime/exec/Executor.h"
#include "bmt/Runtime/exec/Model.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

namespace bmt::runtime {

namespace checkpoint {

std::string crcHex(uint32_t crc) {
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  return hex;
}

bool readableVersion(int version) {
  return version >= kFormatVersion && version <= kPipelineTpVersion;
}

std::string stepName(int64_t step) {
  char text[32];
  std::snprintf(text, sizeof text, "step-%08lld", static_cast<long long>(step));
  return text;
}

std::string rankName(int64_t rank, const char *suffix) {
  char text[48];
  std::snprintf(text, sizeof text, "rank-%05lld%s", static_cast<long long>(rank), suffix);
  return text;
}

/// COMPLETE's line: "bmt-checkpoint <version> step <step> checkpoint.json
/// <CRC-32 of checkpoint.json's bytes, 8 hex digits>\n" (checkpoints
/// written before that checksum end after the step: `withCrc` false).
std::string completeLine(int64_t step, int version, bool withCrc, uint32_t crc) {
  std::string line = std::string(kFormat) + " " + std::to_string(version) + " step " +
                     std::to_string(step);
  if (withCrc) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", crc);
    line += std::string(" checkpoint.json ") + hex;
  }
  return line + "\n";
}

CompleteFile parseComplete(std::string text) {
  CompleteFile c;
  c.present = true;
  c.text = std::move(text);
  std::istringstream in(c.text);
  std::string format, word, json, hex;
  int version = -1;
  long long step = -1;
  if (in >> format >> version >> word >> step && format == kFormat && word == "step" &&
      step >= 0) {
    uint32_t crc = 0;
    bool withCrc = static_cast<bool>(in >> json >> hex) && json == "checkpoint.json" &&
                   hex.size() == 8 &&
                   hex.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (withCrc)
      crc = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
    if (c.text == completeLine(step, version, withCrc, crc)) {
      c.version = version;
      c.step = step;
      c.hasCrc = withCrc;
      c.crc = crc;
    }
  }
  return c;
}

/// The checkpoint's field of an optimizer state slot ("exp_avg" ->
/// "exp_avg"); "master" is saved only for low-precision spaces.
std::string fieldName(int64_t space, const std::string &field) {
  return "s" + std::to_string(space) + "." + field;
}

bool lowPrecision(c10::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

/// Splits an optimizer state key "exp_avg.3" into ("exp_avg", 3).
std::pair<std::string, size_t> splitStateKey(const std::string &key) {
  size_t dot = key.rfind('.');
  if (dot == std::string::npos)
    throw std::logic_error("optimizer state key without an index: " + key);
  return {key.substr(0, dot), static_cast<size_t>(std::stoull(key.substr(dot + 1)))};
}

/// checkpoint.json's "optimizer": the kind, the peak learning rate and the
/// kind's hyperparameters (a version-1 AdamW checkpoint has kind, lr,
/// beta1, beta2, eps and weight_decay; no weight_decay_params: "all").
json optimizerJson(const std::string &kind, double lr, const OptimizerConfig &c) {
  json j = {{"kind", kind}, {"lr", lr}, {"weight_decay", c.weightDecayValue()},
            {"weight_decay_params",
             c.decayParams == WeightDecayParams::All ? "all" : "matrices"}};
  switch (c.kind) {
  case OptimizerKind::Adam:
  case OptimizerKind::AdamW:
    j["eps"] = c.eps;
    [[fallthrough]];
  case OptimizerKind::Lion:
    j["beta1"] = c.beta1Value();
    j["beta2"] = c.beta2Value();
    break;
  case OptimizerKind::SGD:
    j["momentum"] = c.momentum;
    j["dampening"] = c.dampening;
    j["nesterov"] = c.nesterov;
    break;
  case OptimizerKind::Adafactor:
    j["beta2_decay"] = c.beta2Decay;
    j["eps1"] = c.eps1 ? json(*c.eps1) : json(nullptr);
    j["eps2"] = c.eps2;
    j["d"] = c.clipThreshold;
    break;
  }
  return j;
}

/// The optimizer kind without "offload-".
std::string baseKind(const std::string &kind) {
  return kind.rfind("offload-", 0) == 0 ? kind.substr(8) : kind;
}

/// Throws CheckpointError unless `saved` (checkpoint.json's "optimizer")
/// has the kind and hyperparameters of `expected`.
void checkSameOptimizer(const json &saved, const OptimizerConfig &expected,
                        const std::string &folder) {
  json want = optimizerJson(optimizerKindName(expected.kind), 0, expected);
  json have = saved;
  if (!have.contains("weight_decay_params"))
    have["weight_decay_params"] = "all"; // version-1 checkpoints decayed every parameter
  const std::string savedKind = baseKind(have.value("kind", std::string("?")));
  auto describe = [](const json &j) {
    std::string s = j.value("kind", std::string("?"));
    for (const auto &[key, value] : j.items())
      if (key != "kind" && key != "lr")
        s += " " + key + "=" + value.dump();
    return s;
  };
  if (savedKind != want["kind"].get<std::string>())
    throw CheckpointError(folder + " was saved by --optimizer " + savedKind +
                          "; this run uses --optimizer " + want["kind"].get<std::string>() +
                          " (its state cannot be loaded into another optimizer: resume with "
                          "the same --optimizer)");
  for (const auto &[key, value] : want.items()) {
    if (key == "kind" || key == "lr")
      continue;
    auto it = have.find(key);
    const bool same = it != have.end() && (value.is_number() && it->is_number()
                                               ? value.get<double>() == it->get<double>()
                                               : value == *it);
    if (!same)
      throw CheckpointError(folder + " was saved with optimizer settings " + describe(have) +
                            "; this run has " + describe(want) + " (" + key +
                            " differs): resume with the settings it was saved with");
  }
}

std::vector<SpaceSlot> spaceSlots(const plan::Plan &p, size_t numSpaces, int64_t tp) {
  // The spaces begin with the ZeRO storage groups (every trainable tensor
  // is in one with T > 1 or expert splits), one per trainable group that is
  // no other TP rank's or expert-group position's copy, in plan order.
  std::vector<int64_t> groupOf;
  if (p.zeroStage != 0)
    for (size_t g = 0; g < p.groups.size(); ++g)
      if (p.groups[g].tpRank <= 0 && p.groups[g].epRank <= 0 &&
          !p.groups[g].frozen) // frozen groups have no space
        groupOf.push_back(static_cast<int64_t>(g));
  std::vector<SpaceSlot> slots(numSpaces);
  int64_t next = 0;
  for (size_t k = 0; k < numSpaces; ++k) {
    SpaceSlot &slot = slots[k];
    slot.group = k < groupOf.size() ? groupOf[k] : -1;
    slot.expert = slot.group >= 0 && p.groups[slot.group].epRank >= 0;
    slot.copies = tp > 1 ? tp : slot.expert ? p.expertParallel : 1;
    slot.first = next;
    next += slot.copies;
  }
  return slots;
}

void checkCheckpointLayout(const plan::Plan &p, const std::string &folder) {
  if (p.tensorParallel > 1 && p.splitsExperts())
    throw CheckpointError(folder + ": checkpoints of expert weights split over the expert group "
                                   "with tensor parallelism (" +
                          std::to_string(p.tensorParallel) +
                          " ranks per TP group) are not supported yet (recompile with "
                          "--split-expert-weights=false to save and resume them)");
}

int checkpointVersion(const plan::Plan &p) {
  if (p.pipelineStages > 1)
    return p.tensorParallel > 1 || p.pipelineVirtualStages > 1 ? kPipelineTpVersion
                                                                : kPipelineVersion;
  if (p.tensorParallel > 1)
    return kTensorParallelVersion;
  return p.splitsExperts() ? kExpertSplitVersion : kFormatVersion;
}

json spacesJson(const plan::Plan &p, const std::vector<ParameterSpace> &spaces, int64_t tp) {
  json out = json::array();
  const std::vector<SpaceSlot> slots = spaceSlots(p, spaces.size(), tp);
  for (size_t k = 0; k < spaces.size(); ++k) {
    const ParameterSpace &s = spaces[k];
    const SpaceSlot &slot = slots[k];
    for (int64_t c = 0; c < slot.copies; ++c) {
      const std::vector<int64_t> *members = &s.members, *offsets = &s.offsets;
      int64_t size = s.size;
      if (slot.copies > 1) {
        const plan::StorageGroup &copy =
            p.groups.at(slot.expert ? p.epGroup(slot.group, c) : p.tpGroup(slot.group, c));
        members = &copy.members;
        offsets = &copy.offsets;
        size = copy.size;
      }
      json list = json::array();
      for (size_t m = 0; m < members->size(); ++m) {
        const plan::TensorInfo &info = p.tensors.at((*members)[m]);
        json member = {{"tensor", info.name}, {"shape", info.shape},
                       {"offset", (*offsets)[m]}, {"aliases", info.aliases}};
        const bool sliced = slot.copies > 1 && (slot.expert ? info.split.isExpertSplit()
                                                            : info.split.isTensorSplit());
        if (sliced) {
          // The slice's place in the global tensor, as bmt/Plan/SplitRule.h
          // gives it (the group: T TP ranks or E expert-group positions):
          // bmt-to-hf puts tensors back together from these.
          json ranges = json::array();
          for (const split::Range &r :
               split::tpRanges(info.split, info.shape[info.split.dim], slot.copies, c))
            ranges.push_back({r.local, r.global, r.length});
          member["split"] = {
              {"dim", info.split.dim},
              {"chunks", info.split.chunks},
              {"padded_size", info.split.paddedSize},
              {"local_shape", split::localShape(info.shape, info.split, slot.copies)},
              {"ranges", ranges}};
          if (slot.expert)
            member["split"]["over"] = "expert";
        }
        list.push_back(member);
      }
      json space = {{"name", s.name}, {"dtype", plan::dtypeName(s.dtype)},
                    {"master", lowPrecision(s.dtype)}, {"size", size},
                    {"shards", s.numShards}, {"shard_size", s.shardSize}};
      if (tp > 1)
        space["tp_rank"] = c;
      else if (slot.expert)
        space["ep_rank"] = c;
      space["members"] = list;
      out.push_back(space);
    }
  }
  return out;
}

namespace {

/// The trainable storage groups of `p` as checkpoint.json lists them.
std::vector<int64_t> trainableGroups(const plan::Plan &p) {
  std::vector<int64_t> out;
  for (size_t g = 0; g < p.groups.size(); ++g)
    if (p.groups[g].tpRank <= 0 && p.groups[g].epRank <= 0 && !p.groups[g].frozen)
      out.push_back(static_cast<int64_t>(g));
  return out;
}

} // namespace

std::vector<SpaceSlot> pipelineSpaceSlots(const plan::Plan &p,
                                          const std::vector<ParameterSpace> &spaces,
                                          int64_t tp) {
  const std::vector<int64_t> groups = trainableGroups(p);
  std::vector<SpaceSlot> slots(spaces.size());
  for (size_t k = 0; k < spaces.size(); ++k) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](int64_t g) {
      return p.groups[static_cast<size_t>(g)].name == spaces[k].name;
    });
    if (it == groups.end())
      throw CheckpointError("the pipeline's parameter space " + spaces[k].name +
                            " is not a trainable storage group of the plan");
    slots[k].group = *it;
    slots[k].copies = tp;
    slots[k].first = (it - groups.begin()) * tp;
  }
  return slots;
}

namespace {

/// By plan group, the chunk of `savingStage`'s stage that reads it first
/// (chunk c runs on stage c % P; a group no chunk reads: chunk 0).
std::vector<int64_t> savingChunks(const plan::Plan &p, const std::vector<int64_t> &savingStage) {
  const std::vector<std::vector<bool>> reads = Executor::stageGroups(p);
  std::vector<int64_t> out(p.groups.size(), 0);
  for (size_t g = 0; g < out.size(); ++g)
    for (size_t c = reads.size(); c-- > 0;)
      if (reads[c][g] && static_cast<int64_t>(c) % p.pipelineStages == savingStage.at(g))
        out[g] = static_cast<int64_t>(c);
  return out;
}

} // namespace

json pipelineSpacesJson(const plan::Plan &p, const std::vector<int64_t> &savingStage,
                        int64_t d, int64_t tp) {
  // Every group as a space of d shards (a stage's ZeRO layout of one TP
  // rank), T copies with tensor parallelism, then the stage (and with
  // virtual stages the chunk) whose ranks write it.
  const std::vector<int64_t> groups = trainableGroups(p);
  std::vector<ParameterSpace> spaces;
  for (int64_t g : groups) {
    const plan::StorageGroup &group = p.groups[static_cast<size_t>(g)];
    ParameterSpace s;
    s.name = group.name;
    s.dtype = group.dtype;
    s.size = group.size;
    s.members = group.members;
    s.offsets = group.offsets;
    s.numShards = d;
    s.shardSize = plan::shardRange(group.size, 0, d).shardSize;
    spaces.push_back(std::move(s));
  }
  json out = spacesJson(p, spaces, tp);
  const std::vector<int64_t> chunks =
      p.pipelineVirtualStages > 1 ? savingChunks(p, savingStage) : std::vector<int64_t>();
  for (size_t k = 0; k < groups.size(); ++k)
    for (int64_t t = 0; t < tp; ++t) {
      json &space = out[k * static_cast<size_t>(tp) + static_cast<size_t>(t)];
      space["stage"] = savingStage.at(static_cast<size_t>(groups[k]));
      if (!chunks.empty())
        space["chunk"] = chunks.at(static_cast<size_t>(groups[k]));
    }
  return out;
}

json checkpointJson(const RunIdentity &identity, int version, int64_t worldSize, int64_t tp,
                    int64_t ep, const TrainingProgress &progress, json spaces) {
  const LRScheduleConfig &sc = identity.schedule;
  json data = {{"kind", progress.data.kind}};
  if (progress.data.kind == "random-windows") {
    data["sampler"] = progress.data.generator;
    data["windows"] = progress.data.windows;
  } else if (progress.data.kind == "documents") {
    data["documents"] = progress.data.documents;
  } else {
    data["micro_batches"] = progress.data.microBatches;
  }
  if (!progress.data.data.empty())
    data["data"] = progress.data.data;
  json meta = {{"format", kFormat},
               {"version", version},
               {"step", progress.step},
               {"world_size", worldSize},
               {"zero_stage", identity.zeroStage},
               {"shard_group_size", identity.shardGroupSize},
               {"plan",
                {{"identity", identity.planIdentity},
                 {"model", identity.modelIdentity},
                 {"frozen_base", identity.frozenIdentity},
                 {"adapters", identity.adapterSettings},
                 {"source", identity.source},
                 {"model_type", identity.modelType}}},
               {"optimizer", optimizerJson(identity.optimizer, identity.lr,
                                           identity.optimizerConfig)},
               {"schedule",
                {{"kind", scheduleKindName(sc.kind)},
                 {"peak_lr", sc.peakLR},
                 {"warmup_steps", sc.warmupSteps},
                 {"total_steps", sc.totalSteps},
                 {"min_lr", sc.minLR},
                 {"gamma", sc.gamma}}},
               {"batch",
                {{"sequences_per_step", identity.sequencesPerStep},
                 {"seq_len", identity.seqLen}}},
               {"loss_scale", nullptr},
               {"data", data},
               {"objective_rng", progress.objectiveGenerator},
               {"spaces", std::move(spaces)}};
  if (tp > 1)
    meta["tensor_parallel"] = tp;
  if (ep > 1)
    meta["expert_parallel"] = ep;
  if (identity.moeBiasUpdateRate > 0)
    meta["moe_bias_update_rate"] = identity.moeBiasUpdateRate;
  return meta;
}

json readCheckpointJson(const std::string &folder, const std::string &dir) {
  // The folder's identity is its COMPLETE file and checkpoint.json, not
  // its name: a checkpoint copied or renamed resumes as saved.
  const CompleteFile complete = readComplete(dir);
  if (!complete.present)
    throw CheckpointError(folder + ": not a complete checkpoint (no COMPLETE file: the save "
                          "did not finish, or this is not a checkpoint folder)");
  if (complete.version < 0)
    throw CheckpointError(folder + ": not a complete checkpoint (its COMPLETE file does not "
                          "read \"bmt-checkpoint <version> step <step>\")");
  const std::string metaText = readText((std::filesystem::path(dir) / "checkpoint.json").string());
  if (complete.hasCrc && plan::crc32(metaText.data(), metaText.size()) != complete.crc) {
    char text[80];
    std::snprintf(text, sizeof text, "CRC-32 %08x, its COMPLETE file says %08x",
                  plan::crc32(metaText.data(), metaText.size()), complete.crc);
    throw CheckpointError(folder + "/checkpoint.json: checksum mismatch (" + text +
                          "): damaged or changed after the save; resume another checkpoint");
  }
  json meta;
  try {
    meta = json::parse(metaText);
  } catch (const json::exception &e) {
    throw CheckpointError(folder + "/checkpoint.json: not JSON (" + e.what() + ")");
  }
  if (meta.value("format", "") != kFormat)
    throw CheckpointError(folder + "/checkpoint.json: not a bmt checkpoint");
  const int version = meta.value("version", 0);
  if (version != complete.version || meta.value("step", int64_t{-1}) != complete.step)
    throw CheckpointError(folder + "/checkpoint.json: version " + std::to_string(version) +
                          ", step " + meta.value("step", json(nullptr)).dump() +
                          " do not match the COMPLETE file's (" +
                          std::to_string(complete.version) + ", step " +
                          std::to_string(complete.step) + ")");
  if (!readableVersion(version))
    throw CheckpointError(folder + ": checkpoint format version " + std::to_string(version) +
                          "; this bmt-run reads " + std::to_string(kFormatVersion) + " to " +
                          std::to_string(kPipelineTpVersion));
  const bool pipelined = version == kPipelineVersion || version == kPipelineTpVersion;
  if (pipelined != (meta.value("pipeline_stages", 1) > 1))
    throw CheckpointError(folder + "/checkpoint.json: version " + std::to_string(version) +
                          " with pipeline_stages " +
                          std::to_string(meta.value("pipeline_stages", 1)) +
                          " (versions 4 and 5 are the formats of pipeline stages)");
  const int64_t tp = meta.value("tensor_parallel", 1);
  if ((version == kTensorParallelVersion && tp <= 1) ||
      (tp > 1 && version != kTensorParallelVersion && version != kPipelineTpVersion))
    throw CheckpointError(folder + "/checkpoint.json: version " + std::to_string(version) +
                          " with tensor_parallel " + std::to_string(tp) +
                          " (versions 2 and 5 are the formats of tensor parallelism)");
  if (version == kPipelineTpVersion && tp <= 1 && meta.value("virtual_stages", 1) <= 1)
    throw CheckpointError(folder + "/checkpoint.json: version 5 without tensor_parallel or "
                                   "virtual_stages (version 5 is the format of pipeline stages "
                                   "with either)");
  if ((version == kExpertSplitVersion) != (meta.value("expert_parallel", 1) > 1))
    throw CheckpointError(folder + "/checkpoint.json: version " + std::to_string(version) +
                          " with expert_parallel " +
                          std::to_string(meta.value("expert_parallel", 1)) +
                          " (version 3 is the format of expert weights split over the expert "
                          "group)");
  return meta;
}

LRScheduleConfig savedSchedule(const json &meta, const std::string &folder) {
  LRScheduleConfig c;
  const json &s = meta.value("schedule", json::object());
  if (s.empty())
    return c;
  try {
    c.kind = parseLRScheduleKind(s.value("kind", std::string("constant")));
  } catch (const std::invalid_argument &) {
    throw CheckpointError(folder + "/checkpoint.json: schedule kind " + s.value("kind", "") +
                          " is not one bmt-run knows");
  }
  c.peakLR = s.value("peak_lr", c.peakLR);
  c.warmupSteps = s.value("warmup_steps", c.warmupSteps);
  c.totalSteps = s.value("total_steps", c.totalSteps);
  c.minLR = s.value("min_lr", c.minLR);
  c.gamma = s.value("gamma", c.gamma);
  return c;
}

TrainingProgress savedProgress(const json &meta, const std::string &folder) {
  TrainingProgress progress;
  try {
    progress.step = meta.at("step").get<int64_t>();
    const json &data = meta.at("data");
    progress.data.kind = data.at("kind").get<std::string>();
    if (progress.data.kind == "random-windows") {
      progress.data.generator = data.at("sampler").get<std::string>();
      progress.data.windows = data.at("windows").get<int64_t>();
    } else if (progress.data.kind == "documents") {
      progress.data.documents = data.at("documents").get<int64_t>();
    } else {
      progress.data.microBatches = data.at("micro_batches").get<int64_t>();
    }
    if (data.contains("data"))
      progress.data.data = data.at("data").get<std::string>();
    progress.objectiveGenerator = meta.at("objective_rng").get<std::string>();
    const json &ls = meta.at("loss_scale");
    if (!ls.is_null()) {
      progress.lossScale = ls.at("scale").get<double>();
      progress.cleanSteps = ls.at("clean_steps").get<int64_t>();
    }
  } catch (const json::exception &e) {
    throw CheckpointError(folder + "/checkpoint.json: " + e.what());
  }
  return progress;
}

} // namespace checkpoint

// --- identities -------------------------------------------------------------

namespace {

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const void *data, size_t n) {
    const auto *p = static_cast<const unsigned char *>(data);
    for (size_t i = 0; i < n; ++i)
      h = (h ^ p[i]) * 1099511628211ull;
  }
  void add(const std::string &s) {
    add(s.data(), s.size());
    add("\0", 1);
  }
  void add(int64_t v) { add(&v, sizeof v); }
  std::string hex() const {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
    return text;
  }
};

void addTrainables(Fnv &f, const plan::Plan &p) {
  for (const plan::TensorInfo &t : p.tensors)
    if (t.isParameter && t.requiresGrad) {
      f.add(t.name);
      f.add(plan::dtypeName(t.dtype));
      for (int64_t d : t.shape)
        f.add(d);
    }
}

} // namespace

std::string planIdentity(const plan::Plan &p, const std::string &programText, int64_t worldSize) {
  Fnv f;
  f.add(programText);
  addTrainables(f, p);
  for (const plan::StorageGroup &g : p.groups) {
    f.add(g.name);
    f.add(plan::dtypeName(g.dtype));
    f.add(g.size);
    for (size_t m = 0; m < g.members.size(); ++m) {
      f.add(g.members[m]);
      f.add(g.offsets[m]);
    }
  }
  f.add(worldSize);
  f.add(p.zeroStage);
  f.add(p.shardGroupSize);
  return f.hex();
}

std::string modelIdentity(const plan::Plan &p) {
  Fnv f;
  addTrainables(f, p);
  return f.hex();
}

std::string frozenIdentity(const plan::Plan &p) {
  Fnv f;
  bool any = false;
  for (const plan::TensorInfo &t : p.tensors)
    if (t.isParameter && !t.requiresGrad) {
      any = true;
      f.add(t.name);
      f.add(plan::dtypeName(t.dtype));
      for (int64_t d : t.shape)
        f.add(d);
      f.add(t.crc32);
      f.add(t.init);
    }
  return any ? f.hex() : std::string();
}

} // namespace bmt::runtime
