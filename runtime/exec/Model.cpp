//===- Model.cpp - a compiled model ready to run --------------------------===//

#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/train/Generators.h"
#include "bmt/Runtime/objectives/CrossEntropy.h"
#include "bmt/Runtime/fusion/Fused.h"

#include "bmt/Runtime/optim/AdamW.h"
#include "bmt/Runtime/optim/OffloadAdam.h"
#include "bmt/Runtime/optim/Optimizers.h"
#include "bmt/Runtime/parallel/Storage.h"
#include "bmt/Runtime/parallel/Zero.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <ATen/ops/cross_entropy_loss.h>

namespace bmt::runtime {

namespace {

/// The plan index of ZeRO shard `shard`'s group: the shard-th trainable
/// group that is not the copy of another TP rank (frozen groups have no
/// shard among ZeroStorage::shards()).
size_t zeroGroupIndex(const plan::Plan &plan, size_t shard) {
  for (size_t i = 0, k = 0; i < plan.groups.size(); ++i)
    if (plan.groups[i].tpRank <= 0 && plan.groups[i].epRank <= 0 && !plan.groups[i].frozen &&
        k++ == shard)
      return i;
  throw std::out_of_range("no storage group for ZeRO shard " + std::to_string(shard));
}

} // namespace

Model::Model(plan::Archive &archive, at::Device device, Comm *world,
             const std::function<void(int64_t, int64_t)> &progress,
             const ModelOptions &options)
    : plan_(archive.plan()), adapterSettings_(plan::adapterSettings(archive.programText())),
      device_(device), world_(world) {
  if (options.offloadOptimizer && plan_.zeroStage == 0)
    throw ExecutionError(archive.path() + ": offloading the optimizer needs ZeRO storage "
                         "groups, and the plan has none (compile with bmt-opt's default "
                         "pipeline or --bmt-zero)");
  if (!world_) {
    ownWorld_ = createLocalComm();
    world_ = ownWorld_.get();
  }
  const int64_t tp = plan_.tensorParallel;
  int64_t tpRank = 0;
  if (tp > 1) {
    const std::string what = archive.path() + ": tensor parallelism (" + std::to_string(tp) +
                             " ranks per TP group)";
    if (world_->size() % tp != 0)
      throw ExecutionError(what + " needs a world size that is a multiple of " +
                           std::to_string(tp) + ", not " + std::to_string(world_->size()) +
                           (world_->size() == 1 ? " rank" : " ranks") + "; run on a multiple of " + std::to_string(tp) +
                           " ranks or recompile with another --tensor-parallel");
    if (plan_.zeroStage == 0)
      throw ExecutionError(what + " needs ZeRO storage groups, and the plan has none");
    for (const plan::TensorInfo &t : plan_.tensors)
      if (t.isParameter && t.requiresGrad && t.group < 0)
        throw ExecutionError(what + ": the trainable parameter " + t.name +
                             " is outside the ZeRO storage groups, which this runtime does not "
                             "support");
    const int64_t rank = world_->rank();
    tensorComm_ = world_->split(rank / tp, rank, "tensor");
    dataComm_ = world_->split(dataParallelColor(rank), rank, "data");
    tpRank = tensorComm_->rank();
  }
  if (const int64_t ep = plan_.expertParallel; ep > 1) {
    // Expert group g: data-parallel ranks [g*E, (g+1)*E) of one TP rank
    // (with T == 1 the world's ranks; docs/passes/moe-layers.md).
    if (world_->size() % (ep * tp) != 0)
      throw ExecutionError(
          archive.path() + ": expert parallelism (" + std::to_string(ep) +
          " ranks per expert group" +
          (tp > 1 ? " of the data-parallel ranks, tensor parallel " + std::to_string(tp) : "") +
          ") needs a world size that is a multiple of " + std::to_string(ep * tp) + ", not " +
          std::to_string(world_->size()) + (world_->size() == 1 ? " rank" : " ranks") +
          "; run on a multiple of " + std::to_string(ep * tp) +
          " ranks or recompile with another --expert-parallel");
    if (plan_.splitsExperts() && options.offloadOptimizer)
      throw ExecutionError(archive.path() + ": --offload-optimizer with expert parameters split "
                           "over the expert group is not supported: drop --offload-optimizer, "
                           "or recompile with --split-expert-weights=false");
    if (plan_.splitsExperts() && plan_.zeroStage == 0)
      throw ExecutionError(archive.path() + ": expert parameters split over the expert group "
                           "need ZeRO storage groups, and the plan has none (recompile with "
                           "--split-expert-weights=false)");
    for (const plan::TensorInfo &t : plan_.tensors)
      if (t.split.isExpertSplit() && t.group < 0)
        throw ExecutionError(archive.path() + ": the expert parameter " + t.name +
                             " is split over the expert group but outside the ZeRO storage "
                             "groups (a frozen parameter?), which this runtime does not support");
    // With T > 1 a split of the data-parallel ranks of this TP rank: the
    // T ranks of a TP group send their (identical) tokens to the experts of
    // their own TP rank's peers.
    Comm &data = dataComm_ ? *dataComm_ : *world_;
    const int64_t rank = data.rank();
    expertComm_ = data.split(rank / ep, rank, "expert");
  }
  std::vector<bool> held;
  if (plan_.pipelineStages > 1)
    held = setUpPipeline(archive.path(), options);
  int64_t total = 0, done = 0;
  for (const plan::TensorInfo &t : plan_.tensors)
    if (t.group < 0)
      total += t.nbytes();
  if (plan_.zeroStage != 0) {
    int64_t groupBytes = 0;
    std::unique_ptr<ZeroStorage> zero = ZeroStorage::load(
        archive, device_, *world_,
        [&](int64_t d, int64_t t) {
          groupBytes = t;
          if (progress)
            progress(d, t + total);
        },
        options.offloadOptimizer, tensorComm_.get(),
        dataComm_ ? dataComm_.get() : stageComm_.get(), held.empty() ? nullptr : &held);
    zero_ = zero.get();
    if (!held.empty()) { // (1F1B interleaves micro-batches)
      zero_->setGradientSlots(false);
      zero_->setKeepOutsideGathered(true);
    }
    storage_ = std::move(zero);
    done = groupBytes;
    total += groupBytes;
    parameters_ = zero_->shards();
    parameterNames_ = zero_->shardNames();
  }
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const plan::TensorInfo &info = plan_.tensors[i];
    if (info.group >= 0) {
      tensors.emplace_back();
      continue;
    }
    at::Tensor t = archive.readTensor(i);
    if (info.split.isTensorSplit())
      t = plan::tpSlice(t, info.split, tp, tpRank); // this TP rank's slice (and vocab padding)
    t = t.to(device_);
    if (info.isParameter && info.requiresGrad) {
      t.set_requires_grad(true);
      parameters_.push_back(t);
      parameterNames_.push_back(info.name);
    }
    tensors.push_back(t);
    done += info.nbytes();
    if (progress)
      progress(done, total);
  }
  if (!storage_)
    storage_ = std::make_unique<ReplicatedStorage>(parameters_, *world_);
  executor_ = std::make_unique<Executor>(plan_, std::move(tensors), device_);
  if (zero_)
    executor_->setHooks(zero_);
  executor_->setTensorParallel(tensorComm_.get());
  executor_->setExpertParallel(expertComm_.get());
  if (!held.empty())
    executor_->setPipelineChunks(pipelineChunks(), chunkHeld_);
  const plan::Function &entry = plan_.functions[plan_.entry];
  for (size_t i = 0; i < entry.resultNames.size(); ++i)
    if (entry.resultNames[i] == "logits") {
      logitsIndex_ = i;
      hasLogits_ = true;
    } else if (entry.resultNames[i] == "loss") {
      lossIndex_ = i;
    } else if (entry.resultNames[i] == "aux_loss") {
      auxLossIndex_ = static_cast<int64_t>(i);
    }
  if (entry.returns.empty())
    throw ExecutionError("the model's forward returns nothing");
}

