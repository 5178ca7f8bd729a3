//===- bmt-opt.cpp - the bmt compiler driver ------------------------------===//
//
// Behaves like mlir-opt, with two additions: an input that is a PyTorch
// archive (a zip: TorchScript `.pt`, torch.export `.pt2`) is first imported
// into the bmt dialect, and an output ending in `.pt` is written as a sharded.pt archive (the
// runtime plan, the program and the weights) instead of MLIR text.
// Everything else (--pass-pipeline, --mlir-print-ir-after-all,
// --verify-diagnostics, --split-input-file, -o) is MlirOptMain's.
//
// `-o *.pt` without any pass flag or --pass-pipeline runs the default
// pipeline (fuse-gelu, find-blocks, zero, checkpoint, overlap, summary), fed by the
// top-level flags --world-size, --zero-stage, ... (docs/passes.md).
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Export/ShardedArchive.h"
#include "bmt/Import/TorchExport.h"
#include "bmt/Import/TorchScript.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "llvm/Support/Path.h"

#include <cmath>
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;

/// True for outputs written as a sharded.pt archive rather than MLIR text.
static bool isArchiveOutput(llvm::StringRef path) {
  return path.ends_with(".pt") || path.ends_with(".pth");
}

/// Writes `text` to `path` through a temporary file renamed over it.
static std::error_code writeFileAtomically(llvm::StringRef path, llvm::StringRef text) {
  llvm::SmallString<256> tmp;
  int fd;
  if (std::error_code ec = llvm::sys::fs::createUniqueFile(path + ".tmp-%%%%%%", fd, tmp))
    return ec;
  {
    llvm::raw_fd_ostream out(fd, /*shouldClose=*/true);
    out << text;
    out.close();
    if (out.has_error()) {
      std::error_code ec = out.error();
      out.clear_error();
      llvm::sys::fs::remove(tmp);
      return ec;
    }
  }
  if (std::error_code ec = llvm::sys::fs::rename(tmp, path)) {
    llvm::sys::fs::remove(tmp);
    return ec;
  }
  return {};
}

/// True for inputs an importer reads rather than the MLIR parser.
static bool isArchiveInput(llvm::StringRef path) {
  return path.ends_with(".pt") || path.ends_with(".pth") || path.ends_with(".pt2") ||
         (path != "-" && bmt::looksLikeZipArchive(path));
}

/// True for archive inputs the torch.export importer reads: a `.pt2` name,
/// or a zip whose records are those of torch.export.save.
static bool isTorchExportInput(llvm::StringRef path) {
  return path.ends_with(".pt2") || bmt::looksLikeTorchExportArchive(path);
}

/// Prints an importer diagnostic as one line, compiler style:
/// "file.py:12:8: error: model.pt: ..." where the node has a Python source
/// location, "error: model.pt: ..." where it has none.
static LogicalResult printImportDiagnostic(Diagnostic &diag) {
  llvm::raw_ostream &os = llvm::errs();
  if (auto loc = dyn_cast<FileLineColLoc>(diag.getLocation());
      loc && loc.getLine() > 0)
    os << loc.getFilename().getValue() << ":" << loc.getLine() << ":"
       << loc.getColumn() << ": ";
  switch (diag.getSeverity()) {
  case DiagnosticSeverity::Error: os << "error: "; break;
  case DiagnosticSeverity::Warning: os << "warning: "; break;
  case DiagnosticSeverity::Note: os << "note: "; break;
  case DiagnosticSeverity::Remark: os << "remark: "; break;
  }
  os << diag << "\n";
  return success();
}

// Top-level flags of the default pipeline (bmt::DefaultPipelineOptions).
static llvm::cl::OptionCategory defaultPipelineCategory(
    "Default pipeline (bmt-opt MODEL -o sharded.pt without pass flags)");
static llvm::cl::opt<int64_t> clWorldSize(
    "world-size", llvm::cl::desc("ranks of the training job (memory estimate, auto checkpoint)"),
    llvm::cl::init(1), llvm::cl::cat(defaultPipelineCategory));
static llvm::cl::opt<int64_t> clZeroStage("zero-stage", llvm::cl::desc("ZeRO stage: 3 or 2"),
                                          llvm::cl::init(3),
                                          llvm::cl::cat(defaultPipelineCategory));
