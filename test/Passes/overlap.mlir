// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-zero --bmt-overlap 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-zero --bmt-overlap='depth=0' 2>/dev/null | FileCheck %s --check-prefix=DEPTH0
// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-zero --bmt-overlap='depth=5' 2>/dev/null | FileCheck %s --check-prefix=DEPTH5
// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-zero='stage=2' --bmt-overlap 2>/dev/null | FileCheck %s --check-prefix=STAGE2
// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-zero --bmt-overlap -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-zero --bmt-overlap --bmt-summary -o /dev/null 2>&1 | FileCheck %s --check-prefix=SUMMARY

// REMARK: remark: bmt-overlap: prefetch depth 1, ZeRO-3: 6 block all-gathers, 6 releases, 1 outside-block groups gathered in @forward
// SUMMARY: overlap: prefetch depth 1

// Three blocks, one with two dtypes (two groups), two with a frozen bf16
// parameter (its frozen group, scheduled as any other); the embedding
// outside. Depth 1: the gathers of blocks 0 and 1 before block 0, of block
// 2 before block 1, each release after its block's call (ZeRO-3); the
// outside group at the start of @forward.
// CHECK-LABEL: module attributes {bmt.overlap = {prefetch_depth = 1 : i64}
// CHECK-LABEL: func.func @forward(
// CHECK-NEXT: bmt.all_gather @outside_blocks.float32
// CHECK-NEXT: bmt.get_global @emb.w
// CHECK-LABEL: func.func private @body.forward(
// CHECK: bmt.aten "aten::embedding"
// CHECK-NEXT: bmt.all_gather @h.0.float32
// CHECK-NEXT: bmt.all_gather @h.0.bfloat16
// CHECK-NEXT: bmt.all_gather @h.1.float32
// CHECK-NEXT: bmt.all_gather @h.1.frozen.bfloat16
// CHECK-NEXT: call @h.0.forward
// CHECK-NEXT: bmt.release @h.0.float32
// CHECK-NEXT: bmt.release @h.0.bfloat16
// CHECK-NEXT: bmt.all_gather @h.2.float32
// CHECK-NEXT: bmt.all_gather @h.2.frozen.bfloat16
// CHECK-NEXT: call @h.1.forward
// CHECK-NEXT: bmt.release @h.1.float32
// CHECK-NEXT: bmt.release @h.1.frozen.bfloat16
// CHECK-NEXT: call @h.2.forward
// CHECK-NEXT: bmt.release @h.2.float32
// CHECK-NEXT: bmt.release @h.2.frozen.bfloat16
// CHECK-NEXT: return

// DEPTH0-LABEL: func.func private @body.forward(
// DEPTH0: bmt.all_gather @h.0.float32
// DEPTH0-NEXT: bmt.all_gather @h.0.bfloat16
// DEPTH0-NEXT: call @h.0.forward
// DEPTH0-NEXT: bmt.release @h.0.float32
// DEPTH0-NEXT: bmt.release @h.0.bfloat16
// DEPTH0-NEXT: bmt.all_gather @h.1.float32
// DEPTH0-NEXT: bmt.all_gather @h.1.frozen.bfloat16
// DEPTH0-NEXT: call @h.1.forward
// DEPTH0-NEXT: bmt.release @h.1.float32
// DEPTH0-NEXT: bmt.release @h.1.frozen.bfloat16
// DEPTH0-NEXT: bmt.all_gather @h.2.float32
// DEPTH0-NEXT: bmt.all_gather @h.2.frozen.bfloat16
// DEPTH0-NEXT: call @h.2.forward
// DEPTH0-NEXT: bmt.release @h.2.float32
// DEPTH0-NEXT: bmt.release @h.2.frozen.bfloat16

// A depth beyond the list gathers everything before the first call.
// DEPTH5-LABEL: module attributes {bmt.overlap = {prefetch_depth = 5 : i64}
// DEPTH5-LABEL: func.func private @body.forward(
// DEPTH5: bmt.all_gather @h.0.float32
// DEPTH5-NEXT: bmt.all_gather @h.0.bfloat16
// DEPTH5-NEXT: bmt.all_gather @h.1.float32
// DEPTH5-NEXT: bmt.all_gather @h.1.frozen.bfloat16
// DEPTH5-NEXT: bmt.all_gather @h.2.float32
// DEPTH5-NEXT: bmt.all_gather @h.2.frozen.bfloat16
// DEPTH5-NEXT: call @h.0.forward
// DEPTH5-NEXT: bmt.release @h.0.float32

// ZeRO-2: no releases.
// STAGE2-LABEL: func.func private @body.forward(
// STAGE2-NOT: bmt.release
// STAGE2: return
bmt.parameter @emb.w : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @h.0.g : tensor<8xbf16> {requires_grad}
bmt.parameter @h.1.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @h.1.g : tensor<8xbf16>
bmt.parameter @h.2.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @h.2.g : tensor<8xbf16>
func.func @forward(%ids: !bmt.tensor) -> !bmt.tensor {
  %w = bmt.get_global @emb.w : !bmt.tensor
  %0 = call @body.forward(%w, %ids) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @body.forward(%w: !bmt.tensor, %ids: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "body"} {
  %x = bmt.aten "aten::embedding"(%w, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = call @h.2.forward(%1) : (!bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w = bmt.get_global @h.0.w : !bmt.tensor
  %g = bmt.get_global @h.0.g : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mul.Tensor"(%0, %g) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w = bmt.get_global @h.1.w : !bmt.tensor
  %g = bmt.get_global @h.1.g : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mul.Tensor"(%0, %g) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.2.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.2"} {
  %w = bmt.get_global @h.2.w : !bmt.tensor
  %g = bmt.get_global @h.2.g : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mul.Tensor"(%0, %g) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