Model::~Model() = default;

std::vector<c10::IValue> Model::run(const ModelInputs &given) {
  const plan::Function &entry = plan_.functions[plan_.entry];
  if (!given.inputIds.defined())
    throw ExecutionError("the model's forward needs input_ids");
  std::vector<c10::IValue> inputs;
  for (const std::string &name : entry.paramNames) {
    if (name == "input_ids") {
      inputs.emplace_back(given.inputIds);
    } else if (name == "attention_mask") {
      inputs.emplace_back(given.attentionMask.defined() ? given.attentionMask
                                                        : at::ones_like(given.inputIds));
    } else if (name == "position_ids") {
      // Default: each row's positions 0 .. seq - 1 (transformers' own).
      inputs.emplace_back(given.positionIds.defined()
                              ? given.positionIds
                              : at::arange(given.inputIds.size(1), given.inputIds.options())
                                    .expand_as(given.inputIds)
                                    .contiguous());
    } else if (name == "decoder_input_ids") {
      if (!given.decoderInputIds.defined())
        throw ExecutionError("the model's forward takes decoder_input_ids (an encoder-decoder): "
                             "train it with the span-corruption objective, or give "
                             "decoder_input_ids in --dump's inputs");
      inputs.emplace_back(given.decoderInputIds);
    } else if (name == "decoder_attention_mask" && given.decoderInputIds.defined()) {
      inputs.emplace_back(at::ones_like(given.decoderInputIds));
    } else if (name == "labels") {
      if (!given.labels.defined())
        throw ExecutionError("the model's forward takes labels (it computes its own loss): "
                             "train it with bmt-run, which feeds them, or give 'labels' in "
                             "--dump's inputs");
      inputs.emplace_back(given.labels);
    } else {
      throw ExecutionError("the model's forward takes an input '" + name +
                           "' that bmt-run does not provide (it provides input_ids, "
                           "attention_mask, labels, and decoder_input_ids with "
                           "decoder_attention_mask for encoder-decoders); export the model "
                           "with those inputs");
    }
  }
  storage_->beginForward();
  std::vector<c10::IValue> results = executor_->run(inputs);
  storage_->endForward(c10::GradMode::is_enabled());
  if (auxLossIndex_ >= 0 && static_cast<size_t>(auxLossIndex_) < results.size() &&
      results[auxLossIndex_].isTensor())
    lastAuxLoss_ = results[auxLossIndex_].toTensor().detach();
  return results;
}

