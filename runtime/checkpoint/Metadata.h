//===- Metadata.h - checkpoint.json, COMPLETE and names ---------*- C++ -*-===//
//
// Private to runtime/checkpoint: what a checkpoint says about itself
// (docs/checkpoint-format.md). checkpoint.json built from a run and parsed
// back, the COMPLETE line with checkpoint.json's CRC-32, the folder and
// file names, the optimizer's identity.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_CHECKPOINT_METADATA_H
#define BMT_RUNTIME_CHECKPOINT_METADATA_H

#include "bmt/Runtime/checkpoint/Checkpoint.h"

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace bmt::runtime {

struct ParameterSpace;

namespace checkpoint {

using json = nlohmann::json;

/// Version 1: no tensor parallelism (every checkpoint of a plan with
/// tensor_parallel 1 is still written as version 1); version 2: the spaces
/// are TP slices; version 3: the storage groups of expert parameters split
/// over the expert group are listed once per expert-group position, with
/// those positions' slices (docs/checkpoint-format.md). This bmt-run reads
/// all five; version 4: a pipelined plan's, each space written by the
/// ranks of one stage ("stage", "pipeline_stages"); version 5: a pipelined
/// plan's with tensor parallelism or virtual stages (version 4's fields
/// with version 2's TP copies, "virtual_stages" and each space's "chunk").
inline constexpr int kFormatVersion = 1;
inline constexpr int kTensorParallelVersion = 2;
inline constexpr int kExpertSplitVersion = 3;
inline constexpr int kPipelineVersion = 4;
inline constexpr int kPipelineTpVersion = 5;
/// Whether this bmt-run reads checkpoints of format `version`.
bool readableVersion(int version);
inline constexpr const char *kFormat = "bmt-checkpoint";
/// Every tensor of a rank file has a CRC-32 per chunk of this many bytes
/// (the last chunk the rest), so that a reader of a slice checks what it
/// reads by reading at most one chunk more at each end of a piece.
inline constexpr int64_t kChunkBytes = 64 << 10;

/// The name in rank 0's file of a buffer training moves (a router's
/// score-correction bias, Model::routerBiases): this prefix and its plan name.
inline constexpr const char *kBufferPrefix = "buffer.";

/// A CRC-32 as the rank files' metadata writes it: 8 hex digits.
std::string crcHex(uint32_t crc);

/// "step-<8 digits>".
std::string stepName(int64_t step);
/// "rank-<5 digits><suffix>".
std::string rankName(int64_t rank, const char *suffix);

/// COMPLETE's line: "bmt-checkpoint <version> step <step> checkpoint.json
/// <CRC-32 of checkpoint.json's bytes, 8 hex digits>\n" (checkpoints
/// written before that checksum end after the step: `withCrc` false).
std::string completeLine(int64_t step, int version, bool withCrc = false, uint32_t crc = 0);

/// What a folder's COMPLETE file says: the format version and the step,
/// whatever the folder's name. `present` is false without a COMPLETE file;
/// version is -1 for one that does not read so.
struct CompleteFile {
  bool present = false;
  int version = -1;
  int64_t step = -1;
  bool hasCrc = false; ///< the line carries checkpoint.json's CRC-32
  uint32_t crc = 0;
  std::string text;
};
/// Parses the text of a COMPLETE file (present: true).
CompleteFile parseComplete(std::string text);

/// The checkpoint's field of an optimizer state slot of saved space
/// `space` ("s<space>.<field>"); "master" is saved only for low-precision
/// spaces.
std::string fieldName(int64_t space, const std::string &field);
bool lowPrecision(c10::ScalarType t);
/// Splits an optimizer state key "exp_avg.3" into ("exp_avg", 3).
std::pair<std::string, size_t> splitStateKey(const std::string &key);

/// checkpoint.json's "optimizer": the kind, the peak learning rate and the
/// kind's hyperparameters.
json optimizerJson(const std::string &kind, double lr, const OptimizerConfig &c);
/// Throws CheckpointError unless `saved` (checkpoint.json's "optimizer")
/// has the kind and hyperparameters of `expected`.
void checkSameOptimizer(const json &saved, const OptimizerConfig &expected,
                        const std::string &folder);

/// The group of ranks a space's tensors are split over, and where the
/// space's copies are in checkpoint.json's "spaces".
struct SpaceSlot {
  /// Its plan storage group (the tpRank/epRank 0 or -1 copy); -1: a
  /// replicated tensor.
  int64_t group = -1;
  int64_t first = 0;  ///< index of its first copy in "spaces"
  int64_t copies = 1; ///< T with tensor parallelism, E for an expert-split group, else 1
  bool expert = false; ///< a group of expert parameters split over the expert group
};
/// The slots of the `numSpaces` spaces of Model::parameterSpaces() (the
/// ZeRO groups in plan order, then the replicated tensors): with T > 1
/// every space has T copies; with expert splits each expert group has E
/// (position p of space k at first + p), every other space one.
std::vector<SpaceSlot> spaceSlots(const plan::Plan &plan, size_t numSpaces, int64_t tp);
/// The format version a save of `plan` writes: kPipelineTpVersion for a
/// plan cut into stages with T > 1 or V > 1, kPipelineVersion for another
/// plan cut into stages, kTensorParallelVersion with T > 1, kExpertSplitVersion
/// when it splits experts, else 1.
int checkpointVersion(const plan::Plan &plan);

/// Throws CheckpointError naming `folder` for a plan whose parameters this
/// checkpoint format cannot lay out: expert weights split over the expert
/// group together with tensor parallelism (a space's copies are either T
/// TP ranks' or E expert-group positions', not both).
void checkCheckpointLayout(const plan::Plan &plan, const std::string &folder);

/// checkpoint.json's "spaces" of this rank's `spaces` of `plan`, laid out
/// by spaceSlots: each copy with its TP rank ("tp_rank") or expert-group
/// position ("ep_rank"), each split member with its place in the global
/// tensor.
json spacesJson(const plan::Plan &plan, const std::vector<ParameterSpace> &spaces, int64_t tp);
/// Pipeline parallelism (plan pipelineStages P > 1): the slots of this
/// rank's `spaces` (its stage's storage groups) in the checkpoint's list of
/// every trainable storage group, in plan order (T copies each, TP rank t's
/// at first + t, as spaceSlots).
std::vector<SpaceSlot> pipelineSpaceSlots(const plan::Plan &plan,
                                          const std::vector<ParameterSpace> &spaces,
                                          int64_t tp);
/// checkpoint.json's "spaces" of a pipelined run: every trainable storage
/// group of `plan` (T copies with tensor parallelism, as spacesJson),
/// sharded over the `d` data-parallel ranks of a stage and TP rank, each
/// with the stage whose ranks write it (`savingStage`, by plan group: the
/// first stage that holds it, so a group stages 0 and P - 1 share is
/// written by stage 0 only) and, with virtual stages, the chunk of that
/// stage that reads it first (stage = chunk % P).
json pipelineSpacesJson(const plan::Plan &plan, const std::vector<int64_t> &savingStage,
                        int64_t d, int64_t tp);

/// checkpoint.json as rank 0 snapshots it (without "rank_bytes"; its
/// "loss_scale" null): the run, its progress and `spaces` (spacesJson);
/// "tensor_parallel" with tp > 1, "expert_parallel" with ep > 1 (a plan
/// that splits experts).
json checkpointJson(const RunIdentity &identity, int version, int64_t worldSize, int64_t tp,
                    int64_t ep, const TrainingProgress &progress, json spaces);

/// checkpoint.json of the checkpoint in `dir` (`folder` as the user named
/// it, for messages), checked against its COMPLETE file (present, its
/// CRC-32 of checkpoint.json, version and step) and for a format version
/// this bmt-run reads. Throws CheckpointError.
json readCheckpointJson(const std::string &folder, const std::string &dir);
/// checkpoint.json's "schedule" (a default LRScheduleConfig where absent).
LRScheduleConfig savedSchedule(const json &meta, const std::string &folder);
/// The run's state besides the tensors: step, data position, objective
/// generator, loss scale. Throws CheckpointError.
TrainingProgress savedProgress(const json &meta, const std::string &folder);

} // namespace checkpoint
} // namespace bmt::runtime

#endif // BMT_RUNTIME_CHECKPOINT_METADATA_H
