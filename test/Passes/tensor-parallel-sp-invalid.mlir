// RUN: not bmt-opt %s --split-input-file --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2 sequence-parallel=true' -o /dev/null 2>&1 | FileCheck %s

// An op that mixes positions between the chains (a cumulative sum along
// the sequence on the residual path): one error naming it.
// CHECK: error: bmt-tensor-parallel: cannot split the sequence (--sequence-parallel) at aten::cumsum in h.{{[01]}}.forward: an op that may mix positions
bmt.parameter @emb.w : tensor<10x8xf32> {aliases = ["head.w"], requires_grad}
bmt.parameter @h.0.ln.w : tensor<8xf32> {requires_grad}
bmt.parameter @h.0.ln.b : tensor<8xf32> {requires_grad}
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.ln.w : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.ln.b : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> (!bmt.tensor {bmt.name = "logits"}) {
  %e = bmt.get_global @emb.w : !bmt.tensor
  %x = bmt.aten "aten::embedding"(%e, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %e, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %lw = bmt.get_global @h.0.ln.w : !bmt.tensor
  %lb = bmt.get_global @h.0.ln.b : !bmt.tensor
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %n = bmt.aten "aten::layer_norm"(%x, [8], %lw, %lb, 1.0e-05, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%n, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %c = bmt.aten "aten::cumsum"(%x, 1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%c, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %lw = bmt.get_global @h.1.ln.w : !bmt.tensor
  %lb = bmt.get_global @h.1.ln.b : !bmt.tensor
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %n = bmt.aten "aten::layer_norm"(%x, [8], %lw, %lb, 1.0e-05, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%n, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %c = bmt.aten "aten::cumsum"(%x, 1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%c, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}


// -----

// A reshape that merges batch and sequence between the chains.
// CHECK: error: bmt-tensor-parallel: cannot split the sequence (--sequence-parallel) at aten::reshape in h.{{[01]}}.forward: an op that may mix positions
bmt.parameter @emb.w : tensor<10x8xf32> {aliases = ["head.w"], requires_grad}
bmt.parameter @h.0.ln.w : tensor<8xf32> {requires_grad}
bmt.parameter @h.0.ln.b : tensor<8xf32> {requires_grad}
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.ln.w : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.ln.b : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> (!bmt.tensor {bmt.name = "logits"}) {
  %e = bmt.get_global @emb.w : !bmt.tensor
  %x = bmt.aten "aten::embedding"(%e, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %e, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %lw = bmt.get_global @h.0.ln.w : !bmt.tensor
  %lb = bmt.get_global @h.0.ln.b : !bmt.tensor
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %n = bmt.aten "aten::layer_norm"(%x, [8], %lw, %lb, 1.0e-05, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%n, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%x, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::reshape"(%3, [-1, 8]) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::reshape"(%4, [2, -1, 8]) : (!bmt.tensor) -> !bmt.tensor
  return %5 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %lw = bmt.get_global @h.1.ln.w : !bmt.tensor
  %lb = bmt.get_global @h.1.ln.b : !bmt.tensor
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %n = bmt.aten "aten::layer_norm"(%x, [8], %lw, %lb, 1.0e-05, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%n, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%x, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::reshape"(%3, [-1, 8]) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::reshape"(%4, [2, -1, 8]) : (!bmt.tensor) -> !bmt.tensor
  return %5 : !bmt.tensor
}

// -----

// A replicated projection between the last block and the head (as BERT's
// masked-LM head transform): per position, but its weight's gradient would
// need a sum over the TP group; one error naming it.
// CHECK: error: bmt-tensor-parallel: cannot split the sequence (--sequence-parallel) at aten::linear in forward: a matmul outside the tensor-parallel chains
bmt.parameter @emb.w : tensor<10x8xf32> {aliases = ["head.w"], requires_grad}
bmt.parameter @transform.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @h.0.ln.w : tensor<8xf32> {requires_grad}
bmt.parameter @h.0.ln.b : tensor<8xf32> {requires_grad}
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
bmt.parameter @h.1.ln.w : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.ln.b : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.1.w2 : tensor<8x16xf32> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> (!bmt.tensor {bmt.name = "logits"}) {
  %e = bmt.get_global @emb.w : !bmt.tensor
  %x = bmt.aten "aten::embedding"(%e, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %tw = bmt.get_global @transform.w : !bmt.tensor
  %t = bmt.aten "aten::linear"(%1, %tw, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%t, %e, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %lw = bmt.get_global @h.0.ln.w : !bmt.tensor
  %lb = bmt.get_global @h.0.ln.b : !bmt.tensor
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %n = bmt.aten "aten::layer_norm"(%x, [8], %lw, %lb, 1.0e-05, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%n, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%x, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %lw = bmt.get_global @h.1.ln.w : !bmt.tensor
  %lb = bmt.get_global @h.1.ln.b : !bmt.tensor
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %n = bmt.aten "aten::layer_norm"(%x, [8], %lw, %lb, 1.0e-05, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%n, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::add.Tensor"(%x, %2, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}

