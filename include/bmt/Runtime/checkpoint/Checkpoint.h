//===- Checkpoint.h - sharded training checkpoints --------------*- C++ -*-===//
//
// Saves and loads the whole state of a training run as one file per rank
// plus metadata committed last (the format and the commit protocol:
// docs/checkpoint-format.md; the shape follows PyTorch DCP). Every rank
// writes only its own shards and reads only the slices of its own layout,
// so a checkpoint of N ranks resumes on M ranks, under another ZeRO stage
// or shard group size, or another tensor-parallel degree (each tensor's
// slices reassembled by the plan's TensorSplit rule and cut anew).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_CHECKPOINT_CHECKPOINT_H
#define BMT_RUNTIME_CHECKPOINT_CHECKPOINT_H

#include "bmt/Runtime/data/Batches.h"
#include "bmt/Runtime/optim/Optimizers.h"
#include "bmt/Runtime/optim/LRSchedule.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace bmt::plan {
struct Plan;
} // namespace bmt::plan

namespace bmt::runtime {

class LossScaler;
class Model;
class Optimizer;

/// A checkpoint that cannot be written or read: a folder that is not
/// writable, an incomplete or corrupt checkpoint, one of another model. The
/// message names the file and what differs.
class CheckpointError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// bmt-run's --checkpoint-dir, --checkpoint-every, --keep.
struct CheckpointOptions {
  std::string dir;
  int64_t every = 0; ///< save after every N-th step; 0: never
  int64_t keep = 0;  ///< complete checkpoints kept (the newest); 0: all
  /// The step the run starts from (the resumed checkpoint's; 0 for a new
  /// run): `dir` must hold no checkpoint of a later step.
  int64_t startStep = 0;
};

/// What a checkpoint says about the run that saved it (checkpoint.json's
/// "plan", "optimizer" and "schedule").
struct RunIdentity {
  std::string planIdentity;  ///< planIdentity() of the run
  std::string modelIdentity; ///< modelIdentity() of its plan
  std::string frozenIdentity; ///< frozenIdentity() of its plan ("" when nothing is frozen)
  /// plan::adapterSettings() of its program ("" without LoRA adapters): a
  /// resume, and bmt-to-hf, refuse a plan whose settings differ
  std::string adapterSettings;
  /// bmt-run --moe-bias-update-rate (0: off; recorded when on)
  double moeBiasUpdateRate = 0;
  std::string source, modelType;
  int64_t worldSize = 1, zeroStage = 0, shardGroupSize = 1;
  /// "sgd", "adam", "adamw", "lion", "adafactor", or "offload-adam",
  /// "offload-adamw" (--offload-optimizer)
  std::string optimizer;
  double lr = 0;
  OptimizerConfig optimizerConfig; ///< its hyperparameters (a resume must match them)
  LRScheduleConfig schedule;
  /// The batch shape of --data runs (0 for --batches ones: the file's):
  /// sequences a step over all ranks (micro-batch x data-parallel ranks x
  /// micro-batches a step) and --seq-len.
  int64_t sequencesPerStep = 0, seqLen = 0;
  /// The model's Hugging Face files (plan::Archive::hfFiles: config.json,
  /// generation_config.json), copied into every checkpoint as hf/<name>
  /// for bmt-to-hf.
  std::vector<std::pair<std::string, std::string>> hfFiles;
};

/// FNV-1a 64 (hex) of `programText`, the plan's storage layout and
/// tensors, the world size, the ZeRO stage and the shard group size.
std::string planIdentity(const plan::Plan &plan, const std::string &programText,
                         int64_t worldSize);
/// FNV-1a 64 (hex) of the trainable tensors' names, shapes and dtypes in
/// plan order: equal for plans of the same model under any layout.
std::string modelIdentity(const plan::Plan &plan);
/// FNV-1a 64 (hex) of the frozen parameters' (requires_grad false) names,
/// shapes, dtypes, CRC-32s of their bytes and random-init rules: the base a
/// checkpoint's trainable parameters were trained against (checkpoints do
/// not hold it). Empty when the plan freezes nothing.
std::string frozenIdentity(const plan::Plan &plan);

/// The state of a run besides its parameters and optimizer tensors.
struct TrainingProgress {
  int64_t step = 0; ///< optimizer steps done
  DataPosition data;
  std::string objectiveGenerator; ///< masked-LM / span corruption draws (mt19937_64 text)
  /// Loaded only: the loss scaler's scale and clean steps (saving reads
  /// them from the scaler).
  std::optional<double> lossScale;
  int64_t cleanSteps = 0;
};

/// The outcome of one save, once written (and, on rank 0, committed).
struct CheckpointResult {
  int64_t step = 0;
  bool ok = false;
  std::string error;        ///< why not, when !ok
  std::string path;         ///< the complete checkpoint's folder
  int64_t bytes = 0;        ///< this rank's file
  double writeSeconds = 0;  ///< from the snapshot to the commit, in the background
};

/// Saves checkpoints of `model` (parameters), `optimizer` (its state) and
/// `scaler` (may be null) on every rank, in the background:
/// save() snapshots the state into host memory (pinned, on a side stream
/// on CUDA) and returns; a thread writes this rank's file while training
/// goes on, and rank 0's thread commits the checkpoint once every rank's
/// file is written. A failed save (a full disk) removes its folder and is
/// reported by poll()/wait(); the previous checkpoints stay.
/// All references must outlive the saver.
class CheckpointSaver {
public:
  /// Creates options.dir if needed and checks that it can be written and
  /// holds no checkpoint of a step after options.startStep (its saves
  /// would replace them: CheckpointError naming them and what to do); on
  /// rank 0 removes the folders of saves that died in earlier runs (their
  /// "step-N.tmp-<run>" folders, and "step-N" folders without a COMPLETE
  /// file; never one with a COMPLETE file).
  /// Collective (the ranks agree on the run's save folder names). Throws
  /// CheckpointError naming the folder.
  CheckpointSaver(Model &model, Optimizer &optimizer, const LossScaler *scaler,
                  CheckpointOptions options, RunIdentity identity);
  /// Waits for the save in flight.
  ~CheckpointSaver();
  CheckpointSaver(const CheckpointSaver &) = delete;
  CheckpointSaver &operator=(const CheckpointSaver &) = delete;

