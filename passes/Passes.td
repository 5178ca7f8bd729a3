//===- Passes.td - bmt passes ------------------------------*- tablegen -*-===//
//
// Every bmt pass, one definition each; the implementation of pass X is
// passes/X.cpp and its lit test test/Passes/X.mlir (or .test).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_TD
#define BMT_PASSES_TD

include "mlir/Pass/PassBase.td"

def Summary : Pass<"bmt-summary", "::mlir::ModuleOp"> {
  let summary = "Print a summary of the model's parameters, buffers and functions";
  let description = [{
    Prints to stderr, without changing the IR:

    ```
    bmt summary of gpt2.pt
      parameters: 59264 elements in 27 tensors (231.5 KiB)
      tied: 1 (transformer.wte.weight = lm_head.weight)
      buffers: 0 tensors
      functions: 14, calls: 13, aten ops: 120
    ```

    Element counts count tied parameters once, as
    `sum(p.numel() for p in model.parameters())` does. After
    `--bmt-find-blocks` and `--bmt-zero` it also prints the block lists and
    the storage groups, and with `world-size=N` an estimate of the
    parameter memory per rank.
  }];
  let options = [
    Option<"worldSize", "world-size", "int64_t", "0",
           "estimate per-rank parameter memory for this many ranks (0: no estimate)">,
  ];
}

def FindBlocks : Pass<"bmt-find-blocks", "::mlir::ModuleOp"> {
  let summary = "Find the repeated transformer layers and group them into block lists";
  let description = [{
    Walks the call tree from `@forward` and, in each function, looks for runs
    of two or more calls in which each call consumes a result of the previous
    one and every callee is a distinct function with the same structure: the
    same ops, attributes, types and wiring, and parameters of the same shapes
    at the same paths relative to the callee's module (`transformer.h.0`'s
    `attn.c_attn.weight` matches `transformer.h.1`'s), the callees' own
    callees compared the same way. Callees that use no parameter are not
    blocks. Each run becomes a `bmt.block_list` named by the callees' common
    module path (`transformer.h`, `model.layers`, `bert.encoder.layer`), and
    its calls get `bmt.block` and `bmt.block_index`. The search does not look
    inside a block.

    Emits a remark per block list ("2 blocks in transformer.h: ...") and, for
    a model without repeated layers, a remark saying so; the IR is then
    unchanged and the whole model is sharded as one unit by later passes.
  }];
  let dependentDialects = ["::bmt::BmtDialect"];
}

def Zero : Pass<"bmt-zero", "::mlir::ModuleOp"> {
  let summary = "Lay the trainable parameters out as flat, sharded storage groups (ZeRO-3/2)";
  let description = [{
    After `--bmt-find-blocks`: puts the trainable parameters of each block,
    per dtype, into one `bmt.storage_group` (offsets aligned to `alignment`
    bytes, in declaration order), and everything else into the groups of
    `outside_blocks` (embeddings, final norm, head). A parameter used by more
    than one block (weights shared across layers) also goes outside the
    blocks. Records the ZeRO stage and the hybrid shard group size in the
    module attribute `bmt.zero` for the runtime: stage 3 gathers a block's
    parameters before its forward and again before its backward, stage 2
    keeps them gathered from forward to backward; a shard group size G > 0
    shards within groups of G ranks and replicates across groups.
    Without block lists, every parameter goes outside the blocks (one unit).
  }];
  let options = [
    Option<"stage", "stage", "int64_t", "3", "ZeRO stage: 3 or 2">,
    Option<"alignment", "alignment", "int64_t", "512",
           "alignment of each parameter in its group, in bytes">,
    Option<"shardGroupSize", "shard-group-size", "int64_t", "0",
           "hybrid sharding: shard within groups of this many ranks (0: all ranks)">,
  ];
  let dependentDialects = ["::bmt::BmtDialect"];
}

#endif // BMT_PASSES_TD
