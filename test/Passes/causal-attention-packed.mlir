// RUN: bmt-opt %s --split-input-file --bmt-causal-attention 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s --split-input-file --bmt-causal-attention -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK

// A model traced or exported with input_ids only (no attention_mask):
// transformers 5 makes position_ids = arange(seq) (unsqueezed, expanded to
// the batch when the batch is not 1), and under tracing always runs its
// packed-sequence detection on them (masking_utils.find_packed_sequence_indices:
// ids = cumsum(diff(position_ids, prepend=position_ids[:, :1] - 1) != 1)),
// ANDing ids[b, q] == ids[b, kv] into the causal mask. The ids of an arange
// are zeros: the term is true everywhere. The modules below are reduced
// from LLaMA's trace and export (transformers 5.17); test/python/
// test_no_attention_mask.py runs the real models against eager.

// REMARK:      remark: bmt-causal-attention: 1 of 1 aten::scaled_dot_product_attention with an attn_mask made causal (attn_mask=None, is_causal=True) in 1 function (attn.forward); mask computation removed: 43 ops, 1 function argument
// REMARK:      remark: bmt-causal-attention: no aten::scaled_dot_product_attention with an attn_mask
// REMARK:      remark: bmt-causal-attention: 2 lookups of a constant tensor (packed-sequence ids of position_ids that are an arange: one sequence per row) folded in 1 function (model.forward); removed: 13 ops, 0 function arguments
// REMARK:      remark: bmt-causal-attention: 1 of 1 {{.*}} made causal {{.*}}; mask computation removed: 33 ops, 1 function argument
// REMARK:      remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask reads the program input 'position_ids')
// REMARK-NOT:  remark

