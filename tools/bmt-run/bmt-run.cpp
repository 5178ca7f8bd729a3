//===- bmt-run.cpp - train a compiled model -------------------------------===//
//
// bmt-run SHARDED.pt --data train.bin --steps N [options]   (see --help)
//
// One process, or one per rank under `torchrun --no-python bmt-run ...`
// (rendezvous from torchrun's environment; docs/runtime.md). Every failure
// is one "error: ..." line on stderr and exit status 1 on every rank; a
// usage or configuration error, which every rank finds alike, is printed
// by rank 0 alone.
//
//===----------------------------------------------------------------------===//

#include "Options.h"
#include "Run.h"

#include "bmt/Support/ErrorText.h"

#include "bmt/Plan/Archive.h"
#include "bmt/Runtime/checkpoint/Checkpoint.h"
#include "bmt/Runtime/objectives/Corruption.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/fusion/Prewarm.h"
#include "bmt/Runtime/optim/OffloadAdam.h"
#include "bmt/Runtime/comm/Rendezvous.h"
#include "bmt/Runtime/io/Safetensors.h"
#include "bmt/Runtime/train/StopSignal.h"
#include "bmt/Runtime/train/Trainer.h"
#include "bmt/Runtime/Env.h"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sched.h>
#include <unistd.h>

using namespace bmt;
using tools::Failure;

namespace {

/// The device of this rank: "auto" is cuda:LOCAL_RANK when CUDA is
/// available, else the CPU; "cuda" without an index is cuda:LOCAL_RANK.
at::Device chooseDevice(const std::string &name, int64_t localRank) {
  if (name == "auto")
    return at::hasCUDA() ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(localRank))
                         : at::Device("cpu");
  try {
    at::Device d(name);
    if (d.is_cuda() && !at::hasCUDA())
      throw Failure("--device " + name + ": CUDA is not available on this machine");
    if (d.is_cuda() && !d.has_index())
      d = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(localRank));
    return d;
  } catch (const c10::Error &) {
    throw Failure("--device: unknown device '" + name + "'");
  }
}

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
void printLoadSummary(const tools::RunOptions &o, const plan::Archive &archive,
                      runtime::Model &model, const std::string &objective, at::Device device) {
  runtime::Comm *world = &model.world();
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
    std::cout << "bmt-run: " << o.archive << " (" << p.modelType << "), "
              << model.numParameters() << " parameters, " << archive.bytesRead()
              << " bytes read, objective " << objective << ", device " << device << "\n";
    if (worldSize > 1) {
      std::cout << "bmt-run: " << worldSize << " ranks (" << world->backend() << "), ZeRO-"
                << p.zeroStage;
      if (p.tensorParallel > 1)
        std::cout << ", tensor parallel " << p.tensorParallel << " x data parallel "
                  << worldSize / p.tensorParallel;
      std::cout << ", weights " << weightBytes << " bytes; bytes read per rank:";
      for (int64_t r = 0; r < worldSize; ++r)
        std::cout << " " << bytesRead[r].item<int64_t>();
      std::cout << "\n";
    }
  }
}

