//===- CorruptionTest.cpp - BERT masking and T5 span corruption -----------===//
//
// maskTokens' statistics; span corruption's sizes against the numbers of
// the T5 paper's setting (568 tokens -> 512 inputs + 114 targets) and
// numpy's half-to-even rounding, the original window rebuilt from the
// encoder input and the target, the distribution of span and run lengths,
// the decoder input, determinism and errors.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/objectives/Corruption.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

namespace {

using bmt::runtime::maskTokens;
using bmt::runtime::Seq2SeqBatch;
using bmt::runtime::shiftRight;
using bmt::runtime::spanCorruption;
using bmt::runtime::SpanCorruptionConfig;
using bmt::runtime::spanCorruptionLengths;
using bmt::runtime::spanCorruptionWindow;

std::vector<int64_t> values(const at::Tensor &t) {
  at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

//===----------------------------------------------------------------------===//
// maskTokens
//===----------------------------------------------------------------------===//

at::Tensor randomTokens(int64_t batch, int64_t seq, int64_t lo, int64_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  at::Tensor t = at::empty({batch, seq}, at::kLong);
  int64_t *d = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    d[i] = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo));
  return t;
}

TEST(MaskTokens, BertStatistics) {
  const int64_t vocab = 1000, maskId = 3;
  at::Tensor tokens = randomTokens(64, 1024, 5, vocab, 42); // no id equals maskId
  std::mt19937_64 rng(7);
  auto [inputs, labels] = maskTokens(tokens, maskId, vocab, 0.15, rng);
  ASSERT_EQ(inputs.sizes(), tokens.sizes());
  ASSERT_EQ(labels.sizes(), tokens.sizes());
  EXPECT_EQ(inputs.scalar_type(), at::kLong);
  EXPECT_EQ(labels.scalar_type(), at::kLong);

  std::vector<int64_t> tok = values(tokens), in = values(inputs), lab = values(labels);
  const int64_t n = static_cast<int64_t>(tok.size());
  int64_t selected = 0, masked = 0, kept = 0, replaced = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_GE(in[i], 0);
    ASSERT_LT(in[i], vocab);
    if (lab[i] == -100) {
      ASSERT_EQ(in[i], tok[i]) << "unselected token changed at " << i;
      continue;
    }
    ASSERT_EQ(lab[i], tok[i]) << "label is not the original id at " << i;
    ++selected;
    if (in[i] == maskId)
      ++masked;
    else if (in[i] == tok[i])
      ++kept;
    else
      ++replaced;
  }
  // 65536 positions: sd of the selected fraction ~0.0014; of the split ~0.004.
  const double s = static_cast<double>(selected);
  EXPECT_NEAR(s / n, 0.15, 0.01);
  EXPECT_NEAR(masked / s, 0.80, 0.02);
  EXPECT_NEAR(replaced / s, 0.10, 0.02); // a random id equal to the original counts as kept
  EXPECT_NEAR(kept / s, 0.10, 0.02);
}

TEST(MaskTokens, DeterministicForASeed) {
  at::Tensor tokens = randomTokens(4, 128, 5, 500, 1);
  std::mt19937_64 r1(11), r2(11), r3(12);
  auto a = maskTokens(tokens, 4, 500, 0.15, r1);
  auto b = maskTokens(tokens, 4, 500, 0.15, r2);
  auto c = maskTokens(tokens, 4, 500, 0.15, r3);
  EXPECT_TRUE(a.first.equal(b.first));
  EXPECT_TRUE(a.second.equal(b.second));
  EXPECT_FALSE(a.second.equal(c.second));
  // The input is not modified.
  EXPECT_TRUE(tokens.equal(randomTokens(4, 128, 5, 500, 1)));
}

