// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' 2>/dev/null | FileCheck %s

// The split dim moves through each op by the op's ShardingInterface rule
// (lib/Dialect/ShardingInterfaceImpl.cpp), and every op whose result a
// chain splits says how, in the shard dialect's terms over the TP grid:
// grid axis 0 at the split dim, the trailing dims only where the rank is
// unknown. Pointwise ops and dropout keep the dim; a sum over another dim
// without keepdim drops a dim, unsqueeze adds one, softmax reduces another;
// type_as reads its split operand for the dtype only, so its result is
// not split (and not marked).
// CHECK-LABEL: func.func private @h.0.forward
// CHECK-NEXT: %[[IN:.*]] = bmt.tp_copy %arg0 over @tp
// CHECK: bmt.aten "aten::linear"(%[[IN]], {{.*}}) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}0]]>]}}
// CHECK-NEXT: bmt.aten "aten::gelu"{{.*}} {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}0]]>]}}
// CHECK-NEXT: bmt.aten "aten::dropout"{{.*}} {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}0]]>]}}
// CHECK-NEXT: bmt.aten "aten::sum.dim_IntList"({{.*}}, [-2], false, #bmt.none) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}0]]>]}}
// CHECK-NEXT: bmt.aten "aten::unsqueeze"({{.*}}, -2) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}0]]>]}}
// CHECK-NEXT: bmt.aten "aten::softmax.int"({{.*}}, -2, #bmt.none) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}0]]>]}}
// CHECK-NEXT: bmt.aten "aten::type_as"(%arg0, %{{[0-9]+}}) :
// CHECK-NEXT: bmt.aten "aten::mul.Tensor"{{.*}} {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}0]]>]}}
// CHECK-NEXT: %[[ROW:.*]] = bmt.aten "aten::linear"(%{{[0-9]+}}, %{{[0-9]+}}, #bmt.none) :
// CHECK-NEXT: bmt.tp_all_reduce %[[ROW]] over @tp
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.0.b1 : tensor<16xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.b1 : tensor<16xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %b1 = bmt.get_global @h.0.b1 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, %b1) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::gelu"(%0, "none") : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::dropout"(%1, 1.000000e-01, true) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::sum.dim_IntList"(%2, [-2], false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::unsqueeze"(%3, -2) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::softmax.int"(%4, -2, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::type_as"(%x, %5) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::mul.Tensor"(%5, %6) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::linear"(%7, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %8 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %b1 = bmt.get_global @h.1.b1 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, %b1) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::gelu"(%0, "none") : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::dropout"(%1, 1.000000e-01, true) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::sum.dim_IntList"(%2, [-2], false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::unsqueeze"(%3, -2) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::softmax.int"(%4, -2, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::type_as"(%x, %5) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::mul.Tensor"(%5, %6) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::linear"(%7, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %8 : !bmt.tensor
}

// -----

// Heads: with the rank known from the view, the annotations list every
// dim. transpose moves the split dim as its permutation rule says; the
// per-head matmuls and the softmax over the last dim keep it at the heads
// (their contracted and reduced dims are others); reshape merges it back
// into the last dim (the pass's own rule), and the row-parallel matmul
// that contracts it is followed by the all-reduce.
// CHECK-LABEL: func.func private @h.0.forward
// CHECK: bmt.aten "aten::view"({{.*}}, [2, 4, 1, 8]) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}], [], [0], []]>]}}
// CHECK-NEXT: %[[Q:.*]] = bmt.aten "aten::transpose.int"({{.*}}, 1, 2) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}], [0], [], []]>]}}
// CHECK-NEXT: %[[K:.*]] = bmt.aten "aten::transpose.int"(%[[Q]], -1, -2) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}], [0], [], []]>]}}
// CHECK-NEXT: bmt.aten "aten::matmul"(%[[Q]], %[[K]]) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}], [0], [], []]>]}}
// CHECK-NEXT: bmt.aten "aten::softmax.int"({{.*}}, -1, #bmt.none) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}], [0], [], []]>]}}
// CHECK-NEXT: bmt.aten "aten::matmul"({{.*}}, %[[Q]]) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}], [0], [], []]>]}}
// CHECK-NEXT: bmt.aten "aten::transpose.int"({{.*}}, 1, 2) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}], [], [0], []]>]}}
// CHECK-NEXT: bmt.aten "aten::reshape"({{.*}}, [2, 4, 8]) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}], [], [0]]>]}}
// CHECK-NEXT: %[[OUT:.*]] = bmt.aten "aten::linear"({{.*}}) :
// CHECK-NEXT: bmt.tp_all_reduce %[[OUT]] over @tp
bmt.parameter @h.0.wq : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.wo : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.wq : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.wo : tensor<8x16xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %wq = bmt.get_global @h.0.wq : !bmt.tensor
  %wo = bmt.get_global @h.0.wo : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::transpose.int"(%2, -1, -2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::matmul"(%2, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::softmax.int"(%4, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::matmul"(%5, %2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::transpose.int"(%6, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::reshape"(%7, [2, 4, 16]) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::linear"(%8, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %9 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %wq = bmt.get_global @h.1.wq : !bmt.tensor
  %wo = bmt.get_global @h.1.wo : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::view"(%0, [2, 4, 2, 8]) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::transpose.int"(%1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::transpose.int"(%2, -1, -2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::matmul"(%2, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::softmax.int"(%4, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::matmul"(%5, %2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::transpose.int"(%6, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::reshape"(%7, [2, 4, 16]) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::linear"(%8, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %9 : !bmt.tensor
}
