//===- PipelineStep.cpp - a step's micro-batches through the stages -------===//
//
// Pipeline parallelism (docs/runtime/pipeline.md): this stage runs the
// step's micro-batches in the 1F1B order of PipelineSchedule.h (with
// virtual stages, the interleaved order over its chunks), receiving the
// values that enter a chunk from the rank of the chunk before and sending
// those that leave it to the rank of the chunk after (Model::
// setStageInputs / takeStageOutputs, sendValues / recvValues), then, in
// each backward, the gradients of the values that require grad the other
// way. It times each action and the waits in its receives: the step's
// `pipeline` metrics (compute and idle time per rank, against the
// schedule's simulated and closed-form idle share).
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

#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <sstream>

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

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// BMT_DEBUG_PIPELINE_ORDER=one-at-a-time runs each micro-batch through
/// the pipeline before the next (no pipelining), for the test that the
/// measured idle time tells it apart; unset or "1f1b": 1F1B. (GPipe's
/// order is not offered: it keeps several forwards of the last chunk in
/// flight, and ZeRO-3 frees the LM head's gathered weight that the first
/// one's backward still reads.)
PipelineOrder debugOrder() {
  const char *v = std::getenv("BMT_DEBUG_PIPELINE_ORDER");
  const std::string order = v ? v : "";
  if (order == "one-at-a-time")
    return PipelineOrder::OneAtATime;
  if (!order.empty() && order != "1f1b")
    throw TrainingError("BMT_DEBUG_PIPELINE_ORDER=" + order +
                        ": expected 1f1b or one-at-a-time");
  return PipelineOrder::OneFOneB;
}

const char *orderName(PipelineOrder order, int64_t chunks) {
  switch (order) {
  case PipelineOrder::AllForwardsFirst:
    return "all forwards first";
  case PipelineOrder::OneAtATime:
    return "one micro-batch at a time";
  case PipelineOrder::OneFOneB:
    break;
  }
  return chunks > 1 ? "interleaved 1F1B" : "1F1B";
}

/// One rank's times of a step's schedule.
struct StageTimes {
  double compute = 0, idle = 0;
  std::vector<double> forward, backward; ///< per local chunk: seconds, summed
  std::vector<int64_t> forwards, backwards;
  int64_t inFlight = 0; ///< the most forwards held before their backward
};

std::string jsonList(const std::vector<double> &values, int precision) {
  std::ostringstream os;
  os << "[" << std::setprecision(precision);
  for (size_t i = 0; i < values.size(); ++i)
    os << (i ? ", " : "") << values[i];
  os << "]";
  return os.str();
}

/// Gathers every rank's `times` (collective over the world); on rank 0
/// the step's `pipeline` metrics as a JSON object (docs/runtime/
/// pipeline.md), elsewhere "".
std::string reportPipelineTimes(Model &model, const StageTimes &times, PipelineOrder order,
                                int64_t microBatches) {
  Comm &world = model.world();
  const int64_t n = world.size(), rank = world.rank();
  const int64_t stages = model.pipelineStages(), chunks = model.pipelineVirtualStages();
  const int64_t d = n / stages;
  // Per rank: compute, idle, in flight, then per chunk the mean forward
  // and backward seconds.
  const int64_t width = 3 + 2 * chunks;
  at::Tensor all = at::zeros({n * width}, at::kDouble);
  double *row = all.data_ptr<double>() + rank * width;
  row[0] = times.compute;
  row[1] = times.idle;
  row[2] = static_cast<double>(times.inFlight);
  for (int64_t v = 0; v < chunks; ++v) {
    row[3 + v] = times.forwards[v] ? times.forward[v] / double(times.forwards[v]) : 0.0;
    row[3 + chunks + v] = times.backwards[v] ? times.backward[v] / double(times.backwards[v]) : 0.0;
  }
  at::Tensor t = all;
  if (world.backend() != "local")
    t = t.to(world.device());
  world.allReduce(t)->wait();
  if (rank != 0)
    return {};
  all = t.cpu();
  const double *a = all.data_ptr<double>();
  // The schedule simulated with each stage's measured times (the mean
  // over its D ranks), and its closed form for equal times.
  PipelineCosts costs = PipelineCosts::uniform(stages, chunks, 0.0, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t v = 0; v < chunks; ++v) {
      costs.forward[r / d][v] += a[r * width + 3 + v] / static_cast<double>(d);
      costs.backward[r / d][v] += a[r * width + 3 + chunks + v] / static_cast<double>(d);
    }
  PipelineTimeline sim = simulatePipeline(stages, chunks, microBatches, costs, order);
  std::vector<double> computeS, idleS, idleShare, simulated, inFlights, forwardS, backwardS;
  for (int64_t r = 0; r < n; ++r) {
    const double *x = a + r * width;
    computeS.push_back(x[0]);
    idleS.push_back(x[1]);
    idleShare.push_back(x[0] + x[1] > 0 ? x[1] / (x[0] + x[1]) : 0.0);
    const int64_t s = r / d;
    simulated.push_back(sim.makespan > 0 ? sim.idle[s] / sim.makespan : 0.0);
    inFlights.push_back(x[2]);
  }
  std::ostringstream os;
  os << "{\"schedule\": \"" << orderName(order, chunks) << "\", \"stages\": " << stages
     << ", \"virtual_stages\": " << chunks << ", \"micro_batches\": " << microBatches
     << ", \"compute_s\": " << jsonList(computeS, 6) << ", \"idle_s\": " << jsonList(idleS, 6)
     << ", \"idle_fraction\": " << jsonList(idleShare, 4)
     << ", \"simulated_idle_fraction\": " << jsonList(simulated, 4)
     << ", \"bubble\": " << std::setprecision(4) << pipelineBubble(stages, chunks, microBatches)
     << ", \"in_flight\": " << jsonList(inFlights, 6) << ", \"forward_s\": [";
  for (int64_t s = 0; s < stages; ++s)
    os << (s ? ", " : "") << jsonList(costs.forward[s], 6);
  os << "], \"backward_s\": [";
  for (int64_t s = 0; s < stages; ++s)
    os << (s ? ", " : "") << jsonList(costs.backward[s], 6);
  os << "]}";
  return os.str();
}

} // namespace

