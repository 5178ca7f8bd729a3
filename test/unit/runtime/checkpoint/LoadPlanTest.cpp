//===- LoadPlanTest.cpp - which bytes of a checkpoint each rank reads -----===//
//
// runtime/checkpoint/LoadPlan.h (SavedLayout parsed from a checkpoint.json,
// planSlice, shardReads) against a reference that locates every element of
// a rank's slice on its own: the saved rank file and the byte in it.
// ZeRO shards of N = 1, 2, 3 ranks read by M = 1, 2, 3 ranks, and a TP
// split T = 2 (a vocabulary of 127 padded to 128, a fused QKV of 3 chunks,
// a replicated tensor) read at T = 1 and T = 2, and saved at T = 1 read at
// T = 2; expert parameters split over expert groups of E = 1, 2 (version 3:
// one space per expert-group position) read at E = 1, 2, 4. Pipeline
// stages (version 4): a space's shards in the files of the stage that wrote
// it; with T = 2 (version 5) in those of the stage's ranks of its TP rank.

#include "checkpoint/LoadPlan.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

using namespace bmt;
using namespace bmt::runtime::checkpoint;

namespace {

/// Where one element is read from: (rank file, byte offset in the tensor).
using Source = std::pair<int64_t, int64_t>;
constexpr Source kNotRead{-1, -1};

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// A tensor of the test models: shape, and its split (dim -1: none).
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t dim = -1, chunks = 1, padded = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  int64_t inner() const {
    int64_t n = 1;
    for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d)
      n *= shape[d];
    return n;
  }
  int64_t paddedDim() const { return padded ? padded : shape[static_cast<size_t>(dim)]; }
  /// Elements of one TP rank's slice of T.
  int64_t localNumel(int64_t tp) const {
    return dim < 0 || tp == 1 ? numel() : numel() / shape[static_cast<size_t>(dim)] *
                                              (paddedDim() / tp);
  }
  TensorSplit rule(int64_t tp) const {
    TensorSplit s;
    if (dim >= 0 && tp > 1) {
      s.dim = dim;
      s.chunks = chunks;
      s.paddedSize = padded;
    }
    return s;
  }
  SliceLayout layout(int64_t tp, int64_t tpRank) const {
    SliceLayout l;
    l.shape = shape;
    l.split = rule(tp);
    l.tp = tp;
    l.tpRank = tpRank;
    return l;
  }

  /// Reference: local element `i` of TP rank t's slice (of T) -> the global
  /// element (row-major, unpadded), or -1 for padding. The rule written
  /// out: pad the dim to P, cut it into `chunks`, each chunk into T
  /// pieces; rank t holds piece t of every chunk.
  int64_t globalOf(int64_t tp, int64_t t, int64_t i) const {
    if (dim < 0 || tp == 1)
      return i;
    const int64_t in = inner(), local = paddedDim() / tp, piece = local / chunks;
    const int64_t o = i / (local * in), li = i / in % local, r = i % in;
    const int64_t j = li / piece * (paddedDim() / chunks) + t * piece + li % piece;
    if (j >= shape[static_cast<size_t>(dim)])
      return -1;
    return (o * shape[static_cast<size_t>(dim)] + j) * in + r;
  }
};

/// The layout a checkpoint of `tensors` (one space, members in order) was
/// saved in: T TP ranks, `shards` ZeRO shards of each TP rank's space.
struct Saved {
  std::vector<Tensor> tensors;
  int64_t tp = 1, shards = 1;

  int64_t offsetOf(size_t m) const {
    int64_t o = 0;
    for (size_t k = 0; k < m; ++k)
      o += tensors[k].localNumel(tp);
    return o;
  }
  int64_t size() const { return offsetOf(tensors.size()); }
  int64_t shardSize() const { return ceilDiv(size(), shards); }

