//===- Compile.h - the compile path of bmt-opt ------------------*- C++ -*-===//
//
// A model file in, a program out, in memory: import (TorchScript .pt,
// torch.export .pt2) or parse (bmt MLIR text), run the default pipeline or
// the passes named, and write a sharded.pt archive or MLIR text. bmt-opt
// calls compile() for a PyTorch input or a `-o *.pt` output and is plain
// mlir-opt otherwise. Includes no LibTorch header.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_COMPILE_COMPILE_H
#define BMT_COMPILE_COMPILE_H

#include "bmt/Export/ShardedArchive.h"
#include "bmt/Passes/DefaultPipeline.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "llvm/Support/CommandLine.h"

#include <string>
#include <vector>

namespace bmt {

/// True for an output written as a sharded.pt archive (`.pt`, `.pth`).
bool isArchiveOutput(llvm::StringRef path);

/// True for an input an importer reads: `.pt`, `.pth`, `.pt2`, or any other
/// file that starts like a zip. False for "-" (stdin is MLIR text).
bool isArchiveInput(llvm::StringRef path);

/// True when `module` has been through the distribution passes: it has a
/// bmt.block_list or a bmt.storage_group, or the bmt.overlap attribute.
/// The default pipeline does not run on such a module again.
bool isPlanned(mlir::ModuleOp module);

/// Fails with one error line when `output` names the same file as `input`.
mlir::LogicalResult checkOutputIsNotInput(llvm::StringRef input, llvm::StringRef output);

/// Writes `text` to `path` ("-": stdout) through a temporary file renamed
/// over it, so that an existing file survives a failure; a device or FIFO
/// (/dev/null) is written in place, not replaced. Fails with one error
/// line ("error: cannot write PATH: REASON").
mlir::LogicalResult writeOutputFile(llvm::StringRef path, llvm::StringRef text);

/// One compile: where the program comes from and goes, and what runs.
struct CompileRequest {
  std::string input;  ///< .pt/.pth/.pt2 archive, or MLIR text ("-": stdin)
  std::string output; ///< .pt/.pth: a sharded.pt archive; else MLIR text ("-": stdout)
  /// Run the passes that the MlirOptMainConfig names. Otherwise an archive
  /// output runs the default pipeline (unless isPlanned: then a note, and
  /// the module is exported as it is) and a text output runs nothing.
  bool namedPasses = false;
  /// The default pipeline's options; null: the defaults. Bad values are an
  /// error (DefaultPipelineOptions::verify; CompileFlags::check says it first).
  const DefaultPipelineOptions *pipeline = nullptr;
  /// The command-line flags that set `pipeline` ("--world-size"); a planned
  /// input with any of them is an error that names the first.
  std::vector<std::string> pipelineFlags;
  ExportOptions exportOptions;
};

/// Runs `request` in one MLIRContext over `registry`, honouring `config`'s
/// pass pipeline, --verify-each, --allow-unregistered-dialect and
/// --emit-bytecode, and the pass manager's command-line options
/// (--mlir-print-ir-*, --mlir-timing, ...). On success an archive output
/// prints "wrote PATH: N tensors (...)" to stderr. Fails, with the
/// diagnostics already printed and no output file written, when: the
/// output names the input, the input cannot be imported or parsed, a
/// planned input comes with pipeline flags, the pipeline's options are
/// bad, the output's directory does not exist, --split-input-file meets an
/// archive output or --verify-diagnostics an archive input, a pass fails,
/// or the output cannot be written.
mlir::LogicalResult compile(const CompileRequest &request, const mlir::MlirOptMainConfig &config,
                            mlir::DialectRegistry &registry);

/// bmt-opt's own command-line flags: the default pipeline's options as
/// top-level flags (--world-size 8 ...; DefaultPipelineOptions) and
/// --random-init. Construct one before the command line is parsed.
class CompileFlags {
public:
  CompileFlags();
  /// Fails with one error line when a pipeline flag is given but the
  /// default pipeline does not run (a text output, or `namedPasses`), or
  /// when the flags' values are bad (DefaultPipelineOptions::verify).
  mlir::LogicalResult check(llvm::StringRef output, bool namedPasses) const;
  /// The compile of `input` to `output` that these flags ask for.
  CompileRequest request(llvm::StringRef input, llvm::StringRef output, bool namedPasses) const;

private:
  std::vector<std::string> given() const;
  DefaultPipelineOptions pipeline;
  llvm::SmallVector<llvm::cl::Option *> flags; ///< pipeline.commandLineFlags()
  llvm::cl::opt<bool> randomInit;
};

/// Hides from --help (--help-hidden still lists them; they still work) every
/// option registered so far except bmt-opt's own flags and --help/--version:
/// the codegen and target options of the LLVM libraries linked in with MLIR
/// (~550 lines no bmt user needs). Call after constructing CompileFlags and
/// before registerAndParseCLIOptions, which registers mlir-opt's own options
/// (--pass-pipeline, --mlir-print-ir-*, ...) after it, so they stay shown.
void hideLinkedLLVMOptions();

/// True when the command line names a pass or a pipeline (--bmt-zero,
/// --pass-pipeline=..., -p ...): then no default pipeline runs.
bool passesNamedOnCommandLine();

/// Makes a failing pass's error one line: the op is not printed after it
/// unless --mlir-print-op-on-diagnostic is given. Call after parsing.
void keepDiagnosticsShort();

} // namespace bmt

#endif // BMT_COMPILE_COMPILE_H
