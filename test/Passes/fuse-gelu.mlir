// RUN: bmt-opt %s --split-input-file --bmt-fuse-gelu 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s --split-input-file --bmt-fuse-gelu -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK

// GPT-2's fixtures, traced and exported: every block's NewGELUActivation is
// fused, the blocks stay identical for find-blocks, and the default pipeline
// (fuse-gelu first) still finds them.
// RUN: bmt-opt %fixtures/gpt2.pt --bmt-fuse-gelu 2>/dev/null | FileCheck %s --check-prefix=GPT2
// RUN: bmt-opt %fixtures/gpt2.pt2 --bmt-fuse-gelu 2>/dev/null | FileCheck %s --check-prefix=GPT2
// RUN: bmt-opt %fixtures/gpt2.pt --bmt-fuse-gelu --bmt-find-blocks -o /dev/null 2>&1 | FileCheck %s --check-prefix=BLOCKS
// RUN: bmt-opt %fixtures/gpt2.pt2 --bmt-fuse-gelu --bmt-find-blocks -o /dev/null 2>&1 | FileCheck %s --check-prefix=BLOCKS
// RUN: bmt-opt %fixtures/gpt2.pt --bmt-default-pipeline -o /dev/null 2>&1 | FileCheck %s --check-prefixes=PIPELINE,PIPELINE-PT
// RUN: bmt-opt %fixtures/gpt2.pt2 --bmt-default-pipeline -o /dev/null 2>&1 | FileCheck %s --check-prefix=PIPELINE
// RUN: bmt-opt %fixtures/gpt2.pt --bmt-default-pipeline='fuse-gelu=false fuse-elementwise=false' -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOFUSE
// Without fuse-gelu the written-out GELU's pointwise ops make regions of their own.
// RUN: bmt-opt %fixtures/gpt2.pt --bmt-default-pipeline='fuse-gelu=false' -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOFUSE-REGIONS

// GPT2-LABEL: func.func private @transformer.h.0.mlp.act.forward(
// GPT2-NEXT:    %[[G:.*]] = bmt.aten "aten::gelu"(%arg0, "tanh") : (!bmt.tensor) -> !bmt.tensor
// GPT2-NEXT:    return %[[G]]
// GPT2-LABEL: func.func private @transformer.h.1.mlp.act.forward(
// GPT2-NEXT:    %[[G:.*]] = bmt.aten "aten::gelu"(%arg0, "tanh") : (!bmt.tensor) -> !bmt.tensor
// GPT2-NEXT:    return %[[G]]
// GPT2-NOT:   aten::tanh

// BLOCKS:      remark: bmt-fuse-gelu: 2 GELUs fused
// BLOCKS-NEXT: remark: {{.*}}bmt-find-blocks: 2 blocks in transformer.h (transformer.h.0 ... transformer.h.1), rule: identical structure

// PIPELINE:      remark: bmt-fuse-gelu: 2 GELUs fused into aten::gelu (2 approximate="tanh", 0 exact) in 2 functions (transformer.h.0.mlp.act.forward ... transformer.h.1.mlp.act.forward)
// PIPELINE-NEXT: remark: bmt-fuse-elementwise: 13 ops in 7 regions (7 with a last-dim reduction) in 7 functions (transformer.h.0.ln_1.forward ... transformer.ln_f.forward); 2 calls of fusible submodules inlined
// PIPELINE-NEXT: remark: {{.*}}bmt-find-blocks: 2 blocks in transformer.h (transformer.h.0 ... transformer.h.1), rule: identical structure
// PIPELINE:      blocks: 2 in transformer.h (transformer.h.0 ... transformer.h.1), 8544 parameters each
// PIPELINE-PT:   functions: 31, calls: 28, aten ops: 164

// NOFUSE-NOT: bmt-fuse-gelu
// NOFUSE:     remark: bmt-find-blocks: 2 blocks in transformer.h
// NOFUSE:     functions: 31, calls: 30, aten ops: 176

// NOFUSE-REGIONS-NOT: bmt-fuse-gelu
// NOFUSE-REGIONS:     remark: bmt-fuse-elementwise: 45 ops in 11 regions (7 with a last-dim reduction) in 11 functions (transformer.h.0.ln_1.forward ... transformer.ln_f.forward); 2 calls of fusible submodules inlined
// NOFUSE-REGIONS:     remark: bmt-find-blocks: 2 blocks in transformer.h