void Model::synchronizeGradients() {
  storage_->synchronizeGradients();
  if (stages_ > 1)
    sumTiedGradients();
}

at::Tensor Model::gradNorm() { return stages_ > 1 ? pipelineGradNorm() : storage_->gradNorm(); }

void Model::afterOptimizerStep() { storage_->afterOptimizerStep(); }

void Model::parametersChanged() { storage_->parametersChanged(); }

int64_t Model::gradientsWrittenInPlace() const {
  return zero_ ? zero_->gradientsWrittenInPlace() : 0;
}

int64_t Model::recomputeSkips() const { return executor_->recomputeSkips(); }

void Model::seedGenerators(uint64_t seed) {
  seedGeneratorsAt(device_, seed, dataParallel().rank(), /*step=*/0);
}

bool Model::offloadsOptimizer() const { return zero_ && zero_->offloadsOptimizer(); }

HostGradientSource &Model::hostGradients(int64_t microBatchesPerStep) {
  if (!offloadsOptimizer())
    throw ExecutionError("the model was loaded without --offload-optimizer: its gradients "
                         "stay on the device");
  if (parameters_.size() != zero_->shards().size())
    throw ExecutionError("offloading the optimizer: " +
                         std::to_string(parameters_.size() - zero_->shards().size()) +
                         " trainable parameters are outside the ZeRO storage groups");
  zero_->setMicroBatchesPerStep(microBatchesPerStep);
  return *zero_;
}

std::unique_ptr<Optimizer> Model::makeOptimizer(const OptimizerConfig &config,
                                                int64_t microBatchesPerStep) {
  checkOptimizerConfig(config);
  if (plan_.splitsExperts() && config.kind == OptimizerKind::Adafactor)
    throw std::invalid_argument("--optimizer adafactor factors each parameter over its shard "
                                "group, and this plan splits expert parameters over the expert "
                                "group: use another optimizer or recompile with "
                                "--split-expert-weights=false");
  if (offloadsOptimizer()) {
    if (config.kind != OptimizerKind::Adam && config.kind != OptimizerKind::AdamW)
      throw std::invalid_argument(std::string("--offload-optimizer runs Adam or AdamW on the "
                                              "host; --optimizer ") +
                                  optimizerKindName(config.kind) +
                                  " is not offloaded (drop --offload-optimizer)");
    return std::make_unique<OffloadAdamW>(parameters_, adamWConfig(config),
                                          hostGradients(microBatchesPerStep),
                                          parameterLayouts());
  }
  return makeDeviceOptimizer(parameters_, parameterLayouts(), config,
                             zero_ ? &zero_->shardComm() : nullptr, tensorComm_.get());
}

