// RUN: bmt-opt %s --split-input-file --verify-diagnostics --bmt-overlap -o /dev/null
// RUN: not bmt-opt %s --split-input-file --bmt-overlap='depth=-1' -o /dev/null 2>&1 | FileCheck %s --check-prefix=DEPTH
// RUN: not bmt-opt %s --split-input-file --bmt-find-blocks --bmt-zero --bmt-overlap --bmt-overlap -o /dev/null 2>&1 | FileCheck %s --check-prefix=TWICE

// DEPTH: error: bmt-overlap: depth must be 0 or positive, got -1
// TWICE: error: bmt-overlap: the module is already scheduled

// Block lists but no storage groups: --bmt-zero has not run.
// expected-error @+1 {{bmt-overlap: the module has block lists but no storage groups; run --bmt-zero before --bmt-overlap}}
module {
  bmt.parameter @h.0.w : tensor<8x8xf32> {requires_grad}
  bmt.parameter @h.1.w : tensor<8x8xf32> {requires_grad}
  bmt.block_list @h in @forward : [@h.0.forward, @h.1.forward]
  func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
    %0 = call @h.0.forward(%x) {bmt.block = @h, bmt.block_index = 0 : i64} : (!bmt.tensor) -> !bmt.tensor
    %1 = call @h.1.forward(%0) {bmt.block = @h, bmt.block_index = 1 : i64} : (!bmt.tensor) -> !bmt.tensor
    return %1 : !bmt.tensor
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
}

// -----

// Already scheduled: a second run is refused.
// expected-error @+1 {{bmt-overlap: the module is already scheduled}}
module attributes {bmt.overlap = {prefetch_depth = 1 : i64}, bmt.zero = {shard_group_size = 0 : i64, stage = 3 : i64}} {
  bmt.parameter @w : tensor<8x8xf32> {requires_grad}
  bmt.storage_group @outside_blocks.float32 : f32 {alignment = 512 : i64, offsets = array<i64: 0>, params = [@w], size = 128 : i64}
  func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
    bmt.all_gather @outside_blocks.float32
    %w = bmt.get_global @w : !bmt.tensor
    %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %0 : !bmt.tensor
  }
}

// -----

// No storage groups and no blocks: nothing to do, said in a remark.
// expected-remark @+1 {{bmt-overlap: no storage groups; nothing to gather (run --bmt-zero first)}}
module {
  bmt.parameter @w : tensor<8x8xf32> {requires_grad}
  func.func @forward(%x: !bmt.tensor) -> !bmt.tensor {
    %w = bmt.get_global @w : !bmt.tensor
    %0 = bmt.aten "aten::linear"(%x, %w, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
    return %0 : !bmt.tensor
  }
}
