//===- Restore.cpp - the stages of a resume -------------------------------===//
//
// Each rank reads only the slices of its own layout from the rank files
// (docs/checkpoint-format.md); the stages and their order are Restore.h's.
//
//===----------------------------------------------------------------------===//

#include "Restore.h"

#include "bmt/Plan/Plan.h"
#include "bmt/Runtime/comm/Comm.h"
#include "bmt/Runtime/optim/LossScaler.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>

namespace fs = std::filesystem;

namespace bmt::runtime::checkpoint {

// --- readMetadata -------------------------------------------------------------

namespace {

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Throws CheckpointError naming the first trainable tensor that differs
/// between the checkpoint and `plan`.
void checkSameModel(const SavedLayout &layout, const plan::Plan &p,
                    const std::string &folder) {
  std::set<std::string> seen;
  for (const plan::TensorInfo &t : p.tensors) {
    if (!(t.isParameter && t.requiresGrad))
      continue;
    seen.insert(t.name);
    auto it = layout.members().find(t.name);
    if (it == layout.members().end())
      throw CheckpointError(folder + " is a checkpoint of another model: it has no parameter " +
                            t.name);
    if (it->second.shape != t.shape)
      throw CheckpointError(folder + " is a checkpoint of another model: " + t.name + " is " +
                            shapeText(it->second.shape) + " there, " + shapeText(t.shape) +
                            " here");
    if (it->second.dtype != plan::dtypeName(t.dtype))
      throw CheckpointError(folder + ": " + t.name + " is " + it->second.dtype +
                            " in the checkpoint, " + plan::dtypeName(t.dtype) +
                            " in this plan (compile with the checkpoint's --dtype)");
  }
  for (const auto &[name, member] : layout.members())
    if (!seen.count(name))
      throw CheckpointError(folder + " is a checkpoint of another model: it has a parameter " +
                            name + " that this model has not");
}

/// A pipelined run's checkpoint: every rank file there, before anything
/// is read (a rank reads only its stage's share, so a stage's missing files
/// would otherwise stop only the ranks that read them). Throws
/// CheckpointError naming the first missing file and its stage.
void checkStageFiles(const Restore &r) {
  const int64_t stages = r.layout->pipelineStages(), n = r.layout->worldSize();
  if (stages <= 1)
    return;
  for (int64_t rank = 0; rank < n; ++rank) {
    const fs::path file = fs::path(r.folder) / rankName(rank, ".safetensors");
    std::error_code ec;
    if (!fs::is_regular_file(file, ec))
      throw CheckpointError(file.string() + ": missing (the checkpoint of " +
                            std::to_string(stages) + " pipeline stages on " + std::to_string(n) +
                            " ranks has no file of rank " + std::to_string(rank) + ", of stage " +
                            std::to_string(rank / (n / stages)) +
                            "): resume another checkpoint");
  }
}

} // namespace

void readMetadata(Restore &r, const OptimizerConfig *expected) {
  checkCheckpointLayout(r.model.plan(), r.folder);
  fs::path dir = fs::path(r.folder).lexically_normal();
  if (dir.filename().empty())
    dir = dir.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw CheckpointError(r.folder + ": no such checkpoint folder");
  r.meta = readCheckpointJson(r.folder, dir.string());
  if (expected)
    checkSameOptimizer(r.meta.value("optimizer", json::object()), *expected, r.folder);
  r.layout = std::make_unique<SavedLayout>(r.folder, r.meta);
  r.reader = std::make_unique<CheckpointReader>(r.folder, *r.layout);
  checkSameModel(*r.layout, r.model.plan(), r.folder);
  // The frozen parameters are not in the checkpoint: they must be those the
  // trainable ones were trained against (checkpoints older than the record
  // have none to compare).
  const json &planJson = r.meta.value("plan", json::object());
  if (planJson.contains("frozen_base")) {
    std::string saved = planJson.value("frozen_base", std::string());
    std::string here = frozenIdentity(r.model.plan());
    if (saved != here)
      throw CheckpointError(
          r.folder + " was trained against other frozen parameters (" +
          (saved.empty() ? std::string("none") : "identity " + saved) + ") than this plan's (" +
          (here.empty() ? std::string("none") : "identity " + here) +
          "): compile the same base model with the same --freeze to resume");
  }

  // LoRA's rank, alpha, dropout and targets are in the program, not in
  // the tensors: a resume must run the settings it trained with.
  if (planJson.contains("adapters") &&
      planJson.value("adapters", std::string()) != r.model.adapterSettings()) {
    auto shown = [](const std::string &s) { return s.empty() ? std::string("none") : s; };
    throw CheckpointError(r.folder + " was trained with LoRA settings " +
                          shown(planJson.value("adapters", std::string())) + ", this plan has " +
                          shown(r.model.adapterSettings()) +
                          ": compile with the --lora the run was trained with to resume");
  }
  r.report.savedWorldSize = r.layout->worldSize();
  r.report.savedTensorParallel = r.layout->tensorParallel();
  r.report.savedExpertParallel = r.layout->expertParallel();
  r.report.savedPipelineStages = r.layout->pipelineStages();
  r.report.savedVirtualStages = r.layout->virtualStages();
  checkStageFiles(r);
  r.report.savedSchedule = savedSchedule(r.meta, r.folder);
  const json batch = r.meta.value("batch", json::object());
  r.report.savedSequencesPerStep = batch.value("sequences_per_step", int64_t{0});
  r.report.savedSeqLen = batch.value("seq_len", int64_t{0});
  r.report.savedMoeBiasUpdateRate = r.meta.value("moe_bias_update_rate", 0.0);
  r.tp = r.model.plan().tensorParallel;
  r.tpRank = r.model.tensorParallel() ? r.model.tensorParallel()->rank() : 0;
  r.savedTp = r.layout->tensorParallel();
  if (r.model.plan().splitsExperts()) {
    r.ep = r.model.plan().expertParallel;
    r.epRank = r.model.world().rank() % r.ep; // expert group g: ranks [g*E, (g+1)*E)
  }
}

// --- planReads ----------------------------------------------------------------

namespace {

/// How this run slices trainable tensor `t`: over its TP group, or over
/// its expert group (an expert parameter of a plan that splits them).
SliceLayout layoutOf(const Restore &r, const plan::TensorInfo &t) {
  SliceLayout l;
  l.shape = t.shape;
  l.tp = r.tp;
  l.tpRank = r.tpRank;
  if (r.tp > 1 && t.split.isTensorSplit()) {
    l.split.dim = t.split.dim;
    l.split.chunks = t.split.chunks;
    l.split.paddedSize = t.split.paddedSize;
  } else if (r.ep > 1 && t.split.isExpertSplit()) {
    l.split = expertSplit();
    l.tp = r.ep;
    l.tpRank = r.epRank;
  }
  return l;
}

/// The saved copy of `saved` this rank reads first: that of its own TP
/// rank or expert-group position (of an expert-split tensor), modulo the
/// saved copies (a tensor saved whole has one).
size_t savedCopyOf(const Restore &r, const SavedMember &saved) {
  const int64_t mine = saved.layout.split.isExpertSplit() ? r.epRank : r.tpRank;
  return static_cast<size_t>(mine % static_cast<int64_t>(saved.copies.size()));
}

/// The checkpoint's slicing of `saved`; an unsplit tensor is read from
/// the copy savedCopyOf gives.
SliceLayout savedLayoutOf(const Restore &r, const SavedMember &saved) {
  SliceLayout l = saved.layout;
  l.tpRank = static_cast<int64_t>(savedCopyOf(r, saved));
  return l;
}

/// The fields each space needs, with their dtypes: "param", "master" where
/// the trainable tensor is not of the space's dtype, and the optimizer's
/// per-element slots.
std::vector<std::map<std::string, c10::ScalarType>> neededFields(const Restore &r) {
  std::vector<std::map<std::string, c10::ScalarType>> needed(r.spaces.size());
  for (size_t k = 0; k < r.spaces.size(); ++k) {
    const ParameterSpace &s = r.spaces[k];
    needed[k]["param"] = s.dtype;
    const at::Tensor &trainable = r.model.parameters().at(s.parameter);
    if (trainable.scalar_type() != s.dtype)
      needed[k]["master"] = trainable.scalar_type();
  }
  for (const auto &[key, tensor] : r.state.tensors) {
    auto [slot, i] = splitStateKey(key);
    if (slot != "step" && !r.state.replicatedSlots.count(slot))
      needed[r.spaceOfParameter.at(i)][slot] = tensor.scalar_type();
  }
  return needed;
}

/// Queues the reads of member m of space k's elements in this rank's
/// shard of field `field` into `buffer` (the shard's host buffer).
void requestMember(Restore &r, size_t k, size_t m, const std::string &field,
                   const at::Tensor &buffer) {
  const ParameterSpace &s = r.spaces[k];
  const plan::TensorInfo &t = r.model.plan().tensors.at(s.members[m]);
  const int64_t begin = s.shardIndex * s.shardSize;
  const int64_t end = std::min(s.size, begin + s.shardSize);
  const int64_t from = std::max(begin, s.offsets[m]);
  const int64_t to = std::min(end, s.offsets[m] + t.localNumel(r.tp, r.ep));
  if (from >= to)
    return;
  const c10::ScalarType dtype = buffer.scalar_type();
  const int64_t elementSize = static_cast<int64_t>(c10::elementSize(dtype));
  const SavedMember &saved = r.layout->members().at(t.name);
  char *const dst = static_cast<char *>(buffer.data_ptr()) + (from - begin) * elementSize;
  // Elements [local, local + n) of TP rank savedRank's saved slice to
  // dst + at.
  auto copy = [&](int64_t savedRank, int64_t local, int64_t at, int64_t n) {
    const auto &[space, offset] = saved.copies.at(static_cast<size_t>(savedRank));
    const SavedSpace &savedSpace = r.layout->spaces()[space];
    r.report.resharded = r.report.resharded || savedSpace.name != s.name ||
                         offset != s.offsets[m] || savedSpace.shards != s.numShards;
    // A float32 space's master is its parameter.
    std::string savedField = field;
    if (field == "master" && !savedSpace.master)
      savedField = "param";
    r.reader->request(space, savedField, offset + local, n, dst + at * elementSize, dtype);
  };
  // Another TP split: the elements of this slice through the global
  // tensor to the saved slices that hold them (padding stays zero).
  if (planSlice(layoutOf(r, t), savedLayoutOf(r, saved), from - s.offsets[m],
                to - s.offsets[m], copy))
    r.report.resharded = true;
}

} // namespace

void planReads(Restore &r) {
  r.spaces = r.model.parameterSpaces();
  r.state = r.optimizer.state();
  for (size_t k = 0; k < r.spaces.size(); ++k)
    r.spaceOfParameter[r.spaces[k].parameter] = k;
  r.fields.assign(r.spaces.size(), {});
  const auto needed = neededFields(r);
  r.report.resharded = r.layout->worldSize() != r.model.world().size() ||
                       r.savedTp != r.tp || r.layout->expertParallel() != r.ep ||
                       r.layout->pipelineStages() != r.model.pipelineStages() ||
                       r.layout->virtualStages() != r.model.pipelineVirtualStages();
  for (size_t k = 0; k < r.spaces.size(); ++k)
    for (const auto &[field, dtype] : needed[k]) {
      at::Tensor buffer =
          at::zeros({r.spaces[k].shardSize}, at::TensorOptions().dtype(dtype));
      r.fields[k][field] = buffer;
      for (size_t m = 0; m < r.spaces[k].members.size(); ++m)
        requestMember(r, k, m, field, buffer);
    }
}

// --- readFields ---------------------------------------------------------------

namespace {

/// The saved space that holds space k's first member (this TP rank's
/// copy, or tpRank % savedTp's).
size_t savedSpaceOf(const Restore &r, size_t k) {
  const plan::TensorInfo &t = r.model.plan().tensors.at(r.spaces[k].members.at(0));
  const SavedMember &first = r.layout->members().at(t.name);
  return first.copies.at(savedCopyOf(r, first)).first;
}

/// Whether saved space `savedSpace` holds exactly space k's members at
/// their offsets, with the same TP split.
bool sameGroup(const Restore &r, size_t k, size_t savedSpace) {
  const ParameterSpace &s = r.spaces[k];
  const SavedSpace &saved = r.layout->spaces()[savedSpace];
  bool same = saved.name == s.name && r.savedTp == r.tp && r.layout->expertParallel() == r.ep;
  for (size_t m = 0; m < s.members.size() && same; ++m) {
    const SavedMember &member = r.layout->members().at(r.model.plan().tensors.at(s.members[m]).name);
    const auto &copy = member.copies.at(savedCopyOf(r, member));
    same = copy.first == savedSpace && copy.second == s.offsets[m];
  }
  return same;
}

/// Space k's step count and replicated slots (Adafactor's factors,
/// concatenated over the space's members): whole, from shard 0's file of
/// `savedSpace`. The slots only when the saved space has the same members
/// (any number of shards) and the same TP split (this TP rank's factors
/// are those of its slices).
void readWholeFields(Restore &r, size_t k, size_t savedSpace) {
  const std::string parameter = std::to_string(r.spaces[k].parameter);
  const int64_t shard0 = r.layout->rankOf(savedSpace, 0);
  if (r.state.tensors.count("step." + parameter))
    r.fields[k]["step"] =
        r.reader->readChecked(shard0, fieldName(static_cast<int64_t>(savedSpace), "step"));
  for (const std::string &slot : r.state.replicatedSlots) {
    if (!r.state.tensors.count(slot + "." + parameter))
      continue;
    if (!sameGroup(r, k, savedSpace))
      throw CheckpointError(r.folder + ": the optimizer's " + slot + " of " + r.spaces[k].name +
                            " is kept per storage group, and the checkpoint's groups differ "
                            "(another plan's layout" +
                            (r.savedTp != r.tp ? ", saved with tensor parallel " +
                                                     std::to_string(r.savedTp) + ", this run " +
                                                     std::to_string(r.tp)
                                               : std::string()) +
                            "): resume with the plan it was saved with");
    r.fields[k][slot] =
        r.reader->readChecked(shard0, fieldName(static_cast<int64_t>(savedSpace), slot));
  }
}

} // namespace

void readFields(Restore &r) {
  r.reader->flush();
  for (size_t k = 0; k < r.spaces.size(); ++k)
    readWholeFields(r, k, savedSpaceOf(r, k));
  // The buffers training moves, from rank 0's file (the same on every rank).
  for (const auto &[name, buffer] : r.model.routerBiases()) {
    const std::string saved = kBufferPrefix + name;
    if (!r.reader->file(0).find(saved))
      continue; // saved before checkpoints held them: they never moved
    at::Tensor value = r.reader->readChecked(0, saved);
    if (value.sizes() != buffer.sizes() || value.scalar_type() != buffer.scalar_type())
      throw CheckpointError(r.folder + ": " + saved + " is " + c10::str(value.sizes()) + " " +
                            c10::toString(value.scalar_type()) + " in the checkpoint, " +
                            c10::str(buffer.sizes()) + " " + c10::toString(buffer.scalar_type()) +
                            " in this plan");
    r.buffers.emplace_back(buffer, value);
  }
}

// --- apply --------------------------------------------------------------------

void applyParameters(Restore &r) {
  c10::NoGradGuard noGrad;
  for (size_t k = 0; k < r.spaces.size(); ++k) {
    const ParameterSpace &s = r.spaces[k];
    s.value.copy_(r.fields[k].at("param").view(s.value.sizes()));
    const at::Tensor &trainable = r.model.parameters().at(s.parameter);
    if (trainable.scalar_type() != s.dtype)
      trainable.detach().view({-1}).copy_(r.fields[k].at("master"));
  }
}

void applyOptimizerState(Restore &r) {
  OptimizerState restored;
  restored.scalars = r.state.scalars;
  for (const auto &[key, tensor] : r.state.tensors) {
    auto [slot, i] = splitStateKey(key);
    at::Tensor value = r.fields[r.spaceOfParameter.at(i)].at(slot);
    restored.tensors[key] = value.view(tensor.sizes());
  }
  try {
    r.optimizer.loadState(restored);
  } catch (const std::invalid_argument &e) {
    throw CheckpointError(r.folder + ": " + e.what());
  }
}

void applyProgress(Restore &r) {
  r.report.progress = savedProgress(r.meta, r.folder);
  if (r.scaler && r.report.progress.lossScale)
    r.scaler->setState(*r.report.progress.lossScale, r.report.progress.cleanSteps);
}

void applyBuffers(Restore &r) {
  c10::NoGradGuard noGrad;
  for (auto &[buffer, value] : r.buffers)
    buffer.copy_(value);
}

void applyGenerators(Restore &r) {
  if (r.layout->worldSize() != r.model.world().size() || r.savedTp != r.tp ||
      r.layout->pipelineStages() != r.model.pipelineStages())
    return;
  const int64_t rank = r.model.world().rank();
  SafetensorsFile &mine = r.reader->file(rank);
  auto restore = [&](at::Generator g, const char *name) {
    if (!mine.find(name))
      return false;
    at::Tensor state = r.reader->readChecked(rank, name);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
    return true;
  };
  bool restored = restore(at::detail::getDefaultCPUGenerator(), "rng.cpu");
  if (r.model.device().is_cuda())
    restored = restore(at::globalContext().defaultGenerator(r.model.device()), "rng.cuda") &&
               restored;
  r.report.generatorsRestored = restored;
}

} // namespace bmt::runtime::checkpoint
