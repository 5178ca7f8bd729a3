//===- PlanTest.cpp - plan formats 2-6: shard ranges, groups, archives ----===//
//
// shardRange against the definition (ceil(size / N) per shard, clipped);
// a plan with a storage group through IValue and back; the structural
// checks of fromIValue; an archive written with a group and read back by
// ranges (bytes read, checksums, weights-free init rules); a group split
// into parts (version 4) read back the same by every range; the Hugging
// Face files an archive carries; version 6 (tensor parallelism) through
// IValue and back, its refusals, and the TP slicing rule.
//
//===----------------------------------------------------------------------===//

#include "bmt/Plan/Archive.h"
#include "bmt/Plan/Plan.h"

#include <ATen/ops/arange.h>
#include <cmath>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <tuple>

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

TEST(PlanFormat, FrozenGroupsRoundTripAndAreChecked) {
  // A frozen group makes a version 9 plan; its members must be frozen
  // parameters, a trainable group's trainable ones.
  Plan p = twoParameterPlan();
  EXPECT_LT(formatVersionOf(p), 9);
  EXPECT_FALSE(toIValue(p).toGenericDict().at("groups").toList().get(0).toGenericDict().contains(
      "frozen"));
  p.tensors[0].requiresGrad = p.tensors[1].requiresGrad = false;
  EXPECT_THROW(fromIValue(toIValue(p)), PlanError); // frozen members, trainable group
  p.groups[0].frozen = true;
  EXPECT_EQ(formatVersionOf(p), 9);
  Plan back = fromIValue(toIValue(p));
  EXPECT_EQ(back.version, 9);
  EXPECT_TRUE(back.groups[0].frozen);
  p.tensors[1].requiresGrad = true;
  try {
    fromIValue(toIValue(p));
    ADD_FAILURE() << "accepted a trainable parameter in a frozen group";
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find("(frozen) holds block.0.bias, a trainable parameter"),
              std::string::npos)
        << e.what();
  }
  // Written as version 8 (frozen dropped): the frozen members are refused,
  // not trained.
  p.tensors[1].requiresGrad = false;
  c10::IValue v = toIValue(p);
  v.toGenericDict().insert_or_assign("version", int64_t(8));
  EXPECT_THROW(fromIValue(v), PlanError);
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

/// twoParameterPlan with tensor parallelism T = 2: the weight [2, 3] split
/// along dim 1 padded to 4 (local [2, 2]), the bias replicated with
/// reduce_grad, the group in two copies of local size 4 + 3; a TpCopy, a
/// TpAllReduce and a TpRank in the body; vocab-parallel logits.
Plan tensorParallelPlan() {
  Plan p = twoParameterPlan();
  p.tensorParallel = 2;
  p.vocabParallel = true;
  p.vocabSize = 3;
  p.tensors[0].split.dim = 1;
  p.tensors[0].split.paddedSize = 4;
  p.tensors[1].split.reduceGrad = true;
  p.groups[0].offsets = {0, 4};
  p.groups[0].size = 7;
  p.groups[0].tpRank = 0;
  p.groups[0].crc32s = {11, 12};
  StorageGroup copy = p.groups[0];
  copy.tpRank = 1;
  copy.crc32s = {21, 22};
  p.groups.push_back(copy);
  Function &f = p.functions[0];
  f.numRegisters = 4;
  f.resultNames = {"logits"};
  auto tp = [](Instruction::Kind kind, std::vector<Arg> args, int64_t result) {
    Instruction inst;
    inst.kind = kind;
    inst.args = std::move(args);
    inst.results = {result};
    return inst;
  };
  f.body.push_back(tp(Instruction::Kind::TpCopy, {Arg::ofRegister(0)}, 1));
  f.body.push_back(tp(Instruction::Kind::TpAllReduce, {Arg::ofRegister(1)}, 2));
  f.body.push_back(tp(Instruction::Kind::TpRank, {}, 3));
  f.returns = {2};
  return p;
}

/// twoParameterPlan with a MoE layer's dispatch and combine.
Plan moePlan() {
  Plan p = twoParameterPlan();
  Function &f = p.functions[0];
  f.numRegisters = 9;
  f.params = {1, 2, 3};
  f.returns = {8};
  Instruction dispatch;
  dispatch.kind = Instruction::Kind::MoeDispatch;
  dispatch.op = "8";
  dispatch.args = {Arg::ofRegister(1), Arg::ofRegister(2)};
  dispatch.results = {4, 5, 6, 7};
  Instruction combine;
  combine.kind = Instruction::Kind::MoeCombine;
  combine.args = {Arg::ofRegister(4), Arg::ofRegister(7), Arg::ofRegister(3)};
  combine.results = {8};
  f.body.push_back(dispatch);
  f.body.push_back(combine);
  return p;
}

