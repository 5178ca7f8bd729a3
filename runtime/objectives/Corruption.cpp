//===- Corruption.cpp - masked-LM masking and T5 span corruption ----------===//

#include "bmt/Runtime/objectives/Corruption.h"

#include "data/Random.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace bmt::runtime {

//===----------------------------------------------------------------------===//
// maskTokens
//===----------------------------------------------------------------------===//

std::pair<at::Tensor, at::Tensor> maskTokens(const at::Tensor &tokens, int64_t maskId,
                                             int64_t vocab, double probability,
                                             std::mt19937_64 &rng) {
  if (!(probability > 0.0 && probability <= 1.0))
    throw std::invalid_argument("maskTokens: probability must lie in (0, 1], got " +
                                std::to_string(probability));
  if (vocab < 1 || maskId < 0)
    throw std::invalid_argument("maskTokens: need vocab >= 1 and mask id >= 0, got " +
                                std::to_string(vocab) + " and " + std::to_string(maskId));
  at::Tensor src = tokens.to(at::kCPU, at::kLong).contiguous();
  const int64_t n = src.numel();
  if (n == 0)
    throw std::invalid_argument("maskTokens: empty batch");
  at::Tensor inputs = at::empty(src.sizes(), at::kLong);
  at::Tensor labels = at::empty(src.sizes(), at::kLong);
  const int64_t *in = src.const_data_ptr<int64_t>();
  int64_t *out = inputs.data_ptr<int64_t>();
  int64_t *lab = labels.data_ptr<int64_t>();

  auto corrupt = [&](int64_t i) {
    lab[i] = in[i];
    double r = uniform01(rng);
    if (r < 0.8)
      out[i] = maskId;
    else if (r < 0.9)
      out[i] = static_cast<int64_t>(uniformBelow(rng, static_cast<uint64_t>(vocab)));
    else
      out[i] = in[i];
  };
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    if (uniform01(rng) < probability) {
      corrupt(i);
      any = true;
    } else {
      out[i] = in[i];
      lab[i] = -100;
    }
  }
  if (!any)
    corrupt(static_cast<int64_t>(uniformBelow(rng, static_cast<uint64_t>(n))));
  if (tokens.device() != inputs.device())
    return {inputs.to(tokens.device()), labels.to(tokens.device())};
  return {inputs, labels};
}

//===----------------------------------------------------------------------===//
// Span corruption
//===----------------------------------------------------------------------===//

namespace {

/// Rounds half to even (numpy's and TensorFlow's round), whatever the
/// current floating-point rounding mode.
int64_t roundHalfEven(double x) {
  double lower = std::floor(x), frac = x - lower;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(lower, 2.0) != 0.0))
    lower += 1.0;
  return static_cast<int64_t>(lower);
}

void checkConfig(const SpanCorruptionConfig &config) {
  if (!(config.noiseDensity > 0.0 && config.noiseDensity < 1.0))
    throw std::invalid_argument("span corruption: the noise density must lie in (0, 1), got " +
                                std::to_string(config.noiseDensity));
  if (!(config.meanSpanLength >= 1.0) || !std::isfinite(config.meanSpanLength))
    throw std::invalid_argument("span corruption: the mean span length must be >= 1, got " +
                                std::to_string(config.meanSpanLength));
}

/// Splits `items` (>= parts >= 1) into `parts` positive lengths, uniformly
/// over the compositions: parts - 1 distinct cut points drawn from
/// [1, items - 1] (a partial Fisher-Yates shuffle), sorted.
std::vector<int64_t> randomComposition(int64_t items, int64_t parts, std::mt19937_64 &rng,
                                       std::vector<int64_t> &scratch) {
  scratch.resize(static_cast<size_t>(items - 1));
  for (int64_t i = 0; i < items - 1; ++i)
    scratch[static_cast<size_t>(i)] = i + 1;
  for (int64_t i = 0; i < parts - 1; ++i) {
    int64_t j = i + static_cast<int64_t>(uniformBelow(rng, static_cast<uint64_t>(items - 1 - i)));
    std::swap(scratch[static_cast<size_t>(i)], scratch[static_cast<size_t>(j)]);
  }
  std::sort(scratch.begin(), scratch.begin() + (parts - 1));
  std::vector<int64_t> lengths(static_cast<size_t>(parts));
  int64_t previous = 0;
  for (int64_t i = 0; i < parts - 1; ++i) {
    lengths[static_cast<size_t>(i)] = scratch[static_cast<size_t>(i)] - previous;
    previous = scratch[static_cast<size_t>(i)];
  }
  lengths.back() = items - previous;
  return lengths;
}

} // namespace