  json meta() const {
    json spaces = json::array();
    for (int64_t t = 0; t < tp; ++t) {
      json members = json::array();
      for (size_t m = 0; m < tensors.size(); ++m) {
        json member = {{"tensor", tensors[m].name}, {"shape", tensors[m].shape},
                       {"offset", offsetOf(m)}};
        if (tp > 1 && tensors[m].dim >= 0)
          member["split"] = {{"dim", tensors[m].dim}, {"chunks", tensors[m].chunks},
                             {"padded_size", tensors[m].padded}};
        members.push_back(member);
      }
      json space = {{"name", "g0"}, {"dtype", "float32"}, {"master", false},
                    {"size", size()}, {"shards", shards}, {"shard_size", shardSize()},
                    {"members", members}};
      if (tp > 1)
        space["tp_rank"] = t;
      spaces.push_back(space);
    }
    json meta = {{"world_size", tp * shards}, {"spaces", spaces}};
    if (tp > 1)
      meta["tensor_parallel"] = tp;
    return meta;
  }

  /// Reference: local element `i` of TP rank t's saved slice of tensor m ->
  /// the rank file and byte that hold it (shard q of TP rank t's space is
  /// world rank q * T + t's file).
  Source source(size_t m, int64_t t, int64_t i, int64_t elementSize) const {
    const int64_t e = offsetOf(m) + i;
    return {e / shardSize() * tp + t, e % shardSize() * elementSize};
  }
  /// Reference: where global element g of tensor m is saved.
  Source sourceOfGlobal(size_t m, int64_t g, int64_t elementSize) const {
    const Tensor &x = tensors[m];
    for (int64_t t = 0; t < tp; ++t)
      for (int64_t i = 0; i < x.localNumel(tp); ++i)
        if (x.globalOf(tp, t, i) == g)
          return source(m, t, i, elementSize);
    return kNotRead;
  }
};

/// The planner: the source of each element of [a, b) of this rank's slice
/// `mine` of tensor `name`, through planSlice and shardReads as a resume
/// calls them (kNotRead where nothing is read).
std::vector<Source> planned(const SavedLayout &layout, const std::string &name,
                            const SliceLayout &mine, int64_t mineTpRank, int64_t a, int64_t b,
                            int64_t elementSize) {
  std::vector<Source> out(static_cast<size_t>(b - a), kNotRead);
  const SavedMember &saved = layout.members().at(name);
  SliceLayout theirs = saved.layout;
  theirs.tpRank = mineTpRank % static_cast<int64_t>(saved.copies.size());
  planSlice(mine, theirs, a, b, [&](int64_t savedRank, int64_t local, int64_t at, int64_t n) {
    const auto &[space, offset] = saved.copies.at(static_cast<size_t>(savedRank));
    int64_t covered = 0;
    for (const SavedLayout::ShardRead &r : layout.shardReads(space, offset + local, n, elementSize)) {
      ASSERT_EQ(r.nbytes % elementSize, 0);
      ASSERT_EQ(r.dst % elementSize, 0);
      ASSERT_EQ(r.rank, layout.rankOf(space, r.shard));
      for (int64_t k = 0; k < r.nbytes / elementSize; ++k) {
        const int64_t d = at + r.dst / elementSize + k;
        ASSERT_TRUE(d >= 0 && d < b - a) << name << ": element " << d << " out of [a, b)";
        EXPECT_EQ(out[static_cast<size_t>(d)], kNotRead) << name << ": element " << d
                                                          << " read twice";
        out[static_cast<size_t>(d)] = {r.rank, r.offset + k * elementSize};
      }
      covered += r.nbytes / elementSize;
    }
    EXPECT_EQ(covered, n);
  });
  return out;
}

Tensor vector7() { return {"a", {7}}; }
Tensor matrix23() { return {"b", {2, 3}}; }

