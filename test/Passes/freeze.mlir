// RUN: bmt-opt %s --bmt-freeze='patterns=emb.*,h.[0].*' 2>&1 | FileCheck %s
// RUN: bmt-opt %s --bmt-freeze='patterns=h.{0,1}.b,head.w' --bmt-find-blocks --bmt-zero='alignment=64' 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: bmt-opt %s --bmt-freeze='patterns=h.[0-1].*' --bmt-find-blocks --bmt-zero='alignment=64' --bmt-summary='world-size=2' -o /dev/null 2>&1 | FileCheck %s --check-prefix=SUMMARY
// RUN: not bmt-opt %s --bmt-freeze='patterns=h.0.w,h.2.*' -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOMATCH
// RUN: not bmt-opt %s --bmt-freeze='patterns=*' -o /dev/null 2>&1 | FileCheck %s --check-prefix=ALL
// RUN: not bmt-opt %s --bmt-freeze='patterns=h.0.w,,emb.w' -o /dev/null 2>&1 | FileCheck %s --check-prefix=EMPTY
// RUN: not bmt-opt %s --bmt-freeze='patterns=h.[0' -o /dev/null 2>&1 | FileCheck %s --check-prefix=BADGLOB
// A module frozen before (a trace of frozen parameters): bmt-zero refuses it.
// RUN: bmt-opt %s --bmt-freeze='patterns=h.*' -o %t.mlir 2>/dev/null
// RUN: sed -e 's/ {aliases = \["head.w"\], requires_grad}/ {aliases = ["head.w"]}/' %t.mlir > %t.frozen.mlir
// RUN: not bmt-opt %t.frozen.mlir --bmt-find-blocks --bmt-zero -o /dev/null 2>&1 | FileCheck %s --check-prefix=ZEROALL

// Globs over whole names: `h.[0].*` freezes block 0, not block 1; a tied
// parameter is frozen by its own name or an alias.
// CHECK: remark: bmt-freeze: froze 3 parameters (50 elements)
// CHECK: bmt.parameter @emb.w : tensor<4x5xf32> {aliases = ["head.w"]}
// CHECK-NEXT: bmt.parameter @h.0.w : tensor<5x5xf32>{{$}}
// CHECK-NEXT: bmt.parameter @h.0.b : tensor<5xf32>{{$}}
// CHECK-NEXT: bmt.parameter @h.1.w : tensor<5x5xf32> {requires_grad}
// CHECK-NEXT: bmt.parameter @h.1.b : tensor<5xf32> {requires_grad}

// Brace alternatives (their commas do not separate patterns); frozen
// parameters in frozen storage groups of their own, per block (and outside
// the blocks), sharded as the trainable ones.
// ZERO: remark: bmt-freeze: froze 3 parameters (30 elements)
// ZERO: remark: bmt-zero: ZeRO-3, 2 block storage groups (256 bytes), 0 outside blocks (0 bytes), 3 of frozen parameters (256 bytes)
// ZERO: bmt.storage_group @h.0.float32 : f32 {alignment = 64 : i64, block = @h, block_index = 0 : i64, offsets = array<i64: 0>, params = [@h.0.w], size = 32 : i64}
// ZERO-NEXT: bmt.storage_group @h.0.frozen.float32 : f32 {alignment = 64 : i64, block = @h, block_index = 0 : i64, frozen, offsets = array<i64: 0>, params = [@h.0.b], size = 16 : i64}
// ZERO-NEXT: bmt.storage_group @h.1.float32 : f32 {alignment = 64 : i64, block = @h, block_index = 1 : i64, offsets = array<i64: 0>, params = [@h.1.w], size = 32 : i64}
// ZERO-NEXT: bmt.storage_group @h.1.frozen.float32 : f32 {alignment = 64 : i64, block = @h, block_index = 1 : i64, frozen, offsets = array<i64: 0>, params = [@h.1.b], size = 16 : i64}
// ZERO-NEXT: bmt.storage_group @outside_blocks.frozen.float32 : f32 {alignment = 64 : i64, frozen, offsets = array<i64: 0>, params = [@emb.w], size = 32 : i64}
// ZERO-NOT: bmt.storage_group

// SUMMARY: parameters: 80 elements in 5 tensors (320 B), 4 frozen (60 elements)
// SUMMARY: storage groups: 3 (512 B, 512 bytes; 2 of frozen parameters), ZeRO-3
// The frozen 240 B (h.i.w 25 elements, h.i.b 5, in groups of 48 with the
// 64-byte alignment) at 24 elements a block per rank:
// SUMMARY: frozen parameters (sharded over 2 ranks, no gradient or optimizer state): 192 B (192 bytes per rank)

// NOMATCH: error: bmt-freeze: pattern 'h.2.*' matches no parameter
// ALL: error: bmt-freeze: every parameter is frozen, so nothing would train ('*' matches all 5)
// EMPTY: error: bmt-freeze: empty pattern in 'h.0.w,,emb.w'
// BADGLOB: error: bmt-freeze: pattern 'h.[0' is not a glob: {{.+}}
// ZEROALL: error: bmt-zero: every parameter is frozen (requires_grad false in the trace or --freeze), so there is nothing to train

bmt.parameter @emb.w : tensor<4x5xf32> {aliases = ["head.w"], requires_grad}
bmt.parameter @h.0.w : tensor<5x5xf32> {requires_grad}
bmt.parameter @h.0.b : tensor<5xf32> {requires_grad}
bmt.parameter @h.1.w : tensor<5x5xf32> {requires_grad}
bmt.parameter @h.1.b : tensor<5xf32> {requires_grad}
func.func @forward(%ids: !bmt.tensor) -> !bmt.tensor {
  %e = bmt.get_global @emb.w : !bmt.tensor
  %x = bmt.aten "aten::embedding"(%e, %ids, -1, false, false) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  %0 = call @h.0.forward(%x) : (!bmt.tensor) -> !bmt.tensor
  %1 = call @h.1.forward(%0) : (!bmt.tensor) -> !bmt.tensor
  %2 = bmt.aten "aten::linear"(%1, %e, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %2 : !bmt.tensor
}
func.func private @h.0.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.0"} {
  %w = bmt.get_global @h.0.w : !bmt.tensor
  %b = bmt.get_global @h.0.b : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, %b) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
func.func private @h.1.forward(%x: !bmt.tensor) -> !bmt.tensor attributes {bmt.module_path = "h.1"} {
  %w = bmt.get_global @h.1.w : !bmt.tensor
  %b = bmt.get_global @h.1.b : !bmt.tensor
  %0 = bmt.aten "aten::linear"(%x, %w, %b) : (!bmt.tensor, !bmt.tensor, !bmt.tensor) -> !bmt.tensor
  return %0 : !bmt.tensor
}