bool Model::letOptimizerWriteShards(Optimizer &optimizer) {
  if (!zero_ || zero_->offloadsOptimizer() || stages_ > 1)
    return false;
  // (parameters() begin with the shards, in shards() order.)
  std::vector<LowPrecisionCopy> copies = zero_->lowPrecisionCopies();
  if (copies.empty() || !optimizer.writeLowPrecisionCopies(copies))
    return false;
  zero_->letOptimizerWriteShards();
  return true;
}

bool Model::optimizerWritesShards() const { return zero_ && zero_->optimizerWritesShards(); }

std::vector<ParameterLayout> Model::parameterLayouts() const {
  std::vector<ParameterLayout> layouts;
  for (const ParameterSpace &s : parameterSpaces()) {
    ParameterLayout layout;
    for (size_t m = 0; m < s.members.size(); ++m) {
      const plan::TensorInfo &t = plan_.tensors.at(s.members[m]);
      // (Tensor parallelism: the shard holds the local slices.)
      ParameterLayout::Member member{
          t.name, t.localShape(plan_.tensorParallel, plan_.expertParallel), s.offsets[m]};
      member.globalShape = t.shape;
      if (plan_.tensorParallel > 1 && t.split.isTensorSplit())
        member.tpDim = t.split.dim;
      layout.members.push_back(std::move(member));
    }
    layout.begin = s.shardIndex * s.shardSize;
    layout.split = s.numShards > 1;
    layouts.push_back(std::move(layout));
  }
  return layouts;
}

std::vector<ParameterSpace> Model::parameterSpaces() const {
  std::vector<ParameterSpace> spaces;
  const size_t numShards = zero_ ? zero_->shards().size() : 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    ParameterSpace s;
    s.parameter = i;
    if (i < numShards) {
      const plan::StorageGroup &g = plan_.groups[shardGroup(i)];
      ZeroStorage::ShardPlace place = zero_->shardPlace(static_cast<int64_t>(i));
      s.name = g.name;
      s.dtype = g.dtype;
      s.size = g.size;
      s.members = g.members;
      s.offsets = g.offsets;
      s.numShards = place.numShards;
      s.shardIndex = place.shardIndex;
      s.shardSize = place.shard.numel();
      s.writer = place.firstReplica;
      s.value = place.shard;
    } else {
      const int64_t index = plan_.findTensor(parameterNames_[i]);
      const plan::TensorInfo &t = plan_.tensors.at(index);
      s.name = t.name;
      s.dtype = t.dtype;
      s.size = t.numel();
      s.members = {index};
      s.offsets = {0};
      s.shardSize = s.size;
      s.writer = world_->rank() == 0;
      s.value = parameters_[i].detach().view({-1});
    }
    spaces.push_back(std::move(s));
  }
  return spaces;
}

at::ScalarType Model::parameterDtype() const {
  for (const plan::TensorInfo &t : plan_.tensors)
    if (t.isParameter && at::isFloatingType(t.dtype))
      return t.dtype;
  return at::kFloat;
}

void Model::setReduceDtype(std::optional<at::ScalarType> dtype) {
  storage_->setReduceDtype(dtype);
}

std::vector<int64_t> Model::fullParameterOrder() const {
  std::vector<int64_t> order;
  if (zero_)
    for (size_t i = 0; i < plan_.groups.size(); ++i) {
      const plan::StorageGroup &g = plan_.groups[i];
      if (g.tpRank <= 0 && g.epRank <= 0 && !g.frozen && (held_.empty() || held_[i]))
        order.insert(order.end(), g.members.begin(), g.members.end());
    }
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const plan::TensorInfo &info = plan_.tensors[i];
    if (info.isParameter && info.requiresGrad && (info.group < 0 || !zero_))
      order.push_back(static_cast<int64_t>(i));
  }
  return order;
}

std::vector<int64_t> Model::frozenParameterOrder() const {
  std::vector<int64_t> order;
  for (size_t i = 0; i < plan_.tensors.size(); ++i)
    if (plan_.tensors[i].isParameter && !plan_.tensors[i].requiresGrad)
      order.push_back(static_cast<int64_t>(i));
  return order;
}

