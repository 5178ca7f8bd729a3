//===- bmt-run.cpp - train a compiled model -------------------------------===//
//
// bmt-run SHARDED.pt --data train.bin --steps N [options]   (see --help)
//
// One process, or one per rank under `torchrun --no-python bmt-run ...`
// (rendezvous from torchrun's environment; docs/runtime/running.md). Every failure
// is one "error: ..." line on stderr and exit status 1 on every rank; a
// usage or configuration error, which every rank finds alike, is printed
// by rank 0 alone.
//
//===----------------------------------------------------------------------===//

#include "Options.h"
#include "Run.h"

#include "bmt/Plan/Archive.h"
#include "bmt/Runtime/Env.h"
#include "bmt/Runtime/checkpoint/Checkpoint.h"
#include "bmt/Runtime/checkpoint/RunIdentity.h"
#include "bmt/Runtime/checkpoint/SaveParameters.h"
#include "bmt/Runtime/comm/Rendezvous.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/objectives/Corruption.h"
#include "bmt/Runtime/train/DocumentLayout.h"
#include "bmt/Runtime/train/Finish.h"
#include "bmt/Runtime/train/RunChecks.h"
#include "bmt/Runtime/train/RunLog.h"
#include "bmt/Runtime/train/RunReport.h"
#include "bmt/Runtime/train/StopSignal.h"
#include "bmt/Runtime/train/Threads.h"
#include "bmt/Runtime/train/Trainer.h"
#include "bmt/Support/ErrorText.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>

using namespace bmt;
using tools::Failure;

