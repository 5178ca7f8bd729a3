//===- Restore.h - the stages of a resume -----------------------*- C++ -*-===//
//
// Private to runtime/checkpoint: loadCheckpoint (Checkpoint.h) as stages
// over one explicit object, `Restore`, that carries the state from one
// stage to the next. In the order loadCheckpoint calls them:
//
//   readMetadata         checkpoint.json (Metadata.h) checked against
//                        COMPLETE, the optimizer and the model; the saved
//                        layout (LoadPlan.h) and the rank-file reader
//                        (FileStorage.h) set up
//   planReads            this rank's host buffers of every field of every
//                        parameter space, and the reads that fill them
//                        queued (planSlice, SavedLayout::shardReads)
//   readFields           the queued reads done, every byte checked; the
//                        whole tensors (step counts, replicated slots) and
//                        the buffers training moves (Model::routerBiases,
//                        rank 0's file) read
//   applyParameters      into the model's parameters (and float32 masters)
//   applyOptimizerState  into the optimizer
//   applyProgress        the run's progress and the loss scaler
//   applyBuffers         into the buffers training moves
//   applyGenerators      each rank's CPU and CUDA generators
//
// Each stage throws CheckpointError. Nothing of the run changes before
// applyParameters: an error until then leaves the model and the optimizer
// as they were.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_CHECKPOINT_RESTORE_H
#define BMT_RUNTIME_CHECKPOINT_RESTORE_H

#include "FileStorage.h"
#include "LoadPlan.h"
#include "Metadata.h"

#include "bmt/Runtime/checkpoint/Checkpoint.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/optim/Optimizer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace bmt::runtime::checkpoint {

/// One resume of the checkpoint in `folder` into `model`, `optimizer` and
/// `scaler` (null: none), from stage to stage.
struct Restore {
  Restore(std::string folder, Model &model, Optimizer &optimizer, LossScaler *scaler)
      : folder(std::move(folder)), model(model), optimizer(optimizer), scaler(scaler) {}

  // What is restored: the folder as the user named it (for messages).
  const std::string folder;
  Model &model;
  Optimizer &optimizer;
  LossScaler *scaler;

  // readMetadata: the checkpoint's checkpoint.json and layout, the reader
  // of its rank files; this run's T and TP rank, the checkpoint's T.
  json meta;
  std::unique_ptr<SavedLayout> layout;
  std::unique_ptr<CheckpointReader> reader;
  int64_t tp = 1, tpRank = 0, savedTp = 1;
  /// E and this rank's expert-group position when the plan splits expert
  /// weights over the expert group (1 and 0 otherwise).
  int64_t ep = 1, epRank = 0;

  // planReads: this rank's parameter spaces (`spaces[k]` holds trainable
  // tensor spaces[k].parameter), the optimizer's state as it is (its
  // slots' names, dtypes and shapes), and the host buffers the reads fill:
  // fields[k] of space k by field name ("param", "master", an optimizer
  // slot, "step").
  std::vector<ParameterSpace> spaces;
  OptimizerState state;
  std::map<size_t, size_t> spaceOfParameter;
  std::vector<std::map<std::string, at::Tensor>> fields;
  /// readFields: each buffer training moves, with its saved value.
  std::vector<std::pair<at::Tensor, at::Tensor>> buffers;

  // Filled along the way: the saved run's settings (readMetadata), whether
  // this is a reshard (planReads), the progress (applyProgress), the bytes
  // read (loadCheckpoint).
  ResumeReport report;
};

/// Checks that `r.folder` is a complete checkpoint whose format this
/// bmt-run reads, saved by the optimizer `expected` (when given) for the
/// model's trainable tensors; parses its layout and the saved run's
/// schedule and batch shape into r.report.
void readMetadata(Restore &r, const OptimizerConfig *expected);
/// Allocates r.fields (zeros) and queues the reads of this rank's
/// elements of each field; sets r.report.resharded.
void planReads(Restore &r);
/// Reads and checks the queued pieces, then each space's step count and
/// replicated optimizer slots (whole, from shard 0's file).
void readFields(Restore &r);
/// Copies "param" (and "master") of each space into the model.
void applyParameters(Restore &r);
/// Hands the optimizer slots to Optimizer::loadState.
void applyOptimizerState(Restore &r);
/// r.report.progress from checkpoint.json; the loss scaler's state.
void applyProgress(Restore &r);
/// The buffers training moves (readFields' values).
void applyBuffers(Restore &r);
/// Each rank's CPU (and CUDA) generator state, at the same world size and
/// T only.
void applyGenerators(Restore &r);

} // namespace bmt::runtime::checkpoint

#endif // BMT_RUNTIME_CHECKPOINT_RESTORE_H