/// The model's vocabulary: the logits' last dimension on one micro-batch of
/// the run's shape (the fixed batches', else --micro-batch x --seq-len;
/// `span`: span corruption's sizes), which also finds a shape the model
/// cannot take (beyond its position embeddings, or beyond the positions
/// its config.json gives: checkPositions; or not the shape a torch.export
/// program was fixed to) before anything else is done; and, before that,
/// a micro-batch that memory cannot hold (checkMemory).
int64_t probeVocabulary(const tools::RunOptions &o, runtime::Model &model,
                        const tools::FixedBatches &fixed,
                        const runtime::SpanCorruptionConfig *span, int64_t targetLength,
                        const std::vector<plan::NamedFile> &hfFiles) {
  const bool encoderDecoder = model.isEncoderDecoder(), spanCorruption = span != nullptr;
  const int64_t worldSize = model.dataParallel().size(); // the ranks that split the rows
  const at::Device device = model.device();
  int64_t vocab = 0;
  c10::NoGradGuard noGrad;
  int64_t rows = o.microBatch, length = o.seqLen, target = targetLength;
  if (fixed.inputIds.defined()) {
    rows = fixed.inputIds.size(1) / worldSize; // (data-parallel ranks)
    length = fixed.inputIds.size(2);
    target = fixed.labels.size(2);
  } else if (fixed.windows.defined()) {
    rows = fixed.windows.size(1) / worldSize;
    length = fixed.windows.size(2) - 1;
    if (spanCorruption) {
      runtime::SpanCorruptionLengths l =
          runtime::spanCorruptionLengths(fixed.windows.size(2), *span);
      length = l.inputLength;
      target = l.targetLength;
    }
  }
  // A --sequence-parallel plan (its tp_reduce_scatter instructions) splits
  // the sequence over the T ranks of a TP group.
  const plan::Plan &p = model.plan();
  const bool sequenceParallel =
      p.tensorParallel > 1 &&
      std::any_of(p.functions.begin(), p.functions.end(), [](const plan::Function &f) {
        for (const plan::Instruction &inst : f.body)
          if (inst.kind == plan::Instruction::Kind::TpReduceScatter)
            return true;
        return false;
      });
  if (sequenceParallel && length % p.tensorParallel != 0) {
    const std::string t = std::to_string(p.tensorParallel);
    throw tools::ConfigFailure(
        o.archive + " was compiled with --sequence-parallel, which splits the sequence over the " +
        t + " ranks of a tensor-parallel group, so the sequence length must be a multiple of " +
        t + "; " +
        (fixed.inputIds.defined() || fixed.windows.defined()
             ? o.batchesFile + " holds sequences of " + std::to_string(length) + " tokens"
             : "--seq-len is " + std::to_string(length)));
  }
  const std::string shape =
      fixed.inputIds.defined() || fixed.windows.defined()
          ? o.batchesFile
          : "--micro-batch " + std::to_string(o.microBatch) + " --seq-len " + std::to_string(o.seqLen);
  tools::checkPositions(o.archive, hfFiles, length, shape);
  if (!o.evalOnly)
    tools::checkMemory(o, model, rows, length, target, shape);
  at::TensorOptions ids = at::TensorOptions().dtype(at::kLong).device(device);
  runtime::ModelInputs probe;
  probe.inputIds = at::zeros({rows, length}, ids);
  if (encoderDecoder)
    probe.decoderInputIds = at::zeros({rows, target}, ids);
  std::vector<std::pair<std::string, c10::IValue>> results;
  // Only the results' shapes are read: on a GPU the fused regions compute
  // (and compile) nothing here; their kernels are compiled before step 1.
  std::optional<fusion::KernelRecorder> dryRun;
  std::optional<fusion::RecordingScope> recording;
  if (model.usesFusedKernels()) {
    dryRun.emplace(/*dryRun=*/true);
    recording.emplace(model.fusedRegions(), &*dryRun);
  }
  if (model.takesLabels())
    probe.labels = at::zeros({rows, encoderDecoder ? target : length}, ids);
  try {
    if (model.takesLabels())
      results = model.forwardAll(probe);
    else {
      at::Tensor logits = model.forward(probe); // (vocab-parallel: this rank's part of them)
      vocab = model.plan().vocabParallel ? model.plan().vocabSize : logits.size(-1);
    }
  } catch (const runtime::ExecutionError &e) {
    std::string shape = std::to_string(rows) + " x " + std::to_string(length) +
                        (encoderDecoder ? " (decoder " + std::to_string(target) + ")" : "");
    throw Failure((o.batchesFile.empty() ? "--micro-batch " + std::to_string(o.microBatch) +
                                               " --seq-len " + std::to_string(o.seqLen)
                                         : o.batchesFile) +
                  ": the model cannot run a micro-batch of " + shape +
                  " tokens (it may have fewer positions, or be a torch.export program fixed "
                  "to other shapes): " + e.what());
  }
  // --batches with --eval-data: the evaluation's micro-batches are
  // --micro-batch x --seq-len, another shape, found here too (not after
  // the training's steps).
  const bool fixedShape = fixed.inputIds.defined() || fixed.windows.defined();
  if (fixedShape && !o.evalData.empty() && !encoderDecoder && !model.takesLabels() &&
      (o.microBatch != rows || o.seqLen != length)) {
    runtime::ModelInputs eval;
    eval.inputIds = at::zeros({o.microBatch, o.seqLen}, ids);
    try {
      model.forward(eval);
    } catch (const runtime::ExecutionError &e) {
      throw Failure("--eval-data with --micro-batch " + std::to_string(o.microBatch) +
                    " --seq-len " + std::to_string(o.seqLen) +
                    ": the model cannot run an evaluation micro-batch of " +
                    std::to_string(o.microBatch) + " x " + std::to_string(o.seqLen) +
                    " tokens (it may have fewer positions, or be a torch.export program fixed "
                    "to other shapes; set --seq-len to the batches' " + std::to_string(length) +
                    "): " + e.what());
    }
  }
  // A model computing its own loss: its result must be a scalar (an
  // ExecutionError naming it, before any training); one that returns no
  // logits leaves the vocabulary unknown (an id outside it fails in the
  // model's embedding).
  if (model.takesLabels()) {
    runtime::ModelLoss loss = model.lossOf(results);
    return loss.logits.defined() ? loss.logits.size(-1) : std::numeric_limits<int64_t>::max();
  }
  return vocab;
}

/// Prints the parameters' dtype, the master weights, the gradient reduction
/// and the loss scale when any is not plain float32; and the offloaded
/// optimizer's host memory.
void printPrecision(const tools::RunOptions &o, runtime::Model &model, double lossScale) {
  const at::ScalarType modelDtype = model.parameterDtype();
  const at::Device device = model.device();
  if (modelDtype != at::kFloat || lossScale > 0 || o.reduceDtype)
    std::cout << "bmt-run: parameters " << c10::toString(modelDtype)
              << (modelDtype == at::kHalf || modelDtype == at::kBFloat16
                      ? " with float32 master weights (ZeRO shards)"
                      : "")
              << ", gradient reduction "
              << (o.reduceDtype ? tools::dtypeFlagName(*o.reduceDtype)
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
               static_cast<int64_t>(c10::elementSize(runtime::masterDtype(shard.scalar_type())));
    }
    std::cout << "bmt-run: --offload-optimizer: float32 master weights, Adam moments and "
                 "gradient copies of "
              << elements << " elements in " << (device.is_cuda() ? "pinned " : "")
              << "host memory (" << std::fixed << std::setprecision(1)
              << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB on rank 0); the optimizer "
              << "runs on the CPU" << std::defaultfloat << "\n";
  }
}

