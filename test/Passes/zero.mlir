// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-zero='alignment=64' 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-zero='stage=2 shard-group-size=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=STAGE2
// RUN: not bmt-opt %s --split-input-file --bmt-zero='stage=1' -o /dev/null 2>&1 | FileCheck %s --check-prefix=BADSTAGE
// RUN: not bmt-opt %s --split-input-file --bmt-zero='alignment=100' -o /dev/null 2>&1 | FileCheck %s --check-prefix=BADALIGN

// STAGE2: remark: bmt-zero: ZeRO-2, 4 block storage groups (3072 bytes), 1 outside blocks (1024 bytes), 1 of frozen parameters (512 bytes); 1 parameters shared by several blocks kept outside
// BADSTAGE: error: bmt-zero: stage must be 2 or 3, got 1
// BADALIGN: error: bmt-zero: alignment must be a power of two of at least 8 bytes, got 100

// Each block's parameters in one group per dtype, offsets aligned to 64
// bytes (16 f32 or 32 bf16 elements); the embedding (tied to the head) and
// a weight shared by both blocks outside the blocks; a frozen parameter in
// a frozen group of its own (sharded, never reduced).
// CHECK-LABEL: {{^}}module attributes {bmt.zero = {shard_group_size = 0 : i64, stage = 3 : i64}}
// CHECK: bmt.block_list @h
// CHECK-NEXT: bmt.storage_group @h.0.float32 : f32 {alignment = 64 : i64, block = @h, block_index = 0 : i64, offsets = array<i64: 0, 80>, params = [@h.0.w, @h.0.b], size = 96 : i64}
// CHECK-NEXT: bmt.storage_group @h.0.bfloat16 : bf16 {alignment = 64 : i64, block = @h, block_index = 0 : i64, offsets = array<i64: 0>, params = [@h.0.g], size = 32 : i64}
// CHECK-NEXT: bmt.storage_group @h.1.float32 : f32 {alignment = 64 : i64, block = @h, block_index = 1 : i64, offsets = array<i64: 0, 80>, params = [@h.1.w, @h.1.b], size = 96 : i64}
// CHECK-NEXT: bmt.storage_group @h.1.bfloat16 : bf16 {alignment = 64 : i64, block = @h, block_index = 1 : i64, offsets = array<i64: 0>, params = [@h.1.g], size = 32 : i64}
// CHECK-NEXT: bmt.storage_group @outside_blocks.float32 : f32 {alignment = 64 : i64, offsets = array<i64: 0, 32>, params = [@emb.w, @shared.w], size = 48 : i64}
// CHECK-NEXT: bmt.storage_group @outside_blocks.frozen.float32 : f32 {alignment = 64 : i64, frozen, offsets = array<i64: 0>, params = [@frozen.w], size = 16 : i64}
// CHECK-NOT: bmt.storage_group
bmt.parameter @emb.w : tensor<4x5xf32> {aliases = ["head.w"], requires_grad}
bmt.parameter @shared.w : tensor<5xf32> {requires_grad}
bmt.parameter @frozen.w : tensor<5xf32>
bmt.parameter @h.0.w : tensor<5x15xf32> {requires_grad}
bmt.parameter @h.0.b : tensor<5xf32> {requires_grad}
bmt.parameter @h.0.g : tensor<5xbf16> {requires_grad}
bmt.parameter @h.1.w : tensor<5x15xf32> {requires_grad}
bmt.parameter @h.1.b : tensor<5xf32> {requires_grad}
bmt.parameter @h.1.g : tensor<5xbf16> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> !bmt.tensor {
  %e = bmt.get_global @emb.w : !bmt.tensor
  %f = bmt.get_global @frozen.w : !bmt.tensor
  %x = bmt.aten "aten::embedding"(%e, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Tensor"(%1, %f) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %e, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w = bmt.get_global @h.0.w : !bmt.tensor
  %b = bmt.get_global @h.0.b : !bmt.tensor
  %g = bmt.get_global @h.0.g : !bmt.tensor
  %s = bmt.get_global @shared.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, %b) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mul.Tensor"(%0, %g) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Tensor"(%1, %s) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w = bmt.get_global @h.1.w : !bmt.tensor
  %b = bmt.get_global @h.1.b : !bmt.tensor
  %g = bmt.get_global @h.1.g : !bmt.tensor
  %s = bmt.get_global @shared.w : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, %b) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mul.Tensor"(%0, %g) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::mul.Tensor"(%1, %s) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}