static llvm::cl::opt<int64_t> clShardGroupSize(
    "shard-group-size",
    llvm::cl::desc("hybrid sharding: shard within groups of this many ranks (0: all ranks)"),
    llvm::cl::init(0), llvm::cl::cat(defaultPipelineCategory));
static llvm::cl::opt<std::string> clCheckpoint(
    "checkpoint", llvm::cl::desc("blocks recomputed in backward: all, none or auto"),
    llvm::cl::init("all"), llvm::cl::cat(defaultPipelineCategory));
static llvm::cl::opt<double> clMemoryBudgetGib(
    "memory-budget-gib", llvm::cl::desc("--checkpoint=auto: per-rank memory budget in GiB"),
    llvm::cl::init(0), llvm::cl::cat(defaultPipelineCategory));
static llvm::cl::opt<int64_t> clMicroBatch("micro-batch",
                                           llvm::cl::desc("sequences per rank per forward"),
                                           llvm::cl::init(1),
                                           llvm::cl::cat(defaultPipelineCategory));
static llvm::cl::opt<int64_t> clSeqLen("seq-len", llvm::cl::desc("tokens per sequence"),
                                       llvm::cl::init(1024),
                                       llvm::cl::cat(defaultPipelineCategory));
static llvm::cl::opt<int64_t> clPrefetchDepth(
    "prefetch-depth", llvm::cl::desc("blocks gathered ahead of the running one (0: none)"),
    llvm::cl::init(1), llvm::cl::cat(defaultPipelineCategory));

static llvm::cl::opt<bool> clAssumeUnpadded(
    "assume-unpadded",
    llvm::cl::desc("treat attention_mask as all ones, so that a causal mask ANDed with it becomes "
                   "is_causal=True (bmt-causal-attention); recorded in the plan, bmt-run trains "
                   "with all-ones masks and --dump refuses padded ones. --assume-unpadded=false "
                   "keeps the padding term"),
    llvm::cl::init(true), llvm::cl::cat(defaultPipelineCategory));

// Export flag (any -o *.pt).
static llvm::cl::opt<bool> clRandomInit(
    "random-init",
    llvm::cl::desc("-o *.pt: write no weights for the trainable parameters; the runtime "
                   "initializes them by rule (pretraining from scratch, benchmarks)"),
    llvm::cl::init(false));

/// The names of the default pipeline's top-level flags that were given.
static std::vector<std::string> givenPipelineFlags() {
  std::vector<std::string> given;
  for (llvm::cl::Option *opt :
       {static_cast<llvm::cl::Option *>(&clWorldSize), static_cast<llvm::cl::Option *>(&clZeroStage),
        static_cast<llvm::cl::Option *>(&clShardGroupSize),
        static_cast<llvm::cl::Option *>(&clCheckpoint),
        static_cast<llvm::cl::Option *>(&clMemoryBudgetGib),
        static_cast<llvm::cl::Option *>(&clMicroBatch), static_cast<llvm::cl::Option *>(&clSeqLen),
        static_cast<llvm::cl::Option *>(&clPrefetchDepth),
        static_cast<llvm::cl::Option *>(&clAssumeUnpadded)})
    if (opt->getNumOccurrences() > 0)
      given.push_back(("--" + opt->ArgStr).str());
  return given;
}

/// Checks the top-level flags; prints one error and returns false if one is bad.
static bool checkPipelineFlags() {
  auto fail = [](const llvm::Twine &message) {
    llvm::errs() << "error: " << message << "\n";
    return false;
  };
  if (clWorldSize <= 0)
    return fail("--world-size must be positive, got " + llvm::Twine(clWorldSize.getValue()));
  if (clZeroStage != 2 && clZeroStage != 3)
    return fail("--zero-stage must be 3 or 2, got " + llvm::Twine(clZeroStage.getValue()));
  if (clShardGroupSize < 0)
    return fail("--shard-group-size must be 0 (all ranks) or positive, got " +
                llvm::Twine(clShardGroupSize.getValue()));
  if (clCheckpoint != "all" && clCheckpoint != "none" && clCheckpoint != "auto")
    return fail("--checkpoint must be all, none or auto, got '" + clCheckpoint + "'");
  if (!(clMemoryBudgetGib >= 0) || !std::isfinite(clMemoryBudgetGib))
    return fail("--memory-budget-gib must be a positive number of GiB");
  if (clCheckpoint == "auto" && clMemoryBudgetGib <= 0)
    return fail("--checkpoint=auto needs a per-rank memory budget: --memory-budget-gib=N");
  if (clCheckpoint != "auto" && clMemoryBudgetGib > 0)
    return fail("--memory-budget-gib applies to --checkpoint=auto only (the checkpoint mode is " +
                clCheckpoint + ")");
  if (clMicroBatch <= 0)
    return fail("--micro-batch must be positive, got " + llvm::Twine(clMicroBatch.getValue()));
  if (clSeqLen <= 0)
    return fail("--seq-len must be positive, got " + llvm::Twine(clSeqLen.getValue()));
  // Bounds that keep the memory estimate's products inside 64 bits.
  if (clMicroBatch > (int64_t(1) << 20) || clSeqLen > (int64_t(1) << 24))
    return fail("--micro-batch (at most 2^20) or --seq-len (at most 2^24) is too large");
  if (clPrefetchDepth < 0)
    return fail("--prefetch-depth must be 0 or positive, got " +
                llvm::Twine(clPrefetchDepth.getValue()));
  return true;
}