void Trainer::runPipelineMicroBatches(PendingStep &current, MicroBatchSource &source,
                                      std::vector<at::Tensor> &losses) {
  const int64_t stages = model_.pipelineStages(), stage = model_.pipelineStage();
  const int64_t chunks = model_.pipelineVirtualStages();
  Comm &world = model_.world();
  Comm &data = model_.dataParallel();
  const int64_t rank = world.rank();
  auto channel = [&](PipelineTransfer kind, int64_t from, int64_t to) -> Comm & {
    return model_.pipelineChannel(kind, from, to);
  };
  // The step's sends, waited for once every action is queued (see
  // sendValues: on NCCL no send may hold up the compute stream before the
  // receives after it are posted).
  std::vector<std::shared_ptr<Work>> inFlight;
  const int64_t d = data.size();
  const at::Device device = model_.device();
  const int64_t pieces = config_.pipelineMicroBatches;
  const int64_t m = config_.gradAccum * pieces;
  std::vector<MicroBatch> batches;
  for (int64_t a = 0; a < config_.gradAccum; ++a) {
    current.batches.push_back(source.next());
    for (int64_t k = 0; k < pieces; ++k)
      batches.push_back(pieceOf(current.batches.back(), k, pieces, d));
  }
  const PipelineOrder order = debugOrder();
  // Per (local chunk, micro-batch) in flight: what the chunk sent that
  // requires grad (all but the last chunk), the leaves it received (all
  // but the first), the last chunk's objective.
  std::vector<std::vector<std::vector<at::Tensor>>> sent(chunks), received(chunks);
  std::vector<std::vector<at::Tensor>> objectives(chunks, std::vector<at::Tensor>(m));
  for (int64_t v = 0; v < chunks; ++v) {
    sent[v].resize(m);
    received[v].resize(m);
  }
  // The losses in micro-batch order (the last chunk's forwards may run in
  // another order with virtual stages).
  std::vector<at::Tensor> stepLosses(m);
  std::vector<std::mt19937_64> rngOf(m);
  StageTimes times;
  times.forward.assign(chunks, 0.0);
  times.backward.assign(chunks, 0.0);
  times.forwards.assign(chunks, 0);
  times.backwards.assign(chunks, 0);
  int64_t held = 0;
  const Clock::time_point begin = Clock::now();
  for (const PipelineAction &action :
       interleavedOneForwardOneBackward(stage, stages, chunks, m, order)) {
    const int64_t k = action.microBatch, v = action.chunk;
    const Clock::time_point start = Clock::now();
    double waited = 0;
    model_.selectPipelineChunk(v);
    if (action.kind == PipelineAction::Kind::Forward) {
      if (!model_.isFirstChunk()) {
        std::vector<bool> requiresGrad;
        const Clock::time_point r = Clock::now();
        const int64_t from = model_.pipelinePreviousRank();
        std::vector<c10::IValue> values = recvValues(
            channel(PipelineTransfer::Activations, from, rank), from, device, &requiresGrad);
        waited += secondsSince(r);
        for (size_t i = 0; i < values.size(); ++i)
          if (requiresGrad[i]) {
            at::Tensor t = values[i].toTensor();
            t.set_requires_grad(true);
            received[v][k].push_back(t);
          }
        model_.setStageInputs(std::move(values));
      }
      // The objective's draws (masked LM): every chunk of micro-batch k
      // from the state its first chunk started from, which the first
      // chunks (in micro-batch order) advance as one stage would.
      if (v == 0)
        rngOf[k] = rng_;
      std::mt19937_64 copy = rngOf[k];
      MicroBatchLoss result = microBatchLoss(batches[k], v == 0 ? rng_ : copy);
      if (v == 0) { // (each micro-batch's tokens once)
        current.tokens += result.batchInputTokens;
        current.targets += result.batchPredicted;
      }
      if (model_.isLastStage()) {
        stepLosses[k] = result.loss.detach().reshape({1}).to(at::kDouble);
        at::Tensor objective = result.loss.div(static_cast<double>(m));
        if (scaler_)
          objective = objective.mul(scaler_->scale().to(objective.scalar_type()).reshape({}));
        objectives[v][k] = objective;
      } else {
        std::vector<c10::IValue> out = model_.takeStageOutputs();
        for (const c10::IValue &value : out)
          if (value.isTensor() && value.toTensor().defined() && value.toTensor().requires_grad())
            sent[v][k].push_back(value.toTensor());
        const int64_t to = model_.pipelineNextRank();
        sendValues(channel(PipelineTransfer::Activations, rank, to), out, to, &inFlight);
      }
      held += 1;
      times.inFlight = std::max(times.inFlight, held);
      times.forward[v] += secondsSince(start) - waited;
      times.forwards[v] += 1;
      times.idle += waited;
      continue;
    }
    if (model_.isLastStage()) {
      if (objectives[v][k].requires_grad()) // (not when every parameter it reads is frozen)
        objectives[v][k].backward();
      objectives[v][k] = at::Tensor();
    } else if (!sent[v][k].empty()) {
      std::vector<at::Tensor> grads;
      const Clock::time_point r = Clock::now();
      const int64_t from = model_.pipelineNextRank();
      Comm &gradients = channel(PipelineTransfer::Gradients, from, rank);
      for (const at::Tensor &t : sent[v][k]) {
        at::Tensor g = at::empty_like(t, at::MemoryFormat::Contiguous);
        gradients.recv(g, from)->wait();
        grads.push_back(g);
      }
      waited += secondsSince(r);
      torch::autograd::backward(sent[v][k], grads);
      sent[v][k].clear();
    }
    for (const at::Tensor &t : received[v][k]) {
      at::Tensor g = t.grad().defined() ? t.grad().contiguous() : at::zeros_like(t);
      const int64_t to = model_.pipelinePreviousRank();
      inFlight.push_back(channel(PipelineTransfer::Gradients, rank, to).send(g, to));
    }
    received[v][k].clear();
    held -= 1;
    times.backward[v] += secondsSince(start) - waited;
    times.backwards[v] += 1;
    times.idle += waited;
  }
  model_.selectPipelineChunk(0);
  for (at::Tensor &loss : stepLosses)
    losses.push_back(loss.defined() ? loss
                                    : at::zeros({1}, at::TensorOptions()
                                                         .dtype(at::kDouble)
                                                         .device(device)));
  // Until the last stage is done: idle too (the schedule's drain), then
  // every rank's times to rank 0.
  const double busy = secondsSince(begin) - times.idle;
  const Clock::time_point drain = Clock::now();
  for (const std::shared_ptr<Work> &work : inFlight)
    work->wait();
  at::Tensor token = at::zeros({1}, at::kDouble);
  if (world.backend() != "local")
    token = token.to(world.device());
  world.allReduce(token)->wait();
  times.idle += secondsSince(drain);
  times.compute = busy;
  current.pipelineJson = reportPipelineTimes(model_, times, order, m);
}

