//===- Compile.cpp - the compile path of bmt-opt --------------------------===//
//
// Import or parse, passes, export or print: one MLIRContext, one module, no
// text round trip between the stages. See include/bmt/Compile/Compile.h.
//
//===----------------------------------------------------------------------===//

#include "bmt/Compile/Compile.h"

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Import/TorchExport.h"
#include "bmt/Import/TorchScript.h"
#include "bmt/Passes.h"

#include "mlir/Bytecode/BytecodeWriter.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <sys/resource.h>

using namespace mlir;

bool bmt::isArchiveOutput(llvm::StringRef path) {
  return path.ends_with(".pt") || path.ends_with(".pth");
}

bool bmt::isArchiveInput(llvm::StringRef path) {
  return path.ends_with(".pt") || path.ends_with(".pth") || path.ends_with(".pt2") ||
         (path != "-" && looksLikeZipArchive(path));
}

/// True for archive inputs the torch.export importer reads: a `.pt2` name,
/// or a zip whose records are those of torch.export.save.
static bool isTorchExportInput(llvm::StringRef path) {
  return path.ends_with(".pt2") || bmt::looksLikeTorchExportArchive(path);
}

bool bmt::isPlanned(ModuleOp module) {
  return !module.getOps<BlockListOp>().empty() || !module.getOps<StorageGroupOp>().empty() ||
         module->hasAttr("bmt.overlap");
}

static LogicalResult fail(const llvm::Twine &message) {
  llvm::errs() << "error: " << message << "\n";
  return failure();
}

LogicalResult bmt::checkOutputIsNotInput(llvm::StringRef input, llvm::StringRef output) {
  bool same = false;
  if (input != "-" && output != "-" && !llvm::sys::fs::equivalent(input, output, same) && same)
    return fail(output + ": the output would overwrite the input; choose another -o");
  return success();
}

LogicalResult bmt::writeOutputFile(llvm::StringRef path, llvm::StringRef text) {
  if (path == "-") {
    llvm::outs() << text;
    llvm::outs().flush();
    return failure(llvm::outs().has_error());
  }
  auto cannot = [&](std::error_code ec) { return fail("cannot write " + path + ": " + ec.message()); };
  llvm::sys::fs::file_status status;
  if (!llvm::sys::fs::status(path, status) && llvm::sys::fs::exists(status) &&
      !llvm::sys::fs::is_regular_file(status) && !llvm::sys::fs::is_directory(status)) {
    // A device or a FIFO (/dev/null): written in place, as renaming a
    // temporary file over it would replace it.
    std::error_code ec;
    llvm::raw_fd_ostream out(path, ec);
    if (ec)
      return cannot(ec);
    out << text;
    out.close();
    if ((ec = out.error())) {
      out.clear_error();
      return cannot(ec);
    }
    return success();
  }
  llvm::SmallString<256> tmp;
  int fd;
  if (std::error_code ec = llvm::sys::fs::createUniqueFile(path + ".tmp-%%%%%%", fd, tmp))
    return cannot(ec);
  std::error_code ec;
  {
    llvm::raw_fd_ostream out(fd, /*shouldClose=*/true);
    out << text;
    out.close();
    ec = out.error();
    out.clear_error();
  }
  if (!ec)
    ec = llvm::sys::fs::rename(tmp, path);
  if (ec) {
    llvm::sys::fs::remove(tmp);
    return cannot(ec);
  }
  return success();
}

