// The compile path (a PyTorch input or -o *.pt) reads the module itself:
// "already planned" comes from its ops and attributes, not from its text.
// This file's comments name bmt.storage_group, bmt.block_list and
// bmt.overlap, but its IR has none of them, so the default pipeline runs
// (and the export then fails: the module names no source model).
// RUN: not bmt-opt %s -o %t.pt 2>&1 | FileCheck %s --check-prefix=UNPLANNED
// UNPLANNED-NOT: has already been through the passes
// UNPLANNED:     remark: bmt-zero: ZeRO-3
// UNPLANNED:     bmt summary
// UNPLANNED:     error: {{.*}}.pt: the module names no source model (bmt.source)

// The named pipeline checks its options before any pass runs, as the
// top-level flags do, naming them as the pipeline string spells them.
// RUN: not bmt-opt %s --bmt-default-pipeline='checkpoint=auto' 2>&1 | FileCheck %s --check-prefix=NOBUDGET --implicit-check-not=remark
// NOBUDGET: error: bmt-default-pipeline: checkpoint=auto needs a per-rank memory budget: memory-budget-gib=N
// RUN: not bmt-opt %s --bmt-default-pipeline='zero-stage=1' 2>&1 | FileCheck %s --check-prefix=BADSTAGE --implicit-check-not=remark
// BADSTAGE: error: zero-stage must be 3 or 2, got 1
// RUN: not bmt-opt %s --bmt-default-pipeline='checkpoint=some' 2>&1 | FileCheck %s --check-prefix=BADMODE --implicit-check-not=remark
// BADMODE: error: checkpoint must be all, none or auto, got 'some'

// --verify-diagnostics needs MLIR text to read the expectations from.
// RUN: not bmt-opt %fixtures/gpt2.pt --verify-diagnostics 2>&1 | FileCheck %s --check-prefix=VERIFY
// VERIFY: error: --verify-diagnostics needs an MLIR text input, not {{.*}}gpt2.pt

bmt.parameter @proj.weight : tensor<8x8xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %w = bmt.get_global @proj.weight : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
