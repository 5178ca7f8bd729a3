//===- PipelineStep.cpp - a step's micro-batches through the stages -------===//
//
// Pipeline parallelism (docs/runtime/pipeline.md): this stage runs the
// step's micro-batches in the 1F1B order of PipelineSchedule.h, receiving
// the values that enter it from the stage before and sending those that
// leave it to the stage after (Model::setStageInputs / takeStageOutputs,
// sendValues / recvValues), then, in each backward, the gradients of the
// values that require grad the other way.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/train/Trainer.h"
#include "bmt/Runtime/train/PipelineSchedule.h"
#include "train/TrainerSteps.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/autograd.h>

namespace bmt::runtime {

namespace {

/// Rows [begin, end) of every tensor of `b`.
MicroBatch rowsOf(const MicroBatch &b, int64_t begin, int64_t end) {
  MicroBatch out;
  auto cut = [&](const at::Tensor &t) {
    return t.defined() ? t.slice(0, begin, end).contiguous() : t;
  };
  out.window = cut(b.window);
  out.targets = cut(b.targets);
  out.attentionMask = cut(b.attentionMask);
  out.positionIds = cut(b.positionIds);
  return out;
}

/// Piece k of `pieces` of this rank's rows of `b`. A global batch (rows
/// [rowBegin, rowEnd) this rank's, every data-parallel rank's as many)
/// gives the global batch of every rank's piece k, so that the loss is
/// weighted as gradient accumulation over the pieces would weigh it.
MicroBatch pieceOf(const MicroBatch &b, int64_t k, int64_t pieces, int64_t ranks) {
  if (!b.window.defined())
    throw TrainingError("a pipeline trains on token windows; encoder-decoder pairs are not "
                        "supported");
  if (b.rowEnd < 0) {
    const int64_t rows = b.window.size(0);
    if (rows % pieces != 0)
      throw TrainingError("--micro-batches " + std::to_string(pieces) + " does not divide "
                          "this rank's " + std::to_string(rows) + " rows of a micro-batch");
    return rowsOf(b, k * rows / pieces, (k + 1) * rows / pieces);
  }
  const int64_t rows = b.rowEnd - b.rowBegin;
  if (rows % pieces != 0 || rows * ranks != b.window.size(0) || b.rowBegin % rows != 0)
    throw TrainingError("--micro-batches " + std::to_string(pieces) + " does not divide "
                        "this rank's " + std::to_string(rows) + " rows of a micro-batch");
  const int64_t n = rows / pieces;
  std::vector<MicroBatch> parts;
  for (int64_t d = 0; d < ranks; ++d)
    parts.push_back(rowsOf(b, d * rows + k * n, d * rows + (k + 1) * n));
  auto join = [&](at::Tensor MicroBatch::*field) {
    if (!(parts[0].*field).defined())
      return at::Tensor();
    std::vector<at::Tensor> ts;
    for (const MicroBatch &p : parts)
      ts.push_back(p.*field);
    return at::cat(ts);
  };
  MicroBatch out;
  out.window = join(&MicroBatch::window);
  out.targets = join(&MicroBatch::targets);
  out.attentionMask = join(&MicroBatch::attentionMask);
  out.positionIds = join(&MicroBatch::positionIds);
  out.rowBegin = b.rowBegin / rows * n;
  out.rowEnd = out.rowBegin + n;
  return out;
}

} // namespace

int64_t Trainer::microBatchesPerStep() const {
  return config_.gradAccum * (model_.pipelineStages() > 1 ? config_.pipelineMicroBatches : 1);
}

void Trainer::runPipelineMicroBatches(PendingStep &current, MicroBatchSource &source,
                                      std::vector<at::Tensor> &losses) {
  const int64_t stages = model_.pipelineStages(), stage = model_.pipelineStage();
  Comm &world = model_.world();
  Comm &data = model_.dataParallel();
  // The peers: the same TP and data-parallel rank on the stages before
  // and after (a stage's ranks are consecutive).
  const int64_t d = data.size(), rank = world.rank();
  const int64_t previous = rank - model_.stageRanks(), next = rank + model_.stageRanks();
  const at::Device device = model_.device();
  const int64_t pieces = config_.pipelineMicroBatches;
  const int64_t m = config_.gradAccum * pieces;
  std::vector<MicroBatch> batches;
  for (int64_t a = 0; a < config_.gradAccum; ++a) {
    current.batches.push_back(source.next());
    for (int64_t k = 0; k < pieces; ++k)
      batches.push_back(pieceOf(current.batches.back(), k, pieces, d));
  }
  // Per micro-batch in flight: what this stage sent that requires grad
  // (stage < P - 1), the leaves it received (stage > 0), the last stage's
  // objective.
  std::vector<std::vector<at::Tensor>> sent(m), received(m);
  std::vector<at::Tensor> objectives(m);
  for (const PipelineAction &action : oneForwardOneBackward(stage, stages, m)) {
    const int64_t k = action.microBatch;
    if (action.kind == PipelineAction::Kind::Forward) {
      if (stage > 0) {
        std::vector<bool> requiresGrad;
        std::vector<c10::IValue> values = recvValues(world, previous, device, &requiresGrad);
        for (size_t i = 0; i < values.size(); ++i)
          if (requiresGrad[i]) {
            at::Tensor t = values[i].toTensor();
            t.set_requires_grad(true);
            received[k].push_back(t);
          }
        model_.setStageInputs(std::move(values));
      }
      MicroBatchLoss result = microBatchLoss(batches[k], rng_);
      current.tokens += result.batchInputTokens;
      current.targets += result.batchPredicted;
      if (model_.isLastStage()) {
        losses.push_back(result.loss.detach().reshape({1}).to(at::kDouble));
        at::Tensor objective = result.loss.div(static_cast<double>(m));
        if (scaler_)
          objective = objective.mul(scaler_->scale().to(objective.scalar_type()).reshape({}));
        objectives[k] = objective;
      } else {
        losses.push_back(at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device)));
        std::vector<c10::IValue> out = model_.takeStageOutputs();
        for (const c10::IValue &v : out)
          if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad())
            sent[k].push_back(v.toTensor());
        sendValues(world, out, next);
      }
      continue;
    }
    if (model_.isLastStage()) {
      objectives[k].backward();
      objectives[k] = at::Tensor();
    } else if (!sent[k].empty()) {
      std::vector<at::Tensor> grads;
      for (const at::Tensor &t : sent[k]) {
        at::Tensor g = at::empty_like(t, at::MemoryFormat::Contiguous);
        world.recv(g, next)->wait();
        grads.push_back(g);
      }
      torch::autograd::backward(sent[k], grads);
      sent[k].clear();
    }
    for (const at::Tensor &t : received[k]) {
      at::Tensor g = t.grad().defined() ? t.grad().contiguous() : at::zeros_like(t);
      world.send(g, previous)->wait();
    }
    received[k].clear();
  }
}

} // namespace bmt::runtime
