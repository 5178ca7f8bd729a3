// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' 2>&1 | FileCheck %s

// A fused q/k/v projection taken apart by slices of equal parts (Phi-3's
// qkv_proj with as many kv heads as query heads), as a trace records them:
// along dim 2 of the [batch, seq, 48] output. The weight is split in 3
// chunks, each over the 2 ranks (as GPT-2's c_attn), and each slice takes
// the rank's part of its chunk: [0, 16) -> [0, 8), [16, 32) -> [8, 16),
// [32, end) -> [16, end).
// CHECK: remark: bmt-tensor-parallel: 2 ranks, 2 blocks, 2 chains: qkv column-parallel by heads (2 -> 1 per rank, fused q/k/v), o row-parallel
// CHECK: bmt.parameter @h.0.qkv : tensor<48x16xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 3>, requires_grad}
// CHECK-LABEL: func.func private @h.0.forward
// CHECK: "aten::slice.Tensor"(%{{.*}}, 2, 0, 8, 1)
// CHECK: "aten::slice.Tensor"(%{{.*}}, 2, 8, 16, 1)
// CHECK: "aten::slice.Tensor"(%{{.*}}, 2, 16, 9223372036854775807, 1)
// CHECK: "aten::view"(%{{.*}}, [2, 4, 1, 8])
bmt.parameter @h.0.qkv : tensor<48x16xf32> {requires_grad}
bmt.parameter @h.0.o : tensor<16x16xf32> {requires_grad}
bmt.parameter @h.1.qkv : tensor<48x16xf32> {requires_grad}
bmt.parameter @h.1.o : tensor<16x16xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w = bmt.get_global @h.0.qkv : !bmt.tensor
  %wo = bmt.get_global @h.0.o : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %q = bmt.aten "aten::slice.Tensor"(%0, 2, 0, 16, 1) : (!bmt.tensor) -> !bmt.tensor
  %k = bmt.aten "aten::slice.Tensor"(%0, 2, 16, 32, 1) : (!bmt.tensor) -> !bmt.tensor
  %v = bmt.aten "aten::slice.Tensor"(%0, 2, 32, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%q, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::view"(%k, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::transpose.int"(%3, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::view"(%v, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::transpose.int"(%5, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::scaled_dot_product_attention"(%2, %4, %6, #bmt.none, 0.000000e+00, true, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::transpose.int"(%7, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::reshape"(%8, [2, 4, 16]) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::linear"(%9, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %10 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w = bmt.get_global @h.1.qkv : !bmt.tensor
  %wo = bmt.get_global @h.1.o : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %q = bmt.aten "aten::slice.Tensor"(%0, 2, 0, 16, 1) : (!bmt.tensor) -> !bmt.tensor
  %k = bmt.aten "aten::slice.Tensor"(%0, 2, 16, 32, 1) : (!bmt.tensor) -> !bmt.tensor
  %v = bmt.aten "aten::slice.Tensor"(%0, 2, 32, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%q, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::view"(%k, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::transpose.int"(%3, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::view"(%v, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::transpose.int"(%5, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::scaled_dot_product_attention"(%2, %4, %6, #bmt.none, 0.000000e+00, true, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::transpose.int"(%7, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::reshape"(%8, [2, 4, 16]) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::linear"(%9, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %10 : !bmt.tensor
}
