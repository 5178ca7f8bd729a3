//===- Model.cpp - a compiled model ready to run --------------------------===//

#include "bmt/Runtime/Model.h"
#include "bmt/Runtime/CrossEntropy.h"

#include "bmt/Runtime/Optimizer.h"
#include "bmt/Runtime/Zero.h"

#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <ATen/ops/cross_entropy_loss.h>

namespace bmt::runtime {

Model::Model(plan::Archive &archive, at::Device device, Comm *world,
             const std::function<void(int64_t, int64_t)> &progress,
             const ModelOptions &options)
    : plan_(archive.plan()), device_(device), world_(world) {
  if (options.offloadOptimizer && plan_.zeroStage == 0)
    throw ExecutionError(archive.path() + ": offloading the optimizer needs ZeRO storage "
                         "groups, and the plan has none (compile with bmt-opt's default "
                         "pipeline or --bmt-zero)");
  if (!world_) {
    ownWorld_ = createLocalComm();
    world_ = ownWorld_.get();
  }
  int64_t total = 0, done = 0;
  for (const plan::TensorInfo &t : plan_.tensors)
    if (t.group < 0)
      total += t.nbytes();
  if (plan_.zeroStage != 0) {
    int64_t groupBytes = 0;
    zero_ = std::make_unique<ZeroStorage>(archive, device_, *world_,
                                          [&](int64_t d, int64_t t) {
                                            groupBytes = t;
                                            if (progress)
                                              progress(d, t + total);
                                          },
                                          options.offloadOptimizer);
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
    at::Tensor t = archive.readTensor(i).to(device_);
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
  executor_ = std::make_unique<Executor>(plan_, std::move(tensors), device_);
  if (zero_)
    executor_->setHooks(zero_.get());
  const plan::Function &entry = plan_.functions[plan_.entry];
  for (size_t i = 0; i < entry.resultNames.size(); ++i)
    if (entry.resultNames[i] == "logits") {
      logitsIndex_ = i;
      hasLogits_ = true;
    }
  if (entry.returns.empty())
    throw ExecutionError("the model's forward returns nothing");
}

Model::~Model() = default;

std::vector<c10::IValue> Model::run(const at::Tensor &inputIds,
                                    const at::Tensor &attentionMask) {
  const plan::Function &entry = plan_.functions[plan_.entry];
  std::vector<c10::IValue> inputs;
  for (const std::string &name : entry.paramNames) {
    if (name == "input_ids")
      inputs.emplace_back(inputIds);
    else if (name == "attention_mask")
      inputs.emplace_back(attentionMask);
    else
      throw ExecutionError("the model's forward takes an input '" + name +
                           "' that bmt-run does not provide (it provides input_ids "
                           "and attention_mask); export the model with those inputs");
  }
  if (!zero_)
    return executor_->run(inputs);
  zero_->beginForward();
  std::vector<c10::IValue> results = executor_->run(inputs);
  if (!c10::GradMode::is_enabled())
    zero_->releaseAll();
  return results;
}

void Model::synchronizeGradients() {
  if (zero_) {
    zero_->finishGradients();
    return;
  }
  if (world_->size() == 1)
    return;
  for (at::Tensor &p : parameters_) {
    if (!p.grad().defined())
      p.mutable_grad() = at::zeros_like(p);
    world_->allReduce(p.mutable_grad())->wait();
    p.mutable_grad().div_(static_cast<double>(world_->size()));
  }
}

at::Tensor Model::gradNorm() {
  if (zero_)
    return zero_->gradNorm();
  return runtime::clipGradNorm(parameters_, /*maxNorm=*/0.0); // the norm only
}

void Model::afterOptimizerStep() {
  if (!zero_)
    return;
  zero_->refreshFromMasters();
  zero_->releaseAll();
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

at::ScalarType Model::parameterDtype() const {
  for (const plan::TensorInfo &t : plan_.tensors)
    if (t.isParameter && at::isFloatingType(t.dtype))
      return t.dtype;
  return at::kFloat;
}

void Model::setReduceDtype(std::optional<at::ScalarType> dtype) {
  if (zero_)
    zero_->setReduceDtype(dtype);
}

std::vector<std::pair<std::string, at::Tensor>> Model::fullParameters(bool gradients) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < plan_.tensors.size(); ++i) {
    const plan::TensorInfo &info = plan_.tensors[i];
    if (!info.isParameter || !info.requiresGrad)
      continue;
    if (info.group >= 0) {
      out.emplace_back(info.name, zero_->gatherParameter(static_cast<int64_t>(i), gradients));
      continue;
    }
    for (size_t k = 0; k < parameters_.size(); ++k)
      if (parameterNames_[k] == info.name) {
        at::Tensor t = gradients ? parameters_[k].grad() : parameters_[k].detach();
        if (t.defined())
          out.emplace_back(info.name, t.cpu().clone());
      }
  }
  return out;
}

std::vector<std::pair<std::string, c10::IValue>>
Model::forwardAll(const at::Tensor &inputIds, const at::Tensor &attentionMask) {
  std::vector<c10::IValue> results = run(inputIds, attentionMask);
  const plan::Function &entry = plan_.functions[plan_.entry];
  std::vector<std::pair<std::string, c10::IValue>> named;
  for (size_t i = 0; i < results.size(); ++i) {
    std::string name = i < entry.resultNames.size() ? entry.resultNames[i] : "";
    named.emplace_back(name.empty() ? "result" + std::to_string(i) : name, results[i]);
  }
  return named;
}

at::Tensor Model::forward(const at::Tensor &inputIds, const at::Tensor &attentionMask) {
  std::vector<c10::IValue> results = run(inputIds, attentionMask);
  if (!results.at(logitsIndex_).isTensor())
    throw ExecutionError("the model's logits result is not a tensor");
  return results[logitsIndex_].toTensor();
}

int64_t Model::numParameters() const {
  int64_t n = 0;
  for (const plan::TensorInfo &t : plan_.tensors)
    if (t.isParameter && t.requiresGrad)
      n += t.numel();
  return n;
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