// A trace (sizes are aten::size.int) at batch 2, SDPA attention: the
// packed-sequence term is proven true, the call becomes causal, and the
// whole mask computation goes, diff and cumsum included.
// CHECK-LABEL: module {
// CHECK:         func.func private @model.forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}) -> !bmt.tensor {
// CHECK-NOT:       aten::diff
// CHECK-NOT:       aten::cumsum
// CHECK-NOT:       aten::index.Tensor
// CHECK:           call @attn.forward(%{{.*}}) : (!bmt.tensor) -> !bmt.tensor
// CHECK:         func.func private @attn.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
// CHECK-NEXT:      bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, #bmt.none, 0.000000e+00, true, 2.500000e-01, false)
bmt.parameter @embed.weight : tensor<64x16xf32> {requires_grad}
func.func @forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}) -> !bmt.tensor {
  %0 = call @model.forward(%arg0) : (!bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @model.forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}) -> !bmt.tensor {
  %w = bmt.get_global @embed.weight : !bmt.tensor
  %0 = bmt.aten "aten::embedding"(%w, %arg0, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::size.int"(%0, 1) : (!bmt.tensor) -> i64
  %2 = bmt.aten "aten::arange"(%1, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %3 = bmt.constant dense<0> : tensor<i64>
  %4 = bmt.aten "aten::add.Tensor"(%2, %3, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::unsqueeze"(%4, 0) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::size.int"(%0, 0) : (!bmt.tensor) -> i64
  %8 = bmt.aten "aten::expand"(%5, [%7, -1], false) : (!bmt.tensor, i64) -> !bmt.tensor
  %9 = bmt.aten "aten::slice.Tensor"(%8, 0, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::slice.Tensor"(%9, 1, 0, 1, 1) : (!bmt.tensor) -> !bmt.tensor
  %11 = bmt.constant dense<1> : tensor<i64>
  %12 = bmt.aten "aten::sub.Tensor"(%10, %11, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %13 = bmt.aten "aten::diff"(%8, 1, -1, %12, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %14 = bmt.aten "aten::ne.Scalar"(%13, 1) : (!bmt.tensor) -> !bmt.tensor
  %15 = bmt.aten "aten::cumsum"(%14, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %17 = bmt.aten "aten::arange"(%7, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %18 = bmt.aten "aten::arange"(%1, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %19 = bmt.constant dense<0> : tensor<i64>
  %20 = bmt.aten "aten::add.Tensor"(%18, %19, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %21 = bmt.aten "aten::arange"(%1, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %22 = bmt.constant dense<0> : tensor<i64>
  %23 = bmt.aten "aten::add.Tensor"(%21, %22, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %24 = bmt.aten "aten::slice.Tensor"(%17, 0, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %25 = bmt.aten "aten::unsqueeze"(%24, 1) : (!bmt.tensor) -> !bmt.tensor
  %26 = bmt.aten "aten::unsqueeze"(%25, 2) : (!bmt.tensor) -> !bmt.tensor
  %27 = bmt.aten "aten::unsqueeze"(%26, 3) : (!bmt.tensor) -> !bmt.tensor
  %28 = bmt.aten "aten::unsqueeze"(%20, 0) : (!bmt.tensor) -> !bmt.tensor
  %29 = bmt.aten "aten::unsqueeze"(%28, 1) : (!bmt.tensor) -> !bmt.tensor
  %30 = bmt.aten "aten::slice.Tensor"(%29, 2, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %31 = bmt.aten "aten::unsqueeze"(%30, 3) : (!bmt.tensor) -> !bmt.tensor
  %32 = bmt.aten "aten::unsqueeze"(%23, 0) : (!bmt.tensor) -> !bmt.tensor
  %33 = bmt.aten "aten::unsqueeze"(%32, 1) : (!bmt.tensor) -> !bmt.tensor
  %34 = bmt.aten "aten::unsqueeze"(%33, 2) : (!bmt.tensor) -> !bmt.tensor
  %35 = bmt.aten "aten::slice.Tensor"(%34, 3, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %36 = bmt.aten "aten::new_ones"(%31, [], 11, #bmt.none, #bmt.none, false) : (!bmt.tensor) -> !bmt.tensor
  %37 = bmt.aten "aten::le.Tensor"(%35, %31) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %38 = bmt.aten "aten::to.dtype_layout"(%37, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %39 = bmt.aten "aten::__and__.Tensor"(%36, %38) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %40 = bmt.aten "aten::index.Tensor"(%15, [%27, %31]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %41 = bmt.aten "aten::index.Tensor"(%15, [%27, %35]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %42 = bmt.aten "aten::eq.Tensor"(%40, %41) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %43 = bmt.aten "aten::to.dtype_layout"(%42, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %44 = bmt.aten "aten::__and__.Tensor"(%39, %43) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %45 = bmt.aten "aten::expand"(%44, [%7, -1, %1, %1], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %46 = call @attn.forward(%0, %45) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %46 : !bmt.tensor
}
func.func private @attn.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor {bmt.name = "attention_mask"}) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, 2.500000e-01, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// A trace at batch 1, eager attention (the mask made additive by where):
// transformers did not expand position_ids (the sizes were equal), so the
// ids are [1, seq] and the program's lookups ids[b, q] fail at any other
// batch. No SDPA to make causal; each lookup of the constant ids becomes
// b * 0 + q * 0, zeros of the lookup's shape at every batch, and the ids'
// computation goes.
// CHECK-LABEL: module {
// CHECK:         func.func private @model.forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}) -> !bmt.tensor {
// CHECK-NOT:       aten::diff
// CHECK-NOT:       aten::cumsum
// CHECK:           %[[B0:.*]] = bmt.aten "aten::mul.Scalar"(%[[B:.*]], 0)
// CHECK-NEXT:      %[[Q0:.*]] = bmt.aten "aten::mul.Scalar"(%[[Q:.*]], 0)
// CHECK-NEXT:      %[[IQ:.*]] = bmt.aten "aten::add.Tensor"(%[[B0]], %[[Q0]], 1)
// CHECK-NEXT:      %[[B1:.*]] = bmt.aten "aten::mul.Scalar"(%[[B]], 0)
// CHECK-NEXT:      %[[K0:.*]] = bmt.aten "aten::mul.Scalar"(%[[K:.*]], 0)
// CHECK-NEXT:      %[[IK:.*]] = bmt.aten "aten::add.Tensor"(%[[B1]], %[[K0]], 1)
// CHECK-NEXT:      bmt.aten "aten::eq.Tensor"(%[[IQ]], %[[IK]])
// CHECK-NOT:       aten::index.Tensor
// CHECK:         func.func private @attn.forward(
bmt.parameter @embed.weight : tensor<64x16xf32> {requires_grad}
func.func @forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}) -> !bmt.tensor {
  %0 = call @model.forward(%arg0) : (!bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @model.forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}) -> !bmt.tensor {
  %w = bmt.get_global @embed.weight : !bmt.tensor
  %0 = bmt.aten "aten::embedding"(%w, %arg0, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::size.int"(%0, 1) : (!bmt.tensor) -> i64
  %2 = bmt.aten "aten::arange"(%1, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %3 = bmt.constant dense<0> : tensor<i64>
  %4 = bmt.aten "aten::add.Tensor"(%2, %3, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::unsqueeze"(%4, 0) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::size.int"(%0, 0) : (!bmt.tensor) -> i64
  %9 = bmt.aten "aten::slice.Tensor"(%5, 0, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::slice.Tensor"(%9, 1, 0, 1, 1) : (!bmt.tensor) -> !bmt.tensor
  %11 = bmt.constant dense<1> : tensor<i64>
  %12 = bmt.aten "aten::sub.Tensor"(%10, %11, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %13 = bmt.aten "aten::diff"(%5, 1, -1, %12, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %14 = bmt.aten "aten::ne.Scalar"(%13, 1) : (!bmt.tensor) -> !bmt.tensor
  %15 = bmt.aten "aten::cumsum"(%14, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %17 = bmt.aten "aten::arange"(%7, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %18 = bmt.aten "aten::arange"(%1, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %19 = bmt.constant dense<0> : tensor<i64>
  %20 = bmt.aten "aten::add.Tensor"(%18, %19, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %21 = bmt.aten "aten::arange"(%1, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %22 = bmt.constant dense<0> : tensor<i64>
  %23 = bmt.aten "aten::add.Tensor"(%21, %22, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %24 = bmt.aten "aten::slice.Tensor"(%17, 0, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %25 = bmt.aten "aten::unsqueeze"(%24, 1) : (!bmt.tensor) -> !bmt.tensor
  %26 = bmt.aten "aten::unsqueeze"(%25, 2) : (!bmt.tensor) -> !bmt.tensor
  %27 = bmt.aten "aten::unsqueeze"(%26, 3) : (!bmt.tensor) -> !bmt.tensor
  %28 = bmt.aten "aten::unsqueeze"(%20, 0) : (!bmt.tensor) -> !bmt.tensor
  %29 = bmt.aten "aten::unsqueeze"(%28, 1) : (!bmt.tensor) -> !bmt.tensor
  %30 = bmt.aten "aten::slice.Tensor"(%29, 2, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %31 = bmt.aten "aten::unsqueeze"(%30, 3) : (!bmt.tensor) -> !bmt.tensor
  %32 = bmt.aten "aten::unsqueeze"(%23, 0) : (!bmt.tensor) -> !bmt.tensor
  %33 = bmt.aten "aten::unsqueeze"(%32, 1) : (!bmt.tensor) -> !bmt.tensor
  %34 = bmt.aten "aten::unsqueeze"(%33, 2) : (!bmt.tensor) -> !bmt.tensor
  %35 = bmt.aten "aten::slice.Tensor"(%34, 3, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %36 = bmt.aten "aten::new_ones"(%31, [], 11, #bmt.none, #bmt.none, false) : (!bmt.tensor) -> !bmt.tensor
  %37 = bmt.aten "aten::le.Tensor"(%35, %31) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %38 = bmt.aten "aten::to.dtype_layout"(%37, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %39 = bmt.aten "aten::__and__.Tensor"(%36, %38) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %40 = bmt.aten "aten::index.Tensor"(%15, [%27, %31]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %41 = bmt.aten "aten::index.Tensor"(%15, [%27, %35]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %42 = bmt.aten "aten::eq.Tensor"(%40, %41) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %43 = bmt.aten "aten::to.dtype_layout"(%42, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %44 = bmt.aten "aten::__and__.Tensor"(%39, %43) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %45 = bmt.aten "aten::expand"(%44, [%7, -1, %1, %1], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %z = bmt.constant dense<0.000000e+00> : tensor<f32>
  %46 = bmt.aten "aten::where.ScalarOther"(%45, %z, -3.4028234663852886E+38) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %47 = call @attn.forward(%0, %46) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %47 : !bmt.tensor
}
func.func private @attn.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor {bmt.name = "attention_mask"}) -> !bmt.tensor {
  %0 = bmt.aten "aten::transpose.int"(%arg0, -1, -2) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::matmul"(%arg0, %0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::add.Tensor"(%1, %arg1, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::softmax.int"(%2, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::matmul"(%3, %arg0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %4 : !bmt.tensor
}

// -----

// torch.export at 2 x 8 (sizes are constants, offsets aten::add.Scalar /
// sub.Scalar), SDPA: made causal the same way.
// CHECK-LABEL: module {
// CHECK:         func.func private @model.forward(
// CHECK-NOT:       aten::diff
// CHECK-NOT:       aten::cumsum
// CHECK-NOT:       aten::index.Tensor
// CHECK:         func.func private @attn.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
// CHECK-NEXT:      bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, #bmt.none, 0.000000e+00, true, 2.500000e-01, false)
bmt.parameter @embed.weight : tensor<64x16xf32> {requires_grad}
func.func @forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}) -> !bmt.tensor {
  %0 = call @model.forward(%arg0) : (!bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @model.forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}) -> !bmt.tensor {
  %w = bmt.get_global @embed.weight : !bmt.tensor
  %0 = bmt.aten "aten::embedding"(%w, %arg0, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::arange"(8, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %2 = bmt.aten "aten::add.Scalar"(%1, 0, 1) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::unsqueeze"(%2, 0) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::expand"(%3, [2, -1], false) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::slice.Tensor"(%4, 1, 0, 1, 1) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::sub.Scalar"(%5, 1, 1) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::diff"(%4, 1, -1, %6, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::ne.Scalar"(%7, 1) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::cumsum"(%8, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::arange"(2, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %12 = bmt.aten "aten::arange"(8, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %13 = bmt.aten "aten::add.Scalar"(%12, 0, 1) : (!bmt.tensor) -> !bmt.tensor
  %14 = bmt.aten "aten::arange"(8, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %15 = bmt.aten "aten::add.Scalar"(%14, 0, 1) : (!bmt.tensor) -> !bmt.tensor
  %16 = bmt.aten "aten::unsqueeze"(%10, 1) : (!bmt.tensor) -> !bmt.tensor
  %17 = bmt.aten "aten::unsqueeze"(%16, 2) : (!bmt.tensor) -> !bmt.tensor
  %18 = bmt.aten "aten::unsqueeze"(%17, 3) : (!bmt.tensor) -> !bmt.tensor
  %22 = bmt.aten "aten::unsqueeze"(%13, 0) : (!bmt.tensor) -> !bmt.tensor
  %23 = bmt.aten "aten::unsqueeze"(%22, 1) : (!bmt.tensor) -> !bmt.tensor
  %24 = bmt.aten "aten::unsqueeze"(%23, 3) : (!bmt.tensor) -> !bmt.tensor
  %25 = bmt.aten "aten::unsqueeze"(%15, 0) : (!bmt.tensor) -> !bmt.tensor
  %26 = bmt.aten "aten::unsqueeze"(%25, 1) : (!bmt.tensor) -> !bmt.tensor
  %27 = bmt.aten "aten::unsqueeze"(%26, 2) : (!bmt.tensor) -> !bmt.tensor
  %28 = bmt.aten "aten::new_ones"(%24, [], 11, #bmt.none, #bmt.none, false) : (!bmt.tensor) -> !bmt.tensor
  %29 = bmt.aten "aten::le.Tensor"(%27, %24) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %30 = bmt.aten "aten::to.dtype_layout"(%29, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %31 = bmt.aten "aten::__and__.Tensor"(%28, %30) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %32 = bmt.aten "aten::index.Tensor"(%9, [%18, %24]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %33 = bmt.aten "aten::index.Tensor"(%9, [%18, %27]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %34 = bmt.aten "aten::eq.Tensor"(%32, %33) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %35 = bmt.aten "aten::to.dtype_layout"(%34, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %36 = bmt.aten "aten::__and__.Tensor"(%31, %35) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %37 = bmt.aten "aten::expand"(%36, [2, -1, 8, 8], false) : (!bmt.tensor) -> !bmt.tensor
  %38 = call @attn.forward(%0, %37) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %38 : !bmt.tensor
}
func.func private @attn.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor {bmt.name = "attention_mask"}) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, 2.500000e-01, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// position_ids an input of the program (traced with position_ids): the
// sequences may really be packed, the term depends on the data. Left
// alone, and nothing folded.
// CHECK-LABEL: module {
// CHECK:         func.func private @model.forward(
// CHECK:           aten::diff
// CHECK:           aten::index.Tensor
// CHECK:           aten::index.Tensor
// CHECK:         func.func private @attn.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor {bmt.name = "attention_mask"}) -> !bmt.tensor {
// CHECK-NEXT:      bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, 2.500000e-01, false)
bmt.parameter @embed.weight : tensor<64x16xf32> {requires_grad}
func.func @forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}, %arg1: !bmt.tensor {bmt.name = "position_ids"}) -> !bmt.tensor {
  %0 = call @model.forward(%arg0, %arg1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @model.forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}, %arg1: !bmt.tensor {bmt.name = "position_ids"}) -> !bmt.tensor {
  %w = bmt.get_global @embed.weight : !bmt.tensor
  %0 = bmt.aten "aten::embedding"(%w, %arg0, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::size.int"(%0, 1) : (!bmt.tensor) -> i64
  %7 = bmt.aten "aten::size.int"(%0, 0) : (!bmt.tensor) -> i64
  %9 = bmt.aten "aten::slice.Tensor"(%arg1, 0, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::slice.Tensor"(%9, 1, 0, 1, 1) : (!bmt.tensor) -> !bmt.tensor
  %11 = bmt.constant dense<1> : tensor<i64>
  %12 = bmt.aten "aten::sub.Tensor"(%10, %11, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %13 = bmt.aten "aten::diff"(%arg1, 1, -1, %12, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %14 = bmt.aten "aten::ne.Scalar"(%13, 1) : (!bmt.tensor) -> !bmt.tensor
  %15 = bmt.aten "aten::cumsum"(%14, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %17 = bmt.aten "aten::arange"(%7, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %18 = bmt.aten "aten::arange"(%1, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %21 = bmt.aten "aten::arange"(%1, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %25 = bmt.aten "aten::unsqueeze"(%17, 1) : (!bmt.tensor) -> !bmt.tensor
  %26 = bmt.aten "aten::unsqueeze"(%25, 2) : (!bmt.tensor) -> !bmt.tensor
  %27 = bmt.aten "aten::unsqueeze"(%26, 3) : (!bmt.tensor) -> !bmt.tensor
  %28 = bmt.aten "aten::unsqueeze"(%18, 0) : (!bmt.tensor) -> !bmt.tensor
  %29 = bmt.aten "aten::unsqueeze"(%28, 1) : (!bmt.tensor) -> !bmt.tensor
  %31 = bmt.aten "aten::unsqueeze"(%29, 3) : (!bmt.tensor) -> !bmt.tensor
  %32 = bmt.aten "aten::unsqueeze"(%21, 0) : (!bmt.tensor) -> !bmt.tensor
  %33 = bmt.aten "aten::unsqueeze"(%32, 1) : (!bmt.tensor) -> !bmt.tensor
  %35 = bmt.aten "aten::unsqueeze"(%33, 2) : (!bmt.tensor) -> !bmt.tensor
  %37 = bmt.aten "aten::le.Tensor"(%35, %31) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %40 = bmt.aten "aten::index.Tensor"(%15, [%27, %31]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %41 = bmt.aten "aten::index.Tensor"(%15, [%27, %35]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %42 = bmt.aten "aten::eq.Tensor"(%40, %41) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %44 = bmt.aten "aten::__and__.Tensor"(%37, %42) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %45 = bmt.aten "aten::expand"(%44, [%7, -1, %1, %1], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %46 = call @attn.forward(%0, %45) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %46 : !bmt.tensor
}
func.func private @attn.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor {bmt.name = "attention_mask"}) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, 2.500000e-01, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
