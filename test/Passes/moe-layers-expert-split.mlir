// RUN: bmt-opt %s '--bmt-moe-layers=expert-parallel=2 split-expert-weights=true' 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s '--bmt-moe-layers=expert-parallel=2 split-expert-weights=true' -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: bmt-opt %s '--bmt-moe-layers=expert-parallel=2 split-expert-weights=false' 2>/dev/null | FileCheck %s --check-prefix=OFF
// RUN: not bmt-opt %s --bmt-moe-layers --bmt-pipeline-parallel='pipeline-parallel=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=PIPE
// PIPE: error: bmt-pipeline-parallel: mixture-of-experts layers in a pipeline are not supported yet

// Expert parallelism that splits the experts' weights
// (docs/passes/moe-layers.md): the Qwen3-MoE layer of
// moe-layers-expert-parallel.mlir with a gpt-oss-like per-expert bias read
// by the clamped sorted ids. The grouped matmuls' weights and the bias get
// the split over the expert group; the router's weight does not. Without
// split-expert-weights nothing is split.
// CHECK:       module attributes {bmt.expert_parallel = 2 : i64}
// CHECK-DAG:   bmt.parameter @experts.gate_up_proj : tensor<4x32x16xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, over = "expert">, requires_grad}
// CHECK-DAG:   bmt.parameter @experts.down_proj : tensor<4x16x16xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, over = "expert">, requires_grad}
// CHECK-DAG:   bmt.parameter @experts.gate_up_proj_bias : tensor<4x32xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, over = "expert">, requires_grad}
// CHECK-DAG:   bmt.parameter @router.weight : tensor<4x16xf32> {requires_grad}
// CHECK-LABEL: func.func @experts.forward(
// REMARK: remark: bmt-moe-layers: 1 mixture-of-experts layer {{.*}}; experts split over expert groups of 2 ranks; 3 expert parameters split over the expert group
// OFF-NOT:     tensor_split

bmt.parameter @experts.gate_up_proj : tensor<4x32x16xf32> {requires_grad}
bmt.parameter @experts.down_proj : tensor<4x16x16xf32> {requires_grad}
bmt.parameter @experts.gate_up_proj_bias : tensor<4x32xf32> {requires_grad}
bmt.parameter @router.weight : tensor<4x16xf32> {requires_grad}
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
    %19 = bmt.aten "aten::_grouped_mm"(%17, %18, %14, #bmt.none, #bmt.none) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %50 = bmt.get_global @experts.gate_up_proj_bias : !bmt.tensor
    %51 = bmt.aten "aten::clamp_"(%7#0, #bmt.none, 3) : (!bmt.tensor) -> !bmt.tensor
    %52 = bmt.aten "aten::index.Tensor"(%50, [%51]) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %20 = bmt.aten "aten::add.Tensor"(%19, %52, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
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