at::Tensor Model::frozenParameter(int64_t index) {
  const plan::TensorInfo &info = plan_.tensors.at(index);
  if (!info.isParameter || info.requiresGrad)
    throw ExecutionError(info.name + " is not a frozen parameter");
  if (info.split.isExpertSplit())
    throw ExecutionError("the frozen parameter " + info.name + " is split over the expert "
                         "group's ranks, which this runtime cannot put back together");
  at::Tensor local = info.group >= 0 && zero_ ? zero_->frozenParameter(index) // collective
                                              : executor_->tensors().at(index).detach();
  if (!info.split.isTensorSplit())
    return local;
  if (!tensorComm_) // T == 1: only vocab padding to drop
    return plan::tpUnslice({local}, info.split, info.shape);
  // The TP ranks' slices, put back together (collective over the TP group).
  const int64_t tp = plan_.tensorParallel;
  at::Tensor slices = at::empty({tp * local.numel()}, local.options());
  tensorComm_->allGather(slices, local.contiguous().view({-1}))->wait();
  std::vector<at::Tensor> parts;
  for (int64_t t = 0; t < tp; ++t)
    parts.push_back(slices.narrow(0, t * local.numel(), local.numel()).view(local.sizes()));
  return plan::tpUnslice(parts, info.split, info.shape);
}

void Model::forEachFullParameter(
    const std::function<void(int64_t, const at::Tensor &)> &visit, bool gradients) {
  const int64_t tp = plan_.tensorParallel;
  if (zero_)
    for (size_t g = 0; g < zero_->shards().size(); ++g) {
      const plan::StorageGroup &group = plan_.groups[shardGroup(g)];
      at::Tensor full = zero_->gatherGroup(static_cast<int64_t>(g), gradients); // collective
      for (size_t m = 0; m < group.members.size(); ++m) {
        const plan::TensorInfo &info = plan_.tensors[group.members[m]];
        const int64_t ep = plan_.expertParallel;
        at::Tensor local = full.narrow(0, group.offsets[m], info.localNumel(tp, ep))
                               .view(info.localShape(tp, ep));
        if (info.split.isExpertSplit()) {
          // This rank's experts; the expert group's, in position order
          // (collective over the expert group).
          at::Tensor slices = at::empty({ep * local.numel()}, local.options());
          expertComm_->allGather(slices, local.contiguous().view({-1}))->wait();
          visit(group.members[m], slices.view(info.shape));
          continue;
        }
        if (!info.split.isTensorSplit()) {
          visit(group.members[m], local);
          continue;
        }
        if (!tensorComm_) { // T == 1: only vocab padding to drop
          visit(group.members[m], plan::tpUnslice({local}, info.split, info.shape));
          continue;
        }
        // The TP ranks' slices, put back together (collective over the TP group).
        at::Tensor slices = at::empty({tp * local.numel()}, local.options());
        tensorComm_->allGather(slices, local.contiguous().view({-1}))->wait();
        std::vector<at::Tensor> parts;
        for (int64_t t = 0; t < tp; ++t)
          parts.push_back(slices.narrow(0, t * local.numel(), local.numel()).view(local.sizes()));
        visit(group.members[m], plan::tpUnslice(parts, info.split, info.shape));
      }
    }
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const plan::TensorInfo &info = plan_.tensors[i];
    if (!info.isParameter || !info.requiresGrad || (info.group >= 0 && zero_))
      continue;
    for (size_t k = 0; k < parameters_.size(); ++k)
      if (parameterNames_[k] == info.name) {
        at::Tensor t = gradients ? parameters_[k].grad() : parameters_[k].detach();
        if (t.defined())
          visit(static_cast<int64_t>(i), t);
      }
  }
}

std::vector<std::pair<std::string, at::Tensor>> Model::fullParameters(bool gradients) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  forEachFullParameter(
      [&](int64_t index, const at::Tensor &value) {
        out.emplace_back(plan_.tensors[index].name, value.cpu().clone());
      },
      gradients);
  if (stages_ > 1)
    collectStageParameters(out);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Model::routerBiases() {
  std::set<int64_t> biases;
  for (const plan::Function &f : plan_.functions)
    for (const plan::Instruction &inst : f.body)
      if (inst.kind == plan::Instruction::Kind::MoeDispatch && inst.target >= 0)
        biases.insert(inst.target);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (int64_t index : biases)
    out.emplace_back(plan_.tensors.at(index).name, executor_->tensors().at(index));
  return out;
}

std::vector<std::pair<std::string, c10::IValue>>
Model::forwardAll(const ModelInputs &inputs) {
  std::vector<c10::IValue> results = run(inputs);
  const plan::Function &entry = plan_.functions[plan_.entry];
  std::vector<std::pair<std::string, c10::IValue>> named;
  for (size_t i = 0; i < results.size(); ++i) {
    std::string name = i < entry.resultNames.size() ? entry.resultNames[i] : "";
    named.emplace_back(name.empty() ? "result" + std::to_string(i) : name, results[i]);
  }
  return named;
}

