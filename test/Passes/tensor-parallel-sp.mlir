// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=2 sequence-parallel=true' 2>%t.remarks | FileCheck %s
// RUN: FileCheck %s --check-prefix=REMARK --input-file=%t.remarks
// RUN: not bmt-opt %s --split-input-file --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=1 sequence-parallel=true' -o /dev/null 2>&1 | FileCheck %s --check-prefix=T1
// T1: error: bmt-tensor-parallel: sequence-parallel needs tensor-parallel T > 1

// Sequence parallelism on a pre-norm MLP block: the embedding's all-reduce
// becomes a reduce-scatter along the sequence (dim 1), the block's tp_copy
// an all-gather before its column matmul, its all-reduce a reduce-scatter;
// the norms and the residual add run on each rank's part of the sequence,
// so their weights get reduce_grad; the LM head's input is gathered.
// REMARK: bmt-tensor-parallel: 2 ranks, 2 blocks, 2 chains: w1 column-parallel (16 -> 8 per rank), w2 row-parallel; vocab-parallel embedding and LM head (10 -> 5 per rank); sequence-parallel (dim 1): 3 all-gathers, 3 reduce-scatters, 4 parameters reduce_grad;
// CHECK-LABEL: module attributes {bmt.sequence_parallel, bmt.tensor_parallel = 2 : i64
// CHECK:       bmt.parameter @h.0.ln.w : tensor<8xf32> {bmt.tensor_split = #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>, requires_grad}
// CHECK-NEXT:  bmt.parameter @h.0.ln.b : tensor<8xf32> {bmt.tensor_split = #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>, requires_grad}
// CHECK-NEXT:  bmt.parameter @h.0.w1 : tensor<16x8xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1>, requires_grad}
// CHECK-NEXT:  bmt.parameter @h.0.w2 : tensor<8x16xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 1, chunks = 1>, requires_grad}
// CHECK-LABEL: func.func @forward(
// CHECK:       aten::embedding
// CHECK:       %[[E:.*]] = bmt.tp_reduce_scatter %{{.*}} over @tp dim 1
// CHECK-NEXT:  %[[B0:.*]] = call @h.0.forward(%[[E]])
// CHECK-NEXT:  %[[B1:.*]] = call @h.1.forward(%[[B0]])
// CHECK-NEXT:  %[[G:.*]] = bmt.tp_all_gather %[[B1]] over @tp dim 1
// CHECK-NEXT:  bmt.aten "aten::linear"(%[[G]],
// CHECK-NOT:   bmt.tp_copy
// CHECK-LABEL: func.func private @h.0.forward(
// CHECK:       %[[N:.*]] = bmt.aten "aten::layer_norm"(%arg0,
// CHECK-NEXT:  %[[G:.*]] = bmt.tp_all_gather %[[N]] over @tp dim 1
// CHECK-NEXT:  bmt.aten "aten::linear"(%[[G]],
// CHECK:       %[[P:.*]] = bmt.aten "aten::linear"(%{{.*}}, %{{.*}}, #bmt.none)
// CHECK-NEXT:  %[[S:.*]] = bmt.tp_reduce_scatter %[[P]] over @tp dim 1
// CHECK-NEXT:  bmt.aten "aten::add.Tensor"(%arg0, %[[S]], 1)
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

