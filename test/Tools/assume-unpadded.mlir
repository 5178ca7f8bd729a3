// The default pipeline runs bmt-causal-attention first, assuming
// attention_mask all ones (bmt-run trains with such masks); the top-level
// flag --assume-unpadded=false (pipeline option assume-unpadded=false)
// keeps the padding term, causal-attention=false skips the pass. The plan
// and bmt-run's side: test/python/passes/test_causal_attention.py.

// RUN: bmt-opt %s --bmt-default-pipeline='summary=false' 2>&1 | FileCheck %s --check-prefix=ON
// ON:      remark: bmt-causal-attention: 1 of 1 aten::scaled_dot_product_attention with an attn_mask made causal (attn_mask=None, is_causal=True) in 1 function (layers.0.attn.forward), assuming attention_mask all ones; mask computation removed: 23 ops, 2 function arguments
// ON-NEXT: remark: {{.*}}bmt-fuse-gelu
// ON:      module attributes {bmt.assumptions = ["attention_mask all ones"],
// ON:      "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, #bmt.none, 0.000000e+00, true, #bmt.none, false)

// RUN: bmt-opt %s --bmt-default-pipeline='summary=false assume-unpadded=false' 2>&1 | FileCheck %s --check-prefix=OFF
// OFF:     remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask reads attention_mask (padding) and assume-unpadded is off)
// OFF-NOT: bmt.assumptions
// OFF:     "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, #bmt.none, false)

// RUN: bmt-opt %s --bmt-default-pipeline='summary=false causal-attention=false' 2>&1 | FileCheck %s --check-prefix=SKIP
// SKIP-NOT: bmt-causal-attention
// SKIP:     "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, #bmt.none, false)

// The top-level flag belongs to the default pipeline (-o NAME.pt without passes).
// RUN: not bmt-opt %s --assume-unpadded=false 2>&1 | FileCheck %s --check-prefix=FLAG
// FLAG: error: --assume-unpadded sets an option of the default pipeline
// RUN: bmt-opt --help | FileCheck %s --check-prefix=HELP
// HELP-DAG: --assume-unpadded
// HELP-DAG: --bmt-causal-attention

// A LLaMA-like model as torch.export records it at batch 2 x 8: the mask
// (kv <= q and attention_mask[batch, kv]) built in @forward, passed through
// the layer to its attention.
bmt.parameter @layers.0.attn.q.weight : tensor<8x8xf32> {requires_grad}
func.func @forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}, %arg1: !bmt.tensor {bmt.name = "attention_mask"}) -> !bmt.tensor attributes {bmt.module_path = "", bmt.module_type = "Model"} {
  %0 = bmt.aten "aten::to.device"(%arg1, #bmt.device<"cpu">, 11, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::arange"(2, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %2 = bmt.aten "aten::arange"(8, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %3 = bmt.aten "aten::add.Scalar"(%2, 0, 1) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::arange"(8, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %5 = bmt.aten "aten::add.Scalar"(%4, 0, 1) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::unsqueeze"(%1, 1) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::unsqueeze"(%6, 2) : (!bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::unsqueeze"(%7, 3) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::unsqueeze"(%3, 0) : (!bmt.tensor) -> !bmt.tensor
  %10 = bmt.aten "aten::unsqueeze"(%9, 1) : (!bmt.tensor) -> !bmt.tensor
  %11 = bmt.aten "aten::unsqueeze"(%10, 3) : (!bmt.tensor) -> !bmt.tensor
  %12 = bmt.aten "aten::unsqueeze"(%5, 0) : (!bmt.tensor) -> !bmt.tensor
  %13 = bmt.aten "aten::unsqueeze"(%12, 1) : (!bmt.tensor) -> !bmt.tensor
  %14 = bmt.aten "aten::unsqueeze"(%13, 2) : (!bmt.tensor) -> !bmt.tensor
  %15 = bmt.aten "aten::new_ones"(%11, [], 11, #bmt.none, #bmt.none, false) : (!bmt.tensor) -> !bmt.tensor
  %16 = bmt.aten "aten::le.Tensor"(%14, %11) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %17 = bmt.aten "aten::to.dtype_layout"(%16, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %18 = bmt.aten "aten::__and__.Tensor"(%15, %17) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %19 = bmt.aten "aten::index.Tensor"(%0, [%8, %14]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %20 = bmt.aten "aten::to.dtype_layout"(%19, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %21 = bmt.aten "aten::__and__.Tensor"(%18, %20) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %22 = bmt.aten "aten::expand"(%21, [2, -1, 8, 8], false) : (!bmt.tensor) -> !bmt.tensor
  %23 = call @layers.0.forward(%arg0, %22) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %23 : !bmt.tensor
}
func.func private @layers.0.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "layers.0", bmt.module_type = "Layer"} {
  %0 = call @layers.0.attn.forward(%arg0, %arg1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @layers.0.attn.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "layers.0.attn", bmt.module_type = "Attention"} {
  %w = bmt.get_global @layers.0.attn.q.weight : !bmt.tensor
  %q = bmt.aten "aten::linear"(%arg0, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
