//===- TokenDataTest.cpp - token files and batch sampling -----------------===//
//
// Small PREFIX.bin + PREFIX.json pairs written to a temporary directory in
// bmt-prepare-data's format, read back; every error case; the sampler's
// determinism, part bounds and sequential windows.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/data/Batches.h"
#include "bmt/Runtime/data/TokenData.h"

#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <vector>

namespace {

namespace fs = std::filesystem;
using bmt::runtime::BatchSampler;
using bmt::runtime::DataPosition;
using bmt::runtime::DocumentBatches;
using bmt::runtime::MicroBatch;
using bmt::runtime::SequenceLayout;
using bmt::runtime::DataError;
using bmt::runtime::TokenFile;

class TokenData : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/bmt-tokendata-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string prefix(const std::string &name) const { return (dir_ / name).string(); }

  static void writeText(const std::string &path, const std::string &text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
  }

  /// PREFIX.bin with `ids` in `dtype` (little-endian, the host order).
  static void writeBin(const std::string &prefix, const std::vector<uint32_t> &ids,
                       const std::string &dtype) {
    std::ofstream out(prefix + ".bin", std::ios::binary);
    for (uint32_t id : ids) {
      if (dtype == "uint16") {
        uint16_t v = static_cast<uint16_t>(id);
        out.write(reinterpret_cast<const char *>(&v), sizeof v);
      } else {
        out.write(reinterpret_cast<const char *>(&id), sizeof id);
      }
    }
  }

  static std::string metadata(const std::string &dtype, int64_t numTokens, int64_t vocab,
                              const std::string &maskId = "1",
                              const std::string &format = "\"bmt-tokens\"",
                              const std::string &version = "1") {
    return "{\"format\": " + format + ", \"version\": " + version + ", \"dtype\": \"" + dtype +
           "\", \"num_tokens\": " + std::to_string(numTokens) +
           ", \"num_documents\": 3, \"vocab_size\": " + std::to_string(vocab) +
           ", \"eos_id\": 0, \"mask_id\": " + maskId +
           ", \"pad_id\": 2, \"tokenizer\": \"/x/tok.json\", \"source\": \"/x\"}\n";
  }

  /// A complete, valid file pair.
  std::string writeFile(const std::string &name, const std::vector<uint32_t> &ids,
                        const std::string &dtype, int64_t vocab) {
    std::string p = prefix(name);
    writeBin(p, ids, dtype);
    writeText(p + ".json", metadata(dtype, static_cast<int64_t>(ids.size()), vocab));
    return p;
  }

  /// ids[i] = i (a window's first element is its offset).
  std::string writeIota(const std::string &name, int64_t n) {
    std::vector<uint32_t> ids(n);
    for (int64_t i = 0; i < n; ++i)
      ids[i] = static_cast<uint32_t>(i);
    return writeFile(name, ids, "uint32", n);
  }

  /// A version-2 file: documents of the given lengths, ids 10 + their
  /// position in the file, mask 1 on each document's second half (none
  /// without `supervised`). `meta` is added to the json.
  std::string writeDocuments(const std::string &name, const std::vector<int64_t> &lengths,
                             bool supervised = true, const std::string &meta = "") {
    std::string p = prefix(name);
    std::vector<uint32_t> ids;
    std::vector<int64_t> offsets{0};
    std::string mask;
    for (int64_t n : lengths) {
      for (int64_t t = 0; t < n; ++t) {
        ids.push_back(static_cast<uint32_t>(10 + ids.size()));
        mask.push_back(static_cast<char>(t >= n / 2 ? 1 : 0));
      }
      offsets.push_back(static_cast<int64_t>(ids.size()));
    }
    writeBin(p, ids, "uint16");
    writeText(p + ".docs.bin", std::string(reinterpret_cast<const char *>(offsets.data()),
                                           offsets.size() * sizeof(int64_t)));
    if (supervised)
      writeText(p + ".mask.bin", mask);
    writeText(p + ".json",
              "{\"format\": \"bmt-tokens\", \"version\": 2, \"dtype\": \"uint16\", "
              "\"num_tokens\": " + std::to_string(ids.size()) +
                  ", \"num_documents\": " + std::to_string(lengths.size()) +
                  ", \"vocab_size\": 1000, \"eos_id\": 1, \"mask_id\": null, \"pad_id\": 0, "
                  "\"documents\": \"" + name + ".docs.bin\", \"loss_mask\": " +
                  (supervised ? "\"" + name + ".mask.bin\"" : std::string("null")) +
                  ", \"supervised\": " + (supervised ? "true" : "false") + meta + "}");
    return p;
  }

