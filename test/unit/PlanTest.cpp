//===- PlanTest.cpp - plan formats 2-4: shard ranges, groups, archives ----===//
//
// shardRange against the definition (ceil(size / N) per shard, clipped);
// a plan with a storage group through IValue and back; the structural
// checks of fromIValue; an archive written with a group and read back by
// ranges (bytes read, checksums, weights-free init rules); a group split
// into parts (version 4) read back the same by every range; the Hugging
// Face files an archive carries.
//
//===----------------------------------------------------------------------===//

#include "bmt/Plan/Archive.h"
#include "bmt/Plan/Plan.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <caffe2/serialize/inline_container.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace {

using namespace bmt::plan;

TEST(ShardRange, CeilDivisionClippedToTheBuffer) {
  // 10 elements over 3 shards: shard length 4, the last shard holds 2.
  ShardRange r0 = shardRange(10, 0, 3), r1 = shardRange(10, 1, 3), r2 = shardRange(10, 2, 3);
  EXPECT_EQ(r0.shardSize, 4);
  EXPECT_EQ(r0.begin, 0);
  EXPECT_EQ(r0.end, 4);
  EXPECT_EQ(r1.begin, 4);
  EXPECT_EQ(r1.end, 8);
  EXPECT_EQ(r2.begin, 8);
  EXPECT_EQ(r2.end, 10);
  // More shards than elements: the last shards hold nothing.
  ShardRange r3 = shardRange(2, 3, 4);
  EXPECT_EQ(r3.shardSize, 1);
  EXPECT_EQ(r3.begin, 2);
  EXPECT_EQ(r3.end, 2);
  // Every element is in exactly one shard, for many sizes and counts.
  for (int64_t size : {0, 1, 7, 512, 1000})
    for (int64_t n : {1, 2, 3, 4, 8}) {
      int64_t covered = 0, previousEnd = 0;
      for (int64_t r = 0; r < n; ++r) {
        ShardRange s = shardRange(size, r, n);
        EXPECT_EQ(s.begin, previousEnd);
        EXPECT_LE(s.end - s.begin, s.shardSize);
        covered += s.end - s.begin;
        previousEnd = s.end;
      }
      EXPECT_EQ(covered, size);
    }
  EXPECT_THROW(shardRange(10, 3, 3), PlanError);
  EXPECT_THROW(shardRange(10, 0, 0), PlanError);
}

/// Two parameters in one group (at offsets 0 and 8) and a buffer outside.
Plan twoParameterPlan() {
  Plan p;
  p.source = "test";
  p.modelType = "Test";
  p.objective = "causal-lm";
  TensorInfo a;
  a.name = "block.0.weight";
  a.shape = {2, 3};
  a.group = 0;
  TensorInfo b;
  b.name = "block.0.bias";
  b.shape = {3};
  b.group = 0;
  TensorInfo c;
  c.name = "mask";
  c.isParameter = false;
  c.requiresGrad = false;
  c.shape = {4};
  p.tensors = {a, b, c};
  StorageGroup g;
  g.name = "block.0.float32";
  g.members = {0, 1};
  g.offsets = {0, 8};
  g.size = 11;
  g.blockList = "block";
  g.blockIndex = 0;
  p.groups = {g};
  p.zeroStage = 3;
  p.prefetchDepth = 2;
  Function f;
  f.name = "forward";
  f.numRegisters = 1;
  Instruction gather;
  gather.kind = Instruction::Kind::Gather;
  gather.target = 0;
  Instruction global;
  global.kind = Instruction::Kind::Global;
  global.target = 0;
  global.results = {0};
  f.body = {gather, global};
  f.returns = {0};
  p.functions = {f};
  return p;
}

