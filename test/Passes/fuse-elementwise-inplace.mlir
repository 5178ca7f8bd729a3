// A region runs at its root's place, and the runtime saves its inputs for the
// backward: no op joins a region when a value it reads (or a view of it) is
// overwritten in place after it. The same programs without the write (or
// with the write before every read) keep their regions.
// RUN: bmt-opt %s --split-input-file --bmt-fuse-elementwise 2>/dev/null | FileCheck %s

// The mul would move past the write to its input: no region.
// CHECK-LABEL: func.func private @moved_past_write(
// CHECK-NOT:     bmt.fused
// CHECK:         bmt.aten "aten::mul.Tensor"(%arg0, %{{.*}})
// CHECK-NEXT:    bmt.aten "aten::add_.Tensor"(%arg0, %arg1, 1)
// CHECK-NEXT:    bmt.aten "aten::exp"
// CHECK-NOT:     bmt.fused
// CHECK:         return
func.func private @moved_past_write(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> !bmt.tensor {
  %c = bmt.constant dense<2.0> : tensor<f64>
  %0 = bmt.aten "aten::mul.Tensor"(%arg0, %c) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::add_.Tensor"(%arg0, %arg1, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::exp"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}

// -----

// CHECK-LABEL: func.func private @no_write(
// CHECK:         bmt.fused "pointwise"(%arg0)
// CHECK:           bmt.aten "aten::mul.Tensor"
// CHECK-NEXT:      bmt.aten "aten::exp"
func.func private @no_write(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> !bmt.tensor {
  %c = bmt.constant dense<2.0> : tensor<f64>
  %0 = bmt.aten "aten::mul.Tensor"(%arg0, %c) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::exp"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}

// -----

// Written before every read: the region reads the written value, as eager.
// CHECK-LABEL: func.func private @write_before(
// CHECK:         %[[W:.*]] = bmt.aten "aten::add_.Tensor"(%arg0, %arg1, 1)
// CHECK-NEXT:    bmt.fused "pointwise"(%arg0)
func.func private @write_before(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> !bmt.tensor {
  %c = bmt.constant dense<2.0> : tensor<f64>
  %1 = bmt.aten "aten::add_.Tensor"(%arg0, %arg1, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::mul.Tensor"(%arg0, %c) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::exp"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}

// -----

// DeepSeek-V3's router: top-k weights summed (a row region), then divided
// in place by the sum; the region's saved input would be the divided one.
// CHECK-LABEL: func.func private @divided_in_place_after(
// CHECK-NOT:     bmt.fused
// CHECK:         bmt.aten "aten::sum.dim_IntList"(%arg0, [-1], true, #bmt.none)
// CHECK:         bmt.aten "aten::add.Tensor"
// CHECK-NEXT:    bmt.aten "aten::div_.Tensor"(%arg0,
func.func private @divided_in_place_after(%arg0: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::sum.dim_IntList"(%arg0, [-1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %e = bmt.constant dense<1.0E-20> : tensor<f64>
  %1 = bmt.aten "aten::add.Tensor"(%0, %e, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::div_.Tensor"(%arg0, %1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}

// -----

// CHECK-LABEL: func.func private @divided_out_of_place(
// CHECK:         bmt.fused "row"(%arg0)
func.func private @divided_out_of_place(%arg0: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::sum.dim_IntList"(%arg0, [-1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %e = bmt.constant dense<1.0E-20> : tensor<f64>
  %1 = bmt.aten "aten::add.Tensor"(%0, %e, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::div.Tensor"(%arg0, %1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}

// -----

// The region would read a view of a tensor that scatter_ writes after it.
// CHECK-LABEL: func.func private @view_written_after(
// CHECK-NOT:     bmt.fused
// CHECK:         bmt.aten "aten::scatter_.value"
func.func private @view_written_after(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
  %0 = bmt.aten "aten::view"(%arg0, [-1]) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::sigmoid"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::exp"(%1) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::scatter_.value"(%arg0, 1, %arg1, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2, %3 : !bmt.tensor, !bmt.tensor
}

// -----

// A callee that writes its argument in place counts as a write.
// CHECK-LABEL: func.func private @callee_writes(
// CHECK-NOT:     bmt.fused
// CHECK:         call @fill
func.func private @fill(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::masked_fill_.Scalar"(%arg0, %arg1, 0.0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @callee_writes(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
  %1 = bmt.aten "aten::sigmoid"(%arg0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::exp"(%1) : (!bmt.tensor) -> !bmt.tensor
  %3 = call @fill(%arg0, %arg1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2, %3 : !bmt.tensor, !bmt.tensor
}