/// Prints an importer's or the exporter's diagnostic as one line, compiler
/// style: "file.py:12:8: error: model.pt: ..." where the op has a Python
/// source location, "error: model.pt: ..." where it has none.
static LogicalResult printOneLine(Diagnostic &diag) {
  llvm::raw_ostream &os = llvm::errs();
  if (auto loc = dyn_cast<FileLineColLoc>(diag.getLocation()); loc && loc.getLine() > 0)
    os << loc.getFilename().getValue() << ":" << loc.getLine() << ":" << loc.getColumn() << ": ";
  switch (diag.getSeverity()) {
  case DiagnosticSeverity::Error: os << "error: "; break;
  case DiagnosticSeverity::Warning: os << "warning: "; break;
  case DiagnosticSeverity::Note: os << "note: "; break;
  case DiagnosticSeverity::Remark: os << "remark: "; break;
  }
  os << diag << "\n";
  return success();
}

/// The program in `path`: imported from a PyTorch archive (diagnostics one
/// line each), or parsed as MLIR text into `sourceMgr` (diagnostics with
/// source lines, as mlir-opt's). Null, diagnostics printed, on failure.
static OwningOpRef<ModuleOp> loadProgram(llvm::StringRef path, MLIRContext &context,
                                         llvm::SourceMgr &sourceMgr, bool verify) {
  if (bmt::isArchiveInput(path)) {
    ScopedDiagnosticHandler handler(&context, printOneLine);
    return isTorchExportInput(path) ? bmt::importTorchExport(path, context)
                                    : bmt::importTorchScript(path, context);
  }
  std::string error;
  std::unique_ptr<llvm::MemoryBuffer> buffer = openInputFile(path, &error);
  if (!buffer) {
    (void)fail(error);
    return nullptr;
  }
  sourceMgr.AddNewSourceBuffer(std::move(buffer), llvm::SMLoc());
  SourceMgrDiagnosticHandler handler(sourceMgr, &context);
  return parseSourceFile<ModuleOp>(sourceMgr, ParserConfig(&context, verify));
}

/// Fails with one error line unless the directory `output` goes to exists
/// (checked before the passes run, not after).
static LogicalResult checkOutputDirectory(llvm::StringRef output) {
  llvm::SmallString<256> parent(output);
  llvm::sys::path::remove_filename(parent);
  if (parent.empty())
    parent = ".";
  if (!llvm::sys::fs::is_directory(parent))
    return fail(output + ": the directory " + parent + " does not exist");
  return success();
}

/// Writes `module` as a sharded.pt archive whose program text keeps the
/// source locations, and says what it wrote.
static LogicalResult writeArchive(ModuleOp module, llvm::StringRef path,
                                  const bmt::ExportOptions &options) {
  OpPrintingFlags flags;
  flags.enableDebugInfo(/*enable=*/true, flags.shouldPrintDebugInfoPrettyForm());
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os, flags);
  os << '\n';
  ScopedDiagnosticHandler handler(module.getContext(), printOneLine);
  bmt::ExportStats stats;
  if (failed(bmt::exportShardedArchive(module, path, text, &stats, options)))
    return failure();
  llvm::errs() << "wrote " << path << ": " << stats.numTensors << " tensors ("
               << stats.weightBytes << " bytes), " << stats.numFunctions << " functions, "
               << stats.numInstructions << " instructions\n";
  if (!stats.checkpoint.empty()) {
    struct rusage usage;
    ::getrusage(RUSAGE_SELF, &usage);
    llvm::errs() << "streamed the weights from " << stats.checkpointFiles
                 << " safetensors file" << (stats.checkpointFiles == 1 ? "" : "s") << " in "
                 << stats.checkpoint << ": read " << stats.bytesRead << " bytes, wrote "
                 << stats.bytesWritten << " bytes in "
                 << llvm::format("%.1f", stats.seconds) << " s; peak memory "
                 << llvm::format("%.2f", usage.ru_maxrss / 1048576.0) << " GiB\n";
  }
  return success();
}