  fs::path dir_;
};

/// `fn` throws DataError whose message holds every one of `parts`.
void expectDataError(const std::function<void()> &fn, const std::vector<std::string> &parts) {
  try {
    fn();
    ADD_FAILURE() << "no DataError";
  } catch (const DataError &e) {
    std::string what = e.what();
    for (const std::string &part : parts)
      EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
  }
}

std::vector<int64_t> values(const at::Tensor &t) {
  at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

TEST_F(TokenData, ReadsUint16) {
  std::vector<uint32_t> ids = {0, 5, 65535, 7, 1, 300, 2, 9, 4, 65000};
  std::string p = writeFile("u16", ids, "uint16", 65536);
  TokenFile file(p + ".bin");
  EXPECT_EQ(file.numTokens(), 10);
  EXPECT_EQ(file.vocabSize(), 65536);
  EXPECT_EQ(file.eosId(), 0);
  ASSERT_TRUE(file.maskId().has_value());
  EXPECT_EQ(*file.maskId(), 1);
  EXPECT_EQ(file.binPath(), p + ".bin");
  for (int64_t i = 0; i < 10; ++i)
    EXPECT_EQ(file.token(i), ids[i]);
  at::Tensor s = file.slice(2, 5);
  EXPECT_EQ(s.scalar_type(), at::kLong);
  EXPECT_EQ(s.dim(), 1);
  EXPECT_EQ(values(s), (std::vector<int64_t>{65535, 7, 1, 300, 2}));
  EXPECT_EQ(file.slice(10, 0).numel(), 0);
  EXPECT_THROW(file.token(10), std::out_of_range);
  EXPECT_THROW(file.token(-1), std::out_of_range);
  EXPECT_THROW(file.slice(8, 3), std::out_of_range);
  EXPECT_NO_THROW(file.checkIds(65536));
}

TEST_F(TokenData, ReadsPadAndSentinelIds) {
  std::string p = writeFile("plain", {1, 2, 3}, "uint16", 10);
  TokenFile plain(p + ".bin");
  ASSERT_TRUE(plain.padId().has_value());
  EXPECT_EQ(*plain.padId(), 2);
  EXPECT_TRUE(plain.sentinelIds().empty()); // no "sentinel_ids" key
  std::string meta = metadata("uint16", 3, 10);
  std::string withSentinels = meta;
  withSentinels.insert(withSentinels.rfind('}'), ", \"sentinel_ids\": [9, 8, 7]");
  writeText(p + ".json", withSentinels);
  TokenFile t5(p + ".bin");
  EXPECT_EQ(t5.sentinelIds(), (std::vector<int64_t>{9, 8, 7}));
  std::string outside = meta;
  outside.insert(outside.rfind('}'), ", \"sentinel_ids\": [9, 10]");
  writeText(p + ".json", outside);
  expectDataError([&] { TokenFile f(p + ".bin"); }, {"plain.json", "sentinel_ids", "10"});
  std::string notList = meta;
  notList.insert(notList.rfind('}'), ", \"sentinel_ids\": 5");
  writeText(p + ".json", notList);
  expectDataError([&] { TokenFile f(p + ".bin"); }, {"sentinel_ids", "list"});
}

TEST_F(TokenData, ReadsUint32ByJsonPathWithNullMask) {
  std::vector<uint32_t> ids = {100000, 3, 70000, 0, 99999};
  std::string p = prefix("u32");
  writeBin(p, ids, "uint32");
  writeText(p + ".json", metadata("uint32", 5, 100001, "null"));
  TokenFile file(p + ".json");
  EXPECT_EQ(file.numTokens(), 5);
  EXPECT_EQ(file.vocabSize(), 100001);
  EXPECT_FALSE(file.maskId().has_value());
  EXPECT_EQ(file.binPath(), p + ".bin");
  EXPECT_EQ(values(file.slice(0, 5)), (std::vector<int64_t>{100000, 3, 70000, 0, 99999}));
  EXPECT_EQ(file.token(2), 70000);
}

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

TEST_F(TokenData, MissingBin) {
  std::string p = prefix("nobin");
  writeText(p + ".json", metadata("uint16", 4, 100));
  expectDataError([&] { TokenFile f(p + ".json"); }, {p + ".bin", "cannot open"});
}

TEST_F(TokenData, MissingJson) {
  std::string p = prefix("nojson");
  writeBin(p, {1, 2, 3}, "uint16");
  expectDataError([&] { TokenFile f(p + ".bin"); }, {p + ".json", "cannot open"});
}

TEST_F(TokenData, BadJson) {
  std::string p = prefix("badjson");
  writeBin(p, {1, 2, 3}, "uint16");
  writeText(p + ".json", "{\"format\": \"bmt-tokens\", \"version\": ");
  expectDataError([&] { TokenFile f(p + ".bin"); }, {p + ".json", "JSON"});
  writeText(p + ".json", "[1, 2]");
  expectDataError([&] { TokenFile f(p + ".bin"); }, {p + ".json", "not a JSON object"});
}

TEST_F(TokenData, UnknownFormatVersionDtype) {
  std::string p = prefix("meta");
  writeBin(p, {1, 2, 3, 4}, "uint16");
  writeText(p + ".json", metadata("uint16", 4, 100, "1", "\"numpy\""));
  expectDataError([&] { TokenFile f(p + ".bin"); }, {p + ".json", "format", "numpy"});
  writeText(p + ".json", metadata("uint16", 4, 100, "1", "\"bmt-tokens\"", "3"));
  expectDataError([&] { TokenFile f(p + ".bin"); }, {p + ".json", "version 3"});
  writeText(p + ".json", metadata("int8", 8, 100));
  expectDataError([&] { TokenFile f(p + ".bin"); }, {p + ".json", "dtype", "int8"});
  // Missing and mistyped fields.
  writeText(p + ".json", "{\"format\": \"bmt-tokens\", \"version\": 1, \"dtype\": \"uint16\","
                         " \"vocab_size\": 100, \"eos_id\": 0}");
  expectDataError([&] { TokenFile f(p + ".bin"); }, {p + ".json", "num_tokens"});
  writeText(p + ".json", "{\"format\": \"bmt-tokens\", \"version\": 1, \"dtype\": \"uint16\","
                         " \"num_tokens\": \"4\", \"vocab_size\": 100, \"eos_id\": 0}");
  expectDataError([&] { TokenFile f(p + ".bin"); }, {p + ".json", "num_tokens", "integer"});
}

TEST_F(TokenData, SizeMismatch) {
  std::string p = prefix("size");
  writeBin(p, {1, 2, 3, 4, 5}, "uint16"); // 10 bytes
  writeText(p + ".json", metadata("uint16", 6, 100));
  expectDataError([&] { TokenFile f(p + ".bin"); }, {p + ".bin", "10 bytes", "12 bytes"});
  // The right count but the wrong dtype: 5 uint32 would be 20 bytes.
  writeText(p + ".json", metadata("uint32", 5, 100));
  expectDataError([&] { TokenFile f(p + ".bin"); }, {p + ".bin", "20 bytes"});
}

TEST_F(TokenData, ShorterThanOneSequence) {
  std::string p = writeIota("short", 10);
  TokenFile file(p + ".bin");
  expectDataError([&] { BatchSampler s(file, 2, 10, 0); }, {p + ".bin", "fewer than one sequence"});
  EXPECT_NO_THROW(BatchSampler(file, 2, 9, 0)); // exactly seqLen + 1 tokens
  // 10 tokens in 2 parts: 5 each, too few for seqLen 5.
  expectDataError([&] { BatchSampler s(file, 1, 5, 0, 1, 2); }, {p + ".bin", "part 1 of 2"});
  EXPECT_THROW(BatchSampler(file, 1, 2, 0, 2, 2), std::invalid_argument);
}

TEST_F(TokenData, CheckIdsReportsPositionAndId) {
  std::vector<uint32_t> ids(1000, 5);
  ids[777] = 70000;
  ids[900] = 80000;
  std::string p = writeFile("ids", ids, "uint32", 100000);
  TokenFile file(p + ".bin");
  EXPECT_NO_THROW(file.checkIds(80001));
  expectDataError([&] { file.checkIds(50000); }, {p + ".bin", "70000", "position 777", "50000"});

  std::vector<uint32_t> small(300, 3);
  small[123] = 40000;
  std::string q = writeFile("ids16", small, "uint16", 65536);
  TokenFile file16(q + ".json");
  expectDataError([&] { file16.checkIds(32000); }, {q + ".bin", "40000", "position 123"});
  EXPECT_NO_THROW(file16.checkIds(40001));
}

//===----------------------------------------------------------------------===//
// Sampling
//===----------------------------------------------------------------------===//

TEST_F(TokenData, SamplerIsDeterministicForASeed) {
  std::string p = writeIota("iota", 5000);
  TokenFile file(p + ".bin");
  BatchSampler a(file, 4, 16, 1234), b(file, 4, 16, 1234), c(file, 4, 16, 99);
  bool differs = false;
  for (int i = 0; i < 5; ++i) {
    at::Tensor x = a.next(), y = b.next(), z = c.next();
    EXPECT_EQ(x.sizes(), (std::vector<int64_t>{4, 17}));
    EXPECT_EQ(x.scalar_type(), at::kLong);
    EXPECT_TRUE(x.equal(y));
    differs |= !x.equal(z);
  }
  EXPECT_TRUE(differs);
}

TEST_F(TokenData, SamplerWindowsLieInsideThePart) {
  const int64_t n = 1000, seqLen = 9, window = seqLen + 1;
  std::string p = writeIota("parts", n);
  TokenFile file(p + ".bin");
  for (int64_t part = 0; part < 3; ++part) {
    SCOPED_TRACE("part " + std::to_string(part));
    const int64_t begin = n * part / 3, end = n * (part + 1) / 3; // [0,333) [333,666) [666,1000)
    BatchSampler sampler(file, 8, seqLen, 7 + part, part, 3);
    int64_t lo = n, hi = -1;
    for (int i = 0; i < 200; ++i) {
      std::vector<int64_t> v = values(sampler.next());
      for (int64_t r = 0; r < 8; ++r) {
        const int64_t start = v[r * window];
        for (int64_t j = 0; j < window; ++j)
          ASSERT_EQ(v[r * window + j], start + j) << "not consecutive tokens";
        ASSERT_GE(start, begin);
        ASSERT_LE(start + window, end);
        lo = std::min(lo, start);
        hi = std::max(hi, start);
      }
    }
    // Uniform over the part: both ends are reached (1600 draws, ~330 offsets).
    EXPECT_LT(lo, begin + 10);
    EXPECT_GT(hi, end - window - 10);
  }
}

TEST_F(TokenData, SequentialBatches) {
  const int64_t n = 1000;
  std::string p = writeIota("seq", n);
  TokenFile file(p + ".bin");
  BatchSampler whole(file, 2, 9, 0);
  EXPECT_EQ(whole.numSequentialBatches(), 50); // 100 windows of 10, 2 per batch
  at::Tensor b3 = whole.sequential(3);
  EXPECT_EQ(b3.sizes(), (std::vector<int64_t>{2, 10}));
  std::vector<int64_t> expected(20);
  for (int64_t i = 0; i < 20; ++i)
    expected[i] = 60 + i;
  EXPECT_EQ(values(b3), expected);
  EXPECT_TRUE(whole.sequential(3).equal(b3));
  EXPECT_THROW(whole.sequential(50), std::out_of_range);
  EXPECT_THROW(whole.sequential(-1), std::out_of_range);

  // Part 1 of 3 is [333, 666): 33 windows, 16 batches of 2, from 333 on.
  BatchSampler part(file, 2, 9, 0, 1, 3);
  EXPECT_EQ(part.numSequentialBatches(), 16);
  EXPECT_EQ(values(part.sequential(0))[0], 333);
  std::vector<int64_t> last = values(part.sequential(15));
  EXPECT_EQ(last.front(), 333 + 15 * 20);
  EXPECT_EQ(last.back(), 333 + 16 * 20 - 1);
  EXPECT_LT(last.back(), 666);
}

} // namespace

