// RUN: bmt-opt %s --bmt-summary -o %t.mlir 2>&1 | FileCheck %s
// The pass changes nothing:
// RUN: bmt-opt %s -o %t.before.mlir
// RUN: diff %t.before.mlir %t.mlir

// Tied parameters count once (16*8 + 8 + 8*8 elements; 128*4 + 8*2 + 64*4 bytes).
// CHECK:      bmt summary
// CHECK-NEXT:   parameters: 200 elements in 3 tensors (784 B)
// CHECK-NEXT:   tied: 1 (wte.weight = lm_head.weight)
// CHECK-NEXT:   buffers: 1 tensors
// CHECK-NEXT:   functions: 2, calls: 1, aten ops: 2

bmt.parameter @wte.weight : tensor<16x8xf32> {aliases = ["lm_head.weight"], requires_grad}
bmt.parameter @ln.weight : tensor<8xbf16> {requires_grad}
bmt.parameter @proj.weight : tensor<8x8xf32> {requires_grad}
bmt.buffer @mask : tensor<4x4xi1>

func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @proj.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @proj.forward(%x: !bmt.tensor) -> !bmt.tensor {
  %w = bmt.get_global @proj.weight : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