/// Writes `module` as MLIR text, or bytecode with --emit-bytecode.
static LogicalResult writeProgram(ModuleOp module, llvm::StringRef path,
                                  const MlirOptMainConfig &config) {
  std::string text;
  llvm::raw_string_ostream os(text);
  if (config.shouldEmitBytecode()) {
    BytecodeWriterConfig writerConfig;
    if (auto version = config.bytecodeVersionToEmit())
      writerConfig.setDesiredBytecodeVersion(*version);
    if (failed(writeBytecodeToFile(module, os, writerConfig)))
      return failure();
  } else {
    module->print(os, OpPrintingFlags());
    os << '\n';
  }
  return bmt::writeOutputFile(path, text);
}

LogicalResult bmt::compile(const CompileRequest &request, const MlirOptMainConfig &config,
                           DialectRegistry &registry) {
  bool archiveOutput = isArchiveOutput(request.output);
  if (failed(checkOutputIsNotInput(request.input, request.output)))
    return failure();
  if (config.shouldVerifyDiagnostics() && isArchiveInput(request.input))
    return fail("--verify-diagnostics needs an MLIR text input, not " + request.input);

  MLIRContext context(registry);
  context.allowUnregisteredDialects(config.shouldAllowUnregisteredDialects());
  llvm::SourceMgr sourceMgr;
  OwningOpRef<ModuleOp> module =
      loadProgram(request.input, context, sourceMgr, config.shouldVerifyOnParsing());
  if (!module)
    return failure();

  bool defaultPipeline = archiveOutput && !request.namedPasses;
  if (defaultPipeline && isPlanned(*module)) {
    if (!request.pipelineFlags.empty())
      return fail(request.pipelineFlags.front() + ": " + request.input +
                  " has already been through the passes (it has block lists or storage "
                  "groups); it is exported as it is, so the default pipeline's flags do not "
                  "apply");
    llvm::errs() << "note: " << request.input
                 << " has already been through the passes; exporting it as it is\n";
    defaultPipeline = false;
  }
  if (archiveOutput && failed(checkOutputDirectory(request.output)))
    return failure();
  if (archiveOutput && !config.inputSplitMarker().empty())
    return fail("--split-input-file cannot write an archive");

  // The passes, as mlir-opt runs them: its diagnostics, verifier, IR
  // printing and timing options.
  {
    SourceMgrDiagnosticHandler handler(sourceMgr, &context);
    PassManager pm(&context, ModuleOp::getOperationName(), PassManager::Nesting::Implicit);
    pm.enableVerifier(config.shouldVerifyPasses());
    if (failed(applyPassManagerCLOptions(pm)))
      return failure();
    DefaultTimingManager timingManager;
    applyDefaultTimingManagerCLOptions(timingManager);
    TimingScope timing = timingManager.getRootScope();
    pm.enableTiming(timing);
    DefaultPipelineOptions defaults;
    const DefaultPipelineOptions &options = request.pipeline ? *request.pipeline : defaults;
    if (defaultPipeline) {
      if (std::string problem = options.verify(""); !problem.empty())
        return fail("default pipeline: " + problem);
      buildDefaultPipeline(pm, options);
    } else if (request.namedPasses && failed(config.setupPassPipeline(pm)))
      return failure();
    if (failed(pm.run(*module)))
      return failure();
  }
  return archiveOutput ? writeArchive(*module, request.output, request.exportOptions)
                       : writeProgram(*module, request.output, config);
}

/// The --help section of bmt-opt's own flags.
static llvm::cl::OptionCategory &bmtCategory() {
  static llvm::cl::OptionCategory category(
      "Default pipeline (bmt-opt MODEL -o sharded.pt without pass flags)");
  return category;
}

bmt::CompileFlags::CompileFlags()
    : flags(pipeline.commandLineFlags()),
      randomInit("random-init",
                 llvm::cl::desc("-o *.pt: write no weights for the trainable parameters; the "
                                "runtime initializes them by rule (pretraining from scratch, "
                                "benchmarks)"),
                 llvm::cl::init(false), llvm::cl::cat(bmtCategory())) {
  // The pipeline's options live in the options' own subcommand; register
  // them again so that they are top-level flags as well.
  for (llvm::cl::Option *flag : flags) {
    flag->removeArgument();
    flag->addSubCommand(llvm::cl::SubCommand::getTopLevel());
    flag->addCategory(bmtCategory());
    flag->addArgument();
  }
}

