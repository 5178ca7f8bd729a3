//===- Metrics.h - what a run reports, as text and as JSON lines -*- C++ -*-===//
//
// One writer for both outputs of a run: a human line per step (every
// logEvery steps, the last step and every skipped one) and per evaluation,
// and one JSON line per step and per evaluation (the files of docs/runtime/
// describe the fields with their topics: step.md, data.md, checkpoint.md,
// inspection.md). Non-finite numbers are written as JSON null. Rank 0 writes.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_METRICS_H
#define BMT_RUNTIME_TRAIN_METRICS_H

#include <c10/core/Device.h>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace bmt::runtime {

/// Loss and perplexity over held-out data.
struct EvalResult {
  double loss = 0;       ///< mean cross-entropy per predicted token (nats)
  double perplexity = 0; ///< exp(loss)
  int64_t tokens = 0;    ///< predicted tokens
};

/// One optimizer step as reported.
struct StepMetrics {
  int64_t step = 0, steps = 0; ///< this step (from 1) and the run's last
  double loss = 0;             ///< mean over micro-batches and ranks
  double lr = 0;
  double gradNorm = 0;         ///< global, before clipping; NaN when skipped
  bool skipped = false;        ///< inf/NaN gradients on some rank (fp16), or skipReason
  const char *skipReason = nullptr; ///< why, when not inf/NaN gradients ("no target tokens")
  double lossScale = 0;        ///< the scale the step used; 0: loss scaling off
  double nextLossScale = 0;    ///< the scale after the step's update
  int64_t tokens = 0;          ///< input tokens of all ranks (padding not counted)
  int64_t targetTokens = 0;    ///< predicted (target) tokens of all ranks
  double tokensPerSecond = 0, tflops = 0, elapsedSeconds = 0, peakMemoryGiB = 0;
  /// Seconds the host spent queueing the step's work (data, forward,
  /// backward, optimizer launches); near the step's time: host-bound.
  double hostSeconds = 0;
  /// Fused kernels made ready at their first call since the first step
  /// began (so far, over the steps reported and the one queued after):
  /// those the prewarm did not find, or all of them without it.
  int64_t fusedLazyKernels = 0;
  /// Weight gradients written by their operators (linear layers'
  /// matmuls, embeddings' backwards) into ZeRO's flat gradient on rank 0
  /// since the first step began (cumulative, as above).
  int64_t gradientsInPlace = 0;
  /// Operators of recomputed blocks left uncomputed (only their backward
  /// recorded) on rank 0 since the first step began (cumulative).
  int64_t recomputeSkipped = 0;
  /// A mixture of experts: tokens per expert in the step (all ranks), the
  /// least and the most over every MoE layer and expert; NaN: no MoE layer.
  double expertTokensMin = std::nan(""), expertTokensMax = std::nan("");
  /// The step's mean of the forward's aux_loss result; NaN: none.
  double auxLoss = std::nan("");
  /// Pipeline parallelism: a JSON object of each rank's compute and idle
  /// time in the step's schedule against the schedule's figures
  /// (docs/runtime/pipeline.md, "Idle time"); empty: none.
  std::string pipeline;
};

/// One block's (or the parameters outside blocks') statistics at an
/// inspected step (bmt-run --inspect-every; train/Inspect.h). Norms are L2
/// over all of the block's parameters / gradients; NaN when not finite or
/// not measured (outputMaxAbs outside blocks).
struct BlockInspection {
  std::string name; ///< the block's module path ("transformer.h.0"), or "outside_blocks"
  double paramNorm = 0, paramMaxAbs = 0, gradNorm = 0, gradMaxAbs = 0, outputMaxAbs = 0;
};

class MetricsWriter {
public:
  /// `json` may be null (no --log-file); logEvery >= 1.
  MetricsWriter(std::ostream &out, std::ostream *json, int64_t logEvery);

  /// "step N/M | loss ... | lr ... | grad norm ... | [loss scale ... |]
  /// tokens/s | elapsed" (or "... | skipped: inf/NaN gradients, loss scale
  /// A -> B"), and {"kind": "train", "step", "loss", "lr", "grad_norm",
  /// "loss_scale", "skipped", "tokens", "tokens_per_s", "tflops",
  /// "elapsed_s", "peak_mem_gib", "host_s", "fused_lazy_kernels",
  /// "gradients_in_place", "recompute_skipped"}.
  void step(const StepMetrics &m);

  /// "eval  step N | val loss ... | val ppl ... | N tokens" and {"kind":
  /// "eval", "step", "val_loss", "val_ppl", "tokens"}; step 0 for an
  /// evaluation without training.
  void evaluation(int64_t step, const EvalResult &r);
  /// A finished checkpoint save: "checkpoint step N -> PATH | B bytes
  /// (rank 0) | written in W s, training held H s" (or "warning:
  /// checkpoint step N failed: WHY; the previous checkpoints stay, training
  /// goes on"; `last`, the save of the run's last step: "warning:
  /// checkpoint step N failed: WHY; it is the last step's save") and
  /// {"kind": "checkpoint", "step", "ok", "path" | "error", "bytes",
  /// "write_s", "held_s"}. `where`: the path, or the error.
  void checkpoint(int64_t step, bool ok, const std::string &where, int64_t bytes,
                  double writeSeconds, double heldSeconds, bool last = false);

  /// {"kind": "inspect", "step", "blocks": [{"name", "param_norm",
  /// "param_max_abs", "grad_norm", "grad_max_abs", "output_max_abs"}, ...]}
  /// (JSON only; nothing when there is no JSON log).
  void inspection(int64_t step, const std::vector<BlockInspection> &blocks);

private:
  /// Flushes the JSON log; at its first failed write (a full disk) says so
  /// once ("warning: --log-file: the line of step N could not be written
  /// (WHY); the log is incomplete from there") and writes no more JSON, so
  /// that no torn line follows. bmt-run then exits 1 at the end of the run.
  void flushJson(int64_t step);

  std::ostream &out_;
  std::ostream *json_;
  int64_t logEvery_;
};

/// Peak memory of this process in GiB: the CUDA caching allocator's peak of
/// allocated bytes on a CUDA device, else the peak resident set size.
double peakMemoryGiB(c10::Device device);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_METRICS_H
