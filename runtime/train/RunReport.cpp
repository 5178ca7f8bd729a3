//===- RunReport.cpp - what bmt-run says about a run's setup ---------------===//

#include "bmt/Runtime/train/RunReport.h"

#include "bmt/Plan/Archive.h"
#include "bmt/Runtime/comm/Comm.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/optim/OffloadAdam.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <unistd.h>

namespace bmt::runtime {

/// A progress bar on stderr while the weights load (only on a terminal).
void loadProgress(int64_t done, int64_t total) {
  static bool tty = ::isatty(2) && std::getenv("RANK") == nullptr;
  if (!tty || total <= 0)
    return;
  int width = 30, filled = static_cast<int>(width * done / total);
  std::fprintf(stderr, "\rloading weights [%.*s%*s] %5.1f%% of %.1f MiB",
               filled, "##############################", width - filled, "",
               100.0 * static_cast<double>(done) / static_cast<double>(total),
               static_cast<double>(total) / (1024.0 * 1024.0));
  if (done == total)
    std::fprintf(stderr, "\n");
}

/// Prints (rank 0) what was loaded: the model, its parameters, the bytes
/// this rank read, the objective and device; with several ranks, the bytes
/// every rank read (an all-gather: collective).
void printLoadSummary(const std::string &archiveName, const plan::Archive &archive, Model &model,
                      const std::string &objective, c10::Device device) {
  Comm *world = &model.world();
  const plan::Plan &p = model.plan();
  const int64_t worldSize = world->size();
  const bool rank0 = world->rank() == 0;
  // Bytes each rank read from the archive (rank-local loading).
  at::Tensor bytesRead;
  {
    at::Tensor mine = at::full({1}, archive.bytesRead(), at::TensorOptions().dtype(at::kLong))
                          .to(world->device());
    at::Tensor all = at::empty({worldSize}, mine.options());
    world->allGather(all, mine)->wait();
    bytesRead = all.cpu();
  }
  // The weight records' bytes: storage groups (with their alignment
  // padding) and the tensors outside them.
  int64_t weightBytes = 0;
  for (const plan::StorageGroup &g : p.groups)
    weightBytes += g.nbytes();
  for (const plan::TensorInfo &t : p.tensors)
    if (t.group < 0)
      weightBytes += t.nbytes();
  if (rank0) {
    std::cout << "bmt-run: " << archiveName << " (" << p.modelType << "), "
              << model.numParameters() << " parameters, " << archive.bytesRead()
              << " bytes read, objective " << objective << ", device " << device;
    if (int64_t frozen = model.frozenBytesPerRank())
      std::cout << ", frozen parameters " << frozen << " bytes per rank";
    std::cout << "\n";
    if (worldSize > 1) {
      std::cout << "bmt-run: " << worldSize << " ranks (" << world->backend() << "), ZeRO-"
                << p.zeroStage;
      const int64_t stages = std::max<int64_t>(p.pipelineStages, 1);
      if (stages > 1)
        std::cout << ", pipeline " << stages << " stages"
                  << (p.pipelineVirtualStages > 1
                          ? " (" + std::to_string(p.pipelineVirtualStages) + " virtual stages each)"
                          : std::string())
                  << " x";
      if (p.tensorParallel > 1)
        std::cout << (stages > 1 ? " " : ", ") << "tensor parallel " << p.tensorParallel
                  << " x";
      if (stages > 1 || p.tensorParallel > 1) // "pipeline 2 stages x tensor parallel 2 x data parallel 1"
        std::cout << " data parallel " << worldSize / (stages * p.tensorParallel);
      if (p.expertParallel > 1)
        std::cout << ", expert parallel: " << worldSize / p.expertParallel
                  << " expert groups of " << p.expertParallel << " ranks";
      if (p.splitsExperts())
        std::cout << " (expert weights split: a rank gathers " << model.gatheredParameters()
                  << " parameters)";
      std::cout << ", weights " << weightBytes << " bytes; bytes read per rank:";
      for (int64_t r = 0; r < worldSize; ++r)
        std::cout << " " << bytesRead[r].item<int64_t>();
      std::cout << "\n";
    }
  }
}

/// Prints the parameters' dtype, the master weights, the gradient reduction
/// and the loss scale when any is not plain float32; and the offloaded
/// optimizer's host memory.
void printPrecision(Model &model, double lossScale, std::optional<c10::ScalarType> reduceDtype,
                    const std::string &reduceName) {
  const at::ScalarType modelDtype = model.parameterDtype();
  const at::Device device = model.device();
  if (modelDtype != at::kFloat || lossScale > 0 || reduceDtype)
    std::cout << "bmt-run: parameters " << c10::toString(modelDtype)
              << (modelDtype == at::kHalf || modelDtype == at::kBFloat16
                      ? " with float32 master weights (ZeRO shards)"
                      : "")
              << ", gradient reduction "
              << (reduceDtype ? reduceName
                                : std::string(c10::toString(modelDtype)))
              << ", loss scale "
              << (lossScale > 0 ? std::to_string(static_cast<int64_t>(lossScale))
                                : std::string("off"))
              << "\n";
  if (model.offloadsOptimizer()) {
    // Per element of this rank's shards: the float32 master, the two
    // moments and the gradient copy (float64 for float64 groups).
    int64_t elements = 0, bytes = 0;
    for (const at::Tensor &shard : model.parameters()) {
      elements += shard.numel();
      bytes += shard.numel() * 4 *
               static_cast<int64_t>(c10::elementSize(masterDtype(shard.scalar_type())));
    }
    std::cout << "bmt-run: --offload-optimizer: float32 master weights, Adam moments and "
                 "gradient copies of "
              << elements << " elements in " << (device.is_cuda() ? "pinned " : "")
              << "host memory (" << std::fixed << std::setprecision(1)
              << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB on rank 0); the optimizer "
              << "runs on the CPU" << std::defaultfloat << "\n";
  }
}

