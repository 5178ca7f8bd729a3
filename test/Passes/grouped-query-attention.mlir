// RUN: bmt-opt %s --split-input-file --bmt-grouped-query-attention 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s --split-input-file --bmt-grouped-query-attention -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK

// One remark per module (the split inputs below, in order).
// REMARK: remark: bmt-grouped-query-attention: 1 aten::scaled_dot_product_attention call reads the key/value heads with enable_gqa=True instead of their repeats; 18 ops removed
// REMARK: remark: bmt-grouped-query-attention: 1 aten::scaled_dot_product_attention call reads the key/value heads with enable_gqa=True instead of their repeats; 6 ops removed
// REMARK: remark: bmt-grouped-query-attention: 1 aten::scaled_dot_product_attention call reads the key/value heads with enable_gqa=True instead of their repeats; 3 ops removed
// REMARK: remark: bmt-grouped-query-attention: no aten::scaled_dot_product_attention whose key and value are repeat_kv's repeats of fewer heads (5 calls left as they are)
// REMARK-NOT: remark

// repeat_kv as torch.jit.trace records it (x[:, :, None, :, :] with full
// slices, sizes from aten::size, kv * n computed): the call reads k and v
// with enable_gqa=True, and the repeats and their size arithmetic are gone.
// CHECK-LABEL: func.func private @attn.forward(
// CHECK-SAME:    %[[Q:[^:]*]]: !bmt.tensor, %[[K:[^:]*]]: !bmt.tensor, %[[V:[^:]*]]: !bmt.tensor
// CHECK-NEXT:    %[[O:.*]] = bmt.aten "aten::scaled_dot_product_attention"(%[[Q]], %[[K]], %[[V]], #bmt.none, 0.000000e+00, true, 1.250000e-01, true)
// CHECK-NEXT:    return %[[O]]
func.func private @attn.forward(%q: !bmt.tensor, %k: !bmt.tensor, %v: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::size.int"(%k, 0) : (!bmt.tensor) -> i64
  %1 = bmt.aten "aten::size.int"(%k, 1) : (!bmt.tensor) -> i64
  %2 = bmt.aten "aten::size.int"(%k, 2) : (!bmt.tensor) -> i64
  %3 = bmt.aten "aten::size.int"(%k, 3) : (!bmt.tensor) -> i64
  %4 = bmt.aten "aten::slice.Tensor"(%k, 0, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::slice.Tensor"(%4, 1, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::unsqueeze"(%5, 2) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::slice.Tensor"(%6, 3, 0, 9223372036854775807, 1) : (!bmt.tensor) -> !bmt.tensor
  %8 = bmt.aten "aten::expand"(%7, [%0, %1, 4, %2, %3], false) : (!bmt.tensor, i64, i64, i64, i64) -> !bmt.tensor
  %9 = bmt.num_to_tensor %1 : i64 -> !bmt.tensor
  %10 = bmt.constant dense<4> : tensor<i64>
  %11 = bmt.aten "aten::mul.Tensor"(%9, %10) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %12 = bmt.aten "aten::Int.Tensor"(%11) : (!bmt.tensor) -> i64
  %13 = bmt.aten "aten::reshape"(%8, [%0, %12, %2, %3]) : (!bmt.tensor, i64, i64, i64, i64) -> !bmt.tensor
  %14 = bmt.aten "aten::unsqueeze"(%v, 2) : (!bmt.tensor) -> !bmt.tensor
  %15 = bmt.aten "aten::expand"(%14, [-1, -1, 4, -1, -1], false) : (!bmt.tensor) -> !bmt.tensor
  %16 = bmt.aten "aten::size.int"(%v, 0) : (!bmt.tensor) -> i64
  %17 = bmt.aten "aten::reshape"(%15, [%16, -1, 1024, 64]) : (!bmt.tensor, i64) -> !bmt.tensor
  %18 = bmt.aten "aten::scaled_dot_product_attention"(%q, %13, %17, #bmt.none, 0.000000e+00, true, 1.250000e-01, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %18 : !bmt.tensor
}

// -----

// The same as a static torch.export records it: every size a number.
// CHECK-LABEL: func.func private @attn.forward(
// CHECK-NEXT:    %[[O:.*]] = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg1, %arg2, #bmt.none, 0.000000e+00, true, #bmt.none, true)
// CHECK-NEXT:    return %[[O]]
func.func private @attn.forward(%q: !bmt.tensor, %k: !bmt.tensor, %v: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::unsqueeze"(%k, 2) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::expand"(%0, [3, 2, 2, 12, 8], false) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::reshape"(%1, [3, 4, 12, 8]) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::unsqueeze"(%v, -3) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::expand"(%3, [3, 2, 2, 12, 8], false) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::view"(%4, [3, 4, 12, 8]) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::scaled_dot_product_attention"(%q, %2, %5, #bmt.none, 0.000000e+00, true, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %6 : !bmt.tensor
}

// -----

// A repeat that something else reads too: the call reads the kv heads, the
// other reader keeps its repeat (only v's, nothing else reads, is erased).
// CHECK-LABEL: func.func private @attn.forward(
// CHECK:         %[[R:.*]] = bmt.aten "aten::reshape"
// CHECK-NEXT:    %[[O:.*]] = bmt.aten "aten::scaled_dot_product_attention"(%arg0, %arg1, %arg2, {{.*}}, true)
// CHECK-NEXT:    return %[[O]], %[[R]]
func.func private @attn.forward(%q: !bmt.tensor, %k: !bmt.tensor, %v: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
  %0 = bmt.aten "aten::unsqueeze"(%k, 2) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::expand"(%0, [-1, -1, 2, -1, -1], false) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::reshape"(%1, [3, 4, 12, 8]) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::unsqueeze"(%v, 2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::expand"(%3, [-1, -1, 2, -1, -1], false) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::reshape"(%4, [3, 4, 12, 8]) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::scaled_dot_product_attention"(%q, %2, %5, #bmt.none, 0.000000e+00, true, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %6, %2 : !bmt.tensor, !bmt.tensor
}

// -----

// Left as they are (the remark says none matched): k and v repeated by different
// factors; a batch of 1 broadcast by the expand (its size is another
// tensor's); a narrow after the repeat (tensor parallelism's replicated
// k/v); a reshape that does not merge kv and n; enable_gqa already true.
// CHECK-LABEL: func.func private @different.forward(
// CHECK:         aten::scaled_dot_product_attention"(%arg0, %{{[0-9]+}}, %{{[0-9]+}}, {{.*}}, false)
func.func private @different.forward(%q: !bmt.tensor, %k: !bmt.tensor, %v: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::unsqueeze"(%k, 2) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::expand"(%0, [-1, -1, 2, -1, -1], false) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::reshape"(%1, [3, 4, 12, 8]) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::unsqueeze"(%v, 2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::expand"(%3, [-1, -1, 4, -1, -1], false) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::reshape"(%4, [3, 4, 12, 8]) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::scaled_dot_product_attention"(%q, %2, %5, #bmt.none, 0.000000e+00, true, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %6 : !bmt.tensor
}
// CHECK-LABEL: func.func private @broadcast.forward(
// CHECK:         aten::scaled_dot_product_attention"(%arg0, %{{[0-9]+}}, %{{[0-9]+}}, {{.*}}, false)
func.func private @broadcast.forward(%q: !bmt.tensor, %k: !bmt.tensor, %v: !bmt.tensor) -> !bmt.tensor {
  %b = bmt.aten "aten::size.int"(%q, 0) : (!bmt.tensor) -> i64
  %0 = bmt.aten "aten::unsqueeze"(%k, 2) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::expand"(%0, [%b, -1, 2, -1, -1], false) : (!bmt.tensor, i64) -> !bmt.tensor
  %2 = bmt.aten "aten::reshape"(%1, [%b, 4, 12, 8]) : (!bmt.tensor, i64) -> !bmt.tensor
  %3 = bmt.aten "aten::unsqueeze"(%v, 2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::expand"(%3, [%b, -1, 2, -1, -1], false) : (!bmt.tensor, i64) -> !bmt.tensor
  %5 = bmt.aten "aten::reshape"(%4, [%b, 4, 12, 8]) : (!bmt.tensor, i64) -> !bmt.tensor
  %6 = bmt.aten "aten::scaled_dot_product_attention"(%q, %2, %5, #bmt.none, 0.000000e+00, true, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %6 : !bmt.tensor
}
// CHECK-LABEL: func.func private @narrowed.forward(
// CHECK:         aten::scaled_dot_product_attention"(%arg0, %{{[0-9]+}}, %{{[0-9]+}}, {{.*}}, false)
func.func private @narrowed.forward(%q: !bmt.tensor, %k: !bmt.tensor, %v: !bmt.tensor, %r: i64) -> !bmt.tensor {
  %0 = bmt.aten "aten::unsqueeze"(%k, 2) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::expand"(%0, [-1, -1, 4, -1, -1], false) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::reshape"(%1, [3, 8, 12, 8]) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::narrow"(%2, 1, %r, 4) : (!bmt.tensor, i64) -> !bmt.tensor
  %4 = bmt.aten "aten::unsqueeze"(%v, 2) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::expand"(%4, [-1, -1, 4, -1, -1], false) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::reshape"(%5, [3, 8, 12, 8]) : (!bmt.tensor) -> !bmt.tensor
  %7 = bmt.aten "aten::narrow"(%6, 1, %r, 4) : (!bmt.tensor, i64) -> !bmt.tensor
  %8 = bmt.aten "aten::scaled_dot_product_attention"(%q, %3, %7, #bmt.none, 0.000000e+00, true, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %8 : !bmt.tensor
}
// CHECK-LABEL: func.func private @unmerged.forward(
// CHECK:         aten::scaled_dot_product_attention"(%arg0, %{{[0-9]+}}, %{{[0-9]+}}, {{.*}}, false)
func.func private @unmerged.forward(%q: !bmt.tensor, %k: !bmt.tensor, %v: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::unsqueeze"(%k, 2) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::expand"(%0, [3, 2, 2, 12, 8], false) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::reshape"(%1, [3, 4, 8, 12]) : (!bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::unsqueeze"(%v, 2) : (!bmt.tensor) -> !bmt.tensor
  %4 = bmt.aten "aten::expand"(%3, [3, 2, 2, 12, 8], false) : (!bmt.tensor) -> !bmt.tensor
  %5 = bmt.aten "aten::reshape"(%4, [3, 4, 8, 12]) : (!bmt.tensor) -> !bmt.tensor
  %6 = bmt.aten "aten::scaled_dot_product_attention"(%q, %2, %5, #bmt.none, 0.000000e+00, true, #bmt.none, false) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %6 : !bmt.tensor
}
// CHECK-LABEL: func.func private @already.forward(
// CHECK:         aten::scaled_dot_product_attention"(%arg0, %arg1, %arg2, {{.*}}, true)
func.func private @already.forward(%q: !bmt.tensor, %k: !bmt.tensor, %v: !bmt.tensor) -> !bmt.tensor {
  %0 = bmt.aten "aten::scaled_dot_product_attention"(%q, %k, %v, #bmt.none, 0.000000e+00, true, #bmt.none, true) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
