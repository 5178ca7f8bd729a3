// RUN: bmt-opt %s --split-input-file --bmt-find-blocks 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s --split-input-file --bmt-find-blocks -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK

// find-blocks' module-list rule: chained calls of one module type at
// consecutive indices under one path make a block list even where their
// structures differ (T5: block 0 owns the relative-attention bias and
// passes the position bias on). It applies only where it groups more calls
// than the structural rule from the same call.

// REMARK: remark: bmt-find-blocks: 3 blocks in h (h.0 ... h.2), rule: module list of my.Layer (structure differs: h.0)
// REMARK: remark: bmt-find-blocks: 2 blocks in g (g.0 ... g.1), rule: identical structure
// REMARK: remark: bmt-find-blocks: no repeated layers found; the model is one unit
// REMARK-NOT: bmt-find-blocks: {{[0-9]+}} blocks

// h.0 has an extra parameter and an extra result (the "position bias") that
// h.1 and h.2 take: h.1 and h.2 alone would be a structural list, but the
// module list h.0 ... h.2 is longer and wins. g.0 and g.1 are identical:
// the structural rule makes the list (the module-list rule would give the
// same calls).
// CHECK-LABEL: {{^}}module {
// CHECK-DAG: bmt.block_list @h in @forward : [@h.0.forward, @h.1.forward, @h.2.forward]
// CHECK-DAG: bmt.block_list @g in @forward : [@g.0.forward, @g.1.forward]
// CHECK-NOT: bmt.block_list
// CHECK: call @h.0.forward(%{{.*}}) {bmt.block = @h, bmt.block_index = 0 : i64}
// CHECK: call @h.1.forward(%{{.*}}) {bmt.block = @h, bmt.block_index = 1 : i64}
// CHECK: call @h.2.forward(%{{.*}}) {bmt.block = @h, bmt.block_index = 2 : i64}
// CHECK: call @g.0.forward(%{{.*}}) {bmt.block = @g, bmt.block_index = 0 : i64}
// CHECK: call @g.1.forward(%{{.*}}) {bmt.block = @g, bmt.block_index = 1 : i64}
// CHECK-NOT: bmt.block =
bmt.parameter @h.0.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @h.0.rel : tensor<8x8xf32> {requires_grad}
bmt.parameter @h.1.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @h.2.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @g.0.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @g.1.w : tensor<8x8xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0:2 = call @h.0.forward(%x) : (!bmt.tensor) -> (!bmt.tensor, !bmt.tensor)
  %1 = call @h.1.forward(%0#0, %0#1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = call @h.2.forward(%1, %0#1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = call @g.0.forward(%2) : (!bmt.tensor) -> !bmt.tensor
  %4 = call @g.1.forward(%3) : (!bmt.tensor) -> !bmt.tensor
  return %4 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) attributes {bmt.module_path = "h.0", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @h.0.w : !bmt.tensor
  %r = bmt.get_global @h.0.rel : !bmt.tensor
  %p = bmt.aten "aten::linear"(%x, %r, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::add.Tensor"(%0, %p, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %1, %p : !bmt.tensor, !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor, %p: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @h.1.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::add.Tensor"(%0, %p, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @h.2.forward(%x: !bmt.tensor, %p: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.2", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @h.2.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::add.Tensor"(%0, %p, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @g.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "g.0", bmt.module_type = "my.Other"} {
  %w = bmt.get_global @g.0.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @g.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "g.1", bmt.module_type = "my.Other"} {
  %w = bmt.get_global @g.1.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// Not module lists (each pair differs in structure, so the structural rule
// does not apply either): the same module type at consecutive indices but
// not chained (a); chained at consecutive indices but of different module
// types (b); indices that are not consecutive (c); consecutive indices under
// different paths (d.0, e.1); no bmt.module_type (f); a layer that uses no
// parameter (z.1); paths without an index (k.first, k.second).
// CHECK-LABEL: {{^}}module {
// CHECK-NOT: bmt.block_list
// CHECK-NOT: bmt.block =
bmt.parameter @w0 : tensor<8x8xf32> {requires_grad}
bmt.parameter @w1 : tensor<8x8xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor) {
  %a0 = call @a.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %a1 = call @a.1.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %b0 = call @b.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %b1 = call @b.1.forward(%b0) : (!bmt.tensor) -> !bmt.tensor
  %c0 = call @c.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %c2 = call @c.2.forward(%c0) : (!bmt.tensor) -> !bmt.tensor
  %d0 = call @d.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %e1 = call @e.1.forward(%d0) : (!bmt.tensor) -> !bmt.tensor
  %f0 = call @f.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %f1 = call @f.1.forward(%f0) : (!bmt.tensor) -> !bmt.tensor
  %z0 = call @z.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %z1 = call @z.1.forward(%z0) : (!bmt.tensor) -> !bmt.tensor
  %k0 = call @k.first.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %k1 = call @k.second.forward(%k0) : (!bmt.tensor) -> !bmt.tensor
  return %a1, %b1, %c2, %e1, %f1, %z1, %k1, %a0 : !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor
}
func.func private @a.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "a.0", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @w0 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @a.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "a.1", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @w1 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @b.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "b.0", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @w0 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @b.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "b.1", bmt.module_type = "my.OtherLayer"} {
  %w = bmt.get_global @w1 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @c.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "c.0", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @w0 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @c.2.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "c.2", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @w1 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @d.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "d.0", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @w0 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @e.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "e.1", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @w1 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @f.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "f.0"} {
  %w = bmt.get_global @w0 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @f.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "f.1"} {
  %w = bmt.get_global @w1 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @z.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "z.0", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @w0 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @z.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "z.1", bmt.module_type = "my.Layer"} {
  %0 = bmt.aten "aten::relu"(%x) : (!bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @k.first.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "k.first", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @w0 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @k.second.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "k.second", bmt.module_type = "my.Layer"} {
  %w = bmt.get_global @w1 : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
