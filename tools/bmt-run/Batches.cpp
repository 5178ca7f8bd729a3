//===- Batches.cpp - bmt-run's batches: --batches, span corruption's ids --===//

#include "Run.h"

#include "bmt/Support/ErrorText.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>

#include <iostream>
#include <memory>

namespace bmt::tools {

DecoderConfig decoderConfig(plan::Archive &archive) {
  DecoderConfig out;
  for (const auto &[name, content] : archive.hfFiles()) {
    if (name != "config.json")
      continue;
    const nlohmann::json config = nlohmann::json::parse(content, nullptr, false);
    if (!config.is_object())
      throw Failure(archive.path() + ": its config.json (bmt/hf/config.json) is not a JSON "
                    "object");
    auto id = [&](const char *key) -> std::optional<int64_t> {
      auto it = config.find(key);
      if (it == config.end() || it->is_null())
        return std::nullopt;
      if (!it->is_number_integer())
        throw Failure(archive.path() + ": its config.json's " + key + " is " + it->dump() +
                      ", not a token id");
      return it->get<int64_t>();
    };
    out.startId = id("decoder_start_token_id");
    out.padId = id("pad_token_id");
  }
  return out;
}

DecoderIds decoderIds(const RunOptions &o, const DecoderConfig &config,
                      const runtime::TokenFile *data) {
  DecoderIds ids;
  ids.padId = config.padId.value_or(0);
  if (o.decoderStartId >= 0) {
    ids.startId = o.decoderStartId;
    ids.source = "--decoder-start-id";
  } else if (config.startId) {
    ids.startId = *config.startId;
    ids.source = "the model's config.json decoder_start_token_id";
  } else if (data && data->padId()) {
    ids.startId = *data->padId();
    ids.source = "the data's pad_id; the model carries no decoder_start_token_id";
  } else {
    ids.startId = 0;
    ids.source = "T5's 0; the model carries no decoder_start_token_id";
  }
  return ids;
}

/// Span corruption's token ids. The sentinels are the tokenizer's
/// <extra_id_0>, <extra_id_1>, ... (the data's "sentinel_ids") or, for a
/// tokenizer without them, the model's top ids vocab - 1, vocab - 2, ...
/// (T5's order) when no token of the data uses them (ids below the data's
/// vocab_size, or below `dataVocab` without a token file); EOS is the
/// data's eos_id (1, T5's, without a file); the decoder's ids are
/// decoderIds'. Prints them when `print`.
runtime::SpanCorruptionConfig spanCorruptionSettings(const tools::RunOptions &o,
                                                     const DecoderConfig &decoder,
                                                     runtime::SpanCorruptionConfig span,
                                                     const runtime::SpanCorruptionLengths &lengths,
                                                     int64_t vocab, const runtime::TokenFile *data,
                                                     int64_t dataVocab, bool print) {
  span.eosId = data ? data->eosId() : 1;
  const DecoderIds ids = decoderIds(o, decoder, data);
  span.decoderStartId = ids.startId;
  span.decoderPadId = ids.padId;
  if (span.decoderStartId < 0 || span.decoderStartId >= vocab || span.decoderPadId < 0 ||
      span.decoderPadId >= vocab)
    throw Failure("the decoder start id " + std::to_string(span.decoderStartId) + " (" +
                  ids.source + ") or pad id " + std::to_string(span.decoderPadId) +
                  " is outside the model's vocabulary of " + std::to_string(vocab));
  std::string source;
  if (data && !data->sentinelIds().empty()) {
    span.sentinels = data->sentinelIds();
    source = "the tokenizer's <extra_id_N>";
    for (int64_t id : span.sentinels)
      if (id >= vocab)
        throw Failure(data->binPath() + ": the tokenizer's sentinel id " + std::to_string(id) +
                      " is outside the model's vocabulary of " + std::to_string(vocab) +
                      " (a model exported for another tokenizer?)");
    if (static_cast<int64_t>(span.sentinels.size()) < lengths.spans)
      throw Failure(data->binPath() + ": the tokenizer has " +
                    std::to_string(span.sentinels.size()) +
                    " sentinel tokens (<extra_id_N>), fewer than the " +
                    std::to_string(lengths.spans) + " corrupted spans of a window; lower "
                    "--seq-len or --noise-density, or raise --mean-span-length");
  } else {
    int64_t used = data ? data->vocabSize() : dataVocab;
    if (vocab - used < lengths.spans)
      throw Failure("span corruption needs " + std::to_string(lengths.spans) +
                    " sentinel ids per window: " +
                    (data ? data->binPath() + "'s tokenizer has no <extra_id_N> tokens"
                          : std::string("there is no token file")) +
                    ", and the model's vocabulary of " + std::to_string(vocab) + " leaves " +
                    std::to_string(std::max<int64_t>(vocab - used, 0)) +
                    " ids above the data's " + std::to_string(used) +
                    " (export the model with a larger vocab_size, or use a tokenizer with "
                    "sentinels)");
    for (int64_t i = 0; i < lengths.spans; ++i)
      span.sentinels.push_back(vocab - 1 - i);
    source = "the model's top ids";
  }
  if (print) {
    const int64_t window = lengths.inputLength + lengths.noiseTokens - lengths.spans - 1;
    std::cout << "bmt-run: span corruption: windows of " << window << " tokens -> encoder input "
              << lengths.inputLength << " + target " << lengths.targetLength << " tokens ("
              << lengths.noiseTokens << " corrupted in " << lengths.spans
              << (lengths.spans == 1 ? " span" : " spans") << "); sentinels from " << source << " (" << span.sentinels.front()
              << ", ...), eos " << span.eosId << ", decoder start " << span.decoderStartId
              << " (" << ids.source << ")\n";
  }
  return span;
}

FixedBatches loadBatches(const tools::RunOptions &o, bool encoderDecoder,
                         const std::string &modelType, int64_t worldSize) {
  c10::IValue v;
  try {
    v = torch::jit::pickle_load(readFile(o.batchesFile));
  } catch (const c10::Error &e) {
    throw Failure(o.batchesFile + ": not a torch.save file: " +
                  bmt::firstErrorLine(e.what_without_backtrace()));
  }
  // Every rank reads the whole file and trains on its rows of each batch.
  auto rows = [&](const at::Tensor &t) {
    if (t.size(1) % worldSize != 0)
      throw Failure(o.batchesFile + ": a batch of " + std::to_string(t.size(1)) +
                    " rows cannot be split evenly over " + std::to_string(worldSize) + " ranks");
    return t.contiguous();
  };
  auto isIds = [](const c10::IValue &x) {
    return x.isTensor() && x.toTensor().dim() == 3 && x.toTensor().scalar_type() == at::kLong &&
           x.toTensor().numel() > 0;
  };
  FixedBatches fixed;
  if (v.isGenericDict()) {
    auto d = v.toGenericDict();
    auto ids = d.find(std::string("input_ids")), labels = d.find(std::string("labels"));
    if (ids == d.end() || labels == d.end() || !isIds(ids->value()) || !isIds(labels->value()) ||
        ids->value().toTensor().size(0) != labels->value().toTensor().size(0) ||
        ids->value().toTensor().size(1) != labels->value().toTensor().size(1))
      throw Failure(o.batchesFile + ": expected {\"input_ids\": [n, micro-batch, S], "
                    "\"labels\": [n, micro-batch, T]} (int64, the same n and micro-batch)");
    if (!encoderDecoder)
      throw Failure(o.batchesFile + ": source/target pairs train an encoder-decoder; " +
                    o.archive + " (" + modelType + ") is not one (give token windows)");
    fixed.inputIds = rows(ids->value().toTensor());
    fixed.labels = rows(labels->value().toTensor());
    return fixed;
  }
  if (!isIds(v) || v.toTensor().size(2) < 2)
    throw Failure(o.batchesFile + ": expected an int64 tensor [n, micro-batch, seq-len + 1]" +
                  std::string(encoderDecoder ? " or a dict {\"input_ids\", \"labels\"}" : ""));
  fixed.windows = rows(v.toTensor());
  return fixed;
}

void checkBatchIds(const FixedBatches &fixed, int64_t vocab, const std::string &path) {
  if (fixed.inputIds.defined() &&
      (fixed.inputIds.max().item<int64_t>() >= vocab || fixed.inputIds.min().item<int64_t>() < 0 ||
       fixed.labels.max().item<int64_t>() >= vocab ||
       fixed.labels.ne(-100).logical_and(fixed.labels.lt(0)).any().item<bool>()))
    throw Failure(path + ": token ids outside the model's vocabulary of " +
                  std::to_string(vocab) + " (labels may also be -100)");
  if (fixed.windows.defined() &&
      (fixed.windows.max().item<int64_t>() >= vocab || fixed.windows.min().item<int64_t>() < 0))
    throw Failure(path + ": token ids outside the model's vocabulary of " +
                  std::to_string(vocab));
}

std::unique_ptr<runtime::MicroBatchSource> makeBatchSource(const FixedBatches &fixed,
                                                           const runtime::TokenFile *train,
                                                           int64_t microBatch,
                                                           int64_t windowLength, uint64_t seed,
                                                           int64_t rank, int64_t worldSize) {
  if (fixed.inputIds.defined() || fixed.windows.defined())
    return runtime::fixedBatches(fixed.windows, fixed.inputIds, fixed.labels, rank, worldSize);
  if (!train)
    return nullptr;
  return runtime::randomWindows(*train, microBatch, windowLength, seed, rank, worldSize);
}

std::unique_ptr<runtime::TokenFile> openTrainingData(const RunOptions &o, int64_t vocab) {
  if (o.data.empty())
    return nullptr;
  auto train = std::make_unique<runtime::TokenFile>(o.data);
  train->checkIds(vocab);
  return train;
}

std::unique_ptr<runtime::TokenFile> openEvaluationData(const RunOptions &o, int64_t vocab,
                                                       int64_t windowLength) {
  if (o.evalData.empty())
    return nullptr;
  auto eval = std::make_unique<runtime::TokenFile>(o.evalData);
  eval->checkIds(vocab);
  int64_t needed = o.microBatch * windowLength;
  if (!eval->hasDocuments() && eval->numTokens() < needed) // (documents: any number)
    throw runtime::DataError(eval->binPath() + ": " + std::to_string(eval->numTokens()) +
                             " tokens, fewer than one evaluation batch of " +
                             std::to_string(o.microBatch) + " x " + std::to_string(windowLength) +
                             " = " + std::to_string(needed) + " (lower --micro-batch or --seq-len)");
  return eval;
}

int64_t maskTokenId(const runtime::TokenFile *data) {
  if (!data || !data->maskId())
    throw Failure("masked-LM training needs a [MASK] token id, and the data's metadata has "
                  "none (prepare the data with a tokenizer that has [MASK])");
  return *data->maskId();
}

runtime::ProbeShape probeShape(const RunOptions &o, const FixedBatches &fixed,
                               const runtime::SpanCorruptionConfig *span, int64_t targetLength,
                               int64_t worldSize,
                               const std::vector<std::pair<std::string, std::string>> &hfFiles) {
  runtime::ProbeShape s;
  s.archive = o.archive;
  s.rows = o.microBatch;
  s.length = o.seqLen;
  s.target = targetLength;
  if (fixed.inputIds.defined()) {
    s.rows = fixed.inputIds.size(1) / worldSize; // (data-parallel ranks)
    s.length = fixed.inputIds.size(2);
    s.target = fixed.labels.size(2);
  } else if (fixed.windows.defined()) {
    s.rows = fixed.windows.size(1) / worldSize;
    s.length = fixed.windows.size(2) - 1;
    if (span) {
      runtime::SpanCorruptionLengths l = runtime::spanCorruptionLengths(fixed.windows.size(2), *span);
      s.length = l.inputLength;
      s.target = l.targetLength;
    }
  }
  const std::string options =
      "--micro-batch " + std::to_string(o.microBatch) + " --seq-len " + std::to_string(o.seqLen);
  s.fixedShape = fixed.inputIds.defined() || fixed.windows.defined();
  s.shape = s.fixedShape ? o.batchesFile : options;
  s.runName = o.batchesFile.empty() ? options : o.batchesFile;
  if (s.fixedShape && !o.evalData.empty())
    s.evalShape = std::make_pair(o.microBatch, o.seqLen);
  s.checkMemory = !o.evalOnly;
  s.measureMemory = o.memoryCheck;
  s.hfFiles = hfFiles;
  return s;
}

} // namespace bmt::tools
