//===- TokenData.h - memory-mapped token files ------------------*- C++ -*-===//
//
// Reads the token files written by bmt-prepare-data (python/bmt): PREFIX.bin
// (flat little-endian uint16 or uint32 token ids) with PREFIX.json beside it
// ({"format": "bmt-tokens", "version": 1, "dtype", "num_tokens",
// "vocab_size", "eos_id", "mask_id", "pad_id", "sentinel_ids", ...}). The
// .bin is mmap-ed read-only; batches are copied out of it.
//
// Version 2 (docs/runtime/data.md) adds document boundaries,
// PREFIX.docs.bin (int64 [num_documents + 1] token offsets), and for
// supervised data a loss mask, PREFIX.mask.bin (uint8 [num_tokens]: 1 where
// the token is a training target); the json names both files ("documents",
// "loss_mask") and says "num_documents", "supervised", "truncated",
// "max_length". Version 1 files have neither (one stream of tokens).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_DATA_TOKENDATA_H
#define BMT_RUNTIME_DATA_TOKENDATA_H

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace bmt::runtime {

/// Bad data: missing file, bad metadata, wrong size or dtype, a token id
/// outside the vocabulary, a file shorter than one sequence. The message
/// names the file.
class DataError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

class TokenFile {
public:
  /// Opens `path`, either PREFIX.bin or PREFIX.json (the other is found
  /// beside it; a bare PREFIX works too). Checks that the metadata's format
  /// and version are known, that dtype is uint16 or uint32, that
  /// num_tokens, vocab_size and eos_id are integers (mask_id, pad_id:
  /// integer or null; sentinel_ids: absent, null or a list of integers),
  /// eos_id, mask_id and the sentinel ids < vocab_size, and the .bin size is
  /// num_tokens times its item size. Version 2: the documents file holds
  /// num_documents + 1 int64 offsets, the first 0, the last num_tokens,
  /// strictly increasing (no empty document); the loss mask (when "loss_mask"
  /// names one, required when "supervised" is true) holds num_tokens bytes,
  /// each 0 or 1. Throws DataError otherwise, naming the file.
  /// Reads and validates both files into memory (8 bytes a document and
  /// one byte a token).
  explicit TokenFile(const std::string &path);
  ~TokenFile();
  TokenFile(const TokenFile &) = delete;
  TokenFile &operator=(const TokenFile &) = delete;

  int64_t numTokens() const { return numTokens_; }
  int64_t vocabSize() const { return vocabSize_; } ///< of the tokenizer
  int64_t eosId() const { return eosId_; }
  std::optional<int64_t> maskId() const { return maskId_; }
  std::optional<int64_t> padId() const { return padId_; }
  /// The tokenizer's span-corruption sentinels <extra_id_0>, <extra_id_1>,
  /// ... in that order (T5's tokenizers); empty when it has none.
  const std::vector<int64_t> &sentinelIds() const { return sentinelIds_; }
  const std::string &binPath() const { return binPath_; }

  /// What identifies the data for a resumed run: the counts, the token
  /// type and a CRC-32 (zlib's) of the first and last MiB of the tokens,
  /// e.g. "1048576 tokens, 412 documents, uint16, crc32 3f1c09aa".
  std::string fingerprint() const;
  /// The file's format version (1 or 2).
  int64_t version() const { return version_; }
  /// Whether the file has document boundaries (version 2).
  bool hasDocuments() const { return !documentOffsets_.empty(); }
  /// Documents (0 for version 1: the file is one stream).
  int64_t numDocuments() const {
    return documentOffsets_.empty() ? 0 : static_cast<int64_t>(documentOffsets_.size()) - 1;
  }
  /// Document `d` is tokens [documentStart(d), documentEnd(d))
  /// (0 <= d < numDocuments(); std::out_of_range otherwise).
  int64_t documentStart(int64_t d) const;
  int64_t documentEnd(int64_t d) const;
  /// Whether the file is supervised data with a loss mask.
  bool hasLossMask() const { return hasLossMask_; }
  /// Whether token `i` is a training target: its loss-mask byte, or true
  /// without a loss mask. std::out_of_range outside the file.
  bool isTarget(int64_t i) const;
  /// Documents the data preparation cut to its max_length (metadata
  /// "truncated"; 0 when absent).
  int64_t preparedTruncated() const { return preparedTruncated_; }

  /// Token `i` (0 <= i < numTokens(); std::out_of_range otherwise).
  int64_t token(int64_t i) const;

  /// Throws DataError naming the file, the position and the id if any token
  /// id is >= modelVocab (scans the whole file once).
  void checkIds(int64_t modelVocab) const;

  /// Tokens [start, start + length) as an int64 CPU tensor [length]
  /// (std::out_of_range if not inside the file).
  at::Tensor slice(int64_t start, int64_t length) const;

private:
  void readDocuments(const nlohmann::json &meta);

  std::string binPath_, jsonPath_;
  int64_t numTokens_ = 0, vocabSize_ = 0, eosId_ = 0;
  std::optional<int64_t> maskId_, padId_;
  std::vector<int64_t> sentinelIds_;
  int itemSize_ = 2;
  int64_t version_ = 1, preparedTruncated_ = 0;
  std::vector<int64_t> documentOffsets_; ///< [num_documents + 1]; empty for version 1
  std::vector<uint8_t> lossMask_;        ///< [num_tokens]; empty without a loss mask
  bool hasLossMask_ = false;
  const uint8_t *data_ = nullptr;
  size_t mappedBytes_ = 0;
};

/// Draws training batches of `batch` windows of `seqLen + 1` consecutive
/// tokens at uniformly random offsets (seeded), from this rank's part of the
/// file: with `numParts` data-parallel ranks, part `part` is the
/// [part/numParts, (part+1)/numParts) fraction of the tokens.
class BatchSampler {
public:
  /// Throws DataError when the part holds fewer than seqLen + 1 tokens,
  /// std::invalid_argument for batch or seqLen < 1 or a part outside
  /// [0, numParts). Offsets are drawn by rejection from the generator's raw
  /// output: the same batches for a seed with any standard library.
  BatchSampler(const TokenFile &file, int64_t batch, int64_t seqLen,
               uint64_t seed, int64_t part = 0, int64_t numParts = 1);

  /// int64 CPU tensor [batch, seqLen + 1].
  at::Tensor next();

  /// The i-th of the file's consecutive, non-overlapping windows
  /// [batch, seqLen + 1] (for evaluation: deterministic, covers the part in
  /// order); numSequentialBatches() of them fit (std::out_of_range beyond).
  at::Tensor sequential(int64_t i) const;
  int64_t numSequentialBatches() const;

  /// The generator's state in std::mt19937_64's text form (operator<<),
  /// and back: setGeneratorState(generatorState()) continues the same
  /// sequence of windows. Throws std::invalid_argument for text that does
  /// not parse.
  std::string generatorState() const;
  void setGeneratorState(const std::string &state);

private:
  const TokenFile &file_;
  int64_t batch_, seqLen_, begin_, end_;
  std::mt19937_64 rng_;
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_DATA_TOKENDATA_H