namespace {

int run(const tools::RunOptions &o) {
  tools::checkOutputs(o);
  runtime::RendezvousInfo rendezvous = runtime::rendezvousFromEnvironment();
  at::Device device = runtime::chooseDevice(o.device, rendezvous.localRank);
  plan::Archive archive(o.archive);
  {
    runtime::PipelineRequest pipeline;
    pipeline.worldSize = rendezvous.worldSize;
    pipeline.microBatches = o.pipelineMicroBatchesGiven ? o.train.pipelineMicroBatches : 0;
    pipeline.dump = !o.dumpInputs.empty();
    pipeline.inspect = o.train.inspectEvery > 0;
    pipeline.offload = o.offloadOptimizer;
    pipeline.adafactor = o.train.optimizer.kind == runtime::OptimizerKind::Adafactor;
    pipeline.evalRows = o.evalData.empty() ? 0 : o.microBatch;
    pipeline.profile = o.train.profileFrom > 0;
    runtime::checkPipeline(o.archive, archive.plan(), pipeline);
  }
  runtime::checkTensorParallel(o.archive, archive.plan(), rendezvous.worldSize,
                               !o.dumpInputs.empty(), o.train.inspectEvery > 0);
  archive.setInitSeed(o.train.seed); // weights-free plans: initial values by --seed
  runtime::checkOffload(o.archive, archive.plan(), o.offloadOptimizer);
  std::unique_ptr<runtime::Comm> world = runtime::connect(rendezvous, device);
  const bool rank0 = world->rank() == 0;
  runtime::ModelOptions modelOptions;
  modelOptions.offloadOptimizer = o.offloadOptimizer;
  runtime::Model model(archive, device, world.get(), rank0 ? runtime::loadProgress : nullptr,
                       modelOptions);
  const plan::Plan &p = model.plan();
  const tools::DecoderConfig decoder = tools::decoderConfig(archive);
  if (!o.saveParams.empty() && rank0)
    tools::checkSaveParamsRoom(o.saveParams, runtime::savedParameterBytes(model));
  // Tensor parallelism: a TP group of T ranks shares its rows of the batch;
  // the data is split over the data-parallel ranks.
  const int64_t worldSize = model.dataParallel().size(), rank = model.dataParallel().rank();
  // Dropout repeats run to run and agrees over a TP group; a resume
  // restores each rank's saved generator states after this, or on another
  // layout reseeds them from the step it resumes at (Generators.h).
  model.seedGenerators(o.train.seed);
  const bool encoderDecoder = model.isEncoderDecoder();
  const runtime::ObjectiveChoice choice =
      runtime::chooseObjective(model, o.archive, o.objective, o.modelLoss, !o.dumpInputs.empty());
  const runtime::Objective objectiveKind = choice.kind;
  const bool modelLoss = choice.modelLoss;
  const std::string &objective = choice.name;
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
  runtime::printLoadSummary(o.archive, archive, model, objective, device);

  if (!o.dumpInputs.empty()) {
    tools::runDump(model, o, objectiveKind, decoder);
    return 0;
  }

  // --batches: this rank's rows, read now so that the probe below runs at
  // their shapes.
  tools::FixedBatches fixed;
  if (!o.batchesFile.empty() && !o.evalOnly)
    fixed = tools::loadBatches(o, encoderDecoder, p.modelType, worldSize);

  // A pipeline runs pieces of a micro-batch's rows / M (--micro-batches):
  // the probe runs one piece, the shape a torch.export program must take.
  const int64_t pieces = p.pipelineStages <= 1      ? 1
                         : o.pipelineMicroBatchesGiven ? o.train.pipelineMicroBatches
                                                       : p.pipelineStages; // (the fewest 1F1B takes)
  if (p.pipelineStages > 1 && !o.evalOnly) {
    // (PipelineStep.cpp checks each batch as well.)
    const int64_t rows = fixed.windows.defined() ? fixed.windows.size(1) / worldSize : o.microBatch;
    if (rows % pieces != 0)
      throw tools::UsageError("--micro-batches " + std::to_string(pieces) +
                              " does not divide this rank's " + std::to_string(rows) +
                              " rows of a micro-batch (" +
                              (fixed.windows.defined() ? o.batchesFile : "--micro-batch") + ")");
  }
  runtime::ProbeShape probe = tools::probeShape(o, fixed, spanCorruption ? &span : nullptr,
                                                spanLengths.targetLength, worldSize,
                                                archive.hfFiles());
  if (pieces > 1 && probe.rows % pieces == 0) {
    probe.rows /= pieces;
    probe.runName += " in pieces of " + std::to_string(probe.rows) +
                     (probe.rows == 1 ? " row" : " rows") + " (--micro-batches " +
                     std::to_string(pieces) + ")";
  }
  const int64_t vocab = runtime::probeVocabulary(model, probe);

  runtime::checkVocabularyKnown(o.archive, vocab, objectiveKind);
  std::unique_ptr<runtime::TokenFile> train = tools::openTrainingData(o, vocab);
  std::unique_ptr<runtime::TokenFile> eval = tools::openEvaluationData(o, vocab, windowLength);
  runtime::LayoutRequest layoutRequest{o.archive, o.sequences, o.windows,
                                       !o.batchesFile.empty(), o.overlongError};
  const std::optional<runtime::SequenceLayout> layout = runtime::documentLayout(
      layoutRequest, model, objectiveKind, train.get(), eval.get(), windowLength, rank0);

  // The command line's settings, completed by what the model and the data say.
  runtime::TrainConfig config = o.train;
  config.pipelineMicroBatches = pieces;
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
    runtime::printPrecision(model, config.lossScale, o.reduceDtype,
                            o.reduceDtype ? tools::dtypeFlagName(*o.reduceDtype) : "");

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
  // A resumed run adds its steps to the log of the run it continues.
  std::unique_ptr<std::ofstream> log;
  if (!o.logFile.empty())
    log = runtime::openRunLog(o.logFile, !resumeFrom.empty(), rank0);
  if (config.moeBiasUpdateRate > 0 && model.routerBiases().empty())
    throw tools::UsageError("--moe-bias-update-rate: " + o.archive +
                            " has no router with a score-correction bias (a buffer of one value "
                            "per expert added to the scores its top-k chooses by, as "
                            "DeepSeek-V3's e_score_correction_bias)");
  runtime::Trainer trainer(model, config, std::cout, log.get());
  if (rank0 && model.optimizerWritesShards())
    std::cout << "bmt-run: the optimizer writes the " << c10::toString(model.parameterDtype())
              << " shards in its update, from the gradients as reduced (no float32 copy of "
                 "them, no separate cast of the masters)\n";
  const int64_t sequencesPerStep = o.microBatch * worldSize * o.train.gradAccum;
  if (!o.checkpoints.dir.empty()) {
    runtime::RunIdentity identity = runtime::runIdentity(
        archive, p, worldSize, o.batchesFile.empty() ? sequencesPerStep : 0, o.seqLen);
    identity.moeBiasUpdateRate = config.moeBiasUpdateRate;
    trainer.setCheckpoints(o.checkpoints, identity);
  }
  if (!resumeFrom.empty() && !o.evalOnly) {
    // Every refusal (other data, a checkpoint folder this run cannot save
    // into) before the line that says the run resumed.
    runtime::ResumeReport report = trainer.resume(resumeFrom, batches.get());
    trainer.openCheckpoints();
    std::vector<std::string> changes = runtime::changedSettings(
        report, config.schedule, sequencesPerStep, o.seqLen, !o.batchesFile.empty());
    // The routers' biases move only with the rate the run gives now.
    if (report.savedMoeBiasUpdateRate != config.moeBiasUpdateRate) {
      std::ostringstream s;
      s << "--moe-bias-update-rate " << config.moeBiasUpdateRate
        << " (saved: " << report.savedMoeBiasUpdateRate << ")";
      changes.push_back(s.str());
    }
    runtime::printResume(report, resumeFrom, changes, o.train.steps,
                         model.world()); // collective
  }

  if (o.evalOnly) {
    trainer.reportEvaluation(
        0, trainer.evaluate(*eval, windowLength - 1, o.microBatch, o.train.evalBatches));
    return runtime::checkRunLog(o.logFile, log.get(), 0);
  }

  const runtime::TrainOutcome outcome =
      trainer.train(*batches, eval.get(), windowLength - 1, o.microBatch);
  return runtime::checkRunLog(
      o.logFile, log.get(),
      runtime::finishRun(model, outcome, o.checkpoints.dir, o.saveParams));
}

/// Writes `line` unless this process is a rank other than 0 of a launch
/// (torchrun's RANK).
void printOnRank0(const std::string &line) {
  const char *rank = std::getenv("RANK");
  if (rank == nullptr || std::string(rank) == "0")
    bmt::writeErrorLine(line);
}

} // namespace

int main(int argc, char **argv) {
  // Each line reaches a redirected log as it is printed, so that a killed
  // run's log still holds its start-up and last step lines.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  runtime::chooseThreads(argv);
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
  } catch (const runtime::AgreedError &e) {
    printOnRank0(std::string("error: ") + e.what());
  } catch (const runtime::ConfigError &e) {
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