  /// Bytes of the host buffers a save copies into (allocated, pinned on
  /// CUDA, by the constructor).
  int64_t hostBytes() const;
  /// The folders (names in options.dir) the constructor removed; rank 0
  /// only, empty on the other ranks.
  const std::vector<std::string> &removedDeadSaves() const;
  /// Whether the run saves after `step`.
  bool due(int64_t step) const;
  /// Snapshots the state after `progress.step` (call after the step was
  /// queued, before the next) and starts writing it. Waits first for the
  /// previous save to be written. Returns the seconds the calling thread
  /// was held, the wait included.
  double save(const TrainingProgress &progress);
  /// Call before anything changes the parameters or the optimizer's state
  /// (the optimizer step): on CUDA the current stream waits for the
  /// snapshot's copies (no host wait); host tensors are copied by the
  /// saving thread, which this waits for. Returns the seconds waited.
  double beforeStateChange();
  /// The result of a save that finished since the last call, if any
  /// (never waits).
  std::optional<CheckpointResult> poll();
  /// Waits for the save in flight (rank 0: and its commit) and returns its
  /// result, if there was one not yet reported.
  std::optional<CheckpointResult> wait();

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The newest complete checkpoint folder in `dir` (one with a valid
/// COMPLETE file), or none. Incomplete and in-progress folders are ignored.
std::optional<std::string> latestCheckpoint(const std::string &dir);

/// What a resume read.
struct ResumeReport {
  TrainingProgress progress;
  int64_t bytesRead = 0;       ///< by this rank, from the rank files
  int64_t savedWorldSize = 0;  ///< of the run that saved it
  int64_t savedTensorParallel = 1; ///< its tensor-parallel degree T
  int64_t savedExpertParallel = 1; ///< E of its expert-split weights (1: not split)
  int64_t savedPipelineStages = 1; ///< P of a pipelined run (1: no stages)
  int64_t savedVirtualStages = 1;  ///< its V (1: none)
  bool resharded = false;      ///< its layout differs from this run's
  /// Whether this rank's generator states were restored (the same N, T and
  /// P, and the checkpoint holds them for this run's device); otherwise the
  /// caller reseeds them (Generators.h).
  bool generatorsRestored = false;
  /// The learning-rate schedule and batch shape it was trained with (the
  /// schedule's totalSteps is --steps + 1; RunIdentity's batch fields, 0
  /// where not recorded).
  LRScheduleConfig savedSchedule;
  int64_t savedSequencesPerStep = 0, savedSeqLen = 0;
  /// The router-bias update rate it was trained with (0: off or not recorded).
  double savedMoeBiasUpdateRate = 0;
};

/// Loads the checkpoint in `folder` into `model`'s parameters, the
/// `optimizer`'s state and `scaler` (when both have loss scaling), reading
/// only this rank's slices; at the same world size, tensor-parallel
/// degree and pipeline stages it restores each rank's CPU and CUDA
/// generator states (ResumeReport::generatorsRestored). A
/// checkpoint saved with another tensor parallelism (format version 2, or
/// 1 without it) is resharded: every element of this rank's slices is read
/// from the saved slice that holds it (plan::tpSlice's rule, the padding
/// left out). Returns the rest of the run's state.
/// Every byte it reads is checked against its chunk's CRC-32 (rank files
/// without per-chunk checksums: each tensor touched is read whole and
/// checked against its CRC-32). The folder is known by its COMPLETE file
/// and checkpoint.json, whatever its name.
/// Throws CheckpointError, changing nothing, for a folder that is not a
/// complete checkpoint, another format version, another model (naming the
/// first tensor that differs), missing or truncated rank files, and a
/// checksum mismatch (naming the file, tensor, chunk and model tensors).
/// With `expected` (the run's optimizer, `offloaded` or not): throws
/// CheckpointError, changing nothing, when the checkpoint was saved by
/// another optimizer or with other hyperparameters (its kind and settings
/// as checkpoint.json's "optimizer" records them, the "offload-" prefix
/// and the learning rate aside), naming both.
ResumeReport loadCheckpoint(const std::string &folder, Model &model, Optimizer &optimizer,
                            LossScaler *scaler, const OptimizerConfig *expected = nullptr);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_CHECKPOINT_CHECKPOINT_H