//===----------------------------------------------------------------------===//
// Version 2: documents and the loss mask; DocumentBatches
//===----------------------------------------------------------------------===//

namespace {

std::vector<int64_t> row(const at::Tensor &t, int64_t r) { return values(t[r]); }

} // namespace

TEST_F(TokenData, ReadsDocumentsAndLossMask) {
  std::string p = writeDocuments("v2", {3, 4, 2}, true, ", \"truncated\": 5");
  TokenFile f(p + ".json");
  EXPECT_EQ(f.version(), 2);
  ASSERT_TRUE(f.hasDocuments());
  EXPECT_EQ(f.numDocuments(), 3);
  EXPECT_EQ(f.documentStart(1), 3);
  EXPECT_EQ(f.documentEnd(1), 7);
  EXPECT_TRUE(f.hasLossMask());
  EXPECT_FALSE(f.isTarget(3)); // document 1: tokens 3..6, mask on 5, 6
  EXPECT_TRUE(f.isTarget(5));
  EXPECT_EQ(f.preparedTruncated(), 5);
  EXPECT_THROW(f.documentStart(3), std::out_of_range);
  TokenFile plain(writeDocuments("plain", {2, 2}, false) + ".bin");
  EXPECT_FALSE(plain.hasLossMask());
  EXPECT_TRUE(plain.isTarget(0));
  TokenFile v1(writeIota("v1", 8));
  EXPECT_FALSE(v1.hasDocuments());
  EXPECT_EQ(v1.numDocuments(), 0);
}

