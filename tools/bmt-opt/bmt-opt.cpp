//===- bmt-opt.cpp - the bmt compiler driver ------------------------------===//
//
// mlir-opt with bmt's dialect and passes. A PyTorch archive input
// (TorchScript .pt, torch.export .pt2) or a sharded.pt output (-o *.pt)
// goes to the compile path (include/bmt/Compile/Compile.h): import, the
// default pipeline (fed by --world-size, ...; docs/passes/default-pipeline.md) or the passes
// named, then the archive or MLIR text. Either way the output is written
// only on success, so a failed run leaves an existing file as it was.
//
//===----------------------------------------------------------------------===//

#include "bmt/Compile/Compile.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/ShardingInterfaceImpl.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  DialectRegistry registry;
  // shard: the TP group (shard.grid) of --bmt-tensor-parallel, so that its
  // output parses back.
  registry.insert<bmt::BmtDialect, func::FuncDialect, shard::ShardDialect>();
  // The upstream ShardingInterface of bmt.aten and bmt.fused (the rules
  // --bmt-tensor-parallel propagates its splits by).
  bmt::registerShardingInterfaceExternalModels(registry);
  bmt::registerBmtPasses();
  bmt::registerDefaultPipeline();
  registerTransformsPasses(); // canonicalize, cse, symbol-dce, inline, ...
  bmt::CompileFlags flags;    // --world-size, ..., --random-init
  bmt::hideLinkedLLVMOptions();

  auto [input, output] = registerAndParseCLIOptions(
      argc, argv,
      "bmt-opt: compiles a PyTorch model (TorchScript .pt, torch.export .pt2 or bmt MLIR) for "
      "distributed training\n",
      registry);
  MlirOptMainConfig config = MlirOptMainConfig::createFromCLOptions();
  bmt::keepDiagnosticsShort();
  bool namedPasses = bmt::passesNamedOnCommandLine();
  if (failed(flags.check(output, namedPasses)))
    return 1;
  if (bmt::isArchiveInput(input) || bmt::isArchiveOutput(output))
    return asMainReturnCode(
        bmt::compile(flags.request(input, output, namedPasses), config, registry));

  // MLIR text to MLIR text: mlir-opt.
  if (failed(bmt::checkOutputIsNotInput(input, output)))
    return 1;
  std::string error;
  std::unique_ptr<llvm::MemoryBuffer> buffer = openInputFile(input, &error);
  if (!buffer)
    return llvm::errs() << "error: " << error << "\n", 1;
  std::string text;
  llvm::raw_string_ostream os(text);
  if (failed(MlirOptMain(os, std::move(buffer), registry, config)))
    return 1;
  return asMainReturnCode(bmt::writeOutputFile(output, text));
}