/// Prints (rank 0) where a resumed run continues and the bytes each rank
/// read from the checkpoint (an all-gather: collective).
/// What this run sets differently from the run that saved the checkpoint:
/// its learning-rate schedule and batch shape, one "--flag now (saved: then)"
/// phrase each. The run goes on with its own values (a changed --lr or
/// --steps is often meant); saying so keeps a slip from going unnoticed.
std::vector<std::string> changedSettings(const ResumeReport &r, const LRScheduleConfig &now,
                                         int64_t sequencesPerStep, int64_t seqLen,
                                         bool fixedBatches) {
  std::vector<std::string> out;
  auto number = [](double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  };
  auto note = [&](const std::string &flag, const std::string &value, const std::string &saved) {
    if (value != saved)
      out.push_back(flag + " " + value + " (saved: " + saved + ")");
  };
  const LRScheduleConfig &then = r.savedSchedule;
  note("--schedule", scheduleKindName(now.kind), scheduleKindName(then.kind));
  note("--lr", number(now.peakLR), number(then.peakLR));
  note("--warmup", std::to_string(now.warmupSteps), std::to_string(then.warmupSteps));
  const bool decays = now.kind == LRScheduleKind::Linear ||
                      now.kind == LRScheduleKind::Cosine;
  if (decays) {
    note("--min-lr", number(now.minLR), number(then.minLR));
    // The decay ends one step after --steps (see the schedule's setup).
    note("--steps", std::to_string(now.totalSteps - 1), std::to_string(then.totalSteps - 1));
  }
  if (now.kind == LRScheduleKind::Exponential)
    note("--lr-gamma", number(now.gamma), number(then.gamma));
  if (r.savedSequencesPerStep > 0 && !fixedBatches) {
    // The global batch, not --micro-batch: a resume on other ranks keeps it
    // with another --micro-batch.
    if (sequencesPerStep != r.savedSequencesPerStep)
      out.push_back("the batch to " + std::to_string(sequencesPerStep) +
                    " sequences a step (--micro-batch x data-parallel ranks x --grad-accum; "
                    "saved: " + std::to_string(r.savedSequencesPerStep) + ")");
    note("--seq-len", std::to_string(seqLen), std::to_string(r.savedSeqLen));
  }
  return out;
}

/// Rank 0 prints where the run resumed from, the bytes each rank read and
/// `changes` (changedSettings); with `steps` at or below the checkpoint's
/// step only that nothing is left to train (the resume's lines would say
/// training goes on). Collective: every rank calls it.
void printResume(const ResumeReport &r, const std::string &folder,
                 const std::vector<std::string> &changes, int64_t steps, Comm &world) {
  at::Tensor mine = at::full({1}, r.bytesRead, at::TensorOptions().dtype(at::kLong))
                        .to(world.device());
  at::Tensor all = at::empty({world.size()}, mine.options());
  world.allGather(all, mine)->wait();
  all = all.cpu();
  if (world.rank() != 0)
    return;
  if (r.progress.step >= steps) {
    std::cout << "bmt-run: note: the checkpoint is at step " << r.progress.step << ", --steps is "
              << steps << ": nothing to train (a larger --steps goes on)\n";
    return;
  }
  std::cout << "bmt-run: resumed from " << folder << " at step " << r.progress.step
            << " (saved by " << r.savedWorldSize << (r.savedWorldSize == 1 ? " rank" : " ranks")
            << (r.savedTensorParallel > 1
                    ? ", tensor parallel " + std::to_string(r.savedTensorParallel)
                    : std::string())
            << (r.savedPipelineStages > 1
                    ? ", " + std::to_string(r.savedPipelineStages) + " pipeline stages"
                    : std::string())
            << (r.savedVirtualStages > 1
                    ? ", " + std::to_string(r.savedVirtualStages) + " virtual stages"
                    : std::string())
            << (r.savedExpertParallel > 1
                    ? ", expert weights split over " + std::to_string(r.savedExpertParallel) +
                          " ranks per expert group"
                    : std::string())
            << (r.resharded ? ", resharded to this run's layout" : "")
            << "); bytes read per rank:";
  for (int64_t i = 0; i < world.size(); ++i)
    std::cout << " " << all[i].item<int64_t>();
  std::cout << "\n";
  if (!changes.empty()) {
    std::string line = "bmt-run: note: this run changes";
    for (size_t i = 0; i < changes.size(); ++i)
      line += (i ? ", " : " ") + changes[i];
    std::cout << line << "; training goes on with this run's values\n";
  }
}

} // namespace bmt::runtime
