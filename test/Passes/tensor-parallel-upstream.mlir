// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2 print-shadow' -o /dev/null 2>&1 | FileCheck %s
// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2' | FileCheck %s --check-prefix=IR

// Each chain's ranked shadow, as upstream's sharding-propagation leaves it:
// the pass annotates the column weight (split along its output dim) and
// the results of the views it follows by its own rule (the view into heads
// enters as an argument split at the heads, the reshape back as one split
// at the hidden dim); every other sharding is upstream's: the input x
// replicated, the column result at the last dim, the transposes, per-head
// matmuls and softmax at the heads, the row weight along its input dim
// and the row result replicated.
// CHECK-LABEL: // bmt-tensor-parallel: the shadow of the chain of aten::linear in h.0.forward after sharding-propagation
// CHECK: shard.grid @tp(shape = 2)
// CHECK: func.func @chain(%arg0: tensor<?x?x?xf32>, %arg1: tensor<16x8xf32>, %arg2: tensor<2x4x2x8xf32>, %arg3: tensor<2x4x16xf32>, %arg4: tensor<8x16xf32>)
// CHECK: %[[WS:.*]] = shard.sharding @tp split_axes = {{\[\[}}0]]
// CHECK-NEXT: %[[W:.*]] = shard.shard %arg1 to %[[WS]] annotate_for_users : tensor<16x8xf32>
// CHECK-NEXT: %[[XS:.*]] = shard.sharding @tp split_axes = {{\[\[}}]]
// CHECK-NEXT: %[[X:.*]] = shard.shard %arg0 to %[[XS]] annotate_for_users
// CHECK-NEXT: %[[COL:.*]] = bmt.aten "aten::linear"(%[[X]], %[[W]], #bmt.none)
// CHECK-NEXT: %[[COLS:.*]] = shard.sharding @tp split_axes = {{\[\[}}], [], [0]]
// CHECK-NEXT: shard.shard %[[COL]] to %[[COLS]] :
// CHECK-NEXT: %[[HS:.*]] = shard.sharding @tp split_axes = {{\[\[}}], [], [0]]
// CHECK-NEXT: %[[H:.*]] = shard.shard %arg2 to %[[HS]] annotate_for_users : tensor<2x4x2x8xf32>
// CHECK-NEXT: %[[Q:.*]] = bmt.aten "aten::transpose.int"(%[[H]], 1, 2)
// CHECK-NEXT: %[[QS:.*]] = shard.sharding @tp split_axes = {{\[\[}}], [0]]
// CHECK-NEXT: shard.shard %[[Q]] to %[[QS]] :
// CHECK: bmt.aten "aten::matmul"
// CHECK-NEXT: shard.sharding @tp split_axes = {{\[\[}}], [0]]
// CHECK: bmt.aten "aten::softmax.int"
// CHECK-NEXT: shard.sharding @tp split_axes = {{\[\[}}], [0]]
// CHECK: bmt.aten "aten::matmul"
// CHECK-NEXT: shard.sharding @tp split_axes = {{\[\[}}], [0]]
// CHECK: bmt.aten "aten::transpose.int"({{.*}}, 1, 2)
// CHECK-NEXT: shard.sharding @tp split_axes = {{\[\[}}], [], [0]]
// CHECK: %[[MS:.*]] = shard.sharding @tp split_axes = {{\[\[}}], [], [0]]
// CHECK-NEXT: %[[M:.*]] = shard.shard %arg3 to %[[MS]] annotate_for_users : tensor<2x4x16xf32>
// CHECK-NEXT: %[[RS:.*]] = shard.sharding @tp split_axes = {{\[\[}}], [0]]
// CHECK-NEXT: %[[R:.*]] = shard.shard %arg4 to %[[RS]] annotate_for_users : tensor<8x16xf32>
// CHECK-NEXT: %[[ROW:.*]] = bmt.aten "aten::linear"(%[[M]], %[[R]], #bmt.none)
// CHECK-NEXT: %[[OS:.*]] = shard.sharding @tp split_axes = {{\[\[}}]]
// CHECK-NEXT: shard.shard %[[ROW]] to %[[OS]] :

// Then upstream's shard-partition of it: the local shapes (the weights'
// output and input halves, 2 heads -> 1 per rank) and its one collective,
// the all-reduce (a sum) after the row-parallel matmul, the one that the
// pass's bmt.tp_all_reduce is.
// CHECK-LABEL: // bmt-tensor-parallel: the shadow of the chain of aten::linear in h.0.forward after shard-partition
// CHECK: func.func @chain(%arg0: tensor<?x?x?xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<2x4x1x8xf32>, %arg3: tensor<2x4x8xf32>, %arg4: tensor<8x8xf32>)
// CHECK-NOT: shard.
// CHECK: %[[P:.*]] = bmt.aten "aten::linear"(%arg3, %arg4, #bmt.none)
// CHECK-NEXT: %[[SUM:.*]] = shard.all_reduce %[[P]] on @tp grid_axes = [0]
// CHECK-NEXT: return {{.*}}%[[SUM]]
// CHECK-LABEL: the shadow of the chain of aten::linear in h.1.forward after sharding-propagation

// The program: the annotations are upstream's decisions (the view's the
// pass's own rule's), bmt.tp_all_reduce the collective partition made.
// IR-LABEL: func.func private @h.0.forward
// IR: bmt.aten "aten::linear"({{.*}}) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}0]]>]}}
// IR-NEXT: bmt.aten "aten::view"({{.*}}, [2, 4, 1, 8]) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}], [], [0], []]>]}}
// IR-NEXT: bmt.aten "aten::transpose.int"({{.*}}, 1, 2) {bmt.sharding = {grid = @tp, split_axes = [#shard<axisarray{{\[\[}}], [0], [], []]>]}}
// IR: %[[OUT:.*]] = bmt.aten "aten::linear"({{.*}}) :
// IR-NEXT: bmt.tp_all_reduce %[[OUT]] over @tp

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