// One remark per module (the split inputs below, in order).
// REMARK: remark: bmt-fuse-gelu: 1 GELU fused into aten::gelu (1 approximate="tanh", 0 exact) in 1 function (act.forward)
// REMARK: remark: bmt-fuse-gelu: 1 GELU fused into aten::gelu (1 approximate="tanh", 0 exact) in 1 function (act.forward)
// REMARK: remark: bmt-fuse-gelu: 1 GELU fused into aten::gelu (1 approximate="tanh", 0 exact) in 1 function (act.forward)
// REMARK: remark: bmt-fuse-gelu: no GELU written out as elementwise ops
// REMARK: remark: bmt-fuse-gelu: no GELU written out as elementwise ops
// REMARK: remark: bmt-fuse-gelu: no GELU written out as elementwise ops
// REMARK: remark: bmt-fuse-gelu: no GELU written out as elementwise ops
// REMARK: remark: bmt-fuse-gelu: 2 GELUs fused into aten::gelu (0 approximate="tanh", 2 exact) in 2 functions (erf.ts.forward ... erf.export.forward)
// REMARK: remark: bmt-fuse-gelu: 1 GELU fused into aten::gelu (0 approximate="tanh", 1 exact) in 1 function (act.forward)
// REMARK-NOT: remark

// NewGELUActivation ("gelu_new": GPT-2, GPT-J, Phi) as torch.jit.trace
// records it: constants as 0-dim f64 tensors, aten::mul.Tensor/add.Tensor.
// The eight ops and their constants become one aten::gelu of the input; the
// linear before it and the users after it are untouched.
// CHECK-LABEL: func.func private @act.forward(
// CHECK-SAME:    %[[X:[^:]*]]: !bmt.tensor
// CHECK-NEXT:    %[[G:.*]] = bmt.aten "aten::gelu"(%[[X]], "tanh") : (!bmt.tensor) -> !bmt.tensor
// CHECK-NEXT:    %[[Y:.*]] = bmt.aten "aten::linear"(%[[G]],
// CHECK-NEXT:    return %[[Y]], %[[X]]
func.func private @act.forward(%arg0: !bmt.tensor, %w: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
  %0 = bmt.constant dense<5.000000e-01> : tensor<f64>
  %1 = bmt.aten "aten::mul.Tensor"(%arg0, %0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::pow.Tensor_Scalar"(%arg0, 3.000000e+00) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.constant dense<4.471500e-02> : tensor<f64>
  %4 = bmt.aten "aten::mul.Tensor"(%2, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::add.Tensor"(%arg0, %4, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %6 = bmt.constant dense<0.79788456080286541> : tensor<f64>
  %7 = bmt.aten "aten::mul.Tensor"(%5, %6) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::tanh"(%7) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.constant dense<1.000000e+00> : tensor<f64>
  %10 = bmt.aten "aten::add.Tensor"(%8, %9, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %11 = bmt.aten "aten::mul.Tensor"(%1, %10) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %12 = bmt.aten "aten::linear"(%11, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %12, %arg0 : !bmt.tensor, !bmt.tensor
}

// -----

// The same activation as torch.export records it: scalar constants in place
// (aten::mul.Scalar, aten::add.Scalar).
// CHECK-LABEL: func.func private @act.forward(
// CHECK-NEXT:    %[[G:.*]] = bmt.aten "aten::gelu"(%arg0, "tanh") : (!bmt.tensor) -> !bmt.tensor
// CHECK-NEXT:    return %[[G]]
func.func private @act.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::mul.Scalar"(%arg0, 5.000000e-01) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::pow.Tensor_Scalar"(%arg0, 3.000000e+00) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Scalar"(%1, 4.471500e-02) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%arg0, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::mul.Scalar"(%3, 0.79788456080286541) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::tanh"(%4) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::add.Scalar"(%5, 1.000000e+00, 1) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::mul.Tensor"(%0, %6) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %7 : !bmt.tensor
}

// -----

// Another association and operand order: BLOOM's
// x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x))) (FastGELU
// is the same with 0.7978845608), an integer 1, the 0.5 applied last.
// CHECK-LABEL: func.func private @act.forward(
// CHECK-NEXT:    %[[G:.*]] = bmt.aten "aten::gelu"(%arg0, "tanh") : (!bmt.tensor) -> !bmt.tensor
// CHECK-NEXT:    return %[[G]]
func.func private @act.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
  %1 = bmt.aten "aten::mul.Scalar"(%arg0, 0.79788456) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Scalar"(%arg0, 4.471500e-02) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::mul.Tensor"(%2, %arg0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::add.Scalar"(%3, 1, 1) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::mul.Tensor"(%1, %4) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::tanh"(%5) : (!bmt.tensor) -> !bmt.tensor
  %c1 = bmt.constant dense<1> : tensor<i64>
  %7 = bmt.aten "aten::add.Tensor"(%c1, %6, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::mul.Tensor"(%7, %arg0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::mul.Scalar"(%8, 5.000000e-01) : (!bmt.tensor) -> !bmt.tensor
  return %9 : !bmt.tensor
}

// -----

// Not GELU: another constant (0.04 instead of 0.044715). Left as it is.
// CHECK-LABEL: func.func private @act.forward(
// CHECK-NOT:     aten::gelu
// CHECK:         bmt.aten "aten::pow.Tensor_Scalar"
// CHECK:         bmt.aten "aten::mul.Tensor"(%{{.*}}, %{{.*}})
// CHECK:         bmt.aten "aten::tanh"
// CHECK:         return
func.func private @act.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.constant dense<5.000000e-01> : tensor<f64>
  %1 = bmt.aten "aten::mul.Tensor"(%arg0, %0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::pow.Tensor_Scalar"(%arg0, 3.000000e+00) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.constant dense<4.000000e-02> : tensor<f64>
  %4 = bmt.aten "aten::mul.Tensor"(%2, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::add.Tensor"(%arg0, %4, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %6 = bmt.constant dense<0.79788456080286541> : tensor<f64>
  %7 = bmt.aten "aten::mul.Tensor"(%5, %6) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::tanh"(%7) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.constant dense<1.000000e+00> : tensor<f64>
  %10 = bmt.aten "aten::add.Tensor"(%8, %9, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %11 = bmt.aten "aten::mul.Tensor"(%1, %10) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %11 : !bmt.tensor
}

// -----

// Not fused: an intermediate (the tanh) has a user outside the pattern, so
// it would have to be computed anyway. Left as it is.
// CHECK-LABEL: func.func private @act.forward(
// CHECK-NOT:     aten::gelu
// CHECK:         %[[T:.*]] = bmt.aten "aten::tanh"
// CHECK:         %[[A:.*]] = bmt.aten "aten::add.Scalar"(%[[T]], 1.000000e+00, 1)
// CHECK:         %[[M:.*]] = bmt.aten "aten::mul.Tensor"(%{{.*}}, %[[A]])
// CHECK:         return %[[M]], %[[T]]
func.func private @act.forward(%arg0: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
  %0 = bmt.aten "aten::mul.Scalar"(%arg0, 5.000000e-01) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::pow.Tensor_Scalar"(%arg0, 3.000000e+00) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Scalar"(%1, 4.471500e-02) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%arg0, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::mul.Scalar"(%3, 0.79788456080286541) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::tanh"(%4) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::add.Scalar"(%5, 1.000000e+00, 1) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::mul.Tensor"(%0, %6) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %7, %5 : !bmt.tensor, !bmt.tensor
}

// -----

// Not GELU: two inputs (0.5 * y * (1 + tanh(... x ...))), and QuickGELU's
// x * sigmoid(1.702 x). Left as they are.
// CHECK-LABEL: func.func private @two.forward(
// CHECK-NOT:     aten::gelu
// CHECK:         return
// CHECK-LABEL: func.func private @quick.forward(
// CHECK-NOT:     aten::gelu
// CHECK:         bmt.aten "aten::sigmoid"
func.func private @two.forward(%x: !bmt.tensor, %y: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::mul.Scalar"(%y, 5.000000e-01) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::pow.Tensor_Scalar"(%x, 3.000000e+00) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Scalar"(%1, 4.471500e-02) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%x, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::mul.Scalar"(%3, 0.79788456080286541) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::tanh"(%4) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::add.Scalar"(%5, 1.000000e+00, 1) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::mul.Tensor"(%0, %6) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %7 : !bmt.tensor
}
func.func private @quick.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.constant dense<1.702000e+00> : tensor<f64>
  %1 = bmt.aten "aten::mul.Tensor"(%arg0, %0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::sigmoid"(%1) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::mul.Tensor"(%arg0, %2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}

// -----

// Not GELU: the tanh form with erf, and the erf form with tanh.
// CHECK-LABEL: func.func private @act.forward(
// CHECK-NOT:     aten::gelu
// CHECK:         bmt.aten "aten::erf"
// CHECK:         bmt.aten "aten::tanh"
func.func private @act.forward(%arg0: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
  %0 = bmt.aten "aten::mul.Scalar"(%arg0, 5.000000e-01) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::pow.Tensor_Scalar"(%arg0, 3.000000e+00) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Scalar"(%1, 4.471500e-02) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%arg0, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::mul.Scalar"(%3, 0.79788456080286541) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::erf"(%4) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::add.Scalar"(%5, 1.000000e+00, 1) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::mul.Tensor"(%0, %6) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::mul.Scalar"(%arg0, 5.000000e-01) : (!bmt.tensor) -> !bmt.tensor
  %11 = bmt.aten "aten::div.Scalar"(%arg0, 1.4142135623730951) : (!bmt.tensor) -> !bmt.tensor
  %12 = bmt.aten "aten::tanh"(%11) : (!bmt.tensor) -> !bmt.tensor
  %13 = bmt.aten "aten::add.Scalar"(%12, 1.000000e+00, 1) : (!bmt.tensor) -> !bmt.tensor
  %14 = bmt.aten "aten::mul.Tensor"(%10, %13) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %7, %14 : !bmt.tensor, !bmt.tensor
}

// -----

// The exact form, 0.5 * x * (1 + erf(x / sqrt(2)))
// (GELUActivation(use_gelu_python=True), "gelu_python"), as a trace and as
// an export record it: aten::gelu(x, "none").
// CHECK-LABEL: func.func private @erf.ts.forward(
// CHECK-NEXT:    %[[G:.*]] = bmt.aten "aten::gelu"(%arg0, "none") : (!bmt.tensor) -> !bmt.tensor
// CHECK-NEXT:    return %[[G]]
// CHECK-LABEL: func.func private @erf.export.forward(
// CHECK-NEXT:    %[[G:.*]] = bmt.aten "aten::gelu"(%arg0, "none") : (!bmt.tensor) -> !bmt.tensor
// CHECK-NEXT:    return %[[G]]
func.func private @erf.ts.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.constant dense<5.000000e-01> : tensor<f64>
  %1 = bmt.aten "aten::mul.Tensor"(%arg0, %0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.constant dense<1.4142135623730951> : tensor<f64>
  %3 = bmt.aten "aten::div.Tensor"(%arg0, %2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::erf"(%3) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.constant dense<1.000000e+00> : tensor<f64>
  %6 = bmt.aten "aten::add.Tensor"(%4, %5, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::mul.Tensor"(%1, %6) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %7 : !bmt.tensor
}
func.func private @erf.export.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::mul.Scalar"(%arg0, 5.000000e-01) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::div.Scalar"(%arg0, 1.4142135623730951) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::erf"(%1) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Scalar"(%2, 1.000000e+00, 1) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::mul.Tensor"(%0, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %4 : !bmt.tensor
}

// -----

// A shared constant that something else still reads stays; the rest of
// the pattern goes.
// CHECK-LABEL: func.func private @act.forward(
// CHECK-NEXT:    %[[C:.*]] = bmt.constant dense<5.000000e-01> : tensor<f64>
// CHECK-NEXT:    %[[G:.*]] = bmt.aten "aten::gelu"(%arg0, "none")
// CHECK-NEXT:    %[[H:.*]] = bmt.aten "aten::mul.Tensor"(%arg1, %[[C]])
// CHECK-NEXT:    return %[[G]], %[[H]]
func.func private @act.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
  %0 = bmt.constant dense<5.000000e-01> : tensor<f64>
  %1 = bmt.aten "aten::mul.Tensor"(%arg0, %0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Scalar"(%arg0, 0.70710678118654757) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::erf"(%2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::add.Scalar"(%3, 1, 1) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::mul.Tensor"(%1, %4) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::mul.Tensor"(%arg1, %0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %5, %6 : !bmt.tensor, !bmt.tensor
}
