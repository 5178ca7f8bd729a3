// RUN: bmt-opt %s --bmt-lora='spec=r=2,alpha=4,dropout=0.1,targets=q' 2>&1 | FileCheck %s
// RUN: bmt-opt %s --bmt-lora='spec=r=2,targets=all-linear' 2>&1 | FileCheck %s --check-prefix=ALL
// RUN: not bmt-opt %s --bmt-lora='spec=r=2,targets=nothing' -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOMATCH
// RUN: not bmt-opt %s --bmt-lora='spec=r=0,targets=q' -o /dev/null 2>&1 | FileCheck %s --check-prefix=BADR
// RUN: not bmt-opt %s --bmt-lora='spec=r=2,targets=q,all-linear' -o /dev/null 2>&1 | FileCheck %s --check-prefix=MIXED

// A [r, in] and B [out, r] after the base weight, with their initial-value
// rules; the base frozen; y + (alpha / r) * B(A(dropout(x))) as one
// bmt.lora_adapter.
// CHECK: remark: bmt-lora: adapted 1 linear layers
// CHECK: bmt.parameter @emb.w : tensor<16x8xf32> {aliases = ["head.w"]}
// CHECK-NEXT: bmt.parameter @h.q.weight : tensor<4x8xf32>{{$}}
// CHECK-NEXT: bmt.parameter @h.q.lora_A.weight : tensor<2x8xf32> {bmt.generated_init = "uniform:0.35355339059327373", requires_grad}
// CHECK-NEXT: bmt.parameter @h.q.lora_B.weight : tensor<4x2xf32> {bmt.generated_init = "zeros", requires_grad}
// CHECK-NEXT: bmt.parameter @h.q.bias : tensor<4xf32>{{$}}
// CHECK-NEXT: bmt.parameter @h.o.weight : tensor<8x4xf32>{{$}}
// CHECK: func.func private @h.q.forward
// CHECK-NEXT: %[[W:.+]] = bmt.get_global @h.q.weight
// CHECK-NEXT: %[[B:.+]] = bmt.get_global @h.q.bias
// CHECK-NEXT: %[[Y:.+]] = bmt.aten "aten::linear"(%arg0, %[[W]], %[[B]])
// CHECK-NEXT: %[[A:.+]] = bmt.get_global @h.q.lora_A.weight
// CHECK-NEXT: %[[BW:.+]] = bmt.get_global @h.q.lora_B.weight
// CHECK-NEXT: %[[SUM:.+]] = bmt.lora_adapter %[[Y]], %arg0, %[[A]], %[[BW]] scale 2.000000e+00 dropout 1.000000e-01
// CHECK-NEXT: return %[[SUM]]

// all-linear: q and o, not the tied head.
// ALL: remark: bmt-lora: adapted 2 linear layers (r=2, alpha=2
// ALL: bmt.lora_adapter {{.*}} dropout 0.000000e+00
// ALL: bmt.lora_adapter {{.*}} dropout 0.000000e+00
// ALL-NOT: @head.w.lora_A

// NOMATCH: error: bmt-lora: no linear layer matches targets 'nothing'
// BADR: error: bmt-lora: r must be a positive integer, got '0'
// MIXED: error: bmt-lora: all-linear stands alone in targets

bmt.parameter @emb.w : tensor<16x8xf32> {aliases = ["head.w"], requires_grad}
bmt.parameter @h.q.weight : tensor<4x8xf32> {requires_grad}
bmt.parameter @h.q.bias : tensor<4xf32> {requires_grad}
bmt.parameter @h.o.weight : tensor<8x4xf32> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> !bmt.tensor {
  %e = bmt.get_global @emb.w : !bmt.tensor
  %x = bmt.aten "aten::embedding"(%e, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.q.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.o.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %e, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.q.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.q"} {
  %w = bmt.get_global @h.q.weight : !bmt.tensor
  %b = bmt.get_global @h.q.bias : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, %b) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @h.o.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.o"} {
  %w = bmt.get_global @h.o.weight : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