TEST(LoadPlan, ZeroShardsOfNRanksReadByMRanks) {
  for (int64_t elementSize : {4, 2})
    for (int64_t n = 1; n <= 3; ++n) {
      Saved saved{{vector7(), matrix23()}, 1, n};
      const SavedLayout layout("ck", saved.meta());
      for (int64_t mRanks = 1; mRanks <= 3; ++mRanks) {
        const int64_t shard = ceilDiv(saved.size(), mRanks);
        for (int64_t r = 0; r < mRanks; ++r) {
          const int64_t begin = r * shard, end = std::min(saved.size(), begin + shard);
          for (size_t m = 0; m < saved.tensors.size(); ++m) {
            const Tensor &x = saved.tensors[m];
            const int64_t from = std::max(begin, saved.offsetOf(m));
            const int64_t to = std::min(end, saved.offsetOf(m) + x.numel());
            if (from >= to)
              continue;
            const int64_t a = from - saved.offsetOf(m), b = to - saved.offsetOf(m);
            const std::vector<Source> got =
                planned(layout, x.name, x.layout(1, 0), 0, a, b, elementSize);
            for (int64_t i = a; i < b; ++i)
              EXPECT_EQ(got[static_cast<size_t>(i - a)], saved.source(m, 0, i, elementSize))
                  << "N=" << n << " M=" << mRanks << " rank " << r << " " << x.name << "[" << i
                  << "] (" << elementSize << "-byte elements)";
          }
        }
      }
    }
}

/// GPT-2-like tensors of a TP split: a vocabulary of 127 padded to 128, a
/// fused QKV (3 chunks of the columns), a replicated one.
std::vector<Tensor> tpTensors() {
  return {{"wte", {127, 3}, 0, 1, 128}, {"qkv", {4, 6}, 1, 3, 0}, {"ln", {3}, -1, 1, 0}};
}

TEST(LoadPlan, TensorParallelT2ReadAtT1AndT2) {
  const int64_t es = 4;
  for (int64_t savedShards : {1, 2})
    for (int64_t savedTp : {2, 1}) {
      Saved saved{tpTensors(), savedTp, savedShards};
      const SavedLayout layout("ck", saved.meta());
      ASSERT_EQ(layout.tensorParallel(), savedTp);
      for (int64_t tp : {1, 2}) {
        if (tp == savedTp && tp == 1)
          continue; // the ZeRO test's case
        for (int64_t t = 0; t < tp; ++t)
          for (size_t m = 0; m < saved.tensors.size(); ++m) {
            const Tensor &x = saved.tensors[m];
            const int64_t local = x.localNumel(tp);
            // The whole slice, and a window cut by a ZeRO shard boundary.
            for (auto [a, b] : {std::pair<int64_t, int64_t>{0, local}, {1, local - 2}}) {
              const std::vector<Source> got =
                  planned(layout, x.name, x.layout(tp, t), t, a, b, es);
              for (int64_t i = a; i < b; ++i) {
                Source want;
                if (x.dim < 0)
                  want = saved.source(m, t % savedTp, i, es); // this TP rank's copy
                else if (tp == savedTp)
                  want = saved.source(m, t, i, es); // the same slice, padding included
                else if (x.globalOf(tp, t, i) < 0)
                  want = kNotRead; // padding of this slice: stays zero
                else
                  want = saved.sourceOfGlobal(m, x.globalOf(tp, t, i), es);
                EXPECT_EQ(got[static_cast<size_t>(i - a)], want)
                    << "saved T=" << savedTp << " x" << savedShards << " shards, read at T="
                    << tp << " rank " << t << ": " << x.name << " local " << i;
              }
            }
          }
      }
    }
}