TEST_F(TokenData, BadDocumentsAndMasks) {
  auto offsets = [&](const std::string &p, const std::vector<int64_t> &o) {
    writeText(p + ".docs.bin", std::string(reinterpret_cast<const char *>(o.data()),
                                           o.size() * sizeof(int64_t)));
  };
  std::string p = writeDocuments("bad", {3, 4, 2});
  offsets(p, {1, 3, 7, 9});
  expectDataError([&] { TokenFile f(p); }, {p + ".docs.bin", "first document offset is 1"});
  offsets(p, {0, 3, 7, 8});
  expectDataError([&] { TokenFile f(p); }, {p + ".docs.bin", "not num_tokens 9"});
  offsets(p, {0, 7, 3, 9});
  expectDataError([&] { TokenFile f(p); }, {p + ".docs.bin", "document 1", "increase"});
  offsets(p, {0, 3, 3, 9});
  expectDataError([&] { TokenFile f(p); }, {p + ".docs.bin", "document 1 is empty"});
  offsets(p, {0, 3, 9});
  expectDataError([&] { TokenFile f(p); }, {p + ".docs.bin", "size is 24 bytes", "32 bytes"});
  offsets(p, {0, 3, 7, 9});
  writeText(p + ".mask.bin", std::string("\0\0\1\0\0\1\1\0\3", 9));
  expectDataError([&] { TokenFile f(p); }, {p + ".mask.bin", "value 3 at token 8"});
  writeText(p + ".mask.bin", std::string("\0\1", 2));
  expectDataError([&] { TokenFile f(p); }, {p + ".mask.bin", "size is 2 bytes"});
  fs::remove(p + ".mask.bin");
  expectDataError([&] { TokenFile f(p); }, {p + ".mask.bin", "cannot open the loss mask"});
}

