// RUN: bmt-opt %s --split-input-file --bmt-find-blocks 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s --split-input-file --bmt-find-blocks -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK

// REMARK: find-blocks.mlir:{{[0-9]+}}:{{[0-9]+}}: remark: bmt-find-blocks: 3 blocks in h (h.0 ... h.2)
// REMARK: remark: bmt-find-blocks: no repeated layers found; the model is one unit
// REMARK: remark: bmt-find-blocks: 2 blocks in enc (enc.0 ... enc.1)
// REMARK: remark: bmt-find-blocks: 2 blocks in dec (dec.0 ... dec.1)
// REMARK-NOT: (wte ... wpe)
// REMARK: remark: bmt-find-blocks: 2 blocks in h (h.0 ... h.1)

// Three chained calls of structurally identical layers become a block list;
// the embedding and the head around them do not.
// CHECK-LABEL: {{^}}module {
// CHECK: bmt.parameter @h.2.w
// CHECK-NEXT: bmt.block_list @h in @body.forward : [@h.0.forward, @h.1.forward, @h.2.forward]
// CHECK: call @h.0.forward(%{{.*}}) {bmt.block = @h, bmt.block_index = 0 : i64}
// CHECK: call @h.1.forward(%{{.*}}) {bmt.block = @h, bmt.block_index = 1 : i64}
// CHECK: call @h.2.forward(%{{.*}}) {bmt.block = @h, bmt.block_index = 2 : i64}
// CHECK-NOT: bmt.block =
bmt.parameter @emb.w : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @h.1.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @h.2.w : tensor<8x8xf32> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> !bmt.tensor {
  %0 = call @body.forward(%ids) : (!bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @body.forward(%ids: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "body"} {
  %w = bmt.get_global @emb.w : !bmt.tensor
  %x = bmt.aten "aten::embedding"(%w, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %s = bmt.aten "aten::relu"(%1) : (!bmt.tensor) -> !bmt.tensor
  %2 = call @h.2.forward(%s) : (!bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w = bmt.get_global @h.0.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w = bmt.get_global @h.1.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @h.2.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.2"} {
  %w = bmt.get_global @h.2.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// Not blocks: layers that differ (another op, another parameter shape),
// layers that are not chained, and layers without parameters.
// CHECK-LABEL: {{^}}module {
// CHECK-NOT: bmt.block_list
// CHECK-NOT: bmt.block =
bmt.parameter @a.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @b.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @c.w : tensor<8x4xf32> {requires_grad}
bmt.parameter @p.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @q.w : tensor<8x8xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
  // a and b differ in their op (relu after linear in b).
  %0 = call @a.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @b.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  // b and c differ in their parameter's shape.
  %2 = call @c.forward(%1) : (!bmt.tensor) -> !bmt.tensor
  // p and q are identical but both read %x: not a chain.
  %3 = call @p.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %4 = call @q.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  // d.0 and d.1 are chained and identical but hold no parameter.
  %5 = call @d.0.forward(%2) : (!bmt.tensor) -> !bmt.tensor
  %6 = call @d.1.forward(%5) : (!bmt.tensor) -> !bmt.tensor
  return %4, %6 : !bmt.tensor, !bmt.tensor
}
func.func private @a.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "a"} {
  %w = bmt.get_global @a.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @b.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "b"} {
  %w = bmt.get_global @b.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @c.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "c"} {
  %w = bmt.get_global @c.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::relu"(%0) : (!bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @p.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "p"} {
  %w = bmt.get_global @p.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @q.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "q"} {
  %w = bmt.get_global @q.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @d.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "d.0"} {
  %0 = bmt.aten "aten::relu"(%x) : (!bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @d.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "d.1"} {
  %0 = bmt.aten "aten::relu"(%x) : (!bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// Blocks whose own sublayers are identical per block, and a second list
// elsewhere (an encoder and a decoder stack); nothing inside a block is searched.
// CHECK-LABEL: {{^}}module {
// CHECK-DAG: bmt.block_list @enc in @forward : [@enc.0.forward, @enc.1.forward]
// CHECK-DAG: bmt.block_list @dec in @forward : [@dec.0.forward, @dec.1.forward]
// CHECK-NOT: bmt.block_list
bmt.parameter @enc.0.f.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @enc.1.f.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @dec.0.f.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @dec.1.f.w : tensor<8x8xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %0 = call @enc.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @enc.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = call @dec.0.forward(%1, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = call @dec.1.forward(%2, %x) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
func.func private @enc.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "enc.0"} {
  %0 = call @enc.0.f.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @enc.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "enc.1"} {
  %0 = call @enc.1.f.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @dec.0.forward(%x: !bmt.tensor, %m: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "dec.0"} {
  %0 = call @dec.0.f.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::add.Tensor"(%0, %m, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @dec.1.forward(%x: !bmt.tensor, %m: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "dec.1"} {
  %0 = call @dec.1.f.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::add.Tensor"(%0, %m, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}
func.func private @enc.0.f.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "enc.0.f"} {
  %w = bmt.get_global @enc.0.f.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @enc.1.f.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "enc.1.f"} {
  %w = bmt.get_global @enc.1.f.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @dec.0.f.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "dec.0.f"} {
  %w = bmt.get_global @dec.0.f.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @dec.1.f.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "dec.1.f"} {
  %w = bmt.get_global @dec.1.f.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}

// -----

// GPT-2 whose vocabulary is as large as its positions: the token and the
// position embedding are identical layers, and the position ids are
// arange(size(token embedding)); a dependence through a shape is no chain,
// so the two embeddings are no block list (only h is).
// CHECK-LABEL: {{^}}module {
// CHECK-NOT: @wte.forward, @wpe.forward
// CHECK: bmt.block_list @h in @forward : [@h.0.forward, @h.1.forward]
// CHECK-NOT: bmt.block_list
bmt.parameter @wte.weight : tensor<16x8xf32> {requires_grad}
bmt.parameter @wpe.weight : tensor<16x8xf32> {requires_grad}
bmt.parameter @h.0.w : tensor<8x8xf32> {requires_grad}
bmt.parameter @h.1.w : tensor<8x8xf32> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> !bmt.tensor {
  %0 = call @wte.forward(%ids) : (!bmt.tensor) -> !bmt.tensor
  %n = bmt.aten "aten::size.int"(%0, 1) : (!bmt.tensor) -> i64
  %pos = bmt.aten "aten::arange"(%n, #bmt.none, #bmt.none, #bmt.device<"cpu">, false) : (i64) -> !bmt.tensor
  %1 = call @wpe.forward(%pos) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::add.Tensor"(%0, %1, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = call @h.0.forward(%2) : (!bmt.tensor) -> !bmt.tensor
  %4 = call @h.1.forward(%3) : (!bmt.tensor) -> !bmt.tensor
  return %4 : !bmt.tensor
}
func.func private @wte.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "wte"} {
  %w = bmt.get_global @wte.weight : !bmt.tensor
  %0 = bmt.aten "aten::embedding"(%w, %x, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @wpe.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "wpe"} {
  %w = bmt.get_global @wpe.weight : !bmt.tensor
  %0 = bmt.aten "aten::embedding"(%w, %x, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w = bmt.get_global @h.0.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w = bmt.get_global @h.1.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