TEST(LoadPlan, PaddingRowIsNotReadAtT1) {
  // The vocabulary's padding row (global row 127, TP rank 1's last local
  // row) is never read into an unsplit tensor: its 127 * 3 elements come
  // from 64 * 3 of rank 0's file and 63 * 3 of rank 1's.
  Saved saved{tpTensors(), 2, 1};
  const SavedLayout layout("ck", saved.meta());
  const std::vector<Source> got = planned(layout, "wte", tpTensors()[0].layout(1, 0), 0, 0,
                                          127 * 3, 4);
  int64_t fromRank[2] = {0, 0};
  for (const Source &s : got) {
    ASSERT_NE(s, kNotRead);
    ++fromRank[s.first];
    EXPECT_LT(s.second, 63 * 3 * 4 + (s.first == 0 ? 3 * 4 : 0));
  }
  EXPECT_EQ(fromRank[0], 64 * 3);
  EXPECT_EQ(fromRank[1], 63 * 3);
}

/// A checkpoint of expert parallelism (version 3): a dense tensor in a
/// space sharded over all N ranks, and X = 4 experts' parameters ([4, 3]
/// and [4]) in a group split over expert groups of E: position p's space
/// holds experts [p*X/E, (p+1)*X/E), sharded over the N/E ranks of that
/// position (shard q in world rank q * E + p's file). E = 1: saved whole,
/// in one space sharded over N (version 1).
struct SavedExperts {
  int64_t ep = 1, n = 1;
  static constexpr int64_t kDense = 5, kExperts = 4;
  static std::vector<Tensor> experts() { return {{"w", {kExperts, 3}}, {"b", {kExperts}}}; }
  int64_t localNumel(size_t m) const { return experts()[m].numel() / ep; }
  int64_t offsetOf(size_t m) const { return m == 0 ? 0 : localNumel(0); }
  int64_t size() const { return localNumel(0) + localNumel(1); }
  int64_t shards() const { return n / ep; }
  int64_t shardSize() const { return ceilDiv(size(), shards()); }

  json meta() const {
    json spaces = json::array();
    spaces.push_back({{"name", "dense"}, {"dtype", "float32"}, {"master", false},
                      {"size", kDense}, {"shards", n}, {"shard_size", ceilDiv(kDense, n)},
                      {"members", {{{"tensor", "d"}, {"shape", {kDense}}, {"offset", 0}}}}});
    for (int64_t p = 0; p < ep; ++p) {
      json members = json::array();
      for (size_t m = 0; m < 2; ++m) {
        json member = {{"tensor", experts()[m].name}, {"shape", experts()[m].shape},
                       {"offset", offsetOf(m)}};
        if (ep > 1)
          member["split"] = {{"dim", 0}, {"chunks", 1}, {"padded_size", 0}, {"over", "expert"}};
        members.push_back(member);
      }
      json space = {{"name", "experts"}, {"dtype", "float32"}, {"master", false},
                    {"size", size()}, {"shards", shards()}, {"shard_size", shardSize()},
                    {"members", members}};
      if (ep > 1)
        space["ep_rank"] = p;
      spaces.push_back(space);
    }
    json meta = {{"world_size", n}, {"spaces", spaces}};
    if (ep > 1)
      meta["expert_parallel"] = ep;
    return meta;
  }

  /// Reference: where global element g of expert tensor m is saved.
  Source sourceOfGlobal(size_t m, int64_t g, int64_t elementSize) const {
    const int64_t p = g / localNumel(m), e = offsetOf(m) + g % localNumel(m);
    return {e / shardSize() * ep + p, e % shardSize() * elementSize};
  }
};