// -----

// Without block lists every trainable parameter is outside the blocks.
// CHECK-LABEL: {{^}}module attributes
// CHECK: bmt.storage_group @outside_blocks.float32 : f32 {alignment = 64 : i64, offsets = array<i64: 0, 16>, params = [@a.w, @b.w], size = 32 : i64}
bmt.parameter @a.w : tensor<3xf32> {requires_grad}
bmt.parameter @b.w : tensor<3xf32> {requires_grad}
func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
  %a = bmt.get_global @a.w : !bmt.tensor
  %b = bmt.get_global @b.w : !bmt.tensor
  %0 = bmt.aten "aten::mul.Tensor"(%x, %a) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %1 = bmt.aten "aten::mul.Tensor"(%0, %b) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %1 : !bmt.tensor
}

// The summary after both passes: blocks, groups, and the per-rank memory
// estimate of docs/passes/memory-estimate.md at world size 2: shards of 120 f32 elements x
// 16 bytes (parameter, gradient, AdamW state) and 32 bf16 x 16 (with fp32
// master weights) = 2432 B; gathered: the outside group and its gradient
// (2 x 192 B) plus, at prefetch depth 1, two gathered blocks and one block
// gradient (3 x 448 B) = 1728 B, and the frozen group gathered (64 B); the
// frozen group of 16 f32 elements (5 and the alignment) sharded: 8 per rank
// (32 B); activations of 1024 tokens.
// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-zero='alignment=64' --bmt-summary='world-size=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=SUMMARY
// RUN: bmt-opt %s --split-input-file --bmt-find-blocks --bmt-zero='alignment=64' --bmt-summary='world-size=4' -o /dev/null 2>&1 | FileCheck %s --check-prefix=SUMMARY4
// SUMMARY: blocks: 2 in h (h.0 ... h.1), 85 parameters each
// SUMMARY-NEXT: outside blocks: 25 parameters
// SUMMARY-NEXT: storage groups: 6 (1.1 KiB, 1152 bytes; 1 of frozen parameters), ZeRO-3
// SUMMARY-NEXT: memory per rank at world size 2 (micro-batch 1, seq-len 1024): about 180.2 KiB (184480 bytes)
// SUMMARY-NEXT: parameter, gradient and optimizer shards: 2.4 KiB (sharded over 2)
// SUMMARY-NEXT: frozen parameters (sharded over 2 ranks, no gradient or optimizer state): 32 B (32 bytes per rank)
// SUMMARY-NEXT: gathered parameters and gradients: 1.8 KiB
// SUMMARY-NEXT: activations: 176.0 KiB

// -----

// Parameters split over the expert group (here E = 2) get a group of their
// own, sized by their local slices: 2 of 4 experts x 3 = 6 elements. At
// world size 4 (this third input's summary) the dense group's 16 elements
// are sharded over 4 ranks and the expert slices' 16 over the 2 that hold
// the same experts: (4 + 8) x 16 bytes (parameter, gradient, AdamW state).
// SUMMARY4: parameter, gradient and optimizer shards: {{.*}} (sharded over 4)
// SUMMARY4: parameter, gradient and optimizer shards: {{.*}} (sharded over 4)
// SUMMARY4: parameter, gradient and optimizer shards: 192 B (sharded over 4; expert slices over 2)
// CHECK-LABEL: {{^}}module attributes
// CHECK: bmt.storage_group @outside_blocks.float32 : f32 {alignment = 64 : i64, offsets = array<i64: 0>, params = [@a.w], size = 16 : i64}
// CHECK-NEXT: bmt.storage_group @outside_blocks.experts.float32 : f32 {alignment = 64 : i64, offsets = array<i64: 0>, params = [@e.w], size = 16 : i64}
module attributes {bmt.expert_parallel = 2 : i64} {
  bmt.parameter @a.w : tensor<3xf32> {requires_grad}
  bmt.parameter @e.w : tensor<4x3xf32> {bmt.tensor_split = #bmt.tensor_split<dim = 0, chunks = 1, over = "expert">, requires_grad}
  func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
    %a = bmt.get_global @a.w : !bmt.tensor
    %e = bmt.get_global @e.w : !bmt.tensor
    %0 = bmt.aten "aten::mul.Tensor"(%x, %a) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    %1 = bmt.aten "aten::mul.Tensor"(%0, %e) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %1 : !bmt.tensor
  }
}
