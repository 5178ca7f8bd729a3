//===- Inspect.h - per-block statistics and the source of a NaN -*- C++ -*-===//
//
// What BMTrain's bmt.inspect gives, for a compiled model:
//
//   - every N steps (bmt-run --inspect-every N), per block of the plan (the
//     block lists and indices of its block calls and ZeRO groups) and for
//     the parameters outside blocks: the L2 norm and max-abs of the
//     parameters and of the gradients, and the max-abs of the block's
//     output, as one JSON line of the log. Under ZeRO the values are global,
//     computed from each rank's shards (sums of squares all-reduced, max-abs
//     with Max), never by gathering whole parameters;
//   - after a step whose loss or gradient norm is not finite, the first
//     block (and operator, with its source location) that produced a
//     non-finite value, found by replaying the step with checks on every
//     instruction. A step with a non-finite gradient norm (without loss
//     scaling) is not applied, so that the replay sees the weights the step
//     ran with; nothing else is done while training is healthy.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_INSPECT_H
#define BMT_RUNTIME_TRAIN_INSPECT_H

#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/train/Metrics.h"

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace bmt::runtime {

/// The blocks of a plan: their names (the called function's module path,
/// e.g. "transformer.h.0") in plan order, and which block each function,
/// storage group and tensor belongs to (-1: outside blocks).
struct PlanBlocks {
  explicit PlanBlocks(const plan::Plan &plan);
  std::vector<std::string> names;
  std::vector<int64_t> ofFunction; ///< by function index: the block whose call reaches it
  std::vector<int64_t> ofGroup;    ///< by storage group
  std::vector<int64_t> ofTensor;   ///< by plan tensor: its group's, else its readers'
  /// The name of block `b`, or "outside_blocks" for -1.
  std::string name(int64_t b) const;
};

/// What a replay of one step needs (Trainer): its micro-batches' losses
/// computed again from the same batches and the same corruption.
struct StepReplay {
  int64_t step = 0;
  int64_t microBatches = 1;
  /// The generator's state before the step's first micro-batch.
  std::mt19937_64 rng;
  /// The loss of micro-batch `micro` (0-based; called in order), drawing
  /// its corruption from `rng` (grad mode decides autograd).
  std::function<at::Tensor(int64_t micro, std::mt19937_64 &rng)> loss;
  /// Clears the gradients of the optimizer's parameters.
  std::function<void()> zeroGrad;
};

class Inspector {
public:
  /// Inspects `model` every `every` steps (0: never; then only
  /// haltOnNonFinite and locateNonFinite do anything), observing its
  /// executor (Model::setObserver) until destroyed; `model` must outlive
  /// it. Throws std::invalid_argument for every < 0.
  Inspector(Model &model, int64_t every);
  ~Inspector();

  /// Before the first forward of `step`: on an inspected step, starts
  /// recording the max-abs of every block's outputs (over the step's
  /// micro-batches). No host synchronisation.
  void beginStep(int64_t step);
  /// On an inspected step, after the gradients are synchronized (and
  /// unscaled) and before the optimizer updates the parameters: measures
  /// parameters and gradients, combines every rank's values and queues
  /// their copy to the host (no host synchronisation on CUDA). Collective
  /// on inspected steps; nothing otherwise.
  void afterGradients(int64_t step);
  /// Once the device has run `step` (its reported values are on the host):
  /// writes its record to `metrics` when it was inspected (pass null on
  /// ranks other than 0). Returns whether there was a record.
  bool report(int64_t step, MetricsWriter *metrics);
  /// The records of reported steps, for tests and callers without a log.
  const std::vector<BlockInspection> &last() const { return last_; }

  /// The found-inf flag of the optimizer step without loss scaling: a
  /// float32 [1] tensor on the model's device, non-zero once any step's
  /// `gradNorm` (float64, one element) was not finite, so that neither that
  /// step nor any queued after it changes the weights. No host sync.
  at::Tensor haltOnNonFinite(const at::Tensor &gradNorm);

  /// After step `replay.step` gave a non-finite loss or gradient norm:
  /// replays its forward with a check of every instruction's results, and
  /// if that is finite its forward and backward with a check of every
  /// operator's gradients, and returns a sentence naming the first block
  /// (and operator: its name, source location and function) that produced
  /// a non-finite value, or saying that the replay found none. Collective
  /// (every rank replays its own rows; the first failure over all ranks is
  /// named, the same sentence on every rank). Leaves the gradients cleared.
  std::string locateNonFinite(const StepReplay &replay);

private:
  struct OutputRecorder;
  struct Record {
    int64_t step = 0;
    at::Tensor values; ///< float64 [entries, 5], on the host (pinned on CUDA)
  };
  Model &model_;
  int64_t every_;
  PlanBlocks blocks_;
  /// By entry (the blocks, then outside blocks): the model.parameters()
  /// whose values this rank adds to the global sums (each element once
  /// over all ranks).
  std::vector<std::vector<size_t>> contributions_;
  std::vector<int64_t> entryOfParameter_;          ///< by model.parameters() index
  std::unique_ptr<OutputRecorder> recorder_;
  std::deque<Record> records_;   ///< inspected steps not reported yet (at most 2)
  std::array<at::Tensor, 2> hostBuffers_; ///< CUDA: pinned memory the records are copied to
  size_t nextBuffer_ = 0;
  std::vector<BlockInspection> last_;
  at::Tensor halted_;
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_INSPECT_H