TEST(LoadPlan, ExpertSplitE2ReadAtE1E2E4) {
  const int64_t es = 4;
  for (auto [savedEp, savedN] : {std::pair<int64_t, int64_t>{2, 2}, {2, 4}, {1, 2}}) {
    SavedExperts saved{savedEp, savedN};
    const SavedLayout layout("ck", saved.meta());
    ASSERT_EQ(layout.expertParallel(), savedEp);
    // The dense tensor: sharded over all N ranks whatever E.
    for (int64_t i = 0; i < SavedExperts::kDense; ++i) {
      const std::vector<Source> got = planned(layout, "d", Tensor{"d", {5}}.layout(1, 0), 0, i,
                                              i + 1, es);
      const int64_t shard = ceilDiv(SavedExperts::kDense, savedN);
      EXPECT_EQ(got[0], Source(i / shard, i % shard * es)) << "d[" << i << "]";
    }
    for (int64_t ep : {1, 2, 4})
      for (int64_t p = 0; p < ep; ++p)
        for (size_t m = 0; m < 2; ++m) {
          const Tensor x = SavedExperts::experts()[m];
          SliceLayout mine = x.layout(1, 0);
          if (ep > 1) {
            mine.split = expertSplit();
            mine.tp = ep;
            mine.tpRank = p;
          }
          const int64_t local = x.numel() / ep;
          const std::vector<Source> got = planned(layout, x.name, mine, p, 0, local, es);
          for (int64_t i = 0; i < local; ++i)
            EXPECT_EQ(got[static_cast<size_t>(i)], saved.sourceOfGlobal(m, p * local + i, es))
                << "saved E=" << savedEp << " N=" << savedN << ", read at E=" << ep
                << " position " << p << ": " << x.name << " local " << i;
        }
  }
}

TEST(LoadPlan, BadExpertLayoutIsRefused) {
  // 4 experts over expert groups of 3: not a split.
  SavedExperts saved{2, 2};
  json meta = saved.meta();
  meta["expert_parallel"] = 3;
  meta["world_size"] = 3;
  try {
    SavedLayout layout("ck", meta);
    FAIL() << "4 experts split over 3 positions were accepted";
  } catch (const runtime::CheckpointError &e) {
    EXPECT_NE(std::string(e.what()).find("ck/checkpoint.json: bad split of w ("),
              std::string::npos)
        << e.what();
  }
  // An expert-split tensor in a space without its position.
  meta = saved.meta();
  meta["spaces"][1].erase("ep_rank");
  try {
    SavedLayout layout("ck", meta);
    FAIL() << "an expert split outside an ep_rank space was accepted";
  } catch (const runtime::CheckpointError &e) {
    EXPECT_NE(std::string(e.what()).find("w is split over the expert group outside an ep_rank "
                                         "space"),
              std::string::npos)
        << e.what();
  }
}

TEST(LoadPlan, BadLayoutIsRefused) {
  Saved saved{{vector7(), matrix23()}, 1, 2};
  json meta = saved.meta();
  meta["spaces"][0]["members"][1]["offset"] = 8; // 8 + 6 > 13
  try {
    SavedLayout layout("ck", meta);
    FAIL() << "a member past its space's end was accepted";
  } catch (const runtime::CheckpointError &e) {
    EXPECT_NE(std::string(e.what()).find("ck/checkpoint.json: bad layout (b does not fit"),
              std::string::npos)
        << e.what();
  }
}

/// A pipelined run's checkpoint (version 4): P = 2 stages on N = 4 ranks,
/// space 0 written by stage 0 (ranks 0, 1), space 1 by stage 1 (ranks 2, 3).
json pipelineMeta() {
  json spaces = json::array();
  for (int64_t stage = 0; stage < 2; ++stage)
    spaces.push_back({{"name", "g" + std::to_string(stage)}, {"dtype", "float32"},
                      {"master", false}, {"size", 7}, {"shards", 2}, {"shard_size", 4},
                      {"stage", stage},
                      {"members", json::array({{{"tensor", "t" + std::to_string(stage)},
                                                {"shape", {7}}, {"offset", 0},
                                                {"aliases", json::array()}}})}});
  return {{"world_size", 4}, {"pipeline_stages", 2}, {"spaces", spaces}};
}