/// Saves the trained parameters as safetensors at `path` (rank 0) under
/// every name of the state dict, tied ones under each, so that transformers
/// can load the file. Gathers one storage group at a time, which rank 0
/// streams into the file (SafetensorsWriter): no rank holds more than its
/// shards and one group. Written to a temporary name and renamed.
/// Collective; a failure to write is found after the last gather, so that
/// the other ranks are not left waiting, and thrown on every rank
/// (AgreedFailure: rank 0 prints it).
/// The entries of --save-params's file: every trained tensor under each of
/// its names.
std::vector<runtime::SafetensorsEntry> savedParameterEntries(runtime::Model &model) {
  const plan::Plan &p = model.plan();
  std::vector<runtime::SafetensorsEntry> entries;
  for (int64_t index : model.fullParameterOrder()) {
    const plan::TensorInfo &t = p.tensors.at(index);
    entries.push_back({t.name, t.dtype, t.shape});
    for (const std::string &alias : t.aliases)
      entries.push_back({alias, t.dtype, t.shape});
  }
  return entries;
}

/// The size of --save-params's file: the tensors' bytes and a header of
/// at most 256 bytes an entry.
int64_t savedParameterBytes(runtime::Model &model) {
  int64_t bytes = 8;
  for (const runtime::SafetensorsEntry &e : savedParameterEntries(model)) {
    int64_t n = static_cast<int64_t>(c10::elementSize(e.dtype));
    for (int64_t d : e.shape)
      n *= d;
    bytes += n + 256;
  }
  return bytes;
}

void saveParameters(runtime::Model &model, const std::string &path) {
  const plan::Plan &p = model.plan();
  const bool rank0 = model.world().rank() == 0;
  std::vector<runtime::SafetensorsEntry> entries = savedParameterEntries(model);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::unique_ptr<runtime::SafetensorsWriter> writer;
  std::string failure;
  auto fail = [&](const std::exception &e) {
    failure = path + ": cannot write: " + e.what();
    writer.reset();
    std::remove(tmp.c_str());
  };
  if (rank0) {
    try {
      writer = std::make_unique<runtime::SafetensorsWriter>(
          tmp, entries, std::map<std::string, std::string>{{"format", "pt"}, {"source", "bmt-run"}});
    } catch (const std::runtime_error &e) {
      fail(e);
    }
  }
  model.forEachFullParameter([&](int64_t index, const at::Tensor &value) { // collective
    if (!writer)
      return;
    try {
      at::Tensor host = value.cpu().contiguous();
      for (size_t k = 0; k <= p.tensors[index].aliases.size(); ++k)
        writer->write(host.data_ptr(), static_cast<int64_t>(host.nbytes()));
    } catch (const std::runtime_error &e) {
      fail(e);
    }
  });
  if (writer) {
    try {
      writer->close();
      if (std::rename(tmp.c_str(), path.c_str()) != 0)
        throw std::runtime_error(std::strerror(errno));
    } catch (const std::runtime_error &e) {
      fail(e);
    }
  }
  // Every rank learns whether rank 0 wrote the file (so that every rank
  // exits alike).
  runtime::Comm &world = model.world();
  if (world.size() > 1) {
    at::Tensor failed = at::full({1}, failure.empty() ? 0.0 : 1.0,
                                 at::TensorOptions().dtype(at::kDouble));
    at::Tensor t = world.backend() == "local" ? failed : failed.to(world.device());
    world.allReduce(t)->wait();
    if (!rank0 && t.cpu().item<double>() > 0)
      throw tools::AgreedFailure(path + ": rank 0 could not write the parameters");
  }
  if (!failure.empty())
    throw tools::AgreedFailure(failure);
  if (rank0)
    std::cout << "saved " << entries.size() << " parameters -> " << path << "\n";
}