at::Tensor Model::forward(const ModelInputs &inputs) {
  std::vector<c10::IValue> results = run(inputs);
  if (!results.at(logitsIndex_).isTensor())
    throw ExecutionError("the model's logits result is not a tensor");
  return results[logitsIndex_].toTensor();
}

bool Model::takesLabels() const { return takesInput("labels"); }

ModelLoss Model::forwardLoss(const ModelInputs &inputs) { return lossOf(forwardAll(inputs)); }

ModelLoss Model::lossOf(const std::vector<std::pair<std::string, c10::IValue>> &results) const {
  const auto &[name, value] = results.at(lossIndex_);
  std::string what;
  if (!value.isTensor())
    what = "a " + value.tagKind();
  else if (!at::isFloatingType(value.toTensor().scalar_type()) || value.toTensor().numel() != 1)
    what = "a " + std::string(c10::toString(value.toTensor().scalar_type())) +
           " tensor of shape " + c10::str(value.toTensor().sizes());
  if (!what.empty())
    throw ExecutionError("the model's forward takes labels, so bmt-run trains on the loss it "
                         "returns (the result named 'loss', else the first), but its result '" +
                         name + "' is " + what + ", not a scalar loss; return the loss first "
                         "(or as 'loss'), or export the model without labels to train it on "
                         "bmt-run's cross-entropy of its logits");
  ModelLoss out;
  out.loss = value.toTensor().reshape({});
  if (hasLogits_ && results.at(logitsIndex_).second.isTensor())
    out.logits = results[logitsIndex_].second.toTensor();
  return out;
}

bool Model::usesFusedKernels() const {
  return fusion::FusedRegion::usesKernels(device_) && !executor_->fusedRegions().empty();
}

bool Model::isEncoderDecoder() const { return takesInput("decoder_input_ids"); }

bool Model::takesInput(const std::string &name) const {
  const plan::Function &entry = plan_.functions[plan_.entry];
  return std::find(entry.paramNames.begin(), entry.paramNames.end(), name) !=
         entry.paramNames.end();
}

int64_t Model::gatheredParameters() const { return zero_ ? zero_->gatheredParameters() : 0; }

int64_t Model::frozenBytesPerRank() const {
  int64_t bytes = zero_ ? zero_->frozenShardBytes() : 0;
  for (const plan::TensorInfo &t : plan_.tensors)
    if (t.isParameter && !t.requiresGrad && (t.group < 0 || !zero_))
      bytes += t.localNumel(plan_.tensorParallel, plan_.expertParallel) *
               static_cast<int64_t>(c10::elementSize(t.dtype));
  return bytes;
}

int64_t Model::numParameters() const {
  int64_t n = 0;
  for (const plan::TensorInfo &t : plan_.tensors)
    if (t.isParameter && t.requiresGrad)
      n += t.numel();
  return n;
}

at::Tensor Model::loss(const at::Tensor &logits, const at::Tensor &labels) {
  if (!plan_.vocabParallel)
    return languageModelLoss(logits, labels, /*shift=*/false);
  const int64_t local = logits.size(-1);
  const int64_t tpRank = tensorComm_ ? tensorComm_->rank() : 0;
  std::unique_ptr<Comm> single;
  Comm *comm = tensorComm_.get();
  if (!comm) { // vocab-parallel with T == 1: a TP group of one
    single = createLocalComm();
    comm = single.get();
  }
  return vocabParallelCrossEntropy(logits.reshape({-1, local}), labels.reshape({-1}), *comm,
                                   tpRank * local, plan_.vocabSize, /*ignoreIndex=*/-100);
}

at::Tensor languageModelLoss(const at::Tensor &logits, const at::Tensor &labels,
                             bool shift) {
  at::Tensor l = logits, y = labels;
  if (shift) {
    l = l.slice(1, 0, l.size(1) - 1);
    y = y.slice(1, 1, y.size(1));
  }
  return crossEntropy(l.reshape({-1, l.size(-1)}), y.reshape({-1}), /*ignoreIndex=*/-100);
}

} // namespace bmt::runtime

namespace bmt::runtime {

size_t Model::shardGroup(size_t shard) const {
  return stages_ > 1 ? static_cast<size_t>(zero_->planGroupOf(shard))
                     : zeroGroupIndex(plan_, shard);
}

} // namespace bmt::runtime
