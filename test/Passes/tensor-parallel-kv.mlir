// RUN: bmt-opt %s --bmt-find-blocks --bmt-tensor-parallel='tensor-parallel=3' 2>%t.remarks | FileCheck %s
// RUN: FileCheck %s --check-prefix=REMARK --input-file=%t.remarks

// Grouped-query attention whose kv heads T does not divide: 6 query heads
// of 4 on 2 kv heads (k with a bias), T = 3. The k/v projections are
// replicated with reduce_grad; q split by heads (2 per rank) and o by its
// input; after the repeat of the kv heads to 6 (expand + reshape), each
// rank narrows them to its query heads [2t, 2t + 2) (rank 1's straddle the
// two kv heads), the offset 2t computed from bmt.tp_rank.
// REMARK: bmt-tensor-parallel: 3 ranks, 2 blocks, 2 chains: q column-parallel by heads (6 -> 2 per rank), k, v k/v replicated on 3 ranks (2 kv heads < T = 3), reduce_grad, o row-parallel;
// CHECK:      bmt.parameter @h.0.q : tensor<24x24xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1>, requires_grad}
// CHECK-NEXT: bmt.parameter @h.0.k : tensor<8x24xf32> {bmt.tensor_split = #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>, requires_grad}
// CHECK-NEXT: bmt.parameter @h.0.kb : tensor<8xf32> {bmt.tensor_split = #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>, requires_grad}
// CHECK-NEXT: bmt.parameter @h.0.v : tensor<8x24xf32> {bmt.tensor_split = #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>, requires_grad}
// CHECK-NEXT: bmt.parameter @h.0.o : tensor<24x24xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 1, chunks = 1>, requires_grad}
// CHECK-LABEL: func.func private @h.0.forward(
// CHECK-NEXT:  %[[X:.*]] = bmt.tp_copy %arg0 over @tp
// CHECK:       bmt.aten "aten::linear"(%[[X]], %{{.*}}, #bmt.none)
// CHECK-NEXT:  bmt.aten "aten::view"(%{{.*}}, [2, 5, 2, 4])
// CHECK:       %[[K:.*]] = bmt.aten "aten::linear"(%[[X]], %{{.*}}, %{{.*}})
// CHECK-NEXT:  bmt.aten "aten::view"(%[[K]], [2, 5, 2, 4])
// CHECK:       bmt.aten "aten::expand"(%{{.*}}, [2, 2, 3, 5, 4], false)
// CHECK-NEXT:  %[[R:.*]] = bmt.aten "aten::reshape"(%{{.*}}, [2, 6, 5, 4])
// CHECK-NEXT:  %[[T:.*]] = bmt.tp_rank over @tp
// CHECK-NEXT:  %[[TT:.*]] = bmt.num_to_tensor %[[T]] : i64 -> !bmt.tensor
// CHECK-NEXT:  %[[O:.*]] = bmt.aten "aten::mul.Scalar"(%[[TT]], 2)
// CHECK-NEXT:  %[[S:.*]] = bmt.aten "aten::Int.Tensor"(%[[O]]) : (!bmt.tensor) -> i64
// CHECK-NEXT:  %[[KN:.*]] = bmt.aten "aten::narrow"(%[[R]], 1, %[[S]], 2)
// CHECK:       %[[V:.*]] = bmt.aten "aten::reshape"(%{{.*}}, [2, 6, 5, 4])
// CHECK:       %[[VN:.*]] = bmt.aten "aten::narrow"(%[[V]], 1, %{{.*}}, 2)
// CHECK-NEXT:  %[[KT:.*]] = bmt.aten "aten::transpose.int"(%[[KN]], 2, 3)
// CHECK-NEXT:  bmt.aten "aten::matmul"(%{{.*}}, %[[KT]])
// CHECK:       bmt.aten "aten::matmul"(%{{.*}}, %[[VN]])
// CHECK:       bmt.aten "aten::reshape"(%{{.*}}, [2, 5, 8])
// CHECK-NEXT:  %[[P:.*]] = bmt.aten "aten::linear"(%{{.*}}, %{{.*}}, #bmt.none)
// CHECK-NEXT:  bmt.tp_all_reduce %[[P]] over @tp
bmt.parameter @h.0.q : tensor<24x24xf32> {requires_grad}
bmt.parameter @h.0.k : tensor<8x24xf32> {requires_grad}
bmt.parameter @h.0.kb : tensor<8xf32> {requires_grad}
bmt.parameter @h.0.v : tensor<8x24xf32> {requires_grad}
bmt.parameter @h.0.o : tensor<24x24xf32> {requires_grad}
bmt.parameter @h.1.q : tensor<24x24xf32> {requires_grad}
bmt.parameter @h.1.k : tensor<8x24xf32> {requires_grad}
bmt.parameter @h.1.kb : tensor<8xf32> {requires_grad}
bmt.parameter @h.1.v : tensor<8x24xf32> {requires_grad}
bmt.parameter @h.1.o : tensor<24x24xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %wq = bmt.get_global @h.0.q : !bmt.tensor
  %wk = bmt.get_global @h.0.k : !bmt.tensor
  %bk = bmt.get_global @h.0.kb : !bmt.tensor
  %wv = bmt.get_global @h.0.v : !bmt.tensor
  %wo = bmt.get_global @h.0.o : !bmt.tensor
  %q = bmt.aten "aten::linear"(%x, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %q1 = bmt.aten "aten::view"(%q, [2, 5, 6, 4]) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::transpose.int"(%q1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %k = bmt.aten "aten::linear"(%x, %wk, %bk) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::view"(%k, [2, 5, 2, 4]) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::transpose.int"(%k1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %k4 = bmt.aten "aten::expand"(%k3, [2, 2, 3, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %k5 = bmt.aten "aten::reshape"(%k4, [2, 6, 5, 4]) : (!bmt.tensor) -> !bmt.tensor
  %v = bmt.aten "aten::linear"(%x, %wv, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %v1 = bmt.aten "aten::view"(%v, [2, 5, 2, 4]) : (!bmt.tensor) -> !bmt.tensor
  %v2 = bmt.aten "aten::transpose.int"(%v1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %v3 = bmt.aten "aten::unsqueeze"(%v2, 2) : (!bmt.tensor) -> !bmt.tensor
  %v4 = bmt.aten "aten::expand"(%v3, [2, 2, 3, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %v5 = bmt.aten "aten::reshape"(%v4, [2, 6, 5, 4]) : (!bmt.tensor) -> !bmt.tensor
  %kt = bmt.aten "aten::transpose.int"(%k5, 2, 3) : (!bmt.tensor) -> !bmt.tensor
  %s = bmt.aten "aten::matmul"(%q2, %kt) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %p = bmt.aten "aten::softmax.int"(%s, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %a = bmt.aten "aten::matmul"(%p, %v5) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %a1 = bmt.aten "aten::transpose.int"(%a, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %a2 = bmt.aten "aten::reshape"(%a1, [2, 5, 24]) : (!bmt.tensor) -> !bmt.tensor
  %o = bmt.aten "aten::linear"(%a2, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %o : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %wq = bmt.get_global @h.1.q : !bmt.tensor
  %wk = bmt.get_global @h.1.k : !bmt.tensor
  %bk = bmt.get_global @h.1.kb : !bmt.tensor
  %wv = bmt.get_global @h.1.v : !bmt.tensor
  %wo = bmt.get_global @h.1.o : !bmt.tensor
  %q = bmt.aten "aten::linear"(%x, %wq, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %q1 = bmt.aten "aten::view"(%q, [2, 5, 6, 4]) : (!bmt.tensor) -> !bmt.tensor
  %q2 = bmt.aten "aten::transpose.int"(%q1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %k = bmt.aten "aten::linear"(%x, %wk, %bk) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %k1 = bmt.aten "aten::view"(%k, [2, 5, 2, 4]) : (!bmt.tensor) -> !bmt.tensor
  %k2 = bmt.aten "aten::transpose.int"(%k1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %k3 = bmt.aten "aten::unsqueeze"(%k2, 2) : (!bmt.tensor) -> !bmt.tensor
  %k4 = bmt.aten "aten::expand"(%k3, [2, 2, 3, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %k5 = bmt.aten "aten::reshape"(%k4, [2, 6, 5, 4]) : (!bmt.tensor) -> !bmt.tensor
  %v = bmt.aten "aten::linear"(%x, %wv, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %v1 = bmt.aten "aten::view"(%v, [2, 5, 2, 4]) : (!bmt.tensor) -> !bmt.tensor
  %v2 = bmt.aten "aten::transpose.int"(%v1, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %v3 = bmt.aten "aten::unsqueeze"(%v2, 2) : (!bmt.tensor) -> !bmt.tensor
  %v4 = bmt.aten "aten::expand"(%v3, [2, 2, 3, 5, 4], false) : (!bmt.tensor) -> !bmt.tensor
  %v5 = bmt.aten "aten::reshape"(%v4, [2, 6, 5, 4]) : (!bmt.tensor) -> !bmt.tensor
  %kt = bmt.aten "aten::transpose.int"(%k5, 2, 3) : (!bmt.tensor) -> !bmt.tensor
  %s = bmt.aten "aten::matmul"(%q2, %kt) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %p = bmt.aten "aten::softmax.int"(%s, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
  %a = bmt.aten "aten::matmul"(%p, %v5) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %a1 = bmt.aten "aten::transpose.int"(%a, 1, 2) : (!bmt.tensor) -> !bmt.tensor
  %a2 = bmt.aten "aten::reshape"(%a1, [2, 5, 24]) : (!bmt.tensor) -> !bmt.tensor
  %o = bmt.aten "aten::linear"(%a2, %wo, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %o : !bmt.tensor
}
