// RUN: not bmt-opt %s --split-input-file --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' -o /dev/null 2>&1 | FileCheck %s

// Ops whose ShardingInterface rule cannot carry the split stop the chain;
// with no chain left the compile fails, naming the op and why.

// No rule: aten::diff changes the size of the dim it differences.
// CHECK: error: bmt-tensor-parallel: found no chain to split (aten::diff in h.0.forward: an op the pass does not know how to split (no sharding rule))
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::diff"(%0, 1, -1, #bmt.none, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::diff"(%0, 1, -1, #bmt.none, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}


// -----

// Operands split along different dims (the split of one and the transposed
// split of the other): upstream's getShardingOption finds no one option.
// CHECK: error: bmt-tensor-parallel: found no chain to split (aten::add.Tensor in h.0.forward: operands split along different dims)
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 16, 16]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%1, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::linear"(%3, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %4 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 16, 16]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%1, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::linear"(%3, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %4 : !bmt.tensor
}


// -----

// A reduction loop carries the split: a mean over the split dim.
// CHECK: error: bmt-tensor-parallel: found no chain to split (aten::mean.dim in h.0.forward: a mean over the split dim (or over an unknown dim))
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mean.dim"(%0, [-1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Tensor"(%0, %1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mean.dim"(%0, [-1], true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Tensor"(%0, %1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}

// -----

// A full mean (every dim, the split one too).
// CHECK: error: bmt-tensor-parallel: found no chain to split (aten::mean in h.0.forward: a mean over the split dim (or over an unknown dim))
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mean"(%0, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Tensor"(%0, %1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mean"(%0, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Tensor"(%0, %1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}


// -----

// mean.dim with dim=None reduces every dim too.
// CHECK: error: bmt-tensor-parallel: found no chain to split (aten::mean.dim in h.0.forward: a mean over the split dim (or over an unknown dim))
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mean.dim"(%0, #bmt.none, true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Tensor"(%0, %1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mean.dim"(%0, #bmt.none, true, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Tensor"(%0, %1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