TEST(MaskTokens, SelectsAtLeastOnePosition) {
  at::Tensor tokens = randomTokens(2, 3, 5, 50, 3);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed);
    auto [inputs, labels] = maskTokens(tokens, 1, 50, 1e-12, rng);
    std::vector<int64_t> lab = values(labels);
    EXPECT_EQ(std::count_if(lab.begin(), lab.end(), [](int64_t l) { return l != -100; }), 1);
  }
}

TEST(MaskTokens, RejectsBadArguments) {
  at::Tensor tokens = randomTokens(2, 3, 5, 50, 3);
  std::mt19937_64 rng(0);
  EXPECT_THROW(maskTokens(tokens, 1, 50, 0.0, rng), std::invalid_argument);
  EXPECT_THROW(maskTokens(tokens, 1, 50, 1.5, rng), std::invalid_argument);
  EXPECT_THROW(maskTokens(tokens, 1, 0, 0.15, rng), std::invalid_argument);
}

//===----------------------------------------------------------------------===//
// Span corruption
//===----------------------------------------------------------------------===//

/// Sentinels 1000, 999, ... (above the test tokens' ids, T5's order).
SpanCorruptionConfig t5Config(int64_t numSentinels = 100) {
  SpanCorruptionConfig c;
  for (int64_t i = 0; i < numSentinels; ++i)
    c.sentinels.push_back(1000 - i);
  c.eosId = 1;
  c.decoderStartId = 0;
  return c;
}

TEST(SpanCorruption, LengthsOfThePapersSetting) {
  SpanCorruptionConfig c = t5Config();
  // transformers' T5 pretraining example: --max_seq_length 512 reads
  // windows of 568 tokens and gets targets of 114.
  auto len = spanCorruptionLengths(568, c);
  EXPECT_EQ(len.noiseTokens, 85); // round(85.2)
  EXPECT_EQ(len.spans, 28);       // round(28.33)
  EXPECT_EQ(len.inputLength, 512);
  EXPECT_EQ(len.targetLength, 114);
  EXPECT_EQ(spanCorruptionWindow(512, c), 568);
  // Rounding half to even, as numpy's round: 2.5 -> 2, 7.5 -> 8.
  c.noiseDensity = 0.25;
  EXPECT_EQ(spanCorruptionLengths(10, c).noiseTokens, 2);
  EXPECT_EQ(spanCorruptionLengths(30, c).noiseTokens, 8);
  // The smallest window: one kept token, one noise token.
  c = t5Config();
  len = spanCorruptionLengths(2, c);
  EXPECT_EQ(len.noiseTokens, 1);
  EXPECT_EQ(len.spans, 1);
  EXPECT_EQ(len.inputLength, 3);
  EXPECT_EQ(len.targetLength, 3);
}

TEST(SpanCorruption, WindowGivesEveryInputLengthExactly) {
  for (double density : {0.15, 0.3, 0.5}) {
    SpanCorruptionConfig c = t5Config();
    c.noiseDensity = density;
    for (int64_t input = 3; input <= 1500; ++input) {
      int64_t window = spanCorruptionWindow(input, c);
      ASSERT_EQ(spanCorruptionLengths(window, c).inputLength, input) << density << " " << input;
      ASSERT_GT(spanCorruptionLengths(window + 1, c).inputLength, input);
    }
  }
  // At density 0.9 a 16-token window keeps 2 tokens in 2 runs (input 5),
  // a 15-token one keeps 1 (input 3): no window gives an input of 4.
  SpanCorruptionConfig c = t5Config();
  c.noiseDensity = 0.9;
  EXPECT_EQ(spanCorruptionLengths(15, c).inputLength, 3);
  EXPECT_EQ(spanCorruptionLengths(16, c).inputLength, 5);
  EXPECT_THROW(spanCorruptionWindow(4, c), std::invalid_argument);
}