/// Prints (rank 0) where a resumed run continues and the bytes each rank
/// read from the checkpoint (an all-gather: collective).
/// What this run sets differently from the run that saved the checkpoint:
/// its learning-rate schedule and batch shape, one "--flag now (saved: then)"
/// phrase each. The run goes on with its own values (a changed --lr or
/// --steps is often meant); saying so keeps a slip from going unnoticed.
std::vector<std::string> changedSettings(const runtime::ResumeReport &r, const tools::RunOptions &o,
                                         const runtime::LRScheduleConfig &now,
                                         int64_t sequencesPerStep) {
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
  const runtime::LRScheduleConfig &then = r.savedSchedule;
  note("--schedule", runtime::scheduleKindName(now.kind), runtime::scheduleKindName(then.kind));
  note("--lr", number(now.peakLR), number(then.peakLR));
  note("--warmup", std::to_string(now.warmupSteps), std::to_string(then.warmupSteps));
  const bool decays = now.kind == runtime::LRScheduleKind::Linear ||
                      now.kind == runtime::LRScheduleKind::Cosine;
  if (decays) {
    note("--min-lr", number(now.minLR), number(then.minLR));
    // The decay ends one step after --steps (see the schedule's setup).
    note("--steps", std::to_string(now.totalSteps - 1), std::to_string(then.totalSteps - 1));
  }
  if (now.kind == runtime::LRScheduleKind::Exponential)
    note("--lr-gamma", number(now.gamma), number(then.gamma));
  if (r.savedSequencesPerStep > 0 && o.batchesFile.empty()) {
    // The global batch, not --micro-batch: a resume on other ranks keeps it
    // with another --micro-batch.
    if (sequencesPerStep != r.savedSequencesPerStep)
      out.push_back("the batch to " + std::to_string(sequencesPerStep) +
                    " sequences a step (--micro-batch x data-parallel ranks x --grad-accum; "
                    "saved: " + std::to_string(r.savedSequencesPerStep) + ")");
    note("--seq-len", std::to_string(o.seqLen), std::to_string(r.savedSeqLen));
  }
  return out;
}

