// RUN: bmt-opt %s --split-input-file --bmt-causal-attention 2>/dev/null | FileCheck %s --check-prefixes=CHECK,SOUND
// RUN: bmt-opt %s --split-input-file --bmt-causal-attention='assume-unpadded=1' 2>/dev/null | FileCheck %s --check-prefixes=CHECK,ASSUME
// RUN: bmt-opt %s --split-input-file --bmt-causal-attention -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: bmt-opt %s --split-input-file --bmt-causal-attention='assume-unpadded=1' -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK-ASSUME

// The test fixtures use eager attention (matmul, softmax): nothing to do.
// RUN: bmt-opt %fixtures/gpt2.pt --bmt-causal-attention -o /dev/null 2>&1 | FileCheck %s --check-prefix=EAGER
// RUN: bmt-opt %fixtures/llama.pt2 --bmt-causal-attention='assume-unpadded=1' -o /dev/null 2>&1 | FileCheck %s --check-prefix=EAGER
// EAGER: remark: bmt-causal-attention: no aten::scaled_dot_product_attention with an attn_mask
// EAGER-NOT: bmt.assumptions

// Models with SDPA attention, traced and exported (GPT-2, LLaMA, OPT, ...),
// are run against eager transformers in test/python/passes/test_causal_attention.py.

// One remark per module (the split inputs below, in order). Without the
// assumption the padded GPT-2 masks stay; the rest is the same both ways.
// REMARK:        remark: bmt-causal-attention: 0 of 2 aten::scaled_dot_product_attention with an attn_mask made causal (attn_mask=None, is_causal=True); left alone: 2 (the mask reads attention_mask (padding) and assume-unpadded is off)
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask reads attention_mask (padding) and assume-unpadded is off)
// REMARK-ASSUME: remark: bmt-causal-attention: 2 of 2 aten::scaled_dot_product_attention with an attn_mask made causal (attn_mask=None, is_causal=True) in 2 functions (transformer.h.0.attn.forward ... transformer.h.1.attn.forward), assuming attention_mask all ones; mask computation removed: 33 ops, 5 function arguments
// REMARK-ASSUME: remark: bmt-causal-attention: 1 of 1 {{.*}} in 1 function (attn.forward), assuming attention_mask all ones; mask computation removed: 30 ops, 1 function argument
// REMARK:        remark: bmt-causal-attention: 1 of 1 {{.*}} made causal (attn_mask=None, is_causal=True) in 1 function (attn.forward); mask computation removed: 12 ops, 1 function argument
// REMARK-ASSUME: remark: bmt-causal-attention: 1 of 1 {{.*}} made causal (attn_mask=None, is_causal=True) in 1 function (attn.forward); mask computation removed: 12 ops, 1 function argument
// REMARK:        remark: bmt-causal-attention: 1 of 1 {{.*}} made causal {{.*}}; mask computation removed: 18 ops, 1 function argument
// REMARK-ASSUME: remark: bmt-causal-attention: 1 of 1 {{.*}} made causal {{.*}}; mask computation removed: 18 ops, 1 function argument
// REMARK:        remark: bmt-causal-attention: 1 of 1 {{.*}} made causal {{.*}}; mask computation removed: 0 ops, 1 function argument
// REMARK-ASSUME: remark: bmt-causal-attention: 1 of 1 {{.*}} made causal {{.*}}; mask computation removed: 0 ops, 1 function argument
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask is not kv <= q)
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask is not kv <= q)
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (an offset that is not a constant)
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (an offset that is not a constant)
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask also bounds kv - q from below (a sliding window))
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask also bounds kv - q from below (a sliding window))
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask also bounds kv - q from below (a sliding window))
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask also bounds kv - q from below (a sliding window))
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the query and key lengths are not provably equal)
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the query and key lengths are not provably equal)
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the query and key lengths are not provably equal)
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the query and key lengths are not provably equal)
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask's computation may be written in place)
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask's computation may be written in place)
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask differs between the call sites of a function)
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask differs between the call sites of a function)
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask is not kv <= q)
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask is not kv <= q)
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask is not kv <= q)
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask is not kv <= q)
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask reads the program input 'doc_ids')
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (the mask reads the program input 'doc_ids')
// REMARK:        remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (a comparison converted to a number (an additive mask))
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 1 {{.*}}; left alone: 1 (a comparison converted to a number (an additive mask))
// REMARK:        remark: bmt-causal-attention: 0 of 2 {{.*}}; left alone: 1 (is_causal is not a constant false); 1 (the mask reads the program input 'mask')
// REMARK-ASSUME: remark: bmt-causal-attention: 0 of 2 {{.*}}; left alone: 1 (is_causal is not a constant false); 1 (the mask reads the program input 'mask')
// REMARK:        remark: bmt-causal-attention: no aten::scaled_dot_product_attention with an attn_mask
// REMARK-ASSUME: remark: bmt-causal-attention: no aten::scaled_dot_product_attention with an attn_mask
// REMARK-NOT:        remark
// REMARK-ASSUME-NOT: remark