std::pair<double, double> Trainer::pipelineEvaluation(const MicroBatch &batch,
                                                      std::mt19937_64 &rng) {
  // Each piece through the chunks in order (every rank's order agrees with
  // the global one, piece by piece, chunk by chunk: no deadlock); the
  // objective's draws as in a step: every chunk of a piece from the state
  // its first chunk started from. Sends are waited for at once (a serial
  // order: no two ranks send to each other at the same time).
  const int64_t rank = model_.world().rank();
  const PipelineTransfer activations = PipelineTransfer::Activations;
  const int64_t pieces = config_.pipelineMicroBatches;
  const bool counts = !model_.tensorParallel() || model_.tensorParallel()->rank() == 0;
  double sum = 0, tokens = 0;
  for (int64_t k = 0; k < pieces; ++k) {
    const MicroBatch piece = pieceOf(batch, k, pieces, 1);
    const std::mt19937_64 start = rng;
    for (int64_t v = 0; v < model_.pipelineVirtualStages(); ++v) {
      model_.selectPipelineChunk(v);
      if (!model_.isFirstChunk()) {
        const int64_t from = model_.pipelinePreviousRank();
        model_.setStageInputs(recvValues(model_.pipelineChannel(activations, from, rank), from,
                                         model_.device()));
      }
      std::mt19937_64 copy = start;
      MicroBatchLoss result = microBatchLoss(piece, v == 0 ? rng : copy);
      if (!model_.isLastStage()) {
        const int64_t to = model_.pipelineNextRank();
        sendValues(model_.pipelineChannel(activations, rank, to), model_.takeStageOutputs(), to);
        continue;
      }
      if (counts) {
        sum += result.loss.item<double>() * static_cast<double>(result.predicted);
        tokens += static_cast<double>(result.predicted);
      }
    }
  }
  model_.selectPipelineChunk(0);
  return {sum, tokens};
}

} // namespace bmt::runtime