TEST(PlanFormat, StorageGroupsRoundTrip) {
  Plan p = fromIValue(toIValue(twoParameterPlan()));
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0].name, "block.0.float32");
  EXPECT_EQ(p.groups[0].offsets, (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(p.groups[0].size, 11);
  EXPECT_EQ(p.groups[0].blockList, "block");
  EXPECT_EQ(p.zeroStage, 3);
  EXPECT_EQ(p.prefetchDepth, 2);
  EXPECT_EQ(p.tensors[1].group, 0);
  EXPECT_EQ(p.tensors[2].group, -1);
  EXPECT_EQ(p.functions[0].body[0].kind, Instruction::Kind::Gather);
}

TEST(PlanFormat, RejectsMalformedGroups) {
  Plan overlapEnd = twoParameterPlan();
  overlapEnd.groups[0].size = 10; // the bias (3 elements at 8) ends at 11
  EXPECT_THROW(fromIValue(toIValue(overlapEnd)), PlanError);
  Plan badMember = twoParameterPlan();
  badMember.groups[0].members = {0, 7};
  EXPECT_THROW(fromIValue(toIValue(badMember)), PlanError);
  Plan badTarget = twoParameterPlan();
  badTarget.functions[0].body[0].target = 5;
  EXPECT_THROW(fromIValue(toIValue(badTarget)), PlanError);
  Plan badStage = twoParameterPlan();
  badStage.zeroStage = 1;
  EXPECT_THROW(fromIValue(toIValue(badStage)), PlanError);
  Plan badInit = twoParameterPlan();
  badInit.tensors[0].init = "uniform";
  EXPECT_THROW(fromIValue(toIValue(badInit)), PlanError);
}

class ArchiveFile : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/bmt-plantest-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(ArchiveFile, RanksReadOnlyTheirRangeOfAGroup) {
  Plan p = twoParameterPlan();
  at::Tensor weight = at::arange(1, 7, at::kFloat).view({2, 3}); // 1..6
  at::Tensor bias = at::arange(10, 13, at::kFloat);                 // 10, 11, 12
  at::Tensor mask = at::arange(4, at::kFloat);
  std::string path = (dir_ / "a.pt").string();
  writeArchive(path, p, "module {}", [&](size_t i) {
    return std::vector<at::Tensor>{weight, bias, mask}[i];
  });
  EXPECT_EQ(p.groups[0].record, "bmt/weights/group0");
  EXPECT_EQ(p.tensors[1].offset, 8 * 4);

  // The flat buffer: weight, two zeros of padding, bias.
  at::Tensor flat = at::cat({weight.reshape({-1}), at::zeros({2}), bias});
  for (int64_t n : {1, 2, 3}) {
    at::Tensor gathered;
    int64_t total = 0;
    for (int64_t r = 0; r < n; ++r) {
      Archive archive(path);
      ShardRange s = shardRange(11, r, n);
      at::Tensor part = archive.readGroupRange(0, s.begin, s.end);
      EXPECT_EQ(archive.bytesRead(), (s.end - s.begin) * 4) << "rank " << r << " of " << n;
      total += archive.bytesRead();
      gathered = gathered.defined() ? at::cat({gathered, part}) : part;
    }
    EXPECT_TRUE(at::equal(gathered, flat)) << n << " ranks";
    EXPECT_EQ(total, 11 * 4);
  }
  // Whole tensors read from their group record at their offsets.
  Archive archive(path);
  EXPECT_TRUE(at::equal(archive.readTensor(0), weight));
  EXPECT_TRUE(at::equal(archive.readTensor(1), bias));
  EXPECT_TRUE(at::equal(archive.readTensor(2), mask));
  EXPECT_THROW(archive.readGroupRange(0, 5, 12), PlanError);
}

TEST_F(ArchiveFile, AGroupSplitIntoPartsReadsAsOne) {
  // Parts of 3 elements (12 bytes): the group's 11 elements in 4 records,
  // parts cutting both members; the archive is version 4.
  at::Tensor weight = at::arange(1, 7, at::kFloat).view({2, 3});
  at::Tensor bias = at::arange(10, 13, at::kFloat);
  at::Tensor mask = at::arange(4, at::kFloat);
  auto weights = [&](size_t i) { return std::vector<at::Tensor>{weight, bias, mask}[i]; };
  Plan whole = twoParameterPlan(), split = twoParameterPlan();
  std::string wholePath = (dir_ / "whole.pt").string(), splitPath = (dir_ / "split.pt").string();
  writeArchive(wholePath, whole, "module {}", weights);
  WriteStats stats = writeArchive(splitPath, split, "module {}", weights, {}, /*maxGroupRecordBytes=*/12);
  EXPECT_EQ(formatVersionOf(whole), 2);
  EXPECT_EQ(formatVersionOf(split), 4);
  EXPECT_EQ(split.groups[0].record, "");
  EXPECT_EQ(split.groups[0].partSize, 3);
  EXPECT_EQ(split.groups[0].parts,
            (std::vector<std::string>{"bmt/weights/group0.0", "bmt/weights/group0.1",
                                      "bmt/weights/group0.2", "bmt/weights/group0.3"}));
  EXPECT_EQ(stats.weightBytes, (11 + 4) * 4);
  EXPECT_EQ(stats.records, 4 + 1 + 3); // parts, the mask; version, program, plan
  {
    caffe2::serialize::PyTorchStreamReader reader(splitPath);
    auto [data, size] = reader.getRecord("bmt/version");
    EXPECT_EQ(std::string(static_cast<const char *>(data.get()), size), "bmt-sharded 4\n");
    EXPECT_EQ(reader.getRecordSize("bmt/weights/group0.3"), 2u * 4);
  }
  // Every range, read from the parts, equals the range of the whole record,
  // reading exactly its bytes; the checksums are those of the whole tensors.
  Archive a(wholePath), b(splitPath);
  EXPECT_EQ(b.plan().groups[0].parts.size(), 4u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(b.plan().tensors[i].crc32, a.plan().tensors[i].crc32) << i;
  for (int64_t begin = 0; begin <= 11; ++begin)
    for (int64_t end = begin; end <= 11; ++end) {
      int64_t before = b.bytesRead();
      EXPECT_TRUE(at::equal(b.readGroupRange(0, begin, end), a.readGroupRange(0, begin, end)))
          << "[" << begin << ", " << end << ")";
      EXPECT_EQ(b.bytesRead() - before, (end - begin) * 4);
    }
  EXPECT_TRUE(at::equal(b.readTensor(0), weight));
  EXPECT_TRUE(at::equal(b.readTensor(1), bias));
  EXPECT_TRUE(at::equal(b.readTensor(2), mask));
  // A plan whose parts do not cover the group is refused.
  Plan bad = split;
  bad.groups[0].parts.pop_back();
  EXPECT_THROW(fromIValue(toIValue(bad)), PlanError);
}

TEST_F(ArchiveFile, AFailingReaderLeavesNoFile) {
  // The reader fails in the second part of the group (read by the helper
  // thread) and, in another archive, on the tensor outside groups.
  for (size_t failing : {size_t(1), size_t(2)}) {
    Plan p = twoParameterPlan();
    std::string path = (dir_ / "failed.pt").string();
    TensorReader read = [&](size_t i, int64_t, int64_t, at::Tensor &dst) {
      if (i == failing)
        throw PlanError("no bytes for tensor " + std::to_string(i));
      dst.fill_(1.0);
    };
    try {
      writeArchive(path, p, "module {}", read, {}, /*maxGroupRecordBytes=*/12);
      FAIL() << "no error";
    } catch (const PlanError &e) {
      EXPECT_EQ(std::string(e.what()), "no bytes for tensor " + std::to_string(failing));
    }
    EXPECT_TRUE(std::filesystem::is_empty(dir_)) << "tensor " << failing;
  }
}

TEST_F(ArchiveFile, WeightsFreePlanHasNoGroupRecord) {
  Plan p = twoParameterPlan();
  p.tensors[0].init = "normal:0.02";
  p.tensors[1].init = "ones";
  std::string path = (dir_ / "free.pt").string();
  writeArchive(path, p, "module {}", [&](size_t i) -> at::Tensor {
    if (i != 2)
      throw PlanError("weights of a weights-free tensor were asked for");
    return at::arange(4, at::kFloat);
  });
  EXPECT_EQ(p.groups[0].record, "");
  Archive archive(path);
  at::Tensor all = archive.readGroupRange(0, 0, 11);
  EXPECT_EQ(archive.bytesRead(), 0);
  EXPECT_TRUE(at::equal(all.narrow(0, 8, 3), at::ones({3})));
  EXPECT_TRUE(at::equal(all.narrow(0, 6, 2), at::zeros({2}))); // padding
  at::Tensor normal = all.narrow(0, 0, 6);
  EXPECT_GT(normal.abs().max().item<float>(), 0.0f);
  EXPECT_LT(normal.abs().max().item<float>(), 0.2f); // 10 standard deviations
  // Any split into ranges (any number of ranks) gives the same values.
  for (int64_t cut = 1; cut < 11; ++cut) {
    at::Tensor again = at::cat({archive.readGroupRange(0, 0, cut), archive.readGroupRange(0, cut, 11)});
    EXPECT_TRUE(at::equal(again, all)) << "cut at " << cut;
  }
  // Another seed, other values.
  archive.setInitSeed(5);
  EXPECT_FALSE(at::equal(archive.readGroupRange(0, 0, 11), all));
}

TEST_F(ArchiveFile, CorruptGroupBytesAreFound) {
  Plan p = twoParameterPlan();
  std::string path = (dir_ / "c.pt").string();
  writeArchive(path, p, "module {}", [&](size_t i) {
    return std::vector<at::Tensor>{at::ones({2, 3}), at::ones({3}), at::ones({4})}[i];
  });
  // Flip the first byte of the weight (the first record after bmt/version
  // is the group; find the float 1.0f = 00 00 80 3f).
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  size_t at = bytes.find(std::string("\x00\x00\x80\x3f\x00\x00\x80\x3f", 8));
  ASSERT_NE(at, std::string::npos);
  f.seekp(static_cast<std::streamoff>(at));
  f.put('\x01');
  f.close();
  Archive archive(path);
  try {
    archive.readGroupRange(0, 0, 11);
    FAIL() << "no checksum error";
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
  }
}

TEST_F(ArchiveFile, CarriesTheHuggingFaceFilesVerbatim) {
  auto weights = [](size_t i) {
    return std::vector<at::Tensor>{at::ones({2, 3}), at::ones({3}), at::ones({4})}[i];
  };
  Plan p = twoParameterPlan();
  std::string with = (dir_ / "hf.pt").string(), without = (dir_ / "plain.pt").string();
  const std::string config = "{\n  \"model_type\": \"gpt2\"\n}\n";
  writeArchive(with, p, "module {}", weights, {{"config.json", config}});
  writeArchive(without, p, "module {}", weights);
  EXPECT_EQ(Archive(with).hfFiles(), (std::vector<NamedFile>{{"config.json", config}}));
  EXPECT_TRUE(Archive(without).hfFiles().empty());
  // Only the files of kHfFileNames; nothing is written otherwise.
  std::string bad = (dir_ / "bad.pt").string();
  EXPECT_THROW(writeArchive(bad, p, "module {}", weights, {{"tokenizer.json", "{}"}}), PlanError);
  EXPECT_FALSE(std::filesystem::exists(bad));
}

} // namespace
