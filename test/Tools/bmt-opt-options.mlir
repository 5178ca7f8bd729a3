// bmt-opt behaves like mlir-opt: --help lists the bmt passes, pass
// pipelines and IR printing work on bmt IR.

// RUN: bmt-opt --help | FileCheck %s --check-prefix=HELP
// HELP-DAG: --bmt-summary
// HELP-DAG: --pass-pipeline
// HELP-DAG: --split-input-file
// HELP-DAG: --verify-diagnostics
// HELP-DAG: --world-size
// HELP-DAG: --random-init
// HELP-DAG: --mlir-print-ir-after-all
// HELP-DAG: --mlir-timing

// --help leaves out the ~550 lines of codegen and target options of the
// LLVM libraries linked in (--help-hidden still lists them; they still work).
// RUN: bmt-opt --help | FileCheck %s --check-prefix=NOLLVM
// NOLLVM-NOT: --amdgpu-
// NOLLVM-NOT: --aarch64-
// NOLLVM-NOT: --x86-
// RUN: bmt-opt --help | %python -c "import sys; n = len(sys.stdin.readlines()); print('lines ok' if n < 300 else f'{n} lines')" | FileCheck %s --check-prefix=LINES
// LINES: lines ok
// RUN: bmt-opt --help-hidden | FileCheck %s --check-prefix=HIDDEN
// HIDDEN: --amdgpu-

// RUN: bmt-opt %s --pass-pipeline='builtin.module(bmt-summary,canonicalize,symbol-dce)' 2>&1 | FileCheck %s --check-prefix=PIPELINE
// PIPELINE: bmt summary
// PIPELINE: parameters: 64 elements in 1 tensors
// symbol-dce removes the unused private function; canonicalize the dead op.
// PIPELINE-NOT: @unused
// PIPELINE-NOT: aten::relu

// RUN: bmt-opt %s --bmt-summary --canonicalize --mlir-print-ir-after-all 2>&1 | FileCheck %s --check-prefix=AFTER
// AFTER: // -----// IR Dump After Summary (bmt-summary) //----- //
// AFTER: // -----// IR Dump After Canonicalizer (canonicalize) //----- //

bmt.parameter @proj.weight : tensor<8x8xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %w = bmt.get_global @proj.weight : !bmt.tensor
  %dead = bmt.get_global @proj.weight : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @unused(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::relu"(%x) : (!bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