/// fromIValue(v) throws a PlanError whose message holds `what`.
void expectRefused(const c10::IValue &v, const std::string &what) {
  try {
    fromIValue(v);
    ADD_FAILURE() << "accepted a plan that should name " << what;
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(PlanFormat, MoeInstructionsRoundTripAtVersion7) {
  EXPECT_EQ(formatVersionOf(twoParameterPlan()), 2);
  Plan p = fromIValue(toIValue(moePlan()));
  EXPECT_EQ(p.version, 7);
  const std::vector<Instruction> &body = p.functions[0].body;
  ASSERT_EQ(body.size(), 4u);
  EXPECT_EQ(body[2].kind, Instruction::Kind::MoeDispatch);
  EXPECT_EQ(body[2].op, "8");
  EXPECT_EQ(body[2].results, (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(body[3].kind, Instruction::Kind::MoeCombine);
  EXPECT_EQ(body[3].args.size(), 3u);
  EXPECT_EQ(body[3].args[2].reg, 3);

  Plan bad = moePlan();
  bad.functions[0].body[2].op = "0";
  expectRefused(toIValue(bad), "moe_dispatch");
  bad = moePlan();
  bad.functions[0].body[2].results.pop_back();
  expectRefused(toIValue(bad), "moe_dispatch");
  bad = moePlan();
  bad.functions[0].body[3].args.pop_back();
  expectRefused(toIValue(bad), "moe_combine");
  // A MoE instruction in a plan that says version 6 (an older writer), and
  // a version 7 plan for a reader of 6 at most: one clear error each.
  c10::IValue v = toIValue(moePlan());
  v.toGenericDict().insert_or_assign("version", int64_t(6));
  expectRefused(v, "version 6");
  EXPECT_EQ(kPlanFormatVersion, 11);
}

/// base = register 0, x = 1, A = 2, B = 3; result 4.
Plan loraPlan(double scale = 2.0, double dropout = 0.05) {
  Plan p = twoParameterPlan();
  Function &f = p.functions[0];
  f.numRegisters = 5;
  Instruction adapter;
  adapter.kind = Instruction::Kind::LoraAdapter;
  adapter.args = {Arg::ofRegister(0), Arg::ofRegister(1), Arg::ofRegister(2), Arg::ofRegister(3),
                  Arg::ofConstant(scale), Arg::ofConstant(dropout), Arg::ofConstant(int64_t(1))};
  adapter.results = {4};
  f.body.push_back(adapter);
  return p;
}

TEST(PlanFormat, LoraAdapterRoundTripsAtVersion11AndIsChecked) {
  Plan p = fromIValue(toIValue(loraPlan()));
  EXPECT_EQ(p.version, 11);
  const Instruction &adapter = p.functions[0].body.back();
  EXPECT_EQ(adapter.kind, Instruction::Kind::LoraAdapter);
  ASSERT_EQ(adapter.args.size(), 7u);
  EXPECT_EQ(adapter.args[6].constant.toInt(), 1);
  EXPECT_EQ(adapter.args[3].reg, 3);
  EXPECT_EQ(adapter.args[4].constant.toDouble(), 2.0);
  EXPECT_EQ(adapter.args[5].constant.toDouble(), 0.05);
  expectRefused(toIValue(loraPlan(2.0, 1.0)), "malformed lora_adapter");
  expectRefused(toIValue(loraPlan(std::nan(""), 0.0)), "malformed lora_adapter");
  Plan bad = loraPlan();
  bad.functions[0].body.back().args.pop_back();
  expectRefused(toIValue(bad), "malformed lora_adapter");
  bad = loraPlan();
  bad.functions[0].body.back().args[6] = Arg::ofConstant(int64_t(2)); // T = 1
  expectRefused(toIValue(bad), "malformed lora_adapter");
  c10::IValue v = toIValue(loraPlan());
  v.toGenericDict().insert_or_assign("version", int64_t(10));
  expectRefused(v, "lora_adapter instruction in a version 10 plan");
}

TEST(PlanFormat, PipelineStagesRoundTripAndAreChecked) {
  // Stages make a version 8 plan; a plan without them stays at its version
  // and has no `pipeline` field.
  Plan p = twoParameterPlan();
  EXPECT_LT(formatVersionOf(p), 8);
  EXPECT_FALSE(toIValue(p).toGenericDict().contains("pipeline"));
  p.pipelineStages = 2;
  p.pipelineBlockList = "h";
  p.pipelineFirstBlocks = {0, 3};
  EXPECT_EQ(formatVersionOf(p), 8);
  Plan back = fromIValue(toIValue(p));
  EXPECT_EQ(back.version, 8);
  EXPECT_EQ(back.pipelineStages, 2);
  EXPECT_EQ(back.pipelineBlockList, "h");
  EXPECT_EQ(back.pipelineFirstBlocks, (std::vector<int64_t>{0, 3}));
  auto refused = [](const Plan &bad) {
    try {
      fromIValue(toIValue(bad));
      ADD_FAILURE() << "accepted a malformed pipeline";
    } catch (const PlanError &e) {
      EXPECT_NE(std::string(e.what()).find("plan: pipeline of"), std::string::npos) << e.what();
    }
  };
  Plan bad = p;
  bad.pipelineFirstBlocks = {0}; // one first block for two stages
  refused(bad);
  bad = p;
  bad.pipelineFirstBlocks = {1, 3}; // stage 0 must start at block 0
  refused(bad);
  bad = p;
  bad.pipelineFirstBlocks = {0, 0}; // an empty stage
  refused(bad);
  // Written as version 7 by an older writer: refused, not ignored.
  c10::IValue v = toIValue(p);
  v.toGenericDict().insert_or_assign("version", int64_t(7));
  try {
    fromIValue(v);
    ADD_FAILURE() << "accepted pipeline stages in a version 7 plan";
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find("version 8"), std::string::npos) << e.what();
  }
  // Virtual stages (V = 2): one first block per chunk, a version 10 plan;
  // P first blocks with V = 2 are refused, and so is V in a version 9 plan.
  p.pipelineVirtualStages = 2;
  p.pipelineFirstBlocks = {0, 1, 2, 3};
  EXPECT_EQ(formatVersionOf(p), 10);
  back = fromIValue(toIValue(p));
  EXPECT_EQ(back.version, 10);
  EXPECT_EQ(back.pipelineVirtualStages, 2);
  EXPECT_EQ(back.pipelineFirstBlocks, (std::vector<int64_t>{0, 1, 2, 3}));
  bad = p;
  bad.pipelineFirstBlocks = {0, 3};
  refused(bad);
  v = toIValue(p);
  v.toGenericDict().insert_or_assign("version", int64_t(9));
  try {
    fromIValue(v);
    ADD_FAILURE() << "accepted virtual stages in a version 9 plan";
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find("version 10"), std::string::npos) << e.what();
  }
}

TEST(PlanFormat, ExpertParallelismRoundTripsAndIsChecked) {
  // The weighted dispatch (routing weights third, routed weights fifth)
  // and expert_parallel; a plan without them has no such field.
  Plan p = moePlan();
  p.functions[0].numRegisters = 11;
  p.functions[0].params = {1, 2, 3, 9};
  p.functions[0].body[2].args.push_back(Arg::ofRegister(9));
  p.functions[0].body[2].results.push_back(10);
  p.expertParallel = 2;
  Plan back = fromIValue(toIValue(p));
  EXPECT_EQ(back.expertParallel, 2);
  EXPECT_EQ(back.functions[0].body[2].args.size(), 3u);
  EXPECT_EQ(back.functions[0].body[2].results, (std::vector<int64_t>{4, 5, 6, 7, 10}));
  EXPECT_FALSE(toIValue(moePlan()).toGenericDict().contains("expert_parallel"));
  EXPECT_EQ(fromIValue(toIValue(moePlan())).expertParallel, 1);
  auto refused = [](const Plan &bad, const std::string &what) {
    try {
      fromIValue(toIValue(bad));
      ADD_FAILURE() << "accepted a plan that should name " << what;
    } catch (const PlanError &e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Plan bad = p;
  bad.functions[0].body[2].results.pop_back(); // weights without routed weights
  refused(bad, "malformed moe_dispatch");
  // expert_parallel present must be at least 2 (and T 1, version 7).
  c10::IValue v = toIValue(p);
  v.toGenericDict().insert_or_assign("expert_parallel", int64_t(1));
  try {
    fromIValue(v);
    ADD_FAILURE() << "accepted expert_parallel 1";
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find("expert_parallel 1"), std::string::npos) << e.what();
  }
}

void expectRefused(const Plan &p, const std::string &field);

/// twoParameterPlan with expert parallelism E = 2: the weight [2, 3] is
/// an expert parameter (2 experts) split over the expert group, alone in
/// storage group copies of ep_rank 0 and 1 of local size 3 ([1, 3]); the
/// bias stays in the dense group.
Plan expertSplitPlan() {
  Plan p = twoParameterPlan();
  p.expertParallel = 2;
  p.tensors[0].split = bmt::expertSplit();
  p.tensors[0].group = 1;
  p.groups[0].members = {1};
  p.groups[0].offsets = {0};
  p.groups[0].size = 3;
  StorageGroup experts;
  experts.name = "block.0.experts.float32";
  experts.members = {0};
  experts.offsets = {0};
  experts.size = 3;
  experts.blockList = "block";
  experts.blockIndex = 0;
  experts.epRank = 0;
  p.groups.push_back(experts);
  experts.epRank = 1;
  p.groups.push_back(experts);
  return p;
}

TEST(PlanFormat, ExpertSplitsRoundTripAtVersion8) {
  EXPECT_EQ(formatVersionOf(expertSplitPlan()), 8);
  c10::IValue v = toIValue(expertSplitPlan());
  c10::impl::GenericDict weight = v.toGenericDict().at("tensors").toListRef()[0].toGenericDict();
  EXPECT_EQ(weight.at("split").toGenericDict().at("over").toStringRef(), "expert");
  Plan p = fromIValue(v);
  EXPECT_EQ(p.version, 8);
  EXPECT_TRUE(p.splitsExperts());
  EXPECT_TRUE(p.tensors[0].split.isExpertSplit());
  EXPECT_FALSE(p.tensors[0].split.isTensorSplit());
  EXPECT_TRUE(p.tensors[1].split.isDefault());
  EXPECT_EQ(p.groups[0].epRank, -1);
  EXPECT_EQ(p.groups[2].epRank, 1);
  EXPECT_EQ(p.epGroup(1, 1), 2);
  EXPECT_EQ(p.epGroup(0, 1), 0); // a dense group has one copy
  // A rank's slice: experts [p*X/E, (p+1)*X/E); no TP slice.
  EXPECT_EQ(p.tensors[0].localShape(1, 2), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(p.tensors[0].localShape(2), (std::vector<int64_t>{2, 3}));
  // A tensor-parallel plan stays version 6, its splits over the TP group.
  Plan tp = fromIValue(toIValue(tensorParallelPlan()));
  EXPECT_TRUE(tp.tensors[0].split.isTensorSplit());
  EXPECT_FALSE(toIValue(tensorParallelPlan()).toGenericDict().at("tensors").toListRef()[0]
                   .toGenericDict().at("split").toGenericDict().contains("over"));
}

TEST(PlanFormat, RejectsInconsistentExpertSplits) {
  Plan p = expertSplitPlan();
  p.expertParallel = 1;
  expectRefused(p, "expert_parallel is 1");
  p = expertSplitPlan();
  p.expertParallel = 3; // 2 experts over 3 ranks (and 2 copies)
  p.groups.back().epRank = 2;
  expectRefused(p, "expert_parallel (3)");
  p = expertSplitPlan();
  p.tensors[0].split.dim = 1;
  expectRefused(p, "dim 0");
  p = expertSplitPlan();
  p.tensors[0].split.chunks = 2;
  expectRefused(p, "chunks 1");
  p = expertSplitPlan();
  p.tensors[2].split = bmt::expertSplit(); // the buffer [4]
  expectRefused(p, "buffer");
  p = expertSplitPlan();
  p.groups.pop_back(); // one copy for E = 2
  expectRefused(p, "ep_rank copies");
  p = expertSplitPlan();
  p.groups[2].epRank = 0; // two copies of position 0
  expectRefused(p, "ep_rank");
  p = expertSplitPlan();
  p.groups[2].size = 4; // the copies differ
  expectRefused(p, "differ");
  p = expertSplitPlan();
  p.groups[1].size = 2; // the local [1, 3] does not fit
  p.groups[2].size = 2;
  expectRefused(p, "does not fit");
  p = expertSplitPlan();
  p.tensors[0].group = 2; // names the ep_rank 1 copy
  expectRefused(p, "ep_rank 0 copy");
  p = expertSplitPlan();
  p.tensors[0].group = 0; // in the dense group
  p.groups[0].members = {0, 1};
  p.groups[0].offsets = {0, 8};
  p.groups[0].size = 11;
  p.groups.resize(1);
  expectRefused(p, "ep_rank 0 copy");
  p = expertSplitPlan();
  p.groups[0].epRank = 0; // a dense member in an ep_rank copy
  expectRefused(p, "ep_rank");
  p = expertSplitPlan();
  p.functions[0].body[0].target = 2; // a gather of the ep_rank 1 copy
  expectRefused(p, "ep_rank");
  // "over" is version 8's: in an older plan, or an unknown group, refused.
  c10::IValue v = toIValue(tensorParallelPlan());
  v.toGenericDict().at("tensors").toListRef()[0].toGenericDict().at("split").toGenericDict()
      .insert_or_assign("over", std::string("expert"));
  try {
    fromIValue(v);
    ADD_FAILURE() << "accepted an expert split in a version 6 plan";
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find("version 6"), std::string::npos) << e.what();
  }
  v = toIValue(expertSplitPlan());
  v.toGenericDict().at("tensors").toListRef()[0].toGenericDict().at("split").toGenericDict()
      .insert_or_assign("over", std::string("pipeline"));
  try {
    fromIValue(v);
    ADD_FAILURE() << "accepted a split over 'pipeline'";
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find("'pipeline'"), std::string::npos) << e.what();
  }
}

TEST(PlanFormat, TensorParallelRoundTrip) {
  Plan p = fromIValue(toIValue(tensorParallelPlan()));
  EXPECT_EQ(p.version, 6);
  EXPECT_EQ(p.tensorParallel, 2);
  EXPECT_TRUE(p.vocabParallel);
  EXPECT_EQ(p.vocabSize, 3);
  EXPECT_EQ(p.tensors[0].split.dim, 1);
  EXPECT_EQ(p.tensors[0].split.chunks, 1);
  EXPECT_EQ(p.tensors[0].split.paddedSize, 4);
  EXPECT_FALSE(p.tensors[0].split.reduceGrad);
  EXPECT_TRUE(p.tensors[1].split.reduceGrad);
  EXPECT_EQ(p.tensors[1].split.dim, -1);
  EXPECT_TRUE(p.tensors[2].split.isDefault());
  EXPECT_EQ(p.tensors[0].localShape(2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(p.tensors[1].localShape(2), (std::vector<int64_t>{3}));
  ASSERT_EQ(p.groups.size(), 2u);
  EXPECT_EQ(p.groups[0].tpRank, 0);
  EXPECT_EQ(p.groups[1].tpRank, 1);
  EXPECT_EQ(p.groups[1].crc32s, (std::vector<int64_t>{21, 22}));
  EXPECT_EQ(p.tpGroup(0, 0), 0);
  EXPECT_EQ(p.tpGroup(0, 1), 1);
  const std::vector<Instruction> &body = p.functions[0].body;
  ASSERT_EQ(body.size(), 5u);
  EXPECT_EQ(body[2].kind, Instruction::Kind::TpCopy);
  EXPECT_EQ(body[3].kind, Instruction::Kind::TpAllReduce);
  EXPECT_EQ(body[3].args[0].reg, 1);
  EXPECT_EQ(body[4].kind, Instruction::Kind::TpRank);
  EXPECT_EQ(body[4].results, (std::vector<int64_t>{3}));
  // Any one tensor-parallel field alone makes the plan version 6.
  Plan one = twoParameterPlan();
  one.tensors[2].split.dim = 0;
  EXPECT_EQ(formatVersionOf(one), 6);
}

TEST(PlanFormat, WithoutTensorParallelismThePlanIsUnchanged) {
  // T == 1: version 2 and none of the version 6 keys, so older readers
  // read it and the pickled bytes are those of before.
  Plan p = twoParameterPlan();
  EXPECT_EQ(formatVersionOf(p), 2);
  c10::IValue v = toIValue(p);
  c10::impl::GenericDict root = v.toGenericDict();
  for (const char *key : {"tensor_parallel", "vocab_parallel", "vocab_size"})
    EXPECT_FALSE(root.contains(key)) << key;
  for (const c10::IValue &t : root.at("tensors").toListRef())
    EXPECT_FALSE(t.toGenericDict().contains("split"));
  for (const c10::IValue &g : root.at("groups").toListRef())
    EXPECT_FALSE(g.toGenericDict().contains("tp_rank"));
  Plan back = fromIValue(v);
  EXPECT_EQ(back.tensorParallel, 1);
  EXPECT_FALSE(back.vocabParallel);
  EXPECT_EQ(back.groups[0].tpRank, -1);
}

/// fromIValue(toIValue(p)) throws PlanError with `field` in its message.
void expectRefused(const Plan &p, const std::string &field) {
  try {
    fromIValue(toIValue(p));
    ADD_FAILURE() << "no error for a bad " << field;
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(PlanFormat, RejectsInconsistentTensorParallelFields) {
  Plan p = tensorParallelPlan();
  p.tensorParallel = 0;
  expectRefused(p, "tensor_parallel");
  p = tensorParallelPlan();
  p.tensors[0].split.dim = 2; // a 2-d tensor
  expectRefused(p, "split dim");
  p = tensorParallelPlan();
  p.tensors[0].split.paddedSize = 2; // below shape[1] = 3
  expectRefused(p, "padded_size");
  p = tensorParallelPlan();
  p.tensors[0].split.paddedSize = 0; // 3 columns over 2 ranks
  expectRefused(p, "tensor_parallel (2)");
  p = tensorParallelPlan();
  p.tensors[0].split.chunks = 0;
  expectRefused(p, "chunks");
  p = tensorParallelPlan();
  p.tensors[2].split.chunks = 3; // without a dim
  expectRefused(p, "chunks");
  p = tensorParallelPlan();
  p.tensors[0].split.reduceGrad = true; // split and reduce_grad
  expectRefused(p, "reduce_grad");
  p = tensorParallelPlan();
  p.groups[1].tpRank = 0; // two copies of rank 0
  expectRefused(p, "tp_rank");
  p = tensorParallelPlan();
  p.groups[1].tpRank = 2;
  expectRefused(p, "tp_rank");
  p = tensorParallelPlan();
  p.groups.pop_back(); // one copy for T = 2
  expectRefused(p, "tp_rank copies");
  p = tensorParallelPlan();
  p.groups[1].size = 8;
  expectRefused(p, "tp_rank copies differ");
  p = tensorParallelPlan();
  p.groups[1].crc32s = {1};
  expectRefused(p, "crc32s");
  p = tensorParallelPlan();
  p.tensors[0].group = 1; // the tp_rank 1 copy
  expectRefused(p, "tp_rank 0");
  p = tensorParallelPlan();
  p.functions[0].body[0].target = 1; // a gather of the tp_rank 1 copy
  expectRefused(p, "tp_rank 0");
  p = tensorParallelPlan();
  p.vocabSize = 0;
  expectRefused(p, "vocab_size");
  p = tensorParallelPlan();
  p.vocabParallel = false; // vocab_size without vocab_parallel
  expectRefused(p, "vocab_size");
  p = tensorParallelPlan();
  p.functions[0].resultNames = {"hidden"};
  expectRefused(p, "logits");
  p = tensorParallelPlan();
  p.functions[0].body[3].args.clear();
  expectRefused(p, "tp_all_reduce");
  p = tensorParallelPlan();
  p.functions[0].body[4].args = {Arg::ofRegister(0)};
  expectRefused(p, "tp_rank");
  p = tensorParallelPlan();
  p.functions[0].body[3].kind = Instruction::Kind::TpAllGather;
  p.functions[0].body[3].op = "x";
  expectRefused(p, "decimal");
  // T == 1 with a group copy.
  p = twoParameterPlan();
  p.groups[0].tpRank = 0;
  expectRefused(p, "tp_rank");
  // A Tp instruction in a plan that says version 5 (older writer).
  c10::IValue v = toIValue(tensorParallelPlan());
  v.toGenericDict().insert_or_assign("version", int64_t(5));
  try {
    fromIValue(v);
    ADD_FAILURE() << "a version 5 plan with tp instructions";
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find("version 5"), std::string::npos) << e.what();
  }
}

TEST(TpSlice, MatchesTheContractsRule) {
  // [2, 12] split along dim 1 into 3 chunks (a fused QKV) over T = 2: rank t
  // holds columns [4c + 2t, 4c + 2t + 2) of each chunk c.
  at::Tensor global = at::arange(24, at::kFloat).view({2, 12});
  TensorSplit qkv;
  qkv.dim = 1;
  qkv.chunks = 3;
  for (int64_t t = 0; t < 2; ++t) {
    std::vector<at::Tensor> expected;
    for (int64_t c = 0; c < 3; ++c)
      expected.push_back(global.narrow(1, 4 * c + 2 * t, 2));
    EXPECT_TRUE(at::equal(tpSlice(global, qkv, 2, t), at::cat(expected, 1))) << t;
  }
  // Vocab padding: [5, 2] padded to 8 rows over T = 4; rank 2 holds rows
  // 4 (real) and 5 (zeros), rank 3 only zeros.
  at::Tensor vocab = at::arange(10, at::kFloat).view({5, 2});
  TensorSplit pad;
  pad.dim = 0;
  pad.paddedSize = 8;
  EXPECT_TRUE(at::equal(tpSlice(vocab, pad, 4, 0), vocab.narrow(0, 0, 2)));
  EXPECT_TRUE(at::equal(tpSlice(vocab, pad, 4, 2),
                        at::cat({vocab.narrow(0, 4, 1), at::zeros({1, 2})})));
  EXPECT_TRUE(at::equal(tpSlice(vocab, pad, 4, 3), at::zeros({2, 2})));
  // tpUnslice puts the slices back together (padding dropped).
  for (auto [tensor, split, ranks] :
       {std::tuple{global, qkv, int64_t(2)}, std::tuple{vocab, pad, int64_t(4)}}) {
    std::vector<at::Tensor> slices;
    for (int64_t t = 0; t < ranks; ++t)
      slices.push_back(tpSlice(tensor, split, ranks, t));
    EXPECT_TRUE(at::equal(tpUnslice(slices, split, tensor.sizes().vec()), tensor));
  }
  // Replicated: the tensor itself; a split that does not fit: refused.
  EXPECT_TRUE(at::equal(tpSlice(global, TensorSplit{}, 2, 1), global));
  TensorSplit odd;
  odd.dim = 0;
  EXPECT_THROW(tpSlice(vocab, odd, 2, 0), PlanError);
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
      // 44 bytes: one checksummed chunk (64 bytes at least), read whole.
      EXPECT_EQ(archive.bytesRead(), s.end > s.begin ? 11 * 4 : 0) << "rank " << r << " of " << n;
      total += archive.bytesRead();
      gathered = gathered.defined() ? at::cat({gathered, part}) : part;
    }
    EXPECT_TRUE(at::equal(gathered, flat)) << n << " ranks";
    EXPECT_EQ(total, 11 * 4 * n);
  }
  // Whole tensors read from their group record at their offsets.
  Archive archive(path);
  EXPECT_TRUE(at::equal(archive.readTensor(0), weight));
  EXPECT_TRUE(at::equal(archive.readTensor(1), bias));
  EXPECT_TRUE(at::equal(archive.readTensor(2), mask));
  EXPECT_THROW(archive.readGroupRange(0, 5, 12), PlanError);
}

TEST_F(ArchiveFile, ExpertSplitCopiesHoldTheirPositionsExperts) {
  // Expert parallelism E = 2: the ep_rank p copy of the experts' group
  // holds expert p of the weight [2, 3]; the weight names the ep_rank 0
  // copy.
  Plan p = expertSplitPlan();
  at::Tensor weight = at::arange(1, 7, at::kFloat).view({2, 3});
  at::Tensor bias = at::arange(10, 13, at::kFloat);
  at::Tensor mask = at::arange(4, at::kFloat);
  std::string path = (dir_ / "experts.pt").string();
  writeArchive(path, p, "module {}", [&](size_t i) {
    return std::vector<at::Tensor>{weight, bias, mask}[i];
  });
  EXPECT_EQ(p.tensors[0].record, "bmt/weights/group1");
  caffe2::serialize::PyTorchStreamReader reader(path);
  for (int64_t e : {0, 1}) {
    auto [data, size] = reader.getRecord("bmt/weights/group" + std::to_string(1 + e));
    ASSERT_EQ(size, 3u * 4);
    at::Tensor got = at::from_blob(data.get(), {3}, at::kFloat).clone();
    EXPECT_TRUE(at::equal(got, weight[e])) << "ep_rank " << e;
  }
  // Read back: each copy's range, and the whole tensor from all copies.
  Archive archive(path);
  EXPECT_TRUE(at::equal(archive.readGroupRange(2, 0, 3), weight[1]));
  EXPECT_TRUE(at::equal(archive.readTensor(0), weight));
  EXPECT_TRUE(at::equal(archive.readTensor(1), bias));
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
  // reading the one checksummed chunk (the whole buffer, chunks span the
  // parts); the checksums are those of the whole tensors.
  Archive a(wholePath), b(splitPath);
  EXPECT_EQ(b.plan().groups[0].parts.size(), 4u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(b.plan().tensors[i].crc32, a.plan().tensors[i].crc32) << i;
  EXPECT_EQ(b.plan().groups[0].chunkBytes, 64);
  EXPECT_EQ(b.plan().groups[0].chunkCrc32s, a.plan().groups[0].chunkCrc32s);
  for (int64_t begin = 0; begin <= 11; ++begin)
    for (int64_t end = begin; end <= 11; ++end) {
      int64_t before = b.bytesRead();
      EXPECT_TRUE(at::equal(b.readGroupRange(0, begin, end), a.readGroupRange(0, begin, end)))
          << "[" << begin << ", " << end << ")";
      EXPECT_EQ(b.bytesRead() - before, end > begin ? 11 * 4 : 0);
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

/// twoParameterPlan with a weight of 50 x 40 and a bias of 40 at element
/// 2000: a group of 8160 bytes, 128 chunks of 64 bytes.
Plan largerPlan() {
  Plan p = twoParameterPlan();
  p.tensors[0].shape = {50, 40};
  p.tensors[1].shape = {40};
  p.groups[0].offsets = {0, 2000};
  p.groups[0].size = 2040;
  return p;
}

/// Writes largerPlan's archive to `path` and flips byte `at` of its
/// group's buffer in the file.
void writeWithFlippedByte(const std::string &path, Plan &p, int64_t at) {
  writeArchive(path, p, "module {}", [](size_t i) {
    return std::vector<at::Tensor>{at::arange(1, 2001, at::kFloat).view({50, 40}),
                                   at::arange(40, at::kFloat), at::ones({4})}[i];
  });
  int64_t start = 0;
  {
    caffe2::serialize::PyTorchStreamReader reader(path);
    start = static_cast<int64_t>(reader.getRecordOffset("bmt/weights/group0"));
  }
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(start + at);
  char byte = static_cast<char>(f.get());
  f.seekp(start + at);
  f.put(static_cast<char>(byte ^ 0x10));
}

TEST_F(ArchiveFile, EveryByteARankReadsIsCheckedByItsChunk) {
  // Byte 4100 of the buffer (the weight, chunk 64 of 128) flipped: of 3
  // ranks (2720 bytes each), rank 1 reads it and finds it; ranks 0 and 2
  // read only their ranges' chunks, which do not hold it.
  Plan p = largerPlan();
  std::string path = (dir_ / "chunks.pt").string();
  writeWithFlippedByte(path, p, 4100);
  EXPECT_EQ(p.groups[0].chunkBytes, 64);
  EXPECT_EQ(p.groups[0].chunkCrc32s.size(), 128u);
  for (int64_t r = 0; r < 3; ++r) {
    Archive archive(path);
    ShardRange s = shardRange(2040, r, 3);
    if (r != 1) {
      archive.readGroupRange(0, s.begin, s.end);
      // Its range, widened to whole chunks: at most a chunk more at each end.
      EXPECT_LE(archive.bytesRead(), (s.end - s.begin) * 4 + 2 * 64) << "rank " << r;
      continue;
    }
    try {
      archive.readGroupRange(0, s.begin, s.end);
      FAIL() << "no checksum error";
    } catch (const PlanError &e) {
      std::string what = e.what();
      EXPECT_NE(what.find(path + ": corrupt record bmt/weights/group0 of storage group "
                                 "block.0.float32 (chunk 64 of 128, bytes [4096, 4160) of its "
                                 "buffer, holding block.0.weight): checksum mismatch"),
                std::string::npos)
          << what;
    }
  }
  // A range that ends just before the flipped byte's chunk reads clean.
  Archive archive(path);
  EXPECT_NO_THROW(archive.readGroupRange(0, 1000, 1024));
  EXPECT_THROW(archive.readGroupRange(0, 1000, 1025), PlanError);
}

TEST_F(ArchiveFile, AnArchiveWithoutChunkChecksumsReadsTheMembersItTouchesWhole) {
  // The same archive as written before chunk checksums (its plan without
  // them): a range reads every member it touches whole and checks it.
  Plan p = largerPlan();
  std::string path = (dir_ / "new.pt").string(), old = (dir_ / "old.pt").string();
  writeWithFlippedByte(path, p, 4100);
  {
    caffe2::serialize::PyTorchStreamReader reader(path);
    caffe2::serialize::PyTorchStreamWriter writer(old);
    for (const std::string &name : reader.getAllRecords()) {
      if (name.rfind("bmt/", 0) != 0)
        continue;
      auto [data, size] = reader.getRecord(name);
      if (name != "bmt/plan.pkl") {
        writer.writeRecord(name, data.get(), size);
        continue;
      }
      Plan plan = fromIValue(torch::jit::pickle_load(
          std::vector<char>(static_cast<char *>(data.get()), static_cast<char *>(data.get()) + size)));
      plan.groups[0].chunkBytes = 0;
      plan.groups[0].chunkCrc32s.clear();
      std::vector<char> bytes = torch::jit::pickle_save(toIValue(plan));
      writer.writeRecord(name, bytes.data(), bytes.size());
    }
    writer.writeEndOfFile();
  }
  Archive archive(old);
  EXPECT_EQ(archive.plan().groups[0].chunkBytes, 0);
  // The bias alone: read whole (160 bytes), clean.
  EXPECT_TRUE(at::equal(archive.readGroupRange(0, 2010, 2020), at::arange(10, 20, at::kFloat)));
  EXPECT_EQ(archive.bytesRead(), 40 * 4);
  // Any range touching the weight reads it whole and finds the flipped byte.
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 10}, {1990, 2010}}) {
    try {
      archive.readGroupRange(0, begin, end);
      FAIL() << "no checksum error for [" << begin << ", " << end << ")";
    } catch (const PlanError &e) {
      EXPECT_NE(std::string(e.what()).find("corrupt record bmt/weights/group0 of block.0.weight "
                                           "(bytes [0, 8000) of storage group block.0.float32's "
                                           "buffer, read whole"),
                std::string::npos)
          << e.what();
    }
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
  EXPECT_THROW(writeArchive(bad, p, "module {}", weights, {{"model.safetensors", "{}"}}), PlanError);
  EXPECT_FALSE(std::filesystem::exists(bad));
}

} // namespace
