// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' --bmt-lora='spec=r=2,alpha=4,targets=fc,proj' 2>&1 | FileCheck %s
// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' --bmt-lora='spec=r=2,dropout=0.1,targets=fc,proj' 2>&1 | FileCheck %s --check-prefix=DROPOUT

// After bmt-tensor-parallel the adapters follow their base's split: fc is
// column-parallel (W split on its outputs): A whole with its gradient
// summed over the TP group, B split on its rows; proj is row-parallel (W
// split on its inputs): A split on its columns, B whole and summed, and
// the adapter's partial output added before the all-reduce.
// CHECK: remark: bmt-lora: over --tensor-parallel 2: 2 adapters of column-parallel layers (B split), 2 of row-parallel ones (A split), 0 whole
// CHECK: bmt.parameter @h.0.fc.weight : tensor<16x8xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1>}
// CHECK-NEXT: bmt.parameter @h.0.fc.lora_A.weight : tensor<2x8xf32> {bmt.generated_init = "uniform:{{.*}}", bmt.tensor_split = #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>, requires_grad}
// CHECK-NEXT: bmt.parameter @h.0.fc.lora_B.weight : tensor<16x2xf32> {bmt.generated_init = "zeros", bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1>, requires_grad}
// CHECK: bmt.parameter @h.0.proj.weight : tensor<8x16xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 1, chunks = 1>}
// CHECK-NEXT: bmt.parameter @h.0.proj.lora_A.weight : tensor<2x16xf32> {bmt.generated_init = "uniform:{{.*}}", bmt.tensor_split = #bmt.tensor_split<dim = 1, chunks = 1>, requires_grad}
// CHECK-NEXT: bmt.parameter @h.0.proj.lora_B.weight : tensor<8x2xf32> {bmt.generated_init = "zeros", bmt.tensor_split = #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>, requires_grad}
// CHECK: func.func private @h.0.forward
// CHECK-NEXT: %[[X:.+]] = bmt.tp_copy
// CHECK: %[[Y:.+]] = bmt.aten "aten::linear"(%[[X]], %{{.+}}, #bmt.none)
// CHECK-NEXT: %[[A:.+]] = bmt.get_global @h.0.fc.lora_A.weight
// CHECK-NEXT: %[[B:.+]] = bmt.get_global @h.0.fc.lora_B.weight
// CHECK-NEXT: %[[C:.+]] = bmt.lora_adapter %[[Y]], %[[X]], %[[A]], %[[B]] scale 2.000000e+00 dropout 0.000000e+00
// CHECK-NEXT: %[[R:.+]] = bmt.aten "aten::relu"(%[[C]])
// CHECK-NEXT: %[[P:.+]] = bmt.aten "aten::linear"(%[[R]], %{{.+}}, #bmt.none)
// CHECK-NEXT: %[[A2:.+]] = bmt.get_global @h.0.proj.lora_A.weight
// CHECK-NEXT: %[[B2:.+]] = bmt.get_global @h.0.proj.lora_B.weight
// CHECK-NEXT: %[[SUM:.+]] = bmt.lora_adapter %[[P]], %[[R]], %[[A2]], %[[B2]] scale 2.000000e+00 dropout 0.000000e+00 input_parts 2
// CHECK-NEXT: %[[ALL:.+]] = bmt.tp_all_reduce %[[SUM]] over @tp
// CHECK-NEXT: return %[[ALL]]

// With dropout, the row-parallel adapter's input is this rank's part of
// proj's input: its mask is that part of the whole input's (input_parts).
// DROPOUT: bmt.lora_adapter {{.*}} dropout 1.000000e-01 : !bmt.tensor
// DROPOUT: bmt.lora_adapter {{.*}} dropout 1.000000e-01 input_parts 2 : !bmt.tensor

bmt.parameter @h.0.fc.weight : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.proj.weight : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.fc.weight : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.proj.weight : tensor<8x16xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %wf = bmt.get_global @h.0.fc.weight : !bmt.tensor
  %wp = bmt.get_global @h.0.proj.weight : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %wf, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %wp, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %wf = bmt.get_global @h.1.fc.weight : !bmt.tensor
  %wp = bmt.get_global @h.1.proj.weight : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %wf, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %wp, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