void bmt::hideLinkedLLVMOptions() {
  for (auto &entry : llvm::cl::getRegisteredOptions()) {
    llvm::cl::Option *option = entry.second;
    if (llvm::is_contained(option->Categories, &bmtCategory()) ||
        llvm::is_contained({"help", "help-list", "version"}, option->ArgStr))
      continue;
    if (option->getOptionHiddenFlag() == llvm::cl::NotHidden)
      option->setHiddenFlag(llvm::cl::Hidden);
  }
}

std::vector<std::string> bmt::CompileFlags::given() const {
  std::vector<std::string> names;
  for (llvm::cl::Option *flag : flags)
    if (flag->getNumOccurrences() > 0)
      names.push_back(("--" + flag->ArgStr).str());
  return names;
}

LogicalResult bmt::CompileFlags::check(llvm::StringRef output, bool namedPasses) const {
  std::vector<std::string> names = given();
  if (!names.empty() && (namedPasses || !isArchiveOutput(output)))
    return fail(names.front() +
                " sets an option of the default pipeline, which runs only for `-o NAME.pt` "
                "without pass flags; pass the option to the pass (e.g. "
                "--bmt-default-pipeline='world-size=8') instead");
  // A flag given twice keeps only its last value (MLIR's pass options
  // allow repeats): `--freeze A --freeze B` would freeze B alone.
  for (llvm::cl::Option *flag : flags)
    if (flag->getNumOccurrences() > 1 && !(flag->getMiscFlags() & llvm::cl::CommaSeparated))
      return fail("--" + flag->ArgStr.str() + " was given " +
                  std::to_string(flag->getNumOccurrences()) +
                  " times; give it once" +
                  (flag->ArgStr == "freeze" ? " (one comma-separated list of patterns)" : ""));
  if (std::string problem = pipeline.verify("--"); !problem.empty())
    return fail(problem);
  // An empty value (a shell variable that was empty) would silently freeze
  // or adapt nothing.
  if (pipeline.freeze.getNumOccurrences() > 0 && llvm::StringRef(pipeline.freeze).trim().empty())
    return fail("--freeze was given an empty value: give the patterns of the parameters to "
                "freeze (docs/passes/freeze.md), or leave the flag out");
  if (pipeline.lora.getNumOccurrences() > 0 && llvm::StringRef(pipeline.lora).trim().empty())
    return fail("--lora was given an empty value: give r=N,targets=... (docs/passes/lora.md), or "
                "leave the flag out");
  return success();
}

bmt::CompileRequest bmt::CompileFlags::request(llvm::StringRef input, llvm::StringRef output,
                                               bool namedPasses) const {
  CompileRequest request;
  request.input = input.str();
  request.output = output.str();
  request.namedPasses = namedPasses;
  request.pipeline = &pipeline;
  request.pipelineFlags = given();
  request.exportOptions.randomInit = randomInit;
  return request;
}

bool bmt::passesNamedOnCommandLine() {
  auto &options = llvm::cl::getRegisteredOptions();
  // Every registered pass and pipeline flag is a value of one list option,
  // so looking up any pass name finds it.
  for (llvm::StringRef name : {"bmt-summary", "pass-pipeline", "p"})
    if (auto *opt = options.lookup(name); opt && opt->getNumOccurrences() > 0)
      return true;
  return false;
}

void bmt::keepDiagnosticsShort() {
  if (auto *printOp = static_cast<llvm::cl::opt<bool> *>(
          llvm::cl::getRegisteredOptions().lookup("mlir-print-op-on-diagnostic"));
      printOp && printOp->getNumOccurrences() == 0)
    *printOp = false;
}