TEST_F(TokenData, PaddedRowsTargetsAndMask) {
  // Documents of 3, 6, 2 tokens; rows of at most 5 (document 1 is cut).
  TokenFile f(writeDocuments("pad", {3, 6, 2}));
  DocumentBatches b(f, SequenceLayout::Padded, 3, 5, 0, /*shuffle=*/false, 0, 1);
  MicroBatch m = b.next();
  EXPECT_TRUE(b.exhausted());
  ASSERT_EQ(m.window.sizes(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(row(m.window, 0), (std::vector<int64_t>{10, 11, 12, 0, 0}));
  EXPECT_EQ(row(m.window, 1), (std::vector<int64_t>{13, 14, 15, 16, 17}));
  EXPECT_EQ(row(m.attentionMask, 0), (std::vector<int64_t>{1, 1, 1, 0, 0}));
  EXPECT_EQ(row(m.targets.to(at::kLong), 0), (std::vector<int64_t>{0, 1, 1, 0, 0}));
  EXPECT_EQ(row(m.targets.to(at::kLong), 1), (std::vector<int64_t>{0, 0, 0, 1, 1}));
  // Document 2 (2 tokens): its first token is never a target.
  EXPECT_EQ(row(m.targets.to(at::kLong), 2), (std::vector<int64_t>{0, 1, 0, 0, 0}));
  EXPECT_FALSE(m.positionIds.defined());
  EXPECT_EQ(m.rowEnd, -1);
  auto [overlong, first] = bmt::runtime::overlongDocuments(f, 5);
  EXPECT_EQ(overlong, 1);
  EXPECT_EQ(first, 1);
}

TEST_F(TokenData, PackedRowsPositions) {
  // 2 + 3 fit a row of 6; 4 does not fit after them and starts the next.
  TokenFile f(writeDocuments("pack", {2, 3, 4, 6}, false));
  DocumentBatches b(f, SequenceLayout::Packed, 2, 6, 0, /*shuffle=*/false, 0, 1);
  MicroBatch m = b.next();
  EXPECT_EQ(row(m.window, 0), (std::vector<int64_t>{10, 11, 12, 13, 14, 0}));
  EXPECT_EQ(row(m.positionIds, 0), (std::vector<int64_t>{0, 1, 0, 1, 2, 0}));
  EXPECT_EQ(row(m.targets.to(at::kLong), 0), (std::vector<int64_t>{0, 1, 0, 1, 1, 0}));
  EXPECT_EQ(row(m.window, 1), (std::vector<int64_t>{15, 16, 17, 18, 0, 0}));
  EXPECT_EQ(row(m.positionIds, 1), (std::vector<int64_t>{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(b.position().documents, 3); // the 6-token one starts the next micro-batch
  MicroBatch n = b.next();
  EXPECT_EQ(n.window.size(0), 1);
  EXPECT_EQ(row(n.positionIds, 0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(b.exhausted());
}

TEST_F(TokenData, DocumentOrderIsTheSameForEveryWorldSize) {
  std::vector<int64_t> lengths;
  for (int i = 0; i < 13; ++i)
    lengths.push_back(2 + (i * 7) % 9);
  TokenFile f(writeDocuments("order", lengths));
  // Epochs are permutations, and differ.
  std::vector<int64_t> e0 = bmt::runtime::documentOrder(13, 5, 0),
                       e1 = bmt::runtime::documentOrder(13, 5, 1);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 13; ++i)
    EXPECT_EQ(sorted[i], i);
  EXPECT_NE(e0, e1);
  for (SequenceLayout layout : {SequenceLayout::Padded, SequenceLayout::Packed}) {
    DocumentBatches one(f, layout, 4, 8, 5, true, 0, 1);
    DocumentBatches r0(f, layout, 2, 8, 5, true, 0, 2), r1(f, layout, 2, 8, 5, true, 1, 2);
    for (int step = 0; step < 9; ++step) { // several epochs
      MicroBatch a = one.next(), b0 = r0.next(), b1 = r1.next();
      EXPECT_TRUE(a.window.equal(b0.window));
      EXPECT_TRUE(a.window.equal(b1.window));
      EXPECT_EQ(b0.rowBegin, 0);
      EXPECT_EQ(b1.rowBegin, 2);
      EXPECT_EQ(b1.rowEnd, 4);
    }
    // seek: the same continuation from a saved position.
    DataPosition saved = one.position();
    MicroBatch want = one.next();
    DocumentBatches again(f, layout, 4, 8, 5, true, 0, 1);
    again.seek(saved);
    EXPECT_TRUE(again.next().window.equal(want.window));
    DataPosition other{"random-windows", "", 0, 0};
    EXPECT_THROW(again.seek(other), std::invalid_argument);
  }
  // Padded, one epoch of micro-batch 13: the rows follow documentOrder.
  DocumentBatches all(f, SequenceLayout::Padded, 13, 16, 5, true, 0, 1);
  MicroBatch m = all.next();
  for (int64_t r = 0; r < 13; ++r)
    EXPECT_EQ(m.window[r][0].item<int64_t>(), 10 + f.documentStart(e0[r]));
}

TEST_F(TokenData, DocumentBatchesNeedDocuments) {
  TokenFile v1(writeIota("v1docs", 32));
  expectDataError(
      [&] { DocumentBatches b(v1, SequenceLayout::Padded, 2, 8, 0, true, 0, 1); },
      {"no document boundaries"});
}
