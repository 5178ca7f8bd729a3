//===- LoadPlan.cpp - which bytes of a checkpoint a rank reads ------------===//
//
// The checkpoint's layout parsed from checkpoint.json, and the split of a
// saved space's elements over its shards' rank files.
//
//===----------------------------------------------------------------------===//

#include "LoadPlan.h"

#include <cstdint>

namespace bmt::runtime::checkpoint {

SavedLayout::SavedLayout(const std::string &folder, const json &meta) : folder_(folder) {
  auto bad = [&](const std::string &why) {
    return CheckpointError(folder_ + "/checkpoint.json: bad layout (" + why + ")");
  };
  try {
    worldSize_ = meta.at("world_size").get<int64_t>();
    tp_ = meta.value("tensor_parallel", int64_t(1));
    ep_ = meta.value("expert_parallel", int64_t(1));
    if (tp_ < 1 || worldSize_ % tp_ != 0)
      throw bad("tensor_parallel " + std::to_string(tp_) + " with world_size " +
                std::to_string(worldSize_));
    if (ep_ < 1 || worldSize_ % ep_ != 0 || (ep_ > 1 && tp_ > 1))
      throw bad("expert_parallel " + std::to_string(ep_) + " with world_size " +
                std::to_string(worldSize_) + ", tensor_parallel " + std::to_string(tp_));
    stages_ = meta.value("pipeline_stages", int64_t(1));
    if (stages_ < 1 || worldSize_ % (stages_ * tp_) != 0 || (stages_ > 1 && ep_ > 1))
      throw bad("pipeline_stages " + std::to_string(stages_) + " with world_size " +
                std::to_string(worldSize_) +
                (tp_ > 1 ? ", tensor_parallel " + std::to_string(tp_) : std::string()));
    virtualStages_ = meta.value("virtual_stages", int64_t(1));
    if (virtualStages_ < 1 || (virtualStages_ > 1 && stages_ == 1))
      throw bad("virtual_stages " + std::to_string(virtualStages_) + " with pipeline_stages " +
                std::to_string(stages_));
    for (const json &s : meta.at("spaces")) {
      SavedSpace space;
      // A pipeline's space: shards over the D ranks of the stage that wrote
      // it (of its TP rank: the stage's T x D ranks, TP innermost).
      const int64_t stage = stages_ > 1 ? s.at("stage").get<int64_t>() : 0;
      if (stage < 0 || stage >= stages_)
        throw bad("space " + s.value("name", std::string("?")) + ": stage " +
                  std::to_string(stage) + " of " + std::to_string(stages_));
      space.firstRank = stage * (worldSize_ / stages_);
      space.name = s.at("name").get<std::string>();
      space.dtype = s.at("dtype").get<std::string>();
      space.master = s.at("master").get<bool>();
      space.size = s.at("size").get<int64_t>();
      space.shards = s.at("shards").get<int64_t>();
      space.shardSize = s.at("shard_size").get<int64_t>();
      // The group the space's copies run over: every space is a TP rank's
      // with T > 1; an expert-split group's copies are positions.
      const bool expert = s.contains("ep_rank");
      if (expert && ep_ == 1)
        throw bad("space " + space.name + " has an ep_rank without expert_parallel");
      space.groupSize = tp_ > 1 ? tp_ : expert ? ep_ : 1;
      space.position = tp_ > 1 ? s.at("tp_rank").get<int64_t>()
                       : expert ? s.at("ep_rank").get<int64_t>()
                                : 0;
      if (space.position < 0 || space.position >= space.groupSize || space.shards < 1 ||
          space.shardSize * space.shards < space.size ||
          space.firstRank + (space.shards - 1) * space.groupSize + space.position >=
              (stages_ > 1 ? space.firstRank + worldSize_ / stages_ : worldSize_))
        throw bad("space " + space.name +
                  ": tp_rank, ep_rank, shards or shard_size out of range");
      const std::string copyName = expert ? "expert-group position" : "TP rank";
      for (const json &m : s.at("members")) {
        const std::string name = m.at("tensor").get<std::string>();
        SavedMember &member = members_[name];
        const std::vector<int64_t> shape = m.at("shape").get<std::vector<int64_t>>();
        const bool overExperts = m.contains("split") && m.at("split").value("over", "") == "expert";
        if (overExperts != expert)
          throw bad(name + (expert ? " is not split over the expert group in an ep_rank space"
                                   : " is split over the expert group outside an ep_rank space"));
        if (member.copies.empty()) {
          member.shape = shape;
          member.dtype = space.dtype;
          member.layout.shape = shape;
          member.layout.tp = space.groupSize;
          if (m.contains("split")) {
            const json &js = m.at("split");
            TensorSplit &rule = member.layout.split;
            rule.dim = js.at("dim").get<int64_t>();
            rule.chunks = js.at("chunks").get<int64_t>();
            rule.paddedSize = js.at("padded_size").get<int64_t>();
            if (overExperts)
              rule.over = SplitGroup::Expert;
            const int64_t rank = static_cast<int64_t>(shape.size());
            std::string why =
                rule.dim < 0 ? "dim " + std::to_string(rule.dim) + " is not a split dim"
                             : split::check(rule, rank, rule.dim < rank ? shape[rule.dim] : -1,
                                            space.groupSize);
            if (!why.empty())
              throw CheckpointError(folder_ + "/checkpoint.json: bad split of " + name + " (" +
                                    why + ")");
          }
          member.copies.assign(static_cast<size_t>(space.groupSize), {SIZE_MAX, 0});
        } else if (shape != member.shape || space.dtype != member.dtype ||
                   member.copies.size() != static_cast<size_t>(space.groupSize)) {
          throw bad(name + " differs between its " + copyName + "s' spaces");
        }
        auto &copy = member.copies.at(static_cast<size_t>(space.position));
        if (copy.first != SIZE_MAX)
          throw bad(name + " twice in the spaces of " + copyName + " " +
                    std::to_string(space.position));
        copy = {spaces_.size(), m.at("offset").get<int64_t>()};
        const int64_t numel = member.layout.localNumel();
        if (copy.second < 0 || copy.second + numel > space.size)
          throw bad(name + " does not fit in space " + space.name);
        space.members.emplace_back(copy.second, numel);
        space.names.push_back(name);
      }
      spaces_.push_back(space);
    }
    for (const auto &[name, member] : members_)
      for (const auto &copy : member.copies)
        if (copy.first == SIZE_MAX)
          throw bad(name + " is missing from a TP rank's or expert-group position's spaces");
  } catch (const json::exception &e) {
    throw bad(e.what());
  }
}

std::vector<SavedLayout::ShardRead> SavedLayout::shardReads(size_t space, int64_t begin,
                                                            int64_t numel,
                                                            int64_t elementSize) const {
  std::vector<ShardRead> reads;
  const SavedSpace &s = spaces_[space];
  int64_t at = begin, end = begin + numel;
  while (at < end) {
    const int64_t shard = at / s.shardSize;
    const int64_t upTo = std::min(end, (shard + 1) * s.shardSize);
    ShardRead r;
    r.rank = rankOf(space, shard);
    r.shard = shard;
    r.offset = (at - shard * s.shardSize) * elementSize;
    r.nbytes = (upTo - at) * elementSize;
    r.dst = (at - begin) * elementSize;
    reads.push_back(r);
    at = upTo;
  }
  return reads;
}

} // namespace bmt::runtime::checkpoint
