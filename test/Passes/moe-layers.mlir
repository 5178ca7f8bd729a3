// RUN: bmt-opt %s --split-input-file --bmt-moe-layers 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s --split-input-file --bmt-moe-layers -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK

// A Qwen3-MoE layer as a trace records it (4 experts): the dispatch and the
// combine become one op each; the experts' ops stay, reading the dispatch's
// results (rows, sorted ids for the padding mask, offsets for the grouped
// matmuls, the permutation for the routing weights).
// CHECK-LABEL: func.func @experts.forward(
// CHECK-NEXT:    %[[DOWN:.*]] = bmt.get_global @experts.down_proj
// CHECK-NEXT:    %[[GATE_UP:.*]] = bmt.get_global @experts.gate_up_proj
// CHECK-NEXT:    %[[K:.*]] = bmt.aten "aten::size.int"(%arg0, -1)
// CHECK-NEXT:    %[[W:.*]] = bmt.aten "aten::reshape"(%arg2, [-1])
// CHECK-NEXT:    %[[ROWS:.*]], %[[SORTED:.*]], %[[OFFSETS:.*]], %[[PERM:.*]] = bmt.moe_dispatch %arg1, %arg0 experts 4 : !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor
// CHECK-NEXT:    %[[WP:.*]] = bmt.aten "aten::index.Tensor"(%[[W]], [%[[PERM]]])
// CHECK-NEXT:    %[[MASK:.*]] = bmt.aten "aten::ge.Scalar"(%[[SORTED]], 4)
// CHECK-NOT:     aten::sort
// CHECK-NOT:     aten::histc
// CHECK:         bmt.aten "aten::masked_fill_.Scalar"(%[[ROWS]],
// CHECK:         bmt.aten "aten::_grouped_mm"({{.*}}, %[[OFFSETS]], #bmt.none, #bmt.none)
// CHECK:         bmt.aten "aten::_grouped_mm"({{.*}}, %[[OFFSETS]], #bmt.none, #bmt.none)
// CHECK:         %[[OUT:.*]] = bmt.aten "aten::mul.Tensor"
// CHECK-NEXT:    %[[SUM:.*]] = bmt.moe_combine %[[OUT]], %[[PERM]] top_k %[[K]] : !bmt.tensor
// CHECK-NEXT:    %[[R:.*]] = bmt.aten "aten::to.dtype"(%[[SUM]], 6, false, false, #bmt.none)
// CHECK-NEXT:    return %[[R]]
// REMARK: remark: bmt-moe-layers: 1 mixture-of-experts layer lowered to bmt.moe_dispatch / bmt.moe_combine (experts.forward)