TEST(LoadPlan, PipelineSpacesAreInTheirStagesFiles) {
  const SavedLayout layout("ck", pipelineMeta());
  EXPECT_EQ(layout.pipelineStages(), 2);
  EXPECT_EQ(layout.rankOf(0, 0), 0);
  EXPECT_EQ(layout.rankOf(0, 1), 1);
  EXPECT_EQ(layout.rankOf(1, 0), 2);
  EXPECT_EQ(layout.rankOf(1, 1), 3);
  // Elements 2..6 of stage 1's space: shard 0's last two, shard 1's three.
  const auto reads = layout.shardReads(1, 2, 5, 4);
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].rank, 2);
  EXPECT_EQ(reads[0].offset, 8);
  EXPECT_EQ(reads[0].nbytes, 8);
  EXPECT_EQ(reads[1].rank, 3);
  EXPECT_EQ(reads[1].offset, 0);
  EXPECT_EQ(reads[1].dst, 8);
}

TEST(LoadPlan, BadPipelineLayoutIsRefused) {
  auto refused = [](json meta, const std::string &why) {
    try {
      SavedLayout layout("ck", meta);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const runtime::CheckpointError &e) {
      EXPECT_NE(std::string(e.what()).find("ck/checkpoint.json: bad layout (" + why),
                std::string::npos)
          << e.what();
    }
  };
  json meta = pipelineMeta();
  meta["spaces"][1]["stage"] = 2;
  refused(meta, "space g1: stage 2 of 2");
  meta = pipelineMeta();
  meta["spaces"][1]["shards"] = 3; // stage 1 has 2 ranks
  meta["spaces"][1]["shard_size"] = 3;
  refused(meta, "space g1: tp_rank, ep_rank, shards or shard_size out of range");
  meta = pipelineMeta();
  meta["world_size"] = 3;
  refused(meta, "pipeline_stages 2 with world_size 3");
  meta = pipelineMeta();
  meta["virtual_stages"] = 2;
  meta["pipeline_stages"] = 1;
  meta["world_size"] = 4;
  refused(meta, "virtual_stages 2 with pipeline_stages 1");
}

/// P = 2 x T = 2 on N = 8 (D = 2, version 5): each group once per TP rank;
/// shard q of stage s's copy of TP rank t in rank s * 4 + q * 2 + t's file.
TEST(LoadPlan, PipelineTpSpacesAreInTheirStagesAndTpRanksFiles) {
  json spaces = json::array();
  for (int64_t stage = 0; stage < 2; ++stage)
    for (int64_t t = 0; t < 2; ++t)
      spaces.push_back(
          {{"name", "g" + std::to_string(stage)}, {"dtype", "float32"}, {"master", false},
           {"size", 8}, {"shards", 2}, {"shard_size", 4}, {"stage", stage}, {"tp_rank", t},
           {"members",
            json::array({{{"tensor", "t" + std::to_string(stage)}, {"shape", {4, 4}},
                          {"offset", 0}, {"aliases", json::array()},
                          {"split", {{"dim", 0}, {"chunks", 1}, {"padded_size", 0}}}}})}});
  const json meta = {{"world_size", 8}, {"pipeline_stages", 2}, {"tensor_parallel", 2},
                     {"virtual_stages", 2}, {"spaces", spaces}};
  const SavedLayout layout("ck", meta);
  EXPECT_EQ(layout.tensorParallel(), 2);
  EXPECT_EQ(layout.virtualStages(), 2);
  EXPECT_EQ(layout.rankOf(0, 0), 0); // stage 0, TP rank 0
  EXPECT_EQ(layout.rankOf(1, 1), 3); // stage 0, TP rank 1, shard 1
  EXPECT_EQ(layout.rankOf(2, 0), 4); // stage 1, TP rank 0
  EXPECT_EQ(layout.rankOf(3, 1), 7);
  json bad = meta;
  bad["world_size"] = 6;
  try {
    SavedLayout refused("ck", bad);
    ADD_FAILURE() << "accepted a world size P x T does not divide";
  } catch (const runtime::CheckpointError &e) {
    EXPECT_NE(std::string(e.what()).find(
                  "bad layout (pipeline_stages 2 with world_size 6, tensor_parallel 2)"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