/// True if the command line names a pass or a pipeline (--bmt-zero,
/// --pass-pipeline=..., -p ...): then bmt-opt is plain mlir-opt.
static bool passesGiven() {
  auto &options = llvm::cl::getRegisteredOptions();
  // Every registered pass and pipeline flag is a value of one list option,
  // so looking up any pass name finds it.
  for (llvm::StringRef name : {"bmt-summary", "pass-pipeline", "p"})
    if (auto *opt = options.lookup(name); opt && opt->getNumOccurrences() > 0)
      return true;
  return false;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  DialectRegistry registry;
  registry.insert<bmt::BmtDialect, func::FuncDialect>();
  bmt::registerBmtPasses();
  bmt::registerDefaultPipeline();
  registerTransformsPasses(); // canonicalize, cse, symbol-dce, inline, ...

  auto [inputFilename, outputFilename] = registerAndParseCLIOptions(
      argc, argv,
      "bmt-opt: compiles a PyTorch model (TorchScript .pt, torch.export .pt2 or bmt MLIR) for "
      "distributed training\n",
      registry);
  MlirOptMainConfig config = MlirOptMainConfig::createFromCLOptions();
  // A failing pass's error is one line: do not print the whole module
  // after it, unless asked for with --mlir-print-op-on-diagnostic.
  if (auto *printOp = static_cast<llvm::cl::opt<bool> *>(
          llvm::cl::getRegisteredOptions().lookup("mlir-print-op-on-diagnostic"));
      printOp && printOp->getNumOccurrences() == 0)
    *printOp = false;

  // `-o *.pt` without passes: the default pipeline, fed by the top-level flags.
  bool defaultPipeline = isArchiveOutput(outputFilename) && !passesGiven();
  std::vector<std::string> pipelineFlags = givenPipelineFlags();
  bool planned = false; // a bmt IR input that the passes have already transformed
  if (defaultPipeline && inputFilename != "-" && !isArchiveInput(inputFilename)) {
    std::string peekError;
    if (auto peek = openInputFile(inputFilename, &peekError)) {
      llvm::StringRef text = peek->getBuffer();
      planned = text.contains("bmt.block_list ") || text.contains("bmt.storage_group ") ||
                text.contains("bmt.overlap");
    }
  }
  if (planned) {
    if (!pipelineFlags.empty()) {
      llvm::errs() << "error: " << pipelineFlags.front() << ": " << inputFilename
                   << " has already been through the passes (it has block lists or storage "
                      "groups); it is exported as it is, so the default pipeline's flags do "
                      "not apply\n";
      return 1;
    }
    llvm::errs() << "note: " << inputFilename
                 << " has already been through the passes; exporting it as it is\n";
    defaultPipeline = false;
  } else if (!defaultPipeline && !pipelineFlags.empty()) {
    llvm::errs() << "error: " << pipelineFlags.front()
                 << " sets an option of the default pipeline, which runs only for "
                    "`-o NAME.pt` without pass flags; pass the option to the pass "
                    "(e.g. --bmt-default-pipeline='world-size=8') instead\n";
    return 1;
  }
  if (!checkPipelineFlags())
    return 1;
  if (defaultPipeline) {
    // Shared: the callback runs inside MlirOptMain.
    auto options = std::make_shared<bmt::DefaultPipelineOptions>();
    options->worldSize = clWorldSize;
    options->zeroStage = clZeroStage == 2 ? bmt::ZeroStage::Two : bmt::ZeroStage::Three;
    options->shardGroupSize = clShardGroupSize;
    options->checkpoint = clCheckpoint == "auto"   ? bmt::CheckpointMode::Auto
                          : clCheckpoint == "none" ? bmt::CheckpointMode::None
                                                   : bmt::CheckpointMode::All;
    options->memoryBudgetGib = clMemoryBudgetGib;
    options->microBatch = clMicroBatch;
    options->seqLen = clSeqLen;
    options->prefetchDepth = clPrefetchDepth;
    options->assumeUnpadded = clAssumeUnpadded;
    config.setPassPipelineSetupFn([options](PassManager &pm) {
      bmt::buildDefaultPipeline(pm, *options);
      return success();
    });
  }

  bool same = false;
  if (inputFilename != "-" && outputFilename != "-" &&
      !llvm::sys::fs::equivalent(inputFilename, outputFilename, same) && same) {
    llvm::errs() << "error: " << outputFilename
                 << ": the output would overwrite the input; choose another -o\n";
    return 1;
  }

  std::unique_ptr<llvm::MemoryBuffer> input;
  std::string errorMessage;
  if (isArchiveInput(inputFilename)) {
    MLIRContext context(registry);
    ScopedDiagnosticHandler handler(&context, printImportDiagnostic);
    OwningOpRef<ModuleOp> module =
        isTorchExportInput(inputFilename)
            ? bmt::importTorchExport(inputFilename, context)
            : bmt::importTorchScript(inputFilename, context);
    if (!module)
      return 1;
    // Hand the module to MlirOptMain as text with its locations, so that
    // every option behaves exactly as on a .mlir input.
    std::string text;
    llvm::raw_string_ostream os(text);
    module->print(os, OpPrintingFlags().enableDebugInfo(/*enable=*/true,
                                                        /*prettyForm=*/false));
    input = llvm::MemoryBuffer::getMemBufferCopy(text, inputFilename);
  } else {
    input = openInputFile(inputFilename, &errorMessage);
    if (!input) {
      llvm::errs() << "error: " << errorMessage << "\n";
      return 1;
    }
  }

  // Run MlirOptMain into memory, then write the result: as a sharded.pt
  // archive for `-o *.pt`, else as text. Writing only after success, to a
  // temporary file renamed over the target, leaves an existing output intact
  // on failure.
  bool archiveOutput = isArchiveOutput(outputFilename);
  if (archiveOutput) {
    // Find an unusable output place before the passes run, not after.
    llvm::SmallString<256> parent(outputFilename);
    llvm::sys::path::remove_filename(parent);
    if (parent.empty())
      parent = ".";
    if (!llvm::sys::fs::is_directory(parent))
      return llvm::errs() << "error: " << outputFilename << ": the directory " << parent
                          << " does not exist\n",
             1;
  }
  if (archiveOutput && !config.inputSplitMarker().empty())
    return llvm::errs() << "error: --split-input-file cannot write an archive\n", 1;
  if (archiveOutput) {
    // Keep source locations in the archive's program text.
    auto &options = llvm::cl::getRegisteredOptions();
    if (auto *debugInfo = static_cast<llvm::cl::opt<bool> *>(
            options.lookup("mlir-print-debuginfo")))
      *debugInfo = true;
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  if (failed(MlirOptMain(os, std::move(input), registry, config)))
    return 1;

  if (archiveOutput) {
    MLIRContext context(registry);
    ScopedDiagnosticHandler handler(&context, printImportDiagnostic);
    OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, &context);
    if (!module)
      return 1;
    bmt::ExportStats stats;
    bmt::ExportOptions exportOptions;
    exportOptions.randomInit = clRandomInit;
    if (failed(bmt::exportShardedArchive(*module, outputFilename, text, &stats, exportOptions)))
      return 1;
    llvm::errs() << "wrote " << outputFilename << ": " << stats.numTensors
                 << " tensors (" << stats.weightBytes << " bytes), "
                 << stats.numFunctions << " functions, " << stats.numInstructions
                 << " instructions\n";
    return 0;
  }
  if (outputFilename == "-") {
    llvm::outs() << text;
    llvm::outs().flush();
    return llvm::outs().has_error() ? 1 : 0;
  }
  if (std::error_code ec = writeFileAtomically(outputFilename, text)) {
    llvm::errs() << "error: cannot write " << outputFilename << ": " << ec.message()
                 << "\n";
    return 1;
  }
  return 0;
}