// GPT-2 as torch.jit.trace records it (transformers 5, SDPA): @forward
// passes attention_mask to the model, which builds the mask
// (masking_utils.sdpa_mask): aranges of batch, q and kv, kv <= q, ANDed
// with attention_mask[batch, kv], expanded to [batch, 1, q, kv], and hands
// it through each block to its attention. q's length is inputs_embeds'
// dim 1, kv's attention_mask's: equal only under the assumption (the mask
// has input_ids' shape), which also makes the padding term true. With it,
// both calls become causal, the mask's computation and the arguments that
// carried it go, and the module records the assumption.
// SOUND-LABEL: module {
// SOUND:         func.func private @transformer.forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}, %arg1: !bmt.tensor {bmt.name = "attention_mask"})
// SOUND:           aten::le.Tensor
// SOUND-LABEL:   func.func private @transformer.h.0.attn.forward(
// SOUND:           bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, 0.35355339059327379, false)
// ASSUME-LABEL: module attributes {bmt.assumptions = ["attention_mask all ones"]} {
// ASSUME:         func.func @forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}, %arg1: !bmt.tensor {bmt.name = "attention_mask"})
// ASSUME-NEXT:      call @transformer.forward(%arg0) : (!bmt.tensor) -> !bmt.tensor
// ASSUME:         func.func private @transformer.forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}) -> !bmt.tensor {
// ASSUME-NEXT:      %[[S:.*]] = bmt.aten "aten::size.int"(%arg0, 1)
// ASSUME-NEXT:      %[[IDS:.*]] = bmt.aten "aten::view"(%arg0, [-1, %[[S]]])
// ASSUME-NEXT:      %[[E:.*]] = call @transformer.wte.forward(%[[IDS]])
// ASSUME-NEXT:      %[[H:.*]] = call @transformer.h.0.forward(%[[E]]) : (!bmt.tensor) -> !bmt.tensor
// ASSUME-NEXT:      call @transformer.h.1.forward(%[[H]]) : (!bmt.tensor) -> !bmt.tensor
// ASSUME-NEXT:      return
// ASSUME:         func.func private @transformer.h.0.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
// ASSUME-NEXT:      call @transformer.h.0.attn.forward(%arg0) : (!bmt.tensor) -> !bmt.tensor
// ASSUME:         func.func private @transformer.h.0.attn.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
// ASSUME-NEXT:      bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, #bmt.none, 0.000000e+00, true, 0.35355339059327379, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
// ASSUME:         func.func private @transformer.h.1.attn.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
// ASSUME-NEXT:      bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, #bmt.none, 0.000000e+00, true, 0.35355339059327379, false)
bmt.parameter @transformer.wte.weight : tensor<64x16xf32> {requires_grad}
func.func @forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}, %arg1: !bmt.tensor {bmt.name = "attention_mask"}) -> !bmt.tensor {
  %0 = call @transformer.forward(%arg0, %arg1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @transformer.forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}, %arg1: !bmt.tensor {bmt.name = "attention_mask"}) -> !bmt.tensor {
  %0 = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %1 = bmt.aten "aten::view"(%arg0, [-1, %0]) : (!bmt.tensor, i64) -> !bmt.tensor
  %2 = bmt.aten "aten::size.int"(%1, 0) : (!bmt.tensor) -> i64
  %3 = call @transformer.wte.forward(%1) : (!bmt.tensor) -> !bmt.tensor
  %12 = bmt.aten "aten::view"(%arg1, [%2, -1]) : (!bmt.tensor, i64) -> !bmt.tensor
  %13 = bmt.aten "aten::to.device"(%12, #bmt.device<"cpu">, 11, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %14 = bmt.aten "aten::size.int"(%3, 1) : (!bmt.tensor) -> i64
  %15 = bmt.aten "aten::size.int"(%13, 1) : (!bmt.tensor) -> i64
  %16 = bmt.aten "aten::size.int"(%3, 0) : (!bmt.tensor) -> i64
  %17 = bmt.aten "aten::arange"(%16, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %18 = bmt.aten "aten::arange"(%14, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %19 = bmt.constant dense<0> : tensor<i64>
  %20 = bmt.aten "aten::add.Tensor"(%18, %19, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %21 = bmt.aten "aten::arange"(%15, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %22 = bmt.constant dense<0> : tensor<i64>
  %23 = bmt.aten "aten::add.Tensor"(%21, %22, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %24 = bmt.aten "aten::slice.Tensor"(%17, 0, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %25 = bmt.aten "aten::unsqueeze"(%24, 1) : (!bmt.tensor) -> !bmt.tensor
  %26 = bmt.aten "aten::unsqueeze"(%25, 2) : (!bmt.tensor) -> !bmt.tensor
  %27 = bmt.aten "aten::unsqueeze"(%26, 3) : (!bmt.tensor) -> !bmt.tensor
  %28 = bmt.aten "aten::unsqueeze"(%20, 0) : (!bmt.tensor) -> !bmt.tensor
  %29 = bmt.aten "aten::unsqueeze"(%28, 1) : (!bmt.tensor) -> !bmt.tensor
  %30 = bmt.aten "aten::slice.Tensor"(%29, 2, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %31 = bmt.aten "aten::unsqueeze"(%30, 3) : (!bmt.tensor) -> !bmt.tensor
  %32 = bmt.aten "aten::unsqueeze"(%23, 0) : (!bmt.tensor) -> !bmt.tensor
  %33 = bmt.aten "aten::unsqueeze"(%32, 1) : (!bmt.tensor) -> !bmt.tensor
  %34 = bmt.aten "aten::unsqueeze"(%33, 2) : (!bmt.tensor) -> !bmt.tensor
  %35 = bmt.aten "aten::slice.Tensor"(%34, 3, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %36 = bmt.aten "aten::new_ones"(%31, [], 11, #bmt.none, #bmt.none, false) : (!bmt.tensor) -> !bmt.tensor
  %37 = bmt.aten "aten::le.Tensor"(%35, %31) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %38 = bmt.aten "aten::to.dtype_layout"(%37, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %39 = bmt.aten "aten::__and__.Tensor"(%36, %38) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %40 = bmt.aten "aten::index.Tensor"(%13, [%27, %35]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %41 = bmt.aten "aten::to.dtype_layout"(%40, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %42 = bmt.aten "aten::__and__.Tensor"(%39, %41) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %43 = bmt.aten "aten::expand"(%42, [%16, -1, %14, %15], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %46 = call @transformer.h.0.forward(%3, %43) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %47 = call @transformer.h.1.forward(%46, %43) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %47 : !bmt.tensor
}
func.func private @transformer.wte.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.get_global @transformer.wte.weight : !bmt.tensor
  %1 = bmt.aten "aten::embedding"(%0, %arg0, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @transformer.h.0.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor {bmt.name = "attention_mask"}) -> !bmt.tensor {
  %0 = call @transformer.h.0.attn.forward(%arg0, %arg1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @transformer.h.0.attn.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, 0.35355339059327379, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @transformer.h.1.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor {bmt.name = "attention_mask"}) -> !bmt.tensor {
  %0 = call @transformer.h.1.attn.forward(%arg0, %arg1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @transformer.h.1.attn.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, 0.35355339059327379, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// The same mask as torch.export records it without dynamic shapes: sizes are
// constants (8 and 8: equal lengths), `+ 0` is aten::add.Scalar, the unused
// head arange stays as exported. Mistral's sliding window (4096) adds
// kv > q - 4096, vacuous at length 8; attention_mask is indexed directly.
// ASSUME-LABEL: module attributes {bmt.assumptions = ["attention_mask all ones"]} {
// ASSUME:         func.func @forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}, %arg1: !bmt.tensor {bmt.name = "attention_mask"})
// ASSUME-NEXT:      %[[H:.*]] = bmt.aten "aten::arange"(1,
// ASSUME-NEXT:      call @attn.forward(%arg0)
// ASSUME:         bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, #bmt.none, 0.000000e+00, true, #bmt.none, false)
// SOUND-LABEL:  module {
// SOUND:          aten::gt.Tensor
// SOUND:          bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, #bmt.none, false)
func.func @forward(%arg0: !bmt.tensor {bmt.name = "input_ids"}, %arg1: !bmt.tensor {bmt.name = "attention_mask"}) -> !bmt.tensor {
  %4 = bmt.aten "aten::to.device"(%arg1, #bmt.device<"cpu">, 11, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::arange"(2, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %6 = bmt.aten "aten::arange"(1, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %7 = bmt.aten "aten::arange"(8, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %8 = bmt.aten "aten::add.Scalar"(%7, 0, 1) : (!bmt.tensor) -> !bmt.tensor
  %9 = bmt.aten "aten::arange"(8, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %10 = bmt.aten "aten::add.Scalar"(%9, 0, 1) : (!bmt.tensor) -> !bmt.tensor
  %11 = bmt.aten "aten::unsqueeze"(%5, 1) : (!bmt.tensor) -> !bmt.tensor
  %12 = bmt.aten "aten::unsqueeze"(%11, 2) : (!bmt.tensor) -> !bmt.tensor
  %13 = bmt.aten "aten::unsqueeze"(%12, 3) : (!bmt.tensor) -> !bmt.tensor
  %17 = bmt.aten "aten::unsqueeze"(%8, 0) : (!bmt.tensor) -> !bmt.tensor
  %18 = bmt.aten "aten::unsqueeze"(%17, 1) : (!bmt.tensor) -> !bmt.tensor
  %19 = bmt.aten "aten::unsqueeze"(%18, 3) : (!bmt.tensor) -> !bmt.tensor
  %20 = bmt.aten "aten::unsqueeze"(%10, 0) : (!bmt.tensor) -> !bmt.tensor
  %21 = bmt.aten "aten::unsqueeze"(%20, 1) : (!bmt.tensor) -> !bmt.tensor
  %22 = bmt.aten "aten::unsqueeze"(%21, 2) : (!bmt.tensor) -> !bmt.tensor
  %23 = bmt.aten "aten::new_ones"(%19, [], 11, #bmt.none, #bmt.none, false) : (!bmt.tensor) -> !bmt.tensor
  %24 = bmt.aten "aten::new_ones"(%19, [], 11, #bmt.none, #bmt.none, false) : (!bmt.tensor) -> !bmt.tensor
  %25 = bmt.aten "aten::sub.Scalar"(%19, 4096, 1) : (!bmt.tensor) -> !bmt.tensor
  %26 = bmt.aten "aten::gt.Tensor"(%22, %25) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %27 = bmt.aten "aten::to.dtype_layout"(%26, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %28 = bmt.aten "aten::__and__.Tensor"(%24, %27) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %29 = bmt.aten "aten::le.Tensor"(%22, %19) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %30 = bmt.aten "aten::to.dtype_layout"(%29, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %31 = bmt.aten "aten::__and__.Tensor"(%28, %30) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %32 = bmt.aten "aten::to.dtype_layout"(%31, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %33 = bmt.aten "aten::__and__.Tensor"(%23, %32) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %34 = bmt.aten "aten::index.Tensor"(%4, [%13, %22]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %35 = bmt.aten "aten::to.dtype_layout"(%34, 11, 0, #bmt.device<"cpu">, #bmt.none, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %36 = bmt.aten "aten::__and__.Tensor"(%33, %35) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %37 = bmt.aten "aten::expand"(%36, [2, -1, 8, 8], false) : (!bmt.tensor) -> !bmt.tensor
  %38 = call @attn.forward(%arg0, %37) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %38 : !bmt.tensor
}
func.func private @attn.forward(%arg0: !bmt.tensor, %arg1: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// A model traced without attention_mask (Falcon): kv <= q alone, over two
// aranges of one length. Sound for every input: no assumption recorded.
// Dropout, scale and enable_gqa stay as they were.
// CHECK-LABEL: module {
// CHECK-NEXT:    func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
// CHECK-NEXT:      %0 = call @attn.forward(%arg0) : (!bmt.tensor) -> !bmt.tensor
// CHECK-NEXT:      return %0
// CHECK:         func.func private @attn.forward(%arg0: !bmt.tensor) -> !bmt.tensor {
// CHECK-NEXT:      bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, #bmt.none, 1.000000e-01, true, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// OPT traced without attention_mask makes one from the input's sizes
// (torch.ones(batch, seq)) and ANDs it in: a tensor of ones, indexed by
// positions, is true, and its length (Int(NumToTensor(size) + 0)) is the
// query length. Sound for every input.
// CHECK-LABEL: module {
// CHECK:         func.func @forward(
// CHECK-NEXT:      %[[N:.*]] = bmt.aten "aten::size.int"(%arg0, 1)
// CHECK-NEXT:      %[[B:.*]] = bmt.aten "aten::size.int"(%arg0, 0)
// CHECK-NEXT:      bmt.num_to_tensor %[[N]]
// CHECK:           %[[ONES:.*]] = bmt.aten "aten::ones"([%[[B]], %{{.*}}]
// CHECK-NEXT:      bmt.aten "aten::cumsum"(%[[ONES]]
// CHECK-NEXT:      call @attn.forward(%arg0)
// CHECK:         bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, #bmt.none, 1.000000e-01, true,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> (!bmt.tensor, !bmt.tensor) {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %t = bmt.num_to_tensor %n : i64 -> !bmt.tensor
  %z = bmt.constant dense<0> : tensor<i64>
  %t0 = bmt.aten "aten::add.Tensor"(%t, %z, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %len = bmt.aten "aten::Int.Tensor"(%t0) : (!bmt.tensor) -> i64
  %ones = bmt.aten "aten::ones"([%b, %len], #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64, i64) -> !bmt.tensor
  %positions = bmt.aten "aten::cumsum"(%ones, 1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %pad = bmt.aten "aten::to.device"(%ones, #bmt.device<"cpu">, 11, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %kvlen = bmt.aten "aten::size.int"(%pad, 1) : (!bmt.tensor) -> i64
  %bi0 = bmt.aten "aten::arange"(%b, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %bi1 = bmt.aten "aten::unsqueeze"(%bi0, 1) : (!bmt.tensor) -> !bmt.tensor
  %bi2 = bmt.aten "aten::unsqueeze"(%bi1, 2) : (!bmt.tensor) -> !bmt.tensor
  %bi3 = bmt.aten "aten::unsqueeze"(%bi2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%kvlen, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %c = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %p = bmt.aten "aten::index.Tensor"(%pad, [%bi3, %k3]) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::__and__.Tensor"(%c, %p) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y, %positions : !bmt.tensor, !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// The mask is also read by another (pure) op: the attention still becomes
// causal; the mask stays for that reader.
// CHECK-LABEL: module {
// CHECK:         %[[M:.*]] = bmt.aten "aten::le.Tensor"
// CHECK-NEXT:    %[[X:.*]] = bmt.aten "aten::expand"(%[[M]]
// CHECK-NEXT:    call @attn.forward(%arg0) :
// CHECK-NEXT:    bmt.aten "aten::logical_not"(%[[X]])
// CHECK:         "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, #bmt.none, 1.000000e-01, true,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> (!bmt.tensor, !bmt.tensor) {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %not = bmt.aten "aten::logical_not"(%x) : (!bmt.tensor) -> !bmt.tensor
  return %y, %not : !bmt.tensor, !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// An offset between the positions (q_offset = 2: a cache of two past
// tokens): kv <= q + 2 is not what is_causal computes. Left alone.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 1.000000e-01, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %qa = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q0 = bmt.aten "aten::add.Scalar"(%qa, 2, 1) : (!bmt.tensor) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// An offset that is not a constant (a cache length known at run time only).
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 1.000000e-01, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}, %past: i64 {bmt.name = "past"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %qa = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %off = bmt.num_to_tensor %past : i64 -> !bmt.tensor
  %q0 = bmt.aten "aten::add.Tensor"(%qa, %off, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// Mistral's sliding window (kv > q - 4096) in a trace: the length is only
// known at run time, so the window may matter. Left alone.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 1.000000e-01, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %c = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %w = bmt.aten "aten::sub.Scalar"(%q3, 4096, 1) : (!bmt.tensor) -> !bmt.tensor
  %s = bmt.aten "aten::gt.Tensor"(%k3, %w) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::__and__.Tensor"(%s, %c) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// A window of 4 at a constant length of 8 (a static export): it matters.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 1.000000e-01, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(8, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(8, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : () -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %c = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %w = bmt.aten "aten::sub.Scalar"(%q3, 4, 1) : (!bmt.tensor) -> !bmt.tensor
  %s = bmt.aten "aten::gt.Tensor"(%k3, %w) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::__and__.Tensor"(%s, %c) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, 8, 8], false) : (!bmt.tensor, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// The key positions span another length (dimension 2 of the input) than
// the query positions: not provably the same length. Left alone.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 1.000000e-01, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %other = bmt.aten "aten::size.int"(%arg0, 2) : (!bmt.tensor) -> i64
  %k0 = bmt.aten "aten::arange"(%other, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %other], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// The lengths come from one function called twice, with different inputs:
// dimension 1 of its (linear) result is a different size at each call.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 0.000000e+00, false,
bmt.parameter @proj.weight : tensor<8x8xf32> {requires_grad}
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}, %arg1: !bmt.tensor {bmt.name = "other"}) -> !bmt.tensor {
  %a = call @proj.forward(%arg0) : (!bmt.tensor) -> !bmt.tensor
  %c = call @proj.forward(%arg1) : (!bmt.tensor) -> !bmt.tensor
  %n = bmt.aten "aten::size.int"(%a, 1) : (!bmt.tensor) -> i64
  %m = bmt.aten "aten::size.int"(%c, 1) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%m, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %mask = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%a, %c, %c, %mask, 0.000000e+00, false, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @proj.forward(%x: !bmt.tensor) -> !bmt.tensor {
  %w = bmt.get_global @proj.weight : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// Something writes the mask in place (masked_fill_ on the expanded mask)
// before the attention reads it. Left alone.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 1.000000e-01, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %f = bmt.aten "aten::masked_fill_.Scalar"(%x, %m, 0) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// One attention function called with the causal mask and with another
// (kv < q): rewriting it would change the second call. Both left alone.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 1.000000e-01, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %strict = bmt.aten "aten::lt.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x2 = bmt.aten "aten::expand"(%strict, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %y2 = call @attn.forward(%y, %x2) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y2 : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// A bidirectional mask (BERT: q >= 0, true everywhere): not causal.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 1.000000e-01, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::ge.Scalar"(%q3, 0) : (!bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// q <= kv (the upper triangle): not what is_causal computes.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 1.000000e-01, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::le.Tensor"(%q3, %k3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// Another term (packed sequences: the same document id at q and kv).
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 1.000000e-01, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}, %arg1: !bmt.tensor {bmt.name = "doc_ids"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %c = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %e = bmt.aten "aten::eq.Tensor"(%arg1, %arg1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::__and__.Tensor"(%c, %e) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// The comparison converted to float: an additive mask (0 or 1 added to
// the scores), not a boolean one. Left alone.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%{{.*}}, %{{.*}}, %{{.*}}, %{{[a-z0-9]+}}, 1.000000e-01, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
  %n = bmt.aten "aten::size.int"(%arg0, 1) : (!bmt.tensor) -> i64
  %b = bmt.aten "aten::size.int"(%arg0, 0) : (!bmt.tensor) -> i64
  %q0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %k0 = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %q1 = bmt.aten "aten::unsqueeze"(%q0, 0) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::unsqueeze"(%q1, 1) : (!bmt.tensor) -> !bmt.tensor
  %q3 = bmt.aten "aten::unsqueeze"(%q2, 3) : (!bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::unsqueeze"(%k0, 0) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::unsqueeze"(%k1, 1) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %c = bmt.aten "aten::le.Tensor"(%k3, %q3) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %m = bmt.aten "aten::to.dtype"(%c, 6, false, false, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %x = bmt.aten "aten::expand"(%m, [%b, -1, %n, %n], false) : (!bmt.tensor, i64, i64, i64) -> !bmt.tensor
  %y = call @attn.forward(%arg0, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %y : !bmt.tensor
}
func.func private @attn.forward(%h: !bmt.tensor, %mask: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%h, %h, %h, %mask, 1.000000e-01, false, 1.250000e-01, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// is_causal already true next to a mask (an error in PyTorch), and a mask
// that is an input of the program: both left alone.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, true,
// CHECK:         "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}, %arg1: !bmt.tensor {bmt.name = "mask"}) -> (!bmt.tensor, !bmt.tensor) {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, true, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, %arg1, 0.000000e+00, false, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0, %1 : !bmt.tensor, !bmt.tensor
}

// -----

// Attention without a mask (already causal): nothing to do.
// CHECK-LABEL: module {
// CHECK:         "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, #bmt.none, 0.000000e+00, true,
func.func @forward(%arg0: !bmt.tensor {bmt.name = "inputs_embeds"}) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg0, %arg0, #bmt.none, 0.000000e+00, true, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
