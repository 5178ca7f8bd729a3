//===- ModelPipeline.cpp - a model's pipeline stage -----------------------===//
//
// Pipeline parallelism in Model (docs/runtime/pipeline.md): the stage's
// communicators and groups, the tied gradients between the first and last
// stage, the gradient norm over the stages, the parameters collected on
// rank 0, and the values that cross a cut.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/parallel/Zero.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>

namespace bmt::runtime {

std::vector<bool> Model::setUpPipeline(const std::string &path, const ModelOptions &options) {
  stages_ = plan_.pipelineStages;
  const int64_t n = world_->size();
  const std::string what = path + ": a pipeline of " + std::to_string(stages_) + " stages";
  const int64_t per = stages_ * plan_.tensorParallel; // (P x T)
  if (n % per != 0)
    throw ExecutionError(what +
                         (plan_.tensorParallel > 1
                              ? " of " + std::to_string(plan_.tensorParallel) + " TP ranks each"
                              : std::string()) +
                         " needs a world size that is a multiple of " +
                         std::to_string(per) + ", not " + std::to_string(n) +
                         "; run on a multiple of " + std::to_string(per) +
                         " ranks or recompile with another --pipeline-parallel");
  if (plan_.zeroStage == 0)
    throw ExecutionError(what + " needs ZeRO storage groups, and the plan has none");
  if (plan_.shardGroupSize > 0)
    throw ExecutionError(what + " with hybrid sharding (--shard-group-size) is not supported");
  if (options.offloadOptimizer)
    throw ExecutionError(what + " with --offload-optimizer is not supported");
  for (const plan::TensorInfo &t : plan_.tensors)
    if (t.isParameter && t.requiresGrad && t.group < 0)
      throw ExecutionError(what + ": the trainable parameter " + t.name +
                           " is outside the ZeRO storage groups, which a pipeline does not "
                           "support");
  for (const plan::StorageGroup &g : plan_.groups)
    if (!g.blockList.empty() && g.blockList != plan_.pipelineBlockList)
      throw ExecutionError(what + ": the storage group " + g.name + " belongs to the block list " +
                           g.blockList + ", not the one cut into stages (" +
                           plan_.pipelineBlockList + "); an encoder-decoder cannot be "
                           "pipelined yet");
  // A stage's d = T x D ranks are consecutive (TP rank innermost, then the
  // data-parallel rank): rank r runs stage r / d.
  const int64_t d = n / stages_, rank = world_->rank();
  stage_ = rank / d;
  stageComm_ = world_->split(stage_, rank, "stage");
  virtualStages_ = plan_.pipelineVirtualStages;
  // pipelineChannel's copies of the world (every rank, in this order).
  const char *names[2][2] = {{"pipeline-activations-up", "pipeline-activations-down"},
                             {"pipeline-gradients-up", "pipeline-gradients-down"}};
  for (int kind = 0; kind < 2; ++kind)
    for (int way = 0; way < 2; ++way)
      channels_[kind][way] = world_->split(0, rank, names[kind][way]);
  // The ranks of the same (data-parallel, TP) rank r % d on the first and
  // last stage share the groups both read (a tied embedding and LM head).
  const bool ends = stage_ == 0 || stage_ == stages_ - 1;
  tieComm_ = world_->split(ends ? rank % d : d + rank, rank, "tied");
  // Each stage holds the groups its instructions (its chunks') read; a
  // group no stage reads is held by stage 0 (it trains nowhere, and is
  // saved) and gathered by its first chunk.
  const std::vector<std::vector<bool>> reads = Executor::stageGroups(plan_);
  std::vector<bool> held(plan_.groups.size(), false);
  tied_.assign(plan_.groups.size(), false);
  chunkHeld_.clear();
  for (int64_t c : pipelineChunks())
    chunkHeld_.push_back(reads.at(c));
  for (size_t g = 0; g < plan_.groups.size(); ++g) {
    std::vector<int64_t> holders;
    for (size_t c = 0; c < reads.size(); ++c)
      if (reads[c][g] && std::find(holders.begin(), holders.end(),
                                   static_cast<int64_t>(c) % stages_) == holders.end())
        holders.push_back(static_cast<int64_t>(c) % stages_);
    std::sort(holders.begin(), holders.end());
    if (holders.empty()) {
      holders.push_back(0);
      if (stage_ == 0)
        chunkHeld_.front()[g] = true;
    }
    if (holders.size() > 2 || (holders.size() == 2 && (holders[0] != 0 || holders[1] != stages_ - 1)))
      throw ExecutionError(what + ": the storage group " + plan_.groups[g].name +
                           " is read by stages " + std::to_string(holders.front()) + " and " +
                           std::to_string(holders.back()) + "; only the first and the last "
                           "stage may share parameters");
    tied_[g] = holders.size() == 2;
    held[g] = std::find(holders.begin(), holders.end(), stage_) != holders.end();
  }
  sameAsFirstCopy(held);
  sameAsFirstCopy(tied_);
  held_ = held;
  return held;
}

std::vector<int64_t> Model::pipelineChunks() const {
  std::vector<int64_t> chunks;
  for (int64_t v = 0; v < virtualStages_; ++v)
    chunks.push_back(v * stages_ + stage_);
  return chunks;
}

void Model::selectPipelineChunk(int64_t v) {
  if (v < 0 || v >= virtualStages_)
    throw std::out_of_range("pipeline: local chunk " + std::to_string(v) + " of " +
                            std::to_string(virtualStages_));
  executor_->selectPipelineChunk(static_cast<size_t>(v));
  chunk_ = v;
}

int64_t Model::pipelinePreviousRank() const {
  const int64_t d = world_->size() / stages_;
  return (stage_ + stages_ - 1) % stages_ * d + world_->rank() % d;
}

int64_t Model::pipelineNextRank() const {
  const int64_t d = world_->size() / stages_;
  return (stage_ + 1) % stages_ * d + world_->rank() % d;
}

Comm &Model::pipelineChannel(PipelineTransfer kind, int64_t from, int64_t to) {
  if (stages_ <= 1 || from == to)
    throw std::logic_error("pipelineChannel: no transfer from rank " + std::to_string(from) +
                           " to " + std::to_string(to) + " in a model of " +
                           std::to_string(stages_) + " stages");
  return *channels_[static_cast<int>(kind)][from < to ? 0 : 1];
}

void Model::sameAsFirstCopy(std::vector<bool> &byGroup) const {
  // With T > 1 the plan has a copy of each group per TP rank; the stage's
  // instructions name the first (tp_rank 0), and this rank holds its own.
  if (plan_.tensorParallel <= 1)
    return;
  for (size_t g = 0; g < plan_.groups.size(); ++g)
    if (plan_.groups[g].tpRank > 0)
      for (size_t f = 0; f < plan_.groups.size(); ++f)
        if (plan_.groups[f].tpRank == 0 && plan_.groups[f].name == plan_.groups[g].name)
          byGroup[g] = byGroup[f];
}

int64_t Model::dataParallelColor(int64_t rank) const {
  const int64_t tp = plan_.tensorParallel, stages = plan_.pipelineStages;
  if (stages <= 1)
    return rank % tp;
  return rank / (world_->size() / stages) * tp + rank % tp;
}

void Model::sumTiedGradients() {
  // Stage 0 and P - 1 hold the same shards of the groups both read (the
  // same D); each has the gradient of its own uses (GPT-2's wte: the
  // embedding on stage 0, the LM head on stage P - 1).
  if (stage_ != 0 && stage_ != stages_ - 1)
    return;
  c10::NoGradGuard noGrad;
  for (size_t i = 0; i < zero_->shards().size(); ++i) {
    if (!tied_[shardGroup(i)])
      continue;
    at::Tensor p = zero_->shards()[i];
    if (!p.grad().defined())
      p.mutable_grad() = at::zeros_like(p);
    at::Tensor grad = p.grad();
    tieComm_->allReduce(grad)->wait();
  }
}

at::Tensor Model::pipelineGradNorm() {
  // Every shard once over the world: the D ranks of a stage hold distinct
  // shards, the T ranks of a TP group count their split members whole and
  // the replicated ones 1/T each (ZeroStorage::gradSquares), and the groups
  // of stage 0 and P - 1 count on stage 0 only.
  at::Tensor t = zero_->gradSquares(
      [&](size_t shard) { return stage_ == 0 || !tied_[shardGroup(shard)]; });
  if (t.device() != world_->device() && world_->backend() != "local")
    t = t.to(world_->device());
  world_->allReduce(t)->wait();
  return t.to(device_).sqrt();
}

void Model::collectStageParameters(std::vector<std::pair<std::string, at::Tensor>> &out) {
  // The first rank of each stage s > 0 sends its stage's parameters (TP
  // slices put together) to rank 0, which adds those it lacks.
  const int64_t d = stageRanks();
  const bool sender = stage_ > 0 && stageComm_->rank() == 0;
  if (sender) {
    std::vector<c10::IValue> values;
    for (const auto &[name, t] : out) {
      values.emplace_back(name);
      values.emplace_back(t);
    }
    sendValues(*world_, values, 0);
  }
  if (world_->rank() != 0)
    return;
  std::set<std::string> have;
  for (const auto &p : out)
    have.insert(p.first);
  for (int64_t s = 1; s < stages_; ++s) {
    std::vector<c10::IValue> values = recvValues(*world_, s * d, at::Device(at::kCPU));
    for (size_t k = 0; k + 1 < values.size(); k += 2) {
      std::string name = values[k].toStringRef();
      if (have.insert(name).second)
        out.emplace_back(name, values[k + 1].toTensor());
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> Model::frozenStageParameters() {
  // Those in a frozen group the stage holds (gathered over its ranks), and
  // those outside the groups (on every rank).
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (int64_t index : frozenParameterOrder()) {
    const plan::TensorInfo &info = plan_.tensors[index];
    if (info.group >= 0 && zero_ && !held_.at(info.group))
      continue;
    out.emplace_back(info.name, frozenParameter(index).cpu().clone()); // collective
  }
  collectStageParameters(out);
  return out;
}

std::vector<int64_t> Model::groupSavingStages() const {
  if (stages_ <= 1)
    return {};
  const std::vector<std::vector<bool>> reads = Executor::stageGroups(plan_);
  std::vector<int64_t> out(plan_.groups.size(), 0);
  // (With virtual stages `reads` is per chunk c, on stage c % P.)
  for (size_t g = 0; g < out.size(); ++g) {
    int64_t first = -1;
    for (size_t c = 0; c < reads.size(); ++c)
      if (reads[c][g]) {
        const int64_t s = static_cast<int64_t>(c) % stages_;
        first = first < 0 ? s : std::min(first, s);
      }
    out[g] = first < 0 ? 0 : first;
  }
  return out;
}

namespace {

at::Device transferDevice(Comm &comm) {
  return comm.backend() == "local" ? at::Device(at::kCPU) : comm.device();
}

} // namespace

void sendValues(Comm &comm, const std::vector<c10::IValue> &values, int64_t peer,
                std::vector<std::shared_ptr<Work>> *inFlight) {
  // A header (pickled: per value a tensor's dtype, shape and requires_grad,
  // or the plain value), its length first; then each tensor's bytes.
  c10::impl::GenericList header(c10::AnyType::get());
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < values.size(); ++i) {
    const c10::IValue &v = values[i];
    if (v.isTensor() && v.toTensor().defined()) {
      const at::Tensor &t = v.toTensor();
      header.push_back(c10::ivalue::Tuple::create(
          {c10::IValue(std::string("t")), c10::IValue(static_cast<int64_t>(t.scalar_type())),
           c10::IValue(t.sizes().vec()), c10::IValue(t.requires_grad())}));
      tensors.push_back(t.detach().contiguous());
      continue;
    }
    if (v.isTensor() || v.isTensorList() || (v.isList() && !v.toList().empty() &&
                                             v.toList().get(0).isTensor()) ||
        v.isTuple())
      throw ExecutionError("pipeline: value " + std::to_string(i) +
                           " crossing a stage cut is a " + v.tagKind() +
                           " holding tensors, which cannot be sent yet");
    header.push_back(c10::ivalue::Tuple::create({c10::IValue(std::string("v")), v}));
  }
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(header));
  const at::Device device = transferDevice(comm);
  at::Tensor length = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong).to(device);
  auto send = [&](const at::Tensor &t) {
    std::shared_ptr<Work> work = comm.send(t, peer);
    if (inFlight)
      inFlight->push_back(std::move(work));
    else
      work->wait();
  };
  send(length);
  at::Tensor data = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  send(data.to(device));
  for (const at::Tensor &t : tensors)
    send(t.device().is_cpu() && !device.is_cpu() ? t.to(device) : t);
}

std::vector<c10::IValue> recvValues(Comm &comm, int64_t peer, at::Device device,
                                    std::vector<bool> *requiresGrad) {
  const at::Device transfer = transferDevice(comm);
  at::Tensor length = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(transfer));
  comm.recv(length, peer)->wait();
  const int64_t n = length.cpu().item<int64_t>();
  at::Tensor data = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(transfer));
  comm.recv(data, peer)->wait();
  data = data.cpu();
  std::vector<char> bytes(static_cast<size_t>(n));
  std::memcpy(bytes.data(), data.data_ptr(), bytes.size());
  c10::IValue header = torch::jit::pickle_load(bytes);
  std::vector<c10::IValue> values;
  if (requiresGrad)
    requiresGrad->clear();
  for (const c10::IValue &entry : header.toListRef()) {
    const auto &e = entry.toTupleRef().elements();
    if (e.at(0).toStringRef() == "v") {
      values.push_back(e.at(1));
      if (requiresGrad)
        requiresGrad->push_back(false);
      continue;
    }
    at::Tensor t = at::empty(e.at(2).toIntVector(),
                             at::TensorOptions()
                                 .dtype(static_cast<at::ScalarType>(e.at(1).toInt()))
                                 .device(device));
    comm.recv(t, peer)->wait();
    values.emplace_back(t);
    if (requiresGrad)
      requiresGrad->push_back(e.at(3).toBool());
  }
  return values;
}

} // namespace bmt::runtime
