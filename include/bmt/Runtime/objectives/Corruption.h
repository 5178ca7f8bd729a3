//===- Corruption.h - pretraining objectives' input corruption --*- C++ -*-===//
//
// The two denoising objectives bmt-run trains besides causal LM, applied to
// token windows on the host: BERT's masked-LM masking (maskTokens) and T5's
// span corruption (spanCorruption). Both draw from a seeded std::mt19937_64
// through its raw 64-bit output, so a seed gives the same corruption with
// every standard library.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OBJECTIVES_CORRUPTION_H
#define BMT_RUNTIME_OBJECTIVES_CORRUPTION_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

namespace bmt::runtime {

/// BERT's masked-LM corruption (Devlin et al. 2019, section 3.1): each
/// token is selected with probability `probability`; a selected token is
/// replaced by `maskId` 80% of the time, by a random id in [0, vocab) 10%,
/// and kept 10%. Returns {inputs, labels}: int64 [batch, seq]; labels hold
/// the original id at selected positions and -100 elsewhere (ignored by
/// cross-entropy). At least one position per batch is selected. `tokens`
/// may be on any device (the results are on the same one); throws
/// std::invalid_argument for probability outside (0, 1], vocab < 1,
/// maskId < 0 or an empty batch.
std::pair<at::Tensor, at::Tensor> maskTokens(const at::Tensor &tokens, int64_t maskId,
                                             int64_t vocab, double probability,
                                             std::mt19937_64 &rng);

/// The settings of T5's span corruption (Raffel et al. 2020, "Exploring the
/// Limits of Transfer Learning with a Unified Text-to-Text Transformer",
/// section 3.1.4; the defaults are the paper's: 15 % of the tokens in spans
/// of mean length 3).
struct SpanCorruptionConfig {
  double noiseDensity = 0.15;  ///< fraction of a window's tokens that are corrupted, in (0, 1)
  double meanSpanLength = 3.0; ///< mean length of a corrupted span in tokens, >= 1
  /// Sentinel ids: the i-th corrupted span of a window is replaced by
  /// sentinels[i] in the encoder input and introduced by it in the target
  /// (T5's <extra_id_i>). Needs at least spanCorruptionLengths().spans.
  std::vector<int64_t> sentinels;
  int64_t eosId = 1;          ///< appended to the encoder input and to the target
  int64_t decoderStartId = 0; ///< first decoder input token (T5: the pad id, 0)
  int64_t decoderPadId = 0;   ///< replaces -100 in the shifted labels (pad_token_id)
};

/// The exact sizes span corruption gives a window of `windowLength` tokens:
/// noiseTokens = round(windowLength * noiseDensity) (rounding half to even,
/// as numpy and TensorFlow do) clamped to [1, windowLength - 1];
/// spans = round(noiseTokens / meanSpanLength) clamped to
/// [1, min(noiseTokens, windowLength - noiseTokens)]; the encoder input
/// has windowLength - noiseTokens + spans + 1 tokens (non-corrupted tokens,
/// a sentinel per span, EOS) and the target noiseTokens + spans + 1
/// (each span after its sentinel, EOS). E.g. 568 tokens at density 0.15 and
/// mean span 3: 85 noise tokens in 28 spans, input 512, target 114.
/// Throws std::invalid_argument for windowLength < 2 or settings outside
/// their ranges.
struct SpanCorruptionLengths {
  int64_t noiseTokens = 0, spans = 0, inputLength = 0, targetLength = 0;
};
SpanCorruptionLengths spanCorruptionLengths(int64_t windowLength,
                                            const SpanCorruptionConfig &config);

/// The window length (tokens read from the data per sequence) whose
/// corrupted encoder input has exactly `inputLength` tokens: the largest
/// length L with spanCorruptionLengths(L).inputLength <= inputLength. At
/// usual densities the input grows by 0 or 1 per window token, so every
/// length >= 3 has one; at high densities (where the span count is capped
/// by the kept tokens) it can skip a length. Throws std::invalid_argument
/// when no window gives exactly that input length, or for bad settings.
int64_t spanCorruptionWindow(int64_t inputLength, const SpanCorruptionConfig &config);

/// One corrupted micro-batch of an encoder-decoder: int64 CPU tensors.
struct Seq2SeqBatch {
  at::Tensor inputIds;        ///< encoder input [batch, inputLength]
  at::Tensor labels;          ///< target [batch, targetLength]
  at::Tensor decoderInputIds; ///< the target shifted right by one, decoderStartId first
};

/// T5's span corruption of each row of `tokens` (int64 [batch, window], any
/// device; read on the host): the row's noise tokens are split at random
/// into `spans` non-empty spans and its other tokens into `spans` non-empty
/// runs, each split uniformly over the compositions; runs and spans
/// alternate, a run first and a span last (so a window's last token is
/// always corrupted, as in T5's random_spans_noise_mask without its
/// random roll, which transformers' T5 pretraining example uses: the roll
/// would make the sizes vary). The encoder input keeps the runs and puts
/// sentinels[i] in place of span i; the target lists sentinels[i] and span
/// i's tokens for each span; both end with eosId. Every row has the sizes
/// of spanCorruptionLengths(window). Throws std::invalid_argument for a
/// tensor that is not 2-D, a window < 2, bad settings or fewer sentinels
/// than spans.
Seq2SeqBatch spanCorruption(const at::Tensor &tokens, const SpanCorruptionConfig &config,
                            std::mt19937_64 &rng);

/// `labels` (int64 [batch, n]) shifted right by one position with
/// `startId` in front, the last label dropped: the decoder input of
/// teacher forcing (transformers' T5 _shift_right; labels of -100 become
/// `padId`). Same device as `labels`.
at::Tensor shiftRight(const at::Tensor &labels, int64_t startId, int64_t padId = 0);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OBJECTIVES_CORRUPTION_H
