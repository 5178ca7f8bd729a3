// RUN: not bmt-opt %s --split-input-file '--bmt-moe-layers=expert-parallel=2 split-expert-weights=true' -o /dev/null 2>&1 | FileCheck %s

// The cases where bmt-moe-layers cannot split a lowered layer's expert
// parameters over the expert group (moe-layers-expert-split.mlir): one
// error each, no output.

// An expert weight read outside its experts cannot be split: one error.
// CHECK: error: bmt-moe-layers: the expert parameter experts.down_proj is read outside its experts, so it cannot be split over the expert group

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
    %60 = bmt.get_global @experts.down_proj : !bmt.tensor
    %61 = bmt.aten "aten::sum"(%60, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %62 = bmt.aten "aten::add.Tensor"(%38, %61, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %62 : !bmt.tensor
}

// -----

// A per-expert table that is a buffer cannot be split: one error.
// CHECK: error: bmt-moe-layers: a per-expert tensor indexed by the sorted expert ids is not a parameter, which cannot be split over the expert group

bmt.parameter @experts.gate_up_proj : tensor<4x32x16xf32> {requires_grad}
bmt.parameter @experts.down_proj : tensor<4x16x16xf32> {requires_grad}
bmt.buffer @experts.gate_up_proj_bias : tensor<4x32xf32>
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

// -----

// A frozen expert (--freeze, --lora) cannot be split yet: one error naming the opt-out.
// CHECK: error: bmt-moe-layers: the expert parameter experts.gate_up_proj is frozen (--freeze, or --lora's frozen base), and frozen experts cannot be split over the expert group yet; compile with --split-expert-weights=false

bmt.parameter @experts.gate_up_proj : tensor<4x32x16xf32>
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