/// Rank 0 prints where the run resumed from, the bytes each rank read and
/// `changes` (changedSettings); with `steps` at or below the checkpoint's
/// step only that nothing is left to train (the resume's lines would say
/// training goes on). Collective: every rank calls it.
void printResume(const runtime::ResumeReport &r, const std::string &folder,
                 const std::vector<std::string> &changes, int64_t steps, runtime::Comm &world) {
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

/// What the entry function returns, for a message: "a plain tensor", or its
/// result names ("'last_hidden_state', 'pooler_output'").
std::string describeResults(const runtime::Model &model) {
  const plan::Function &entry = model.plan().functions[model.plan().entry];
  std::string names;
  for (const std::string &n : entry.resultNames)
    if (!n.empty())
      names += (names.empty() ? "'" : ", '") + n + "'";
  if (!names.empty())
    return names;
  return entry.resultNames.size() == 1
             ? "a plain tensor"
             : std::to_string(entry.resultNames.size()) + " unnamed results (a tuple)";
}

/// Whole documents (--sequences, or supervised data by default): the layout,
/// or none for random windows. Checks that the data, the objective and the
/// plan fit the layout (Failure otherwise, saying what to change), and
/// prints (rank 0) the documents and how many are truncated.
std::optional<runtime::SequenceLayout>
documentLayout(const tools::RunOptions &o, runtime::Model &model,
               runtime::Objective objective, const runtime::TokenFile *train,
               const runtime::TokenFile *eval, int64_t windowLength, bool rank0) {
  const runtime::TokenFile *data = train ? train : eval;
  if (o.windows || !data || !o.batchesFile.empty()) {
    if (o.sequences && !o.batchesFile.empty())
      throw tools::UsageError("--sequences lays out the documents of --data; --batches gives "
                              "ready batches");
    return std::nullopt;
  }
  // Supervised data: packed for a program exported for it (position_ids and
  // no attention_mask: bmt-export-hf --position-ids), else padded.
  const bool exportedForPacking =
      model.takesInput("position_ids") && !model.takesInput("attention_mask");
  std::optional<runtime::SequenceLayout> layout = o.sequences;
  if (!layout && data->hasLossMask())
    layout = exportedForPacking ? runtime::SequenceLayout::Packed
                                : runtime::SequenceLayout::Padded;
  if (!layout) {
    if (rank0 && eval && eval->hasLossMask())
      std::cout << "bmt-run: note: " << eval->binPath() << " is supervised, but the training "
                << "data is read in random windows: evaluation reads windows too and ignores "
                << "its loss mask (--sequences padded or packed evaluates its documents)\n";
    return std::nullopt;
  }
  const char *name = *layout == runtime::SequenceLayout::Padded ? "padded" : "packed";
  if (!data->hasDocuments())
    throw Failure(data->binPath() + ": --sequences " + name + " trains on whole documents, and "
                  "this version-1 token file has no document boundaries (prepare it again "
                  "with bmt-prepare-data, which writes version 2)");
  if (objective != runtime::Objective::CausalLM)
    throw Failure(std::string("--sequences ") + name + " trains causal LMs on whole documents; "
                  "the objective is " + runtime::objectiveName(objective));
  // The other layout is suggested only where this program can run it.
  const bool paddedRuns = model.takesInput("attention_mask");
  const std::string orPacked = exportedForPacking ? ", or train with --sequences packed" : "";
  const std::string orPadded = paddedRuns ? ", or train with --sequences padded" : "";
  if (*layout == runtime::SequenceLayout::Padded) {
    // A plan compiled assuming attention_mask all ones (bmt-opt's default)
    // is fed all ones (Trainer): right padding only follows a row's tokens,
    // which a causal LM's earlier positions never see, so the loss on them
    // is the same with or without the padding term.
    if (!paddedRuns)
      throw Failure(o.archive + "'s forward takes no attention_mask, which padded sequences "
                    "(--sequences padded) need; export the model with attention_mask "
                    "(bmt-export-hf does by default)" + orPacked);
  } else {
    if (!model.takesInput("position_ids"))
      throw Failure(o.archive + "'s forward takes no position_ids, which packed sequences "
                    "(--sequences packed) need to keep documents apart; export the model with "
                    "bmt-export-hf --position-ids and compile it again" + orPadded);
    if (model.takesInput("attention_mask"))
      throw Failure(o.archive + "'s forward takes attention_mask as well as position_ids, and "
                    "transformers keeps packed documents apart (from position_ids) only "
                    "without one; export the model with bmt-export-hf --position-ids (which "
                    "traces without attention_mask) and compile it again");
  }
  for (const runtime::TokenFile *f : {train, eval}) {
    if (!f || !f->hasDocuments())
      continue;
    auto [overlong, first] = runtime::overlongDocuments(*f, windowLength);
    if (overlong > 0 && o.overlongError)
      throw runtime::DataError(
          f->binPath() + ": " + std::to_string(overlong) + " of " +
          std::to_string(f->numDocuments()) + " documents are longer than --seq-len + 1 = " +
          std::to_string(windowLength) + " tokens (the first: document " +
          std::to_string(first) + ", " +
          std::to_string(f->documentEnd(first) - f->documentStart(first)) +
          " tokens); raise --seq-len, or drop --overlong error to truncate them");
    if (rank0)
      std::cout << "bmt-run: " << (f == train ? "training" : "evaluation") << " data: "
                << f->numDocuments() << " documents" << (f->hasLossMask() ? " (supervised)" : "")
                << ", sequences " << name << " in rows of "
                << (*layout == runtime::SequenceLayout::Padded ? "up to " : "") << windowLength
                << " tokens; " << overlong << " truncated to " << windowLength << " tokens"
                << (f->preparedTruncated() > 0
                        ? " (and " + std::to_string(f->preparedTruncated()) +
                              " cut to max_length by bmt-prepare-data)"
                        : std::string())
                << "\n";
  }
  return layout;
}

/// The options a plan compiled for tensor parallelism (T ranks per TP
/// group) refuses, and a world size T does not divide: ConfigFailure,
/// before any rank connects (the model-loss ones need the loaded model).
void checkTensorParallel(const tools::RunOptions &o, const plan::Plan &p, int64_t worldSize) {
  if (p.tensorParallel <= 1)
    return;
  const std::string t = std::to_string(p.tensorParallel);
  const std::string tp = o.archive + " is compiled for tensor parallelism (" + t +
                         " ranks per TP group): ";
  if (worldSize % p.tensorParallel != 0)
    throw tools::ConfigFailure(tp + "it needs a world size that is a multiple of " + t + ", not " +
                               std::to_string(worldSize) + (worldSize == 1 ? " rank" : " ranks") +
                               "; run on a multiple of " + t +
                               " ranks or recompile with another --tensor-parallel");
  if (!o.dumpInputs.empty())
    throw tools::ConfigFailure(tp + "--dump is not supported with it yet (each rank holds a part "
                               "of the logits)");
  if (o.train.inspectEvery > 0)
    throw tools::ConfigFailure(tp + "--inspect-every is not supported with it yet (its statistics "
                               "would mix the ranks' slices)");
}

/// After the steps: a run stopped by a signal exits 128 + the signal (143
/// SIGTERM, 130 SIGINT) without --save-params; a last checkpoint that
/// could not be written is an error (exit 1) naming the state lost, after
/// --save-params has been tried. Collective (--save-params).
int finishRun(const tools::RunOptions &o, runtime::Model &model,
              const runtime::TrainOutcome &outcome) {
  std::string lost;
  if (!outcome.lastSaveError.empty()) {
    std::optional<std::string> newest = runtime::latestCheckpoint(o.checkpoints.dir);
    lost = std::string(outcome.stopSignal
                           ? std::string("stopped by ") + runtime::stopSignalName(outcome.stopSignal) +
                                 " after step " + std::to_string(outcome.lastStep) + ", but the"
                           : std::string("the")) +
           " checkpoint of step " + std::to_string(outcome.lastStep) + " (the last) could not be "
           "written: " + outcome.lastSaveError + "; the trained state after step " +
           std::to_string(outcome.lastStep) + " is lost (" +
           (newest ? "the newest complete checkpoint is " + *newest
                   : "there is no complete checkpoint in " + o.checkpoints.dir) + ")";
  }
  if (outcome.stopSignal) {
    if (!lost.empty())
      throw tools::AgreedFailure(lost);
    return 128 + outcome.stopSignal;
  }
  if (!o.saveParams.empty()) {
    try {
      saveParameters(model, o.saveParams);
    } catch (const tools::AgreedFailure &e) {
      if (lost.empty())
        throw tools::AgreedFailure(std::string(e.what()) + "; the trained parameters of step " +
                                   std::to_string(outcome.lastStep) + " are lost" +
                                   (outcome.lastSavePath.empty()
                                        ? std::string()
                                        : " (the checkpoint " + outcome.lastSavePath +
                                              " holds them: bmt-to-hf exports it)"));
      lost += std::string("; --save-params failed too: ") + e.what();
    }
    if (lost.empty())
      return 0;
    lost += "; --save-params " + o.saveParams + " holds the parameters (not the optimizer state)";
  }
  if (!lost.empty())
    throw tools::AgreedFailure(lost);
  return 0;
}

int run(const tools::RunOptions &o) {
  tools::checkOutputs(o);
  runtime::RendezvousInfo rendezvous = runtime::rendezvousFromEnvironment();
  at::Device device = chooseDevice(o.device, rendezvous.localRank);
  plan::Archive archive(o.archive);
  checkTensorParallel(o, archive.plan(), rendezvous.worldSize);
  archive.setInitSeed(o.train.seed); // weights-free plans: initial values by --seed
  if (o.offloadOptimizer && archive.plan().groups.empty())
    throw tools::UsageError("--offload-optimizer keeps each rank's shard of the optimizer state "
                            "in host memory and needs a plan with ZeRO storage groups; " +
                            o.archive + " has none (compile it with bmt-opt's default pipeline "
                            "or --bmt-zero)");
  std::unique_ptr<runtime::Comm> world = runtime::connect(rendezvous, device);
  const bool rank0 = world->rank() == 0;
  runtime::ModelOptions modelOptions;
  modelOptions.offloadOptimizer = o.offloadOptimizer;
  runtime::Model model(archive, device, world.get(), rank0 ? loadProgress : nullptr,
                       modelOptions);
  const plan::Plan &p = model.plan();
  const tools::DecoderConfig decoder = tools::decoderConfig(archive);
  if (!o.saveParams.empty() && rank0)
    tools::checkSaveParamsRoom(o.saveParams, savedParameterBytes(model));
  // Tensor parallelism: a TP group of T ranks shares its rows of the batch;
  // the data is split over the data-parallel ranks.
  const int64_t worldSize = model.dataParallel().size(), rank = model.dataParallel().rank();
  // Dropout repeats run to run and agrees over a TP group; a resume
  // restores each rank's saved generator states after this.
  model.seedGenerators(o.train.seed);
  const bool encoderDecoder = model.isEncoderDecoder();
  runtime::Objective objectiveKind;
  try {
    objectiveKind = runtime::objectiveForModel(o.objective, encoderDecoder, p.objective);
  } catch (const std::invalid_argument &e) {
    throw Failure(o.archive + " (" + p.modelType + "): " + e.what());
  }
  // A forward taking labels computes its own loss: bmt-run trains on it,
  // feeding the labels of the data objective (Trainer.h modelLabels).
  const bool modelLoss = model.takesLabels();
  if (p.tensorParallel > 1) {
    const std::string tp = o.archive + " is compiled for tensor parallelism (" +
                           std::to_string(p.tensorParallel) + " ranks per TP group): ";
    if (modelLoss)
      throw tools::ConfigFailure(
          tp + "its forward takes labels and computes its own loss, which is not supported with "
               "it yet (bmt cannot see how that loss reduces over the ranks' parts of the "
               "model); export the model without labels (bmt-export-hf without --labels) to "
               "train it on bmt-run's vocab-parallel cross-entropy");
    if (o.modelLoss)
      throw tools::ConfigFailure(tp + "--objective model-loss is not supported with it yet, and "
                                 "its forward takes no labels anyway; leave out --objective to "
                                 "train on bmt-run's vocab-parallel cross-entropy");
  }
  if (o.modelLoss && !modelLoss)
    throw Failure(o.archive + ": --objective model-loss trains on the loss the model computes "
                  "from its labels, but its forward takes no 'labels' input (it was traced or "
                  "exported without them); export it with labels (bmt-export-hf --labels), or "
                  "train it with bmt-run's own cross-entropy (--objective auto)");
  const std::string objective =
      modelLoss ? std::string("model-loss (the loss its forward returns, fed ") +
                      runtime::objectiveName(objectiveKind) + " labels)"
                : std::string(runtime::objectiveName(objectiveKind));
  if (!model.hasLogits() && !modelLoss && o.dumpInputs.empty())
    throw Failure(o.archive + ": the model's forward returns " + describeResults(model) +
                  " and no 'logits' result (" + p.modelType + "); to train, its forward must "
                  "return a dict or ModelOutput with 'logits' [batch, seq, vocab] (a "
                  "*ForCausalLM/*ForMaskedLM/*ForConditionalGeneration model does), or take "
                  "'labels' and return its loss as 'loss' (--objective model-loss); it can be "
                  "run with --dump as it is");
  const bool maskedLM = objectiveKind == runtime::Objective::MaskedLM;
  const bool spanCorruption = objectiveKind == runtime::Objective::SpanCorruption;
  // Span corruption: --seq-len is the encoder input's length; the windows
  // read from the data are longer (their noise spans become sentinels).
  const runtime::SpanCorruptionConfig &span = o.train.spanCorruption;
  int64_t windowLength = o.seqLen + 1; // tokens read per sequence
  runtime::SpanCorruptionLengths spanLengths;
  if (spanCorruption && o.batchesFile.empty()) {
    try {
      windowLength = runtime::spanCorruptionWindow(o.seqLen, span);
      spanLengths = runtime::spanCorruptionLengths(windowLength, span);
    } catch (const std::invalid_argument &e) {
      throw tools::UsageError(std::string("--seq-len, --noise-density, --mean-span-length: ") +
                              e.what());
    }
  }
  printLoadSummary(o, archive, model, objective, device);

  if (!o.dumpInputs.empty()) {
    tools::runDump(model, o, objectiveKind, decoder);
    return 0;
  }

  // --batches: this rank's rows, read now so that the probe below runs at
  // their shapes.
  tools::FixedBatches fixed;
  if (!o.batchesFile.empty() && !o.evalOnly)
    fixed = tools::loadBatches(o, encoderDecoder, p.modelType, worldSize);

  const int64_t vocab =
      probeVocabulary(o, model, fixed, spanCorruption ? &span : nullptr, spanLengths.targetLength,
                      archive.hfFiles());

  if (vocab == std::numeric_limits<int64_t>::max() && objectiveKind != runtime::Objective::CausalLM)
    throw Failure(o.archive + ": the model returns its loss but no 'logits', so bmt-run does not "
                  "know its vocabulary, which " + runtime::objectiveName(objectiveKind) +
                  " needs (random replacement tokens, sentinels); return the logits as well");
  std::unique_ptr<runtime::TokenFile> train = tools::openTrainingData(o, vocab);
  std::unique_ptr<runtime::TokenFile> eval = tools::openEvaluationData(o, vocab, windowLength);
  const std::optional<runtime::SequenceLayout> layout =
      documentLayout(o, model, objectiveKind, train.get(), eval.get(), windowLength, rank0);

  // The command line's settings, completed by what the model and the data say.
  runtime::TrainConfig config = o.train;
  // Linear and cosine decay reach --min-lr one step after the last step, so
  // that the last step still learns (with the default --min-lr 0 it would
  // run at lr 0); with --steps 1 and no warmup the one step runs at --lr.
  config.schedule.totalSteps = std::max<int64_t>(o.train.steps, 1) + 1;
  config.objective = objectiveKind;
  config.modelLoss = modelLoss;
  config.vocabSize = vocab;
  if (layout && eval && eval->hasDocuments())
    config.evalDocuments = layout;
  // Mixed precision.
  at::ScalarType modelDtype = model.parameterDtype();
  config.lossScale = o.lossScale >= 0 ? o.lossScale : (modelDtype == at::kHalf ? 65536.0 : 0.0);
  if (o.reduceDtype)
    model.setReduceDtype(*o.reduceDtype);
  if (rank0)
    printPrecision(o, model, config.lossScale);

  if (maskedLM)
    config.maskId = tools::maskTokenId(train ? train.get() : eval.get());
  if (spanCorruption && o.batchesFile.empty()) // (--batches: below, from the file's windows)
    config.spanCorruption = tools::spanCorruptionSettings(
        o, decoder, span, spanLengths, vocab, train ? train.get() : eval.get(), 0, rank0);

  if (fixed.inputIds.defined()) { // ready encoder-decoder pairs
    const tools::DecoderIds ids = tools::decoderIds(o, decoder, nullptr);
    config.spanCorruption.decoderStartId = ids.startId;
    config.spanCorruption.decoderPadId = ids.padId;
    if (rank0)
      std::cout << "bmt-run: decoder start " << ids.startId << " (" << ids.source << ")\n";
  }
  tools::checkBatchIds(fixed, vocab, o.batchesFile);
  if (fixed.windows.defined() && spanCorruption)
    config.spanCorruption = tools::spanCorruptionSettings(
        o, decoder, span, runtime::spanCorruptionLengths(fixed.windows.size(2), span), vocab, nullptr,
        fixed.windows.max().item<int64_t>() + 1, rank0);
  std::unique_ptr<runtime::MicroBatchSource> batches;
  if (layout && train)
    batches = std::make_unique<runtime::DocumentBatches>(
        *train, *layout, o.microBatch, windowLength, o.train.seed, /*shuffle=*/true, rank,
        worldSize);
  else
    batches = tools::makeBatchSource(fixed, train.get(), o.microBatch, windowLength,
                                     o.train.seed, rank, worldSize);

  // The checkpoint to continue from: named, or the newest complete one.
  std::string resumeFrom = o.resume;
  if (o.resume == "auto") {
    resumeFrom = runtime::latestCheckpoint(o.checkpoints.dir).value_or("");
    if (resumeFrom.empty() && rank0)
      std::cout << "bmt-run: --resume auto: no complete checkpoint in " << o.checkpoints.dir
                << "; starting at step 1\n";
  }
  std::unique_ptr<std::ofstream> log;
  if (!o.logFile.empty()) {
    // A resumed run adds its steps to the log of the run it continues.
    log = std::make_unique<std::ofstream>(o.logFile, resumeFrom.empty() ? std::ios::trunc
                                                                        : std::ios::app);
    if (!*log)
      throw Failure(o.logFile + ": cannot write the log");
  }
  runtime::Trainer trainer(model, config, std::cout, log.get());
  if (rank0 && model.optimizerWritesShards())
    std::cout << "bmt-run: the optimizer writes the " << c10::toString(model.parameterDtype())
              << " shards in its update, from the gradients as reduced (no float32 copy of "
                 "them, no separate cast of the masters)\n";
  const int64_t sequencesPerStep = o.microBatch * worldSize * o.train.gradAccum;
  if (!o.checkpoints.dir.empty()) {
    runtime::RunIdentity identity;
    identity.planIdentity = runtime::planIdentity(p, archive.programText(), worldSize);
    identity.modelIdentity = runtime::modelIdentity(p);
    identity.source = p.source;
    identity.modelType = p.modelType;
    identity.worldSize = worldSize;
    identity.zeroStage = p.zeroStage;
    identity.shardGroupSize = p.shardGroupSize > 0 ? p.shardGroupSize : worldSize;
    identity.hfFiles = archive.hfFiles();
    if (o.batchesFile.empty()) {
      identity.sequencesPerStep = sequencesPerStep;
      identity.seqLen = o.seqLen;
    }
    trainer.setCheckpoints(o.checkpoints, identity);
  }
  if (!resumeFrom.empty() && !o.evalOnly) {
    runtime::ResumeReport report = trainer.resume(resumeFrom);
    printResume(report, resumeFrom,
                changedSettings(report, o, config.schedule, sequencesPerStep), o.train.steps,
                model.world()); // collective
  }

  if (o.evalOnly) {
    trainer.reportEvaluation(
        0, trainer.evaluate(*eval, windowLength - 1, o.microBatch, o.train.evalBatches));
    return 0;
  }

  const runtime::TrainOutcome outcome =
      trainer.train(*batches, eval.get(), windowLength - 1, o.microBatch);
  return finishRun(o, model, outcome);
}

} // namespace

