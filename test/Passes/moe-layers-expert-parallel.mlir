// RUN: bmt-opt %s --split-input-file '--bmt-moe-layers=expert-parallel=2 split-expert-weights=false' 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s --split-input-file '--bmt-moe-layers=expert-parallel=2 split-expert-weights=false' -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: not bmt-opt %s --split-input-file '--bmt-moe-layers=expert-parallel=8 split-expert-weights=false' -o /dev/null 2>&1 | FileCheck %s --check-prefix=ERR

// Expert parallelism (docs/passes/moe-layers.md): the Qwen3-MoE layer of
// moe-layers.mlir; the dispatch also takes the routing weights and its fifth
// result replaces their gather by the permutation (and the reshape only it
// read); the module records E. 8 does not divide the 4 experts: one error
// naming the layer and both counts.
// CHECK:       module attributes {bmt.expert_parallel = 2 : i64}
// CHECK-LABEL: func.func @experts.forward(
// CHECK-NEXT:    %[[DOWN:.*]] = bmt.get_global @experts.down_proj
// CHECK-NEXT:    %[[GATE_UP:.*]] = bmt.get_global @experts.gate_up_proj
// CHECK-NEXT:    %[[K:.*]] = bmt.aten "aten::size.int"(%arg0, -1)
// CHECK-NEXT:    %[[ROWS:.*]], %[[SORTED:.*]], %[[OFFSETS:.*]], %[[PERM:.*]], %[[WP:.*]] = bmt.moe_dispatch %arg1, %arg0 weights %arg2 experts 4 : !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor
// CHECK-NOT:     aten::reshape
// CHECK-NOT:     aten::index.Tensor
// CHECK:         %[[W:.*]] = bmt.aten "aten::unsqueeze"(%[[WP]], -1)
// CHECK-NEXT:    %[[OUT:.*]] = bmt.aten "aten::mul.Tensor"({{.*}}, %[[W]])
// CHECK-NEXT:    %[[SUM:.*]] = bmt.moe_combine %[[OUT]], %[[PERM]] top_k %[[K]] : !bmt.tensor
// REMARK: remark: bmt-moe-layers: 1 mixture-of-experts layer lowered to bmt.moe_dispatch / bmt.moe_combine (experts.forward){{.*}}; experts split over expert groups of 2 ranks
// ERR: error: bmt-moe-layers: experts.forward has 4 experts, not a multiple of expert-parallel 8

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
