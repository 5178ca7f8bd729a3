//===- Stage.cpp - the instructions of one pipeline stage -----------------===//

#include "exec/Stage.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

namespace bmt::runtime {

namespace {

using plan::Instruction;

void registersOf(const plan::Arg &a, std::set<int64_t> &out) {
  if (a.kind == plan::Arg::Kind::Register)
    out.insert(a.reg);
  for (const plan::Arg &e : a.elements)
    registersOf(e, out);
}

/// The registers instructions [from, to) of `f` read, and its returns.
std::set<int64_t> readAfter(const plan::Function &f, size_t from) {
  std::set<int64_t> used(f.returns.begin(), f.returns.end());
  for (size_t n = from; n < f.body.size(); ++n)
    for (const plan::Arg &a : f.body[n].args)
      registersOf(a, used);
  return used;
}

bool rematerialized(Instruction::Kind kind) {
  return kind == Instruction::Kind::Global || kind == Instruction::Kind::Constant ||
         kind == Instruction::Kind::TpRank;
}

} // namespace

std::unique_ptr<Executor::StagePlan> planStage(const plan::Plan &plan, int64_t stage,
                                               const std::vector<bool> &heldGroups) {
  const std::string &list = plan.pipelineBlockList;
  // With virtual stages, `stage` is a chunk of P x V, cut alike.
  const int64_t stages = plan.pipelineStages * plan.pipelineVirtualStages;
  auto fail = [&](const std::string &why) {
    return ExecutionError("pipeline " +
                          std::string(plan.pipelineVirtualStages > 1 ? "chunk " : "stage ") +
                          std::to_string(stage) + " of " + std::to_string(stages) + ": " + why);
  };
  // The function that calls the blocks, and their calls in it.
  int64_t blocksFn = -1;
  std::map<int64_t, size_t> blockCalls;
  for (size_t fi = 0; fi < plan.functions.size(); ++fi)
    for (size_t n = 0; n < plan.functions[fi].body.size(); ++n) {
      const Instruction &inst = plan.functions[fi].body[n];
      if (inst.kind != Instruction::Kind::Call || inst.blockList != list)
        continue;
      if (blocksFn >= 0 && blocksFn != static_cast<int64_t>(fi))
        throw fail("the blocks of " + list + " are called from two functions");
      blocksFn = static_cast<int64_t>(fi);
      if (!blockCalls.emplace(inst.blockIndex, n).second)
        throw fail("block " + std::to_string(inst.blockIndex) + " of " + list +
                   " is called twice");
    }
  const int64_t numBlocks = static_cast<int64_t>(blockCalls.size());
  if (blocksFn < 0 || blockCalls.begin()->first != 0 || blockCalls.rbegin()->first != numBlocks - 1)
    throw fail("the program does not call the blocks of " + list + " once each");
  // The call chain from the entry down to it (plain calls only).
  auto plan_ = std::make_unique<Executor::StagePlan>();
  Executor::StagePlan &sp = *plan_;
  sp.stage = stage;
  sp.stages = stages;
  std::function<bool(size_t)> find = [&](size_t fi) -> bool {
    sp.chain.push_back(fi);
    if (static_cast<int64_t>(fi) == blocksFn)
      return true;
    const plan::Function &f = plan.functions[fi];
    for (size_t n = 0; n < f.body.size(); ++n) {
      const Instruction &inst = f.body[n];
      if (inst.kind != Instruction::Kind::Call || !inst.blockList.empty() ||
          std::find(sp.chain.begin(), sp.chain.end(), static_cast<size_t>(inst.target)) !=
              sp.chain.end())
        continue;
      sp.chainCall.push_back(n);
      if (find(static_cast<size_t>(inst.target)))
        return true;
      sp.chainCall.pop_back();
    }
    sp.chain.pop_back();
    return false;
  };
  if (!find(static_cast<size_t>(plan.entry)))
    throw fail("the blocks of " + list + " are not reached from the entry by plain calls");
  const size_t deepest = sp.chain.size() - 1;
  for (size_t d = 0; d < deepest; ++d) {
    const plan::Function &f = plan.functions[sp.chain[d]];
    for (size_t n = 0; n < f.body.size(); ++n)
      if (n != sp.chainCall[d] && f.body[n].kind == Instruction::Kind::Call &&
          f.body[n].target == static_cast<int64_t>(sp.chain[d + 1]))
        throw fail(f.name + " calls " + plan.functions[sp.chain[d + 1]].name + " twice");
  }

  const plan::Function &blocks = plan.functions[sp.chain[deepest]];
  auto cutPos = [&](int64_t j) -> size_t {
    if (j <= 0)
      return 0;
    if (j >= numBlocks)
      return blocks.body.size();
    return blockCalls.at(j - 1) + 1;
  };
  const std::vector<int64_t> &firsts = plan.pipelineFirstBlocks;
  const int64_t first = firsts.at(stage);
  const int64_t end = stage + 1 < stages ? firsts.at(stage + 1) : numBlocks;
  const bool isFirst = stage == 0, isLast = stage == stages - 1;

  // What this stage runs.
  sp.runs.resize(sp.chain.size());
  for (size_t d = 0; d < sp.chain.size(); ++d) {
    const plan::Function &f = plan.functions[sp.chain[d]];
    std::vector<char> &runs = sp.runs[d];
    runs.assign(f.body.size(), 0);
    for (size_t n = 0; n < f.body.size(); ++n) {
      if (d < deepest)
        runs[n] = n == sp.chainCall[d] || (isFirst && n < sp.chainCall[d]) ||
                  (isLast && n > sp.chainCall[d]);
      else
        runs[n] = n >= (isFirst ? 0 : cutPos(first)) &&
                  n < (isLast ? blocks.body.size() : cutPos(end));
      const Instruction &inst = f.body[n];
      if (inst.kind == Instruction::Kind::Gather || inst.kind == Instruction::Kind::Release)
        runs[n] = inst.target >= 0 && static_cast<size_t>(inst.target) < heldGroups.size() &&
                  heldGroups[inst.target];
    }
  }

  // The registers live across the cut before block j, in (depth, register)
  // order: defined before it (arguments of the entry excepted: every stage
  // has the inputs), read after it; parameters and constants are loaded by
  // the stage that reads them instead (`remat`: their defining instruction).
  auto live = [&](int64_t j, std::vector<std::pair<size_t, size_t>> *remat) {
    std::vector<std::pair<size_t, int64_t>> out;
    for (size_t d = 0; d < sp.chain.size(); ++d) {
      const plan::Function &f = plan.functions[sp.chain[d]];
      const size_t at = d < deepest ? sp.chainCall[d] : cutPos(j);
      std::map<int64_t, int64_t> defined; // register -> defining instruction (-1: a parameter)
      if (d > 0)
        for (int64_t r : f.params)
          defined[r] = -1;
      for (size_t n = 0; n < at; ++n)
        for (int64_t r : f.body[n].results)
          defined[r] = static_cast<int64_t>(n);
      const std::set<int64_t> used = readAfter(f, d < deepest ? at + 1 : at);
      for (const auto &[r, def] : defined) {
        if (!used.count(r))
          continue;
        if (def >= 0 && rematerialized(f.body[def].kind)) {
          if (remat)
            remat->emplace_back(d, static_cast<size_t>(def));
          continue;
        }
        out.emplace_back(d, r);
      }
    }
    return out;
  };
  if (!isFirst) {
    sp.inPos = cutPos(first);
    std::vector<std::pair<size_t, size_t>> remat;
    sp.in = live(first, &remat);
    for (const auto &[d, def] : remat) {
      const plan::Function &f = plan.functions[sp.chain[d]];
      const int64_t r = f.body[def].results.at(0);
      bool read = isLast && std::count(f.returns.begin(), f.returns.end(), r);
      for (size_t n = 0; n < f.body.size() && !read; ++n)
        if (sp.runs[d][n]) {
          std::set<int64_t> regs;
          for (const plan::Arg &a : f.body[n].args)
            registersOf(a, regs);
          read = regs.count(r) > 0;
        }
      if (read)
        sp.runs[d][def] = 1;
    }
  }
  if (!isLast) {
    sp.outPos = cutPos(end);
    sp.out = live(end, nullptr);
  }
  sp.frames.assign(sp.chain.size(), nullptr);
  return plan_;
}

std::vector<std::vector<bool>> Executor::stageGroups(const plan::Plan &plan) {
  std::vector<std::vector<bool>> out;
  const int64_t parts = plan.pipelineStages * plan.pipelineVirtualStages;
  for (int64_t stage = 0; stage < parts; ++stage) {
    std::unique_ptr<StagePlan> sp =
        planStage(plan, stage, std::vector<bool>(plan.groups.size(), false));
    std::vector<bool> reads(plan.groups.size(), false);
    std::vector<char> seen(plan.functions.size(), 0);
    std::function<void(const Instruction &)> visit;
    std::function<void(size_t)> callee = [&](size_t fi) {
      if (seen[fi])
        return;
      seen[fi] = 1;
      for (const Instruction &inst : plan.functions[fi].body)
        visit(inst);
    };
    visit = [&](const Instruction &inst) {
      if (inst.kind == Instruction::Kind::Global && inst.target >= 0) {
        const int64_t g = plan.tensors.at(inst.target).group;
        if (g >= 0)
          reads[g] = true;
      } else if ((inst.kind == Instruction::Kind::Call || inst.kind == Instruction::Kind::Fused) &&
                 inst.target >= 0) {
        callee(static_cast<size_t>(inst.target));
      }
    };
    for (size_t d = 0; d < sp->chain.size(); ++d) {
      const plan::Function &f = plan.functions[sp->chain[d]];
      for (size_t n = 0; n < f.body.size(); ++n)
        if (sp->runs[d][n] && !(d + 1 < sp->chain.size() && n == sp->chainCall[d]))
          visit(f.body[n]);
    }
    out.push_back(std::move(reads));
  }
  return out;
}

} // namespace bmt::runtime
