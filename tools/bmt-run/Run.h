//===- Run.h - bmt-run's pieces apart from the driver -----------*- C++ -*-===//
//
// What bmt-run.cpp's run() uses beside the runtime: its files (Files.cpp),
// its batches (Batches.cpp: --batches, span corruption's token ids, the
// source of each rank's micro-batches) and --dump (Dump.cpp). Every failure
// is a Failure, reported as one "error: ..." line (exit 1).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_TOOLS_BMTRUN_RUN_H
#define BMT_TOOLS_BMTRUN_RUN_H

#include "Options.h"

#include "bmt/Runtime/objectives/Corruption.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/data/TokenData.h"
#include "bmt/Runtime/train/Preflight.h"
#include "bmt/Runtime/train/Trainer.h"
#include "bmt/Plan/Archive.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace bmt::tools {

/// A failure to report as "error: ..." (exit 1).
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Refusals every rank makes alike, printed by rank 0 only, are the
// runtime's ConfigError (train/Preflight.h) and AgreedError (train/Finish.h).

/// Refuses --save-params PATH before training when its folder's free space
/// (statvfs) is below `bytes`, the file's size (Failure naming both).
void checkSaveParamsRoom(const std::string &path, int64_t bytes);

/// The bytes of `path`; Failure when it cannot be opened.
std::vector<char> readFile(const std::string &path);

/// Writes `value` (torch.save format) to `path` atomically (a temporary
/// file renamed); Failure when it cannot be written.
void saveIValue(const std::string &path, const c10::IValue &value);

/// Refuses an output that is one of the inputs, two outputs that are one
/// file, and an output that cannot be created, before anything is loaded or
/// trained (Failure).
void checkOutputs(const RunOptions &o);

/// --batches FILE: the fixed global micro-batches of all ranks, either
/// token windows int64 [n, rows, W] or an encoder-decoder's ready pairs
/// (inputIds int64 [n, rows, S], labels [n, rows, T]); none undefined
/// without --batches.
struct FixedBatches {
  at::Tensor windows, inputIds, labels;
};

/// What the model's config.json (carried in sharded.pt by bmt-export-hf)
/// says about an encoder-decoder's decoder inputs; unset where it says
/// nothing (or the model carries no config.json).
struct DecoderConfig {
  std::optional<int64_t> startId; ///< decoder_start_token_id (T5: 0, BART: 2)
  std::optional<int64_t> padId;   ///< pad_token_id: replaces -100 in the shifted labels
};

/// Reads `archive`'s config.json (Failure when it is not a JSON object or an
/// id there is not an integer or null).
DecoderConfig decoderConfig(plan::Archive &archive);

/// The decoder's first input token: --decoder-start-id, else the config's
/// decoder_start_token_id, else the data's pad_id (`data` may be null),
/// else 0 (T5's); and the id that replaces -100 in the shifted labels (the
/// config's pad_token_id, else 0), as transformers' shift_tokens_right
/// does. `source` says where the start id came from, for bmt-run's notes.
struct DecoderIds {
  int64_t startId = 0;
  int64_t padId = 0;
  std::string source;
};
DecoderIds decoderIds(const RunOptions &o, const DecoderConfig &config,
                      const runtime::TokenFile *data);

/// Reads o.batchesFile. Checks the format and that the rows split evenly
/// over `worldSize` ranks (Failure); the ids are checked by checkBatchIds.
FixedBatches loadBatches(const RunOptions &o, bool encoderDecoder,
                         const std::string &modelType, int64_t worldSize);

/// Failure when a token id of `fixed` lies outside [0, vocab) (labels may
/// also be -100).
void checkBatchIds(const FixedBatches &fixed, int64_t vocab, const std::string &path);

/// The shape of one micro-batch of this rank for runtime::probeVocabulary:
/// `fixed`'s when --batches gave them (`span`: span corruption's sizes,
/// else null), else --micro-batch x --seq-len (`targetLength`: the
/// decoder's); `worldSize`: the data-parallel ranks that split the rows.
runtime::ProbeShape probeShape(const RunOptions &o, const FixedBatches &fixed,
                               const runtime::SpanCorruptionConfig *span, int64_t targetLength,
                               int64_t worldSize,
                               const std::vector<std::pair<std::string, std::string>> &hfFiles);

/// Span corruption's token ids for windows of `lengths` (Batches.cpp says
/// where each comes from); prints them when `print`. Failure when there are
/// too few sentinels or an id lies outside the vocabulary.
runtime::SpanCorruptionConfig spanCorruptionSettings(const RunOptions &o,
                                                     const DecoderConfig &decoder,
                                                     runtime::SpanCorruptionConfig span,
                                                     const runtime::SpanCorruptionLengths &lengths,
                                                     int64_t vocab, const runtime::TokenFile *data,
                                                     int64_t dataVocab, bool print);

/// --data (null without it), its ids checked against the model's `vocab`
/// (runtime::DataError).
std::unique_ptr<runtime::TokenFile> openTrainingData(const RunOptions &o, int64_t vocab);

/// --eval-data (null without it), its ids checked against `vocab`, holding
/// at least one batch of --micro-batch windows of `windowLength` tokens
/// (runtime::DataError).
std::unique_ptr<runtime::TokenFile> openEvaluationData(const RunOptions &o, int64_t vocab,
                                                       int64_t windowLength);

/// Masked LM's [MASK] id, from the data's metadata (Failure without one).
int64_t maskTokenId(const runtime::TokenFile *data);

/// This rank's micro-batches: the fixed batches in turn (cycled), else
/// windows of `windowLength` tokens sampled from `train` (every rank draws
/// the same global batch of microBatch x worldSize windows with `seed` and
/// trains on its rows). Null when there is neither (evaluation only).
/// `fixed` and `train` must outlive the source.
std::unique_ptr<runtime::MicroBatchSource> makeBatchSource(const FixedBatches &fixed,
                                                           const runtime::TokenFile *train,
                                                           int64_t microBatch,
                                                           int64_t windowLength, uint64_t seed,
                                                           int64_t rank, int64_t worldSize);

/// --dump INPUTS OUT: forward, loss and backward on the batch in
/// o.dumpInputs; rank 0 saves the outputs, the loss and every gradient.
void runDump(runtime::Model &model, const RunOptions &o, runtime::Objective objective,
             const DecoderConfig &decoder);

} // namespace bmt::tools

#endif // BMT_TOOLS_BMTRUN_RUN_H
