// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=4' 2>%t.remarks | FileCheck %s
// RUN: FileCheck %s --check-prefix=REMARK --input-file=%t.remarks
// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=4' --bmt-zero='alignment=8' 2>/dev/null | FileCheck %s --check-prefix=ZERO
// The output parses back (shard.grid, the bmt.tp_* ops) and prints the same.
// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=4' -o %t.once.mlir 2>/dev/null
// RUN: bmt-opt %t.once.mlir -o %t.twice.mlir
// RUN: diff %t.once.mlir %t.twice.mlir

// A vocab of 10 over 4 ranks: padded to 12 (3 rows per rank) on the tied
// embedding / LM head; the MLP 8 -> 16 -> 8 split 4 ways.
// REMARK: bmt-tensor-parallel: 4 ranks, 2 blocks, 2 chains: w1 column-parallel (16 -> 4 per rank), w2 row-parallel; vocab-parallel embedding and LM head (10 -> 3 per rank, padded to 12); 4 ops split; 0 chains replicated
// CHECK-LABEL: module attributes {bmt.tensor_parallel = 4 : i64, bmt.tensor_parallel_plan = {{.*}}, bmt.vocab_size = 10 : i64}
// CHECK-NEXT:  shard.grid @tp(shape = 4)
// CHECK-NEXT:  bmt.parameter @emb.w : tensor<10x8xf32> {aliases = ["head.w"], bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, padded_size = 12>, requires_grad}
// CHECK-NEXT:  bmt.parameter @h.0.w1 : tensor<16x8xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1>, requires_grad}
// CHECK-NEXT:  bmt.parameter @h.0.w2 : tensor<8x16xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 1, chunks = 1>, requires_grad}
// CHECK-LABEL: func.func @forward(
// CHECK:       %[[E:.*]] = bmt.get_global @emb.w
// CHECK-NEXT:  %[[T:.*]] = bmt.tp_rank over @tp
// CHECK-NEXT:  %[[L:.*]] = bmt.aten "aten::sub.Scalar"(%arg0, %[[T]], 3)
// CHECK-NEXT:  %[[LO:.*]] = bmt.aten "aten::lt.Scalar"(%[[L]], 0)
// CHECK-NEXT:  %[[HI:.*]] = bmt.aten "aten::ge.Scalar"(%[[L]], 3)
// CHECK-NEXT:  %[[OUT:.*]] = bmt.aten "aten::__or__.Tensor"(%[[LO]], %[[HI]])
// CHECK-NEXT:  %[[I:.*]] = bmt.aten "aten::masked_fill.Scalar"(%[[L]], %[[OUT]], 0)
// CHECK-NEXT:  %[[R:.*]] = bmt.aten "aten::embedding"(%[[E]], %[[I]], -1, false, false)
// CHECK-NEXT:  %[[M:.*]] = bmt.aten "aten::unsqueeze"(%[[OUT]], -1)
// CHECK-NEXT:  %[[Z:.*]] = bmt.aten "aten::masked_fill.Scalar"(%[[R]], %[[M]], 0.000000e+00)
// CHECK-NEXT:  %[[X:.*]] = bmt.tp_all_reduce %[[Z]] over @tp
// CHECK-NEXT:  %[[B0:.*]] = call @h.0.forward(%[[X]])
// CHECK-NEXT:  %[[B1:.*]] = call @h.1.forward(%[[B0]])
// CHECK-NEXT:  %[[C:.*]] = bmt.tp_copy %[[B1]] over @tp
// CHECK-NEXT:  %[[Y:.*]] = bmt.aten "aten::linear"(%[[C]], %[[E]], #bmt.none)
// CHECK-NEXT:  return %[[Y]]
// CHECK-LABEL: func.func private @h.0.forward(
// CHECK-NEXT:  %[[C:.*]] = bmt.tp_copy %arg0 over @tp
// CHECK-NEXT:  bmt.get_global @h.0.w1
// CHECK-NEXT:  bmt.get_global @h.0.w2
// CHECK-NEXT:  %[[A:.*]] = bmt.aten "aten::linear"(%[[C]],
// CHECK-NEXT:  %[[G:.*]] = bmt.aten "aten::relu"(%[[A]])
// CHECK-NEXT:  %[[P:.*]] = bmt.aten "aten::linear"(%[[G]], %{{.*}}, #bmt.none)
// CHECK-NEXT:  %[[S:.*]] = bmt.tp_all_reduce %[[P]] over @tp
// CHECK-NEXT:  return %[[S]]

// Storage groups hold one TP rank's slice: w1 and w2 have 32 elements
// each, the embedding 3 x 8.
// ZERO: bmt.storage_group @h.0.float32 : f32 {alignment = 8 : i64, block = @h, block_index = 0 : i64, offsets = array<i64: 0, 32>, params = [@h.0.w1, @h.0.w2], size = 64 : i64}
// ZERO: bmt.storage_group @outside_blocks.float32 : f32 {alignment = 8 : i64, offsets = array<i64: 0>, params = [@emb.w], size = 24 : i64}
bmt.parameter @emb.w : tensor<10x8xf32> {aliases = ["head.w"], requires_grad}
bmt.parameter @h.0.w1 : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w2 : tensor<8x16xf32> {requires_grad}
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
  %w1 = bmt.get_global @h.0.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.0.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w1 = bmt.get_global @h.1.w1 : !bmt.tensor
  %w2 = bmt.get_global @h.1.w2 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w1, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %w2, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