SpanCorruptionLengths spanCorruptionLengths(int64_t windowLength,
                                            const SpanCorruptionConfig &config) {
  checkConfig(config);
  if (windowLength < 2)
    throw std::invalid_argument("span corruption: a window needs at least 2 tokens, got " +
                                std::to_string(windowLength));
  SpanCorruptionLengths r;
  r.noiseTokens = std::clamp<int64_t>(
      roundHalfEven(static_cast<double>(windowLength) * config.noiseDensity), 1, windowLength - 1);
  r.spans = std::clamp<int64_t>(
      roundHalfEven(static_cast<double>(r.noiseTokens) / config.meanSpanLength), 1,
      std::min(r.noiseTokens, windowLength - r.noiseTokens));
  r.inputLength = windowLength - r.noiseTokens + r.spans + 1;
  r.targetLength = r.noiseTokens + r.spans + 1;
  return r;
}

int64_t spanCorruptionWindow(int64_t inputLength, const SpanCorruptionConfig &config) {
  checkConfig(config);
  if (inputLength < 3 || spanCorruptionLengths(2, config).inputLength > inputLength)
    throw std::invalid_argument("span corruption: no window gives an encoder input of " +
                                std::to_string(inputLength) +
                                " tokens (the shortest input is 3: a token, a sentinel, EOS)");
  // The input length grows with the window (by 0 or 1 per token while the
  // span count is not clamped by the kept tokens, as at usual densities);
  // search upwards for the largest window that still fits.
  int64_t window = 2;
  while (spanCorruptionLengths(window + 1, config).inputLength <= inputLength)
    ++window;
  int64_t got = spanCorruptionLengths(window, config).inputLength;
  if (got != inputLength)
    throw std::invalid_argument(
        "span corruption: no window gives an encoder input of exactly " +
        std::to_string(inputLength) + " tokens at noise density " +
        std::to_string(config.noiseDensity) + " (windows of " + std::to_string(window) +
        " and " + std::to_string(window + 1) + " tokens give " + std::to_string(got) + " and " +
        std::to_string(spanCorruptionLengths(window + 1, config).inputLength) + ")");
  return window;
}

Seq2SeqBatch spanCorruption(const at::Tensor &tokens, const SpanCorruptionConfig &config,
                            std::mt19937_64 &rng) {
  if (tokens.dim() != 2)
    throw std::invalid_argument("span corruption: expected token windows [batch, window], got " +
                                std::to_string(tokens.dim()) + " dimensions");
  const int64_t batch = tokens.size(0), window = tokens.size(1);
  const SpanCorruptionLengths len = spanCorruptionLengths(window, config);
  if (static_cast<int64_t>(config.sentinels.size()) < len.spans)
    throw std::invalid_argument(
        "span corruption: a window of " + std::to_string(window) + " tokens has " +
        std::to_string(len.spans) + " corrupted spans but only " +
        std::to_string(config.sentinels.size()) + " sentinel ids are given");
  at::Tensor src = tokens.to(at::kCPU, at::kLong).contiguous();
  Seq2SeqBatch out;
  out.inputIds = at::empty({batch, len.inputLength}, at::kLong);
  out.labels = at::empty({batch, len.targetLength}, at::kLong);
  std::vector<int64_t> scratch;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t *row = src.const_data_ptr<int64_t>() + b * window;
    int64_t *in = out.inputIds.data_ptr<int64_t>() + b * len.inputLength;
    int64_t *target = out.labels.data_ptr<int64_t>() + b * len.targetLength;
    std::vector<int64_t> noise = randomComposition(len.noiseTokens, len.spans, rng, scratch);
    std::vector<int64_t> kept =
        randomComposition(window - len.noiseTokens, len.spans, rng, scratch);
    int64_t pos = 0;
    for (int64_t s = 0; s < len.spans; ++s) {
      for (int64_t k = 0; k < kept[static_cast<size_t>(s)]; ++k)
        *in++ = row[pos++];
      const int64_t sentinel = config.sentinels[static_cast<size_t>(s)];
      *in++ = sentinel;
      *target++ = sentinel;
      for (int64_t k = 0; k < noise[static_cast<size_t>(s)]; ++k)
        *target++ = row[pos++];
    }
    *in = config.eosId;
    *target = config.eosId;
  }
  out.decoderInputIds = shiftRight(out.labels, config.decoderStartId, config.decoderPadId);
  return out;
}

at::Tensor shiftRight(const at::Tensor &labels, int64_t startId, int64_t padId) {
  if (labels.dim() != 2)
    throw std::invalid_argument("shiftRight: expected labels [batch, n], got " +
                                std::to_string(labels.dim()) + " dimensions");
  at::Tensor shifted = at::full(labels.sizes(), startId, labels.options().dtype(at::kLong));
  if (labels.size(1) > 1)
    shifted.slice(1, 1).copy_(labels.slice(1, 0, labels.size(1) - 1));
  return shifted.masked_fill_(shifted.eq(-100), padId);
}

} // namespace bmt::runtime