/// Rebuilds the window from the encoder input and the target: each
/// sentinel of the input stands for the tokens after it in the target.
std::vector<int64_t> rebuild(const std::vector<int64_t> &in, const std::vector<int64_t> &target,
                             const SpanCorruptionConfig &c) {
  std::map<int64_t, std::vector<int64_t>> spans;
  int64_t current = -1;
  for (size_t i = 0; i + 1 < target.size(); ++i) {
    bool sentinel = std::find(c.sentinels.begin(), c.sentinels.end(), target[i]) != c.sentinels.end();
    if (sentinel) {
      current = target[i];
      spans[current];
    } else {
      spans.at(current).push_back(target[i]);
    }
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i + 1 < in.size(); ++i) {
    auto it = spans.find(in[i]);
    if (it == spans.end())
      out.push_back(in[i]);
    else
      out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

TEST(SpanCorruption, InputAndTargetRebuildTheWindow) {
  SpanCorruptionConfig c = t5Config();
  const int64_t batch = 16, window = 120;
  at::Tensor tokens = randomTokens(batch, window, 5, 900, 3);
  std::mt19937_64 rng(5);
  Seq2SeqBatch b = spanCorruption(tokens, c, rng);
  auto len = spanCorruptionLengths(window, c); // 18 noise tokens in 6 spans
  ASSERT_EQ(b.inputIds.sizes(), (std::vector<int64_t>{batch, len.inputLength}));
  ASSERT_EQ(b.labels.sizes(), (std::vector<int64_t>{batch, len.targetLength}));
  ASSERT_EQ(b.decoderInputIds.sizes(), b.labels.sizes());
  for (int64_t r = 0; r < batch; ++r) {
    std::vector<int64_t> in = values(b.inputIds[r]), target = values(b.labels[r]),
                         decoder = values(b.decoderInputIds[r]), row = values(tokens[r]);
    EXPECT_EQ(in.back(), c.eosId);
    EXPECT_EQ(target.back(), c.eosId);
    EXPECT_EQ(rebuild(in, target, c), row) << "row " << r;
    // Sentinels in order 0, 1, ..., each span and each kept run non-empty:
    // the input starts with a kept token and never has two sentinels in a
    // row; the target starts with sentinel 0 and never has two in a row.
    std::vector<int64_t> seenIn, seenTarget;
    auto isSentinel = [&](int64_t id) { return id > 900; };
    EXPECT_FALSE(isSentinel(in[0]));
    EXPECT_EQ(target[0], c.sentinels[0]);
    for (size_t i = 0; i + 1 < in.size(); ++i)
      if (isSentinel(in[i])) {
        seenIn.push_back(in[i]);
        EXPECT_FALSE(i + 2 < in.size() && isSentinel(in[i + 1]));
      }
    for (size_t i = 0; i + 1 < target.size(); ++i)
      if (isSentinel(target[i])) {
        seenTarget.push_back(target[i]);
        EXPECT_FALSE(isSentinel(target[i + 1]));
      }
    std::vector<int64_t> expected(c.sentinels.begin(), c.sentinels.begin() + len.spans);
    EXPECT_EQ(seenIn, expected);
    EXPECT_EQ(seenTarget, expected);
    // Teacher forcing: the decoder reads the start token, then the target.
    EXPECT_EQ(decoder[0], c.decoderStartId);
    for (size_t i = 1; i < decoder.size(); ++i)
      EXPECT_EQ(decoder[i], target[i - 1]);
  }
}

TEST(SpanCorruption, SpansAndRunsAreUniformCompositions) {
  // Window tokens are their positions + 10. 40 tokens: 6 noise tokens in 2
  // spans, 34 kept tokens in 2 runs, laid out run, span, run, span (so the
  // last token is always corrupted, as in T5's and transformers' code).
  SpanCorruptionConfig c = t5Config();
  const int64_t batch = 8000, window = 40;
  at::Tensor tokens = at::arange(window, at::kLong).repeat({batch, 1}).add_(10);
  std::mt19937_64 rng(9);
  Seq2SeqBatch b = spanCorruption(tokens, c, rng);
  auto len = spanCorruptionLengths(window, c);
  ASSERT_EQ(len.noiseTokens, 6);
  ASSERT_EQ(len.spans, 2);
  std::map<int64_t, int64_t> firstSpanLength, firstRunLength;
  int64_t lastAlwaysCorrupted = 0;
  for (int64_t r = 0; r < batch; ++r) {
    std::vector<int64_t> target = values(b.labels[r]);
    // target: sentinel 0, span 0, sentinel 1, span 1, EOS.
    auto second = std::find(target.begin() + 1, target.end(), c.sentinels[1]);
    ASSERT_NE(second, target.end());
    ++firstSpanLength[second - target.begin() - 1];
    ++firstRunLength[target[1] - 10]; // span 0 starts after run 0
    lastAlwaysCorrupted += target[target.size() - 2] == 10 + window - 1;
  }
  EXPECT_EQ(lastAlwaysCorrupted, batch);
  // A composition of 6 into 2 parts: first part 1..5, each with 1/5.
  for (int64_t k = 1; k <= 5; ++k)
    EXPECT_NEAR(static_cast<double>(firstSpanLength[k]) / batch, 0.2, 0.02) << "length " << k;
  // Of 34 into 2 parts: first run 1..33, each with 1/33 (sd ~0.0019).
  for (int64_t k = 1; k <= 33; ++k)
    EXPECT_NEAR(static_cast<double>(firstRunLength[k]) / batch, 1.0 / 33, 0.008) << "run " << k;
  EXPECT_EQ(firstSpanLength.size(), 5u);
  EXPECT_EQ(firstRunLength.size(), 33u);
}

TEST(SpanCorruption, DeterministicForASeed) {
  SpanCorruptionConfig c = t5Config();
  at::Tensor tokens = randomTokens(4, 64, 5, 900, 1);
  std::mt19937_64 r1(3), r2(3), r3(4);
  Seq2SeqBatch a = spanCorruption(tokens, c, r1), b = spanCorruption(tokens, c, r2),
               d = spanCorruption(tokens, c, r3);
  EXPECT_TRUE(a.inputIds.equal(b.inputIds));
  EXPECT_TRUE(a.labels.equal(b.labels));
  EXPECT_FALSE(a.labels.equal(d.labels));
}

TEST(SpanCorruption, RejectsBadArguments) {
  SpanCorruptionConfig c = t5Config(/*numSentinels=*/2);
  std::mt19937_64 rng(0);
  // 200 tokens: 30 noise tokens in 10 spans, more than 2 sentinels.
  EXPECT_THROW(spanCorruption(randomTokens(1, 200, 5, 900, 0), c, rng), std::invalid_argument);
  EXPECT_THROW(spanCorruption(at::arange(10, at::kLong), c, rng), std::invalid_argument);
  EXPECT_THROW(spanCorruption(randomTokens(2, 1, 5, 900, 0), c, rng), std::invalid_argument);
  c = t5Config();
  c.noiseDensity = 1.0;
  EXPECT_THROW(spanCorruptionLengths(100, c), std::invalid_argument);
  c.noiseDensity = 0.15;
  c.meanSpanLength = 0.5;
  EXPECT_THROW(spanCorruptionLengths(100, c), std::invalid_argument);
  c = t5Config();
  EXPECT_THROW(spanCorruptionWindow(2, c), std::invalid_argument);
}

TEST(ShiftRight, PutsTheStartTokenFirstAndPadsIgnoredLabels) {
  at::Tensor labels = at::tensor({5, -100, 6, 7, 8, 9}, at::kLong).view({2, 3});
  std::vector<int64_t> got = values(shiftRight(labels, /*startId=*/2, /*padId=*/0));
  EXPECT_EQ(got, (std::vector<int64_t>{2, 5, 0, 2, 7, 8}));
}

} // namespace