bmt.parameter @experts.gate_up_proj : tensor<4x32x16xf32> {requires_grad}
bmt.parameter @experts.down_proj : tensor<4x16x16xf32> {requires_grad}
func.func @experts.forward(%arg0: !bmt.tensor {bmt.name = "top_k_index"}, %arg1: !bmt.tensor {bmt.name = "hidden_states"}, %arg2: !bmt.tensor {bmt.name = "top_k_weights"}) -> (!bmt.tensor) {
    %0 = bmt.get_global @experts.down_proj : !bmt.tensor
    %1 = bmt.get_global @experts.gate_up_proj : !bmt.tensor
    %2 = bmt.aten "aten::size.int"(%arg0, -1) : (!bmt.tensor) -> i64
    %3 = bmt.aten "aten::size.int"(%arg1, 0) : (!bmt.tensor) -> i64
    %4 = bmt.aten "aten::size.int"(%arg1, -1) : (!bmt.tensor) -> i64
    %5 = bmt.aten "aten::reshape"(%arg2, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %6 = bmt.aten "aten::reshape"(%arg0, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %7:2 = bmt.aten "aten::sort"(%6, -1, false) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %8 = bmt.num_to_tensor %2 : i64 -> !bmt.tensor
    %9 = bmt.aten "aten::floor_divide"(%7#1, %8) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %10 = bmt.aten "aten::index.Tensor"(%arg1, [%9]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %11 = bmt.aten "aten::index.Tensor"(%5, [%7#1]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %12 = bmt.aten "aten::to.dtype"(%7#0, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %13 = bmt.aten "aten::histc"(%12, 4, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %14 = bmt.aten "aten::cumsum"(%13, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %15 = bmt.aten "aten::ge.Scalar"(%7#0, 4) : (!bmt.tensor) -> !bmt.tensor
    %16 = bmt.aten "aten::unsqueeze"(%15, -1) : (!bmt.tensor) -> !bmt.tensor
    %17 = bmt.aten "aten::masked_fill_.Scalar"(%10, %16, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %18 = bmt.aten "aten::transpose.int"(%1, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %20 = bmt.aten "aten::_grouped_mm"(%17, %18, %14, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %22:2 = bmt.aten "aten::chunk"(%20, 2, -1) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %23 = bmt.aten "aten::silu"(%22#0) : (!bmt.tensor) -> !bmt.tensor
    %24 = bmt.aten "aten::mul.Tensor"(%23, %22#1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %25 = bmt.aten "aten::transpose.int"(%0, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %27 = bmt.aten "aten::_grouped_mm"(%24, %25, %14, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %28 = bmt.aten "aten::masked_fill.Scalar"(%27, %16, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %29 = bmt.aten "aten::unsqueeze"(%11, -1) : (!bmt.tensor) -> !bmt.tensor
    %30 = bmt.aten "aten::mul.Tensor"(%28, %29) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %31 = bmt.aten "aten::empty_like"(%7#1, #bmt.none, #bmt.none, #bmt.none, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %32 = bmt.aten "aten::size.int"(%7#1, 0) : (!bmt.tensor) -> i64
    %33 = bmt.aten "aten::arange"(%32, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
    %34 = bmt.aten "aten::index_put_"(%31, [%7#1], %33, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %35 = bmt.aten "aten::index.Tensor"(%30, [%34]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %36 = bmt.aten "aten::view"(%35, [%3, %2, %4]) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
    %37 = bmt.aten "aten::sum.dim_IntList"(%36, [1], false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %38 = bmt.aten "aten::to.dtype"(%37, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    return %38 : !bmt.tensor
}

// -----

// Near miss: histc counts 5 bins, the weights hold 4 experts.
// CHECK-LABEL: func.func @experts.forward(
// CHECK-NOT:     bmt.moe_
// CHECK:         aten::sort
// CHECK-NOT:     bmt.moe_
// CHECK:         return
// REMARK: warning: bmt-moe-layers: 1 function with aten::_grouped_mm not lowered (experts.forward): their experts run as ATen ops, outside the logged expert load
// REMARK: remark: bmt-moe-layers: no mixture-of-experts layer

bmt.parameter @experts.gate_up_proj : tensor<4x32x16xf32> {requires_grad}
bmt.parameter @experts.down_proj : tensor<4x16x16xf32> {requires_grad}
func.func @experts.forward(%arg0: !bmt.tensor {bmt.name = "top_k_index"}, %arg1: !bmt.tensor {bmt.name = "hidden_states"}, %arg2: !bmt.tensor {bmt.name = "top_k_weights"}) -> (!bmt.tensor) {
    %0 = bmt.get_global @experts.down_proj : !bmt.tensor
    %1 = bmt.get_global @experts.gate_up_proj : !bmt.tensor
    %2 = bmt.aten "aten::size.int"(%arg0, -1) : (!bmt.tensor) -> i64
    %3 = bmt.aten "aten::size.int"(%arg1, 0) : (!bmt.tensor) -> i64
    %4 = bmt.aten "aten::size.int"(%arg1, -1) : (!bmt.tensor) -> i64
    %5 = bmt.aten "aten::reshape"(%arg2, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %6 = bmt.aten "aten::reshape"(%arg0, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %7:2 = bmt.aten "aten::sort"(%6, -1, false) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %8 = bmt.num_to_tensor %2 : i64 -> !bmt.tensor
    %9 = bmt.aten "aten::floor_divide"(%7#1, %8) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %10 = bmt.aten "aten::index.Tensor"(%arg1, [%9]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %11 = bmt.aten "aten::index.Tensor"(%5, [%7#1]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %12 = bmt.aten "aten::to.dtype"(%7#0, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %13 = bmt.aten "aten::histc"(%12, 5, 0, 4) : (!bmt.tensor) -> !bmt.tensor
    %14 = bmt.aten "aten::cumsum"(%13, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %15 = bmt.aten "aten::ge.Scalar"(%7#0, 4) : (!bmt.tensor) -> !bmt.tensor
    %16 = bmt.aten "aten::unsqueeze"(%15, -1) : (!bmt.tensor) -> !bmt.tensor
    %17 = bmt.aten "aten::masked_fill_.Scalar"(%10, %16, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %18 = bmt.aten "aten::transpose.int"(%1, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %20 = bmt.aten "aten::_grouped_mm"(%17, %18, %14, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %22:2 = bmt.aten "aten::chunk"(%20, 2, -1) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %23 = bmt.aten "aten::silu"(%22#0) : (!bmt.tensor) -> !bmt.tensor
    %24 = bmt.aten "aten::mul.Tensor"(%23, %22#1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %25 = bmt.aten "aten::transpose.int"(%0, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %27 = bmt.aten "aten::_grouped_mm"(%24, %25, %14, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %28 = bmt.aten "aten::masked_fill.Scalar"(%27, %16, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %29 = bmt.aten "aten::unsqueeze"(%11, -1) : (!bmt.tensor) -> !bmt.tensor
    %30 = bmt.aten "aten::mul.Tensor"(%28, %29) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %31 = bmt.aten "aten::empty_like"(%7#1, #bmt.none, #bmt.none, #bmt.none, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %32 = bmt.aten "aten::size.int"(%7#1, 0) : (!bmt.tensor) -> i64
    %33 = bmt.aten "aten::arange"(%32, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
    %34 = bmt.aten "aten::index_put_"(%31, [%7#1], %33, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %35 = bmt.aten "aten::index.Tensor"(%30, [%34]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %36 = bmt.aten "aten::view"(%35, [%3, %2, %4]) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
    %37 = bmt.aten "aten::sum.dim_IntList"(%36, [1], false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %38 = bmt.aten "aten::to.dtype"(%37, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    return %38 : !bmt.tensor
}

// -----

// Near miss: the sorted ids are read outside the pattern (a result).
// CHECK-LABEL: func.func @experts.forward(
// CHECK-NOT:     bmt.moe_
// CHECK:         aten::sort
// CHECK-NOT:     bmt.moe_
// CHECK:         return
// REMARK: remark: bmt-moe-layers: no mixture-of-experts layer

bmt.parameter @experts.gate_up_proj : tensor<4x32x16xf32> {requires_grad}
bmt.parameter @experts.down_proj : tensor<4x16x16xf32> {requires_grad}
func.func @experts.forward(%arg0: !bmt.tensor {bmt.name = "top_k_index"}, %arg1: !bmt.tensor {bmt.name = "hidden_states"}, %arg2: !bmt.tensor {bmt.name = "top_k_weights"}) -> (!bmt.tensor, !bmt.tensor) {
    %0 = bmt.get_global @experts.down_proj : !bmt.tensor
    %1 = bmt.get_global @experts.gate_up_proj : !bmt.tensor
    %2 = bmt.aten "aten::size.int"(%arg0, -1) : (!bmt.tensor) -> i64
    %3 = bmt.aten "aten::size.int"(%arg1, 0) : (!bmt.tensor) -> i64
    %4 = bmt.aten "aten::size.int"(%arg1, -1) : (!bmt.tensor) -> i64
    %5 = bmt.aten "aten::reshape"(%arg2, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %6 = bmt.aten "aten::reshape"(%arg0, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %7:2 = bmt.aten "aten::sort"(%6, -1, false) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %8 = bmt.num_to_tensor %2 : i64 -> !bmt.tensor
    %9 = bmt.aten "aten::floor_divide"(%7#1, %8) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %10 = bmt.aten "aten::index.Tensor"(%arg1, [%9]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %11 = bmt.aten "aten::index.Tensor"(%5, [%7#1]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %12 = bmt.aten "aten::to.dtype"(%7#0, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %13 = bmt.aten "aten::histc"(%12, 4, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %14 = bmt.aten "aten::cumsum"(%13, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %15 = bmt.aten "aten::ge.Scalar"(%7#0, 4) : (!bmt.tensor) -> !bmt.tensor
    %extra = bmt.aten "aten::add.Scalar"(%7#0, 1, 1) : (!bmt.tensor) -> !bmt.tensor
    %16 = bmt.aten "aten::unsqueeze"(%15, -1) : (!bmt.tensor) -> !bmt.tensor
    %17 = bmt.aten "aten::masked_fill_.Scalar"(%10, %16, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %18 = bmt.aten "aten::transpose.int"(%1, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %20 = bmt.aten "aten::_grouped_mm"(%17, %18, %14, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %22:2 = bmt.aten "aten::chunk"(%20, 2, -1) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %23 = bmt.aten "aten::silu"(%22#0) : (!bmt.tensor) -> !bmt.tensor
    %24 = bmt.aten "aten::mul.Tensor"(%23, %22#1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %25 = bmt.aten "aten::transpose.int"(%0, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %27 = bmt.aten "aten::_grouped_mm"(%24, %25, %14, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %28 = bmt.aten "aten::masked_fill.Scalar"(%27, %16, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %29 = bmt.aten "aten::unsqueeze"(%11, -1) : (!bmt.tensor) -> !bmt.tensor
    %30 = bmt.aten "aten::mul.Tensor"(%28, %29) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %31 = bmt.aten "aten::empty_like"(%7#1, #bmt.none, #bmt.none, #bmt.none, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %32 = bmt.aten "aten::size.int"(%7#1, 0) : (!bmt.tensor) -> i64
    %33 = bmt.aten "aten::arange"(%32, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
    %34 = bmt.aten "aten::index_put_"(%31, [%7#1], %33, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %35 = bmt.aten "aten::index.Tensor"(%30, [%34]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %36 = bmt.aten "aten::view"(%35, [%3, %2, %4]) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
    %37 = bmt.aten "aten::sum.dim_IntList"(%36, [1], false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %38 = bmt.aten "aten::to.dtype"(%37, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    return %38, %extra : !bmt.tensor, !bmt.tensor
}

// -----

// Near miss: the combine sums over the hidden dim, not over K.
// CHECK-LABEL: func.func @experts.forward(
// CHECK-NOT:     bmt.moe_
// CHECK:         aten::sort
// CHECK-NOT:     bmt.moe_
// CHECK:         return
// REMARK: remark: bmt-moe-layers: no mixture-of-experts layer

bmt.parameter @experts.gate_up_proj : tensor<4x32x16xf32> {requires_grad}
bmt.parameter @experts.down_proj : tensor<4x16x16xf32> {requires_grad}
func.func @experts.forward(%arg0: !bmt.tensor {bmt.name = "top_k_index"}, %arg1: !bmt.tensor {bmt.name = "hidden_states"}, %arg2: !bmt.tensor {bmt.name = "top_k_weights"}) -> (!bmt.tensor) {
    %0 = bmt.get_global @experts.down_proj : !bmt.tensor
    %1 = bmt.get_global @experts.gate_up_proj : !bmt.tensor
    %2 = bmt.aten "aten::size.int"(%arg0, -1) : (!bmt.tensor) -> i64
    %3 = bmt.aten "aten::size.int"(%arg1, 0) : (!bmt.tensor) -> i64
    %4 = bmt.aten "aten::size.int"(%arg1, -1) : (!bmt.tensor) -> i64
    %5 = bmt.aten "aten::reshape"(%arg2, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %6 = bmt.aten "aten::reshape"(%arg0, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %7:2 = bmt.aten "aten::sort"(%6, -1, false) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %8 = bmt.num_to_tensor %2 : i64 -> !bmt.tensor
    %9 = bmt.aten "aten::floor_divide"(%7#1, %8) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %10 = bmt.aten "aten::index.Tensor"(%arg1, [%9]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %11 = bmt.aten "aten::index.Tensor"(%5, [%7#1]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %12 = bmt.aten "aten::to.dtype"(%7#0, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %13 = bmt.aten "aten::histc"(%12, 4, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %14 = bmt.aten "aten::cumsum"(%13, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %15 = bmt.aten "aten::ge.Scalar"(%7#0, 4) : (!bmt.tensor) -> !bmt.tensor
    %16 = bmt.aten "aten::unsqueeze"(%15, -1) : (!bmt.tensor) -> !bmt.tensor
    %17 = bmt.aten "aten::masked_fill_.Scalar"(%10, %16, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %18 = bmt.aten "aten::transpose.int"(%1, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %20 = bmt.aten "aten::_grouped_mm"(%17, %18, %14, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %22:2 = bmt.aten "aten::chunk"(%20, 2, -1) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %23 = bmt.aten "aten::silu"(%22#0) : (!bmt.tensor) -> !bmt.tensor
    %24 = bmt.aten "aten::mul.Tensor"(%23, %22#1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %25 = bmt.aten "aten::transpose.int"(%0, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %27 = bmt.aten "aten::_grouped_mm"(%24, %25, %14, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %28 = bmt.aten "aten::masked_fill.Scalar"(%27, %16, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %29 = bmt.aten "aten::unsqueeze"(%11, -1) : (!bmt.tensor) -> !bmt.tensor
    %30 = bmt.aten "aten::mul.Tensor"(%28, %29) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %31 = bmt.aten "aten::empty_like"(%7#1, #bmt.none, #bmt.none, #bmt.none, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %32 = bmt.aten "aten::size.int"(%7#1, 0) : (!bmt.tensor) -> i64
    %33 = bmt.aten "aten::arange"(%32, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
    %34 = bmt.aten "aten::index_put_"(%31, [%7#1], %33, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %35 = bmt.aten "aten::index.Tensor"(%30, [%34]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %36 = bmt.aten "aten::view"(%35, [%3, %2, %4]) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
    %37 = bmt.aten "aten::sum.dim_IntList"(%36, [2], false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %38 = bmt.aten "aten::to.dtype"(%37, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    return %38 : !bmt.tensor
}

// -----

// Near miss: index_put_ writes the permutation, not arange, at the
// permutation: not the inverse permutation.
// CHECK-LABEL: func.func @experts.forward(
// CHECK-NOT:     bmt.moe_
// CHECK:         aten::sort
// CHECK-NOT:     bmt.moe_
// CHECK:         return
// REMARK: remark: bmt-moe-layers: no mixture-of-experts layer

bmt.parameter @experts.gate_up_proj : tensor<4x32x16xf32> {requires_grad}
bmt.parameter @experts.down_proj : tensor<4x16x16xf32> {requires_grad}
func.func @experts.forward(%arg0: !bmt.tensor {bmt.name = "top_k_index"}, %arg1: !bmt.tensor {bmt.name = "hidden_states"}, %arg2: !bmt.tensor {bmt.name = "top_k_weights"}) -> (!bmt.tensor) {
    %0 = bmt.get_global @experts.down_proj : !bmt.tensor
    %1 = bmt.get_global @experts.gate_up_proj : !bmt.tensor
    %2 = bmt.aten "aten::size.int"(%arg0, -1) : (!bmt.tensor) -> i64
    %3 = bmt.aten "aten::size.int"(%arg1, 0) : (!bmt.tensor) -> i64
    %4 = bmt.aten "aten::size.int"(%arg1, -1) : (!bmt.tensor) -> i64
    %5 = bmt.aten "aten::reshape"(%arg2, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %6 = bmt.aten "aten::reshape"(%arg0, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %7:2 = bmt.aten "aten::sort"(%6, -1, false) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %8 = bmt.num_to_tensor %2 : i64 -> !bmt.tensor
    %9 = bmt.aten "aten::floor_divide"(%7#1, %8) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %10 = bmt.aten "aten::index.Tensor"(%arg1, [%9]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %11 = bmt.aten "aten::index.Tensor"(%5, [%7#1]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %12 = bmt.aten "aten::to.dtype"(%7#0, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %13 = bmt.aten "aten::histc"(%12, 4, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %14 = bmt.aten "aten::cumsum"(%13, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %15 = bmt.aten "aten::ge.Scalar"(%7#0, 4) : (!bmt.tensor) -> !bmt.tensor
    %16 = bmt.aten "aten::unsqueeze"(%15, -1) : (!bmt.tensor) -> !bmt.tensor
    %17 = bmt.aten "aten::masked_fill_.Scalar"(%10, %16, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %18 = bmt.aten "aten::transpose.int"(%1, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %20 = bmt.aten "aten::_grouped_mm"(%17, %18, %14, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %22:2 = bmt.aten "aten::chunk"(%20, 2, -1) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %23 = bmt.aten "aten::silu"(%22#0) : (!bmt.tensor) -> !bmt.tensor
    %24 = bmt.aten "aten::mul.Tensor"(%23, %22#1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %25 = bmt.aten "aten::transpose.int"(%0, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %27 = bmt.aten "aten::_grouped_mm"(%24, %25, %14, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %28 = bmt.aten "aten::masked_fill.Scalar"(%27, %16, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %29 = bmt.aten "aten::unsqueeze"(%11, -1) : (!bmt.tensor) -> !bmt.tensor
    %30 = bmt.aten "aten::mul.Tensor"(%28, %29) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %31 = bmt.aten "aten::empty_like"(%7#1, #bmt.none, #bmt.none, #bmt.none, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %32 = bmt.aten "aten::size.int"(%7#1, 0) : (!bmt.tensor) -> i64
    %33 = bmt.aten "aten::arange"(%32, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
    %34 = bmt.aten "aten::index_put_"(%31, [%7#1], %7#1, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %35 = bmt.aten "aten::index.Tensor"(%30, [%34]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %36 = bmt.aten "aten::view"(%35, [%3, %2, %4]) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
    %37 = bmt.aten "aten::sum.dim_IntList"(%36, [1], false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %38 = bmt.aten "aten::to.dtype"(%37, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    return %38 : !bmt.tensor
}

// -----

// A Mixtral layer as a static torch.export records it: K is a 0-dim
// constant, arange's end and the view's sizes are the export's constants
// (T = 16, K = 2, H = 32), and an unused in-place clamp_ of the sorted ids
// stays. The combine reads K as a new i64 constant.
// CHECK-LABEL: func.func @experts.forward(
// CHECK:         %[[W:.*]] = bmt.aten "aten::reshape"(%arg0, [-1])
// CHECK-NEXT:    %[[ROWS:.*]], %[[SORTED:.*]], %[[OFFSETS:.*]], %[[PERM:.*]] = bmt.moe_dispatch %arg2, %arg1 experts 4
// CHECK-NEXT:    bmt.aten "aten::index.Tensor"(%[[W]], [%[[PERM]]])
// CHECK-NEXT:    bmt.aten "aten::ge.Scalar"(%[[SORTED]], 4)
// CHECK:         bmt.aten "aten::clamp_"(%[[SORTED]], #bmt.none, 3)
// CHECK-NOT:     aten::arange
// CHECK:         bmt.aten "aten::masked_fill.Scalar"
// CHECK-NEXT:    bmt.aten "aten::unsqueeze"
// CHECK-NEXT:    %[[OUT:.*]] = bmt.aten "aten::mul.Tensor"
// CHECK-NEXT:    %[[K:.*]] = bmt.constant 2 : i64
// CHECK-NEXT:    %[[SUM:.*]] = bmt.moe_combine %[[OUT]], %[[PERM]] top_k %[[K]] : !bmt.tensor
// CHECK-NEXT:    return %[[SUM]]
// REMARK: remark: bmt-moe-layers: 1 mixture-of-experts layer lowered to bmt.moe_dispatch / bmt.moe_combine (experts.forward)
bmt.parameter @experts.gate_up_proj : tensor<4x128x32xf32> {requires_grad}
bmt.parameter @experts.down_proj : tensor<4x32x64xf32> {requires_grad}
func.func @experts.forward(%arg0: !bmt.tensor {bmt.name = "div_"}, %arg1: !bmt.tensor {bmt.name = "getitem_6"}, %arg2: !bmt.tensor {bmt.name = "view_3"}) -> !bmt.tensor {
    %0 = bmt.aten "aten::reshape"(%arg0, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %1 = bmt.aten "aten::reshape"(%arg1, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %2:2 = bmt.aten "aten::sort"(%1, -1, false) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %3 = bmt.constant dense<2> : tensor<i64>
    %4 = bmt.aten "aten::floor_divide"(%2#1, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %5 = bmt.aten "aten::index.Tensor"(%arg2, [%4]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %6 = bmt.aten "aten::index.Tensor"(%0, [%2#1]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %7 = bmt.aten "aten::to.dtype"(%2#0, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %8 = bmt.aten "aten::histc"(%7, 4, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %9 = bmt.aten "aten::cumsum"(%8, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %10 = bmt.aten "aten::ge.Scalar"(%2#0, 4) : (!bmt.tensor) -> !bmt.tensor
    %11 = bmt.aten "aten::unsqueeze"(%10, -1) : (!bmt.tensor) -> !bmt.tensor
    %12 = bmt.aten "aten::clamp_"(%2#0, #bmt.none, 3) : (!bmt.tensor) -> !bmt.tensor
    %13 = bmt.aten "aten::masked_fill_.Scalar"(%5, %11, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %14 = bmt.get_global @experts.gate_up_proj : !bmt.tensor
    %15 = bmt.aten "aten::transpose.int"(%14, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %17 = bmt.aten "aten::_grouped_mm"(%13, %15, %9, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %19:2 = bmt.aten "aten::chunk"(%17, 2, -1) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %20 = bmt.aten "aten::silu"(%19#0) : (!bmt.tensor) -> !bmt.tensor
    %21 = bmt.aten "aten::mul.Tensor"(%20, %19#1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %22 = bmt.get_global @experts.down_proj : !bmt.tensor
    %23 = bmt.aten "aten::transpose.int"(%22, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %25 = bmt.aten "aten::_grouped_mm"(%21, %23, %9, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %26 = bmt.aten "aten::masked_fill.Scalar"(%25, %11, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %27 = bmt.aten "aten::unsqueeze"(%6, -1) : (!bmt.tensor) -> !bmt.tensor
    %28 = bmt.aten "aten::mul.Tensor"(%26, %27) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %29 = bmt.aten "aten::empty_like"(%2#1, #bmt.none, #bmt.none, #bmt.none, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %30 = bmt.aten "aten::arange"(32, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
    %31 = bmt.aten "aten::index_put_"(%29, [%2#1], %30, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %32 = bmt.aten "aten::index.Tensor"(%28, [%31]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %33 = bmt.aten "aten::view"(%32, [16, 2, 32]) : (!bmt.tensor) -> !bmt.tensor
    %34 = bmt.aten "aten::sum.dim_IntList"(%33, [1], false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    return %34 : !bmt.tensor
}

// -----

// Near miss (.pt2): the view's K (3) is not floor_divide's (2).
// CHECK-LABEL: func.func @experts.forward(
// CHECK-NOT:     bmt.moe_
// CHECK:         aten::sort
// CHECK-NOT:     bmt.moe_
// CHECK:         return
// REMARK: remark: bmt-moe-layers: no mixture-of-experts layer
bmt.parameter @experts.gate_up_proj : tensor<4x128x32xf32> {requires_grad}
bmt.parameter @experts.down_proj : tensor<4x32x64xf32> {requires_grad}
func.func @experts.forward(%arg0: !bmt.tensor {bmt.name = "div_"}, %arg1: !bmt.tensor {bmt.name = "getitem_6"}, %arg2: !bmt.tensor {bmt.name = "view_3"}) -> !bmt.tensor {
    %0 = bmt.aten "aten::reshape"(%arg0, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %1 = bmt.aten "aten::reshape"(%arg1, [-1]) : (!bmt.tensor) -> !bmt.tensor
    %2:2 = bmt.aten "aten::sort"(%1, -1, false) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %3 = bmt.constant dense<2> : tensor<i64>
    %4 = bmt.aten "aten::floor_divide"(%2#1, %3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %5 = bmt.aten "aten::index.Tensor"(%arg2, [%4]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %6 = bmt.aten "aten::index.Tensor"(%0, [%2#1]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %7 = bmt.aten "aten::to.dtype"(%2#0, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %8 = bmt.aten "aten::histc"(%7, 4, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %9 = bmt.aten "aten::cumsum"(%8, 0, 3) : (!bmt.tensor) -> !bmt.tensor
    %10 = bmt.aten "aten::ge.Scalar"(%2#0, 4) : (!bmt.tensor) -> !bmt.tensor
    %11 = bmt.aten "aten::unsqueeze"(%10, -1) : (!bmt.tensor) -> !bmt.tensor
    %12 = bmt.aten "aten::clamp_"(%2#0, #bmt.none, 3) : (!bmt.tensor) -> !bmt.tensor
    %13 = bmt.aten "aten::masked_fill_.Scalar"(%5, %11, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %14 = bmt.get_global @experts.gate_up_proj : !bmt.tensor
    %15 = bmt.aten "aten::transpose.int"(%14, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %17 = bmt.aten "aten::_grouped_mm"(%13, %15, %9, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %19:2 = bmt.aten "aten::chunk"(%17, 2, -1) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
    %20 = bmt.aten "aten::silu"(%19#0) : (!bmt.tensor) -> !bmt.tensor
    %21 = bmt.aten "aten::mul.Tensor"(%20, %19#1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %22 = bmt.get_global @experts.down_proj : !bmt.tensor
    %23 = bmt.aten "aten::transpose.int"(%22, -2, -1) : (!bmt.tensor) -> !bmt.tensor
    %25 = bmt.aten "aten::_grouped_mm"(%21, %23, %9, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %26 = bmt.aten "aten::masked_fill.Scalar"(%25, %11, 0.000000e+00) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %27 = bmt.aten "aten::unsqueeze"(%6, -1) : (!bmt.tensor) -> !bmt.tensor
    %28 = bmt.aten "aten::mul.Tensor"(%26, %27) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %29 = bmt.aten "aten::empty_like"(%2#1, #bmt.none, #bmt.none, #bmt.none, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %30 = bmt.aten "aten::arange"(32, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
    %31 = bmt.aten "aten::index_put_"(%29, [%2#1], %30, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %32 = bmt.aten "aten::index.Tensor"(%28, [%31]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %33 = bmt.aten "aten::view"(%32, [16, 3, 32]) : (!bmt.tensor) -> !bmt.tensor
    %34 = bmt.aten "aten::sum.dim_IntList"(%33, [1], false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    return %34 : !bmt.tensor
}
