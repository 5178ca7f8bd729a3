// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2' 2>/dev/null | FileCheck %s
// RUN: bmt-opt %s --bmt-find-blocks --bmt-zero --bmt-checkpoint --bmt-pipeline-parallel='pipeline-parallel=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK

// bmt-zero puts the parameters outside the blocks in one storage group
// (outside_blocks.float32); a pipeline splits it by the stages that read
// them, so that stage 0 holds the embedding (and the position table read
// only there) and stage 1 the final norm and the untied head, each group
// laid out as bmt-zero lays one out (members at multiples of 512 bytes).

// CHECK-NOT: @outside_blocks.float32
// CHECK: bmt.storage_group @outside_blocks.stage0.float32 : f32 {alignment = 512 : i64, offsets = array<i64: 0, 2048>, params = [@emb.w, @pos.w], size = 2176 : i64}
// CHECK: bmt.storage_group @outside_blocks.stage1.float32 : f32 {alignment = 512 : i64, offsets = array<i64: 0, 128>, params = [@norm.w, @head.w], size = 2176 : i64}
// CHECK-NOT: @outside_blocks.float32
// REMARK: bmt-pipeline-parallel: 2 blocks of h in 2 stages (blocks per stage: 1 1), 1 data-parallel rank per stage; the parameters outside the blocks in 2 storage groups by the stages that read them

bmt.parameter @emb.w : tensor<64x32xf32> {requires_grad}
bmt.parameter @pos.w : tensor<4x32xf32> {requires_grad}
bmt.parameter @h.0.w : tensor<32x32xf32> {requires_grad}
bmt.parameter @h.1.w : tensor<32x32xf32> {requires_grad}
bmt.parameter @norm.w : tensor<32xf32> {requires_grad}
bmt.parameter @head.w : tensor<64x32xf32> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> !bmt.tensor {
  %e = bmt.get_global @emb.w : !bmt.tensor
  %p = bmt.get_global @pos.w : !bmt.tensor
  %x = bmt.aten "aten::embedding"(%e, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %y = bmt.aten "aten::add.Tensor"(%x, %p, 1) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.0.forward(%y) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %n = bmt.get_global @norm.w : !bmt.tensor
  %2 = bmt.aten "aten::mul.Tensor"(%1, %n) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %w = bmt.get_global @head.w : !bmt.tensor
  %3 = bmt.aten "aten::linear"(%2, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %3 : !bmt.tensor
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
