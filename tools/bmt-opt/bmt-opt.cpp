//===- bmt-opt.cpp - the bmt compiler driver ------------------------------===//
//
// Behaves like mlir-opt, with two additions: an input that is a PyTorch
// archive (a zip: TorchScript `.pt`, torch.export `.pt2`) is first imported
// into the bmt dialect, and an output ending in `.pt` is written as a sharded.pt archive (the
// runtime plan, the program and the weights) instead of MLIR text.
// Everything else (--pass-pipeline, --mlir-print-ir-after-all,
// --verify-diagnostics, --split-input-file, -o) is MlirOptMain's.
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
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
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

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  DialectRegistry registry;
  registry.insert<bmt::BmtDialect, func::FuncDialect>();
  bmt::registerBmtPasses();
  registerTransformsPasses(); // canonicalize, cse, symbol-dce, inline, ...

  auto [inputFilename, outputFilename] = registerAndParseCLIOptions(
      argc, argv,
      "bmt-opt: compiles a PyTorch model (TorchScript .pt, torch.export .pt2 or bmt MLIR) for "
      "distributed training\n",
      registry);
  MlirOptMainConfig config = MlirOptMainConfig::createFromCLOptions();

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
    if (failed(bmt::exportShardedArchive(*module, outputFilename, text, &stats)))
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