namespace {

/// Writes `line` unless this process is a rank other than 0 of a launch
/// (torchrun's RANK).
void printOnRank0(const std::string &line) {
  const char *rank = std::getenv("RANK");
  if (rank == nullptr || std::string(rank) == "0")
    bmt::writeErrorLine(line);
}

/// The CPUs this process may use: its affinity mask, capped by a cgroup
/// CPU quota (cpu.max "QUOTA PERIOD", rounded up).
int64_t usableCpus() {
  cpu_set_t set;
  int64_t cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  std::ifstream in("/sys/fs/cgroup/cpu.max");
  std::string quota;
  int64_t period = 0;
  if (in >> quota >> period && quota != "max" && period > 0) {
    const int64_t q = std::atoll(quota.c_str());
    if (q > 0)
      cpus = std::min(cpus, (q + period - 1) / period);
  }
  return std::max<int64_t>(cpus, 1);
}

/// Without OMP_NUM_THREADS, restarts the process (the same pid, argv) with
/// OMP_NUM_THREADS = the usable CPUs divided by the processes of this host
/// (LOCAL_WORLD_SIZE, at least 1 each) and, unless set, OMP_WAIT_POLICY =
/// passive: OpenMP reads both when it loads, before main. LibTorch's own
/// default counts the host's cores, ignoring a container's CPU quota and
/// other jobs, and OpenMP's threads spin while they wait: on a busy 2-core
/// machine a run was 9x slower (docs/runtime.md, "Threads"). The count does
/// not follow the machine's load: CPU reductions may round differently with
/// another thread count, and a run must repeat bit for bit. Returns when
/// nothing is to be done or exec fails.
void chooseThreads(char **argv) {
  if (std::getenv("OMP_NUM_THREADS") != nullptr)
    return;
  int64_t local = 1;
  if (const char *l = std::getenv("LOCAL_WORLD_SIZE"))
    local = std::max<int64_t>(1, std::atoll(l));
  const int64_t threads = std::max<int64_t>(1, usableCpus() / local);
  ::setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
  ::setenv("OMP_WAIT_POLICY", "passive", 0);
  ::execv("/proc/self/exe", argv);
}

} // namespace

int main(int argc, char **argv) {
  chooseThreads(argv);
  try {
    // SIGTERM / SIGINT: at once, or during the steps after the step in
    // flight, with a checkpoint (StopSignal.h).
    runtime::installStopHandlers();
    tools::RunOptions options = tools::parseRunOptions(argc, argv);
    if (options.help) {
      std::cout << tools::runUsage();
      return 0;
    }
    runtime::env::checkEnvironment(); // a bad BMT_* value: one error before anything loads
    return run(options);
  } catch (const tools::UsageError &e) {
    // The same argv, and so the same error, on every rank.
    printOnRank0(std::string("error: ") + e.what());
  } catch (const tools::ConfigFailure &e) {
    printOnRank0(std::string("error: ") + e.what());
  } catch (const tools::AgreedFailure &e) {
    printOnRank0(std::string("error: ") + e.what());
  } catch (const c10::Error &e) {
    bmt::writeErrorLine("error: " + bmt::firstErrorLine(e.what_without_backtrace()));
  } catch (const std::exception &e) {
    // UsageError, PlanError, DataError, TrainingError, ExecutionError,
    // Failure: their what() is already the one line to print.
    bmt::writeErrorLine(std::string("error: ") + e.what());
  }
  return 1;
}
