//===- BmtOps.td - bmt dialect operations ------------------*- tablegen -*-===//

#ifndef BMT_OPS_TD
#define BMT_OPS_TD

include "bmt/Dialect/BmtDialect.td"
include "bmt/Dialect/BmtTypes.td"
include "bmt/Dialect/BmtAttrs.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

//===----------------------------------------------------------------------===//
// Module-level state
//===----------------------------------------------------------------------===//

def Bmt_ParameterOp : Bmt_Op<"parameter", [Symbol, HasParent<"::mlir::ModuleOp">]> {
  let summary = "a trainable parameter of the model";
  let description = [{
    One parameter tensor. `type` gives its shape and dtype (f32, f16, bf16,
    f64, i64, ...). Tied parameters (one storage reachable under several
    names, such as GPT-2's `transformer.wte.weight` and `lm_head.weight`) are
    one symbol: the first name in module order is `sym_name`, the others are
    listed in `aliases`.

    ```mlir
    bmt.parameter @transformer.wte.weight : tensor<1000x64xf32> {aliases = ["lm_head.weight"], requires_grad}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<AnyRankedTensor>:$type,
                       UnitAttr:$requires_grad,
                       OptionalAttr<StrArrayAttr>:$aliases);
  let assemblyFormat = "$sym_name `:` $type attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Number of elements of the parameter.
    int64_t getNumElements();
  }];
}

def Bmt_BufferOp : Bmt_Op<"buffer", [Symbol, HasParent<"::mlir::ModuleOp">]> {
  let summary = "a non-trainable tensor of the model (a registered buffer or a traced constant)";
  let description = [{
    A buffer as registered with `register_buffer`, or a plain tensor
    attribute of a module. `persistent` marks buffers known to be part of the
    state dict (TorchScript archives do not record this, so their buffers
    never carry it). Ties are handled as for `bmt.parameter`.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<AnyRankedTensor>:$type,
                       UnitAttr:$persistent,
                       OptionalAttr<StrArrayAttr>:$aliases);
  let assemblyFormat = "$sym_name `:` $type attr-dict";
  let hasVerifier = 1;
}

def Bmt_GetGlobalOp : Bmt_Op<"get_global", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "the value of a parameter or buffer";
  let arguments = (ins FlatSymbolRefAttr:$global);
  let results = (outs Bmt_TensorType:$result);
  let assemblyFormat = "$global attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Distribution structure (added by passes)
//===----------------------------------------------------------------------===//

def Bmt_BlockListOp : Bmt_Op<"block_list", [Symbol, HasParent<"::mlir::ModuleOp">,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "a sequence of structurally identical transformer layers";
  let description = [{
    Found by `--bmt-find-blocks`: the function `caller` calls `blocks` in this
    order, each call consuming the previous one's result, and every block
    function has the same body up to the names of its parameters (BMTrain's
    TransformerBlockList of CheckpointBlocks). Each such call carries
    `bmt.block = @<this list>` and `bmt.block_index`. Later passes shard,
    checkpoint and prefetch per block.

    ```mlir
    bmt.block_list @transformer.h in @transformer.forward : [@transformer.h.0.forward, @transformer.h.1.forward]
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, FlatSymbolRefAttr:$caller,
                       FlatSymbolRefArrayAttr:$blocks);
  let assemblyFormat = "$sym_name `in` $caller `:` $blocks attr-dict";
  let hasVerifier = 1;
}

def Bmt_StorageGroupOp : Bmt_Op<"storage_group", [Symbol, HasParent<"::mlir::ModuleOp">,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "parameters stored as one flat, sharded buffer";
  let description = [{
    Made by `--bmt-zero`: the trainable parameters of one block (or of
    everything outside the blocks) of one dtype, or with `frozen` its frozen
    parameters (requires_grad false), laid out back to back in one
    flat buffer of `size` elements, parameter i at element `offsets[i]`
    (each offset a multiple of `alignment` bytes, as BMTrain aligns its
    storages). At run time every rank holds a 1/N slice of the buffer (the
    buffer padded to a multiple of N), all-gathers it before the block runs
    and reduce-scatters its gradient after (a `frozen` group has no gradient,
    no master and no optimizer state: it is only gathered and freed, like
    the trainable groups of its block); sharded.pt stores the buffer as
    is, so that rank r reads one contiguous range. `block` and
    `block_index` name the block it belongs to; absent for the group of
    everything outside blocks.

    ```mlir
    bmt.storage_group @transformer.h.0.float32 : f32 {alignment = 512 : i64, block = @transformer.h, block_index = 0 : i64, offsets = array<i64: 0, 128>, params = [@transformer.h.0.ln_1.weight, @transformer.h.0.ln_1.bias], size = 160 : i64}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttr:$element_type,
                       FlatSymbolRefArrayAttr:$params, DenseI64ArrayAttr:$offsets,
                       I64Attr:$size, I64Attr:$alignment,
                       OptionalAttr<FlatSymbolRefAttr>:$block,
                       OptionalAttr<I64Attr>:$block_index,
                       UnitAttr:$frozen);
  let assemblyFormat = "$sym_name `:` $element_type attr-dict";
  let hasVerifier = 1;
}

def Bmt_AllGatherOp : Bmt_Op<"all_gather", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "start the all-gather of a storage group";
  let description = [{
    Placed by `--bmt-overlap` in the function that calls a block list: starts
    gathering the full buffer of `group` from every rank's shard. The runtime
    does not wait for it here; the call of the block that reads the group
    waits. Putting the gather of block i+1 before the call of block i is the
    prefetch that overlaps communication with block i's compute.

    ```mlir
    bmt.all_gather @transformer.h.1.float32
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$group);
  let assemblyFormat = "$group attr-dict";
}

def Bmt_ReleaseOp : Bmt_Op<"release", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "free the gathered buffer of a storage group (ZeRO-3)";
  let description = [{
    Placed by `--bmt-overlap` after the call of the block that owns `group`
    when the ZeRO stage is 3: the gathered buffer is freed and gathered again
    before the block's backward. Under ZeRO-2 no release is placed and the
    buffer lives until the block's backward has run.

    ```mlir
    bmt.release @transformer.h.0.float32
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$group);
  let assemblyFormat = "$group attr-dict";
}

def Bmt_TpCopyOp : Bmt_Op<"tp_copy", [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "enter a column-parallel chain: identity forward, gradient summed over the TP group";
  let description = [{
    Placed by `--bmt-tensor-parallel` on the replicated input of the
    column-parallel matmuls of one chain (Megatron-LM's "f"). Forward it
    returns its input; in backward the gradient is summed over the `grid`
    (the tensor-parallel group: the ranks with the same data-parallel rank).
    The runtime runs it as the plan's `TpCopy` instruction.

    ```mlir
    %x1 = bmt.tp_copy %x over @tp : !bmt.tensor
    ```
  }];
  let arguments = (ins Bmt_TensorType:$input, FlatSymbolRefAttr:$grid);
  let results = (outs Bmt_TensorType:$result);
  let assemblyFormat = "$input `over` $grid attr-dict `:` type($input)";
}

def Bmt_TpAllReduceOp : Bmt_Op<"tp_all_reduce", [AllTypesMatch<["input", "result"]>]> {
  let summary = "leave a row-parallel chain: the sum over the TP group of the partial results";
  let description = [{
    Placed by `--bmt-tensor-parallel` after the row-parallel matmul that
    ends a chain (Megatron-LM's "g"): every rank of `grid` holds a partial
    sum; the result is the sum over the group. Backward passes the gradient
    unchanged. The runtime runs it as the plan's `TpAllReduce` instruction.

    ```mlir
    %y = bmt.tp_all_reduce %partial over @tp : !bmt.tensor
    ```
  }];
  let arguments = (ins Bmt_TensorType:$input, FlatSymbolRefAttr:$grid);
  let results = (outs Bmt_TensorType:$result);
  let assemblyFormat = "$input `over` $grid attr-dict `:` type($input)";
}

def Bmt_TpAllGatherOp : Bmt_Op<"tp_all_gather", [AllTypesMatch<["input", "result"]>]> {
  let summary = "enter a column-parallel chain under sequence parallelism: all-gather along `dim`";
  let description = [{
    Placed by `--bmt-tensor-parallel` with `sequence-parallel` where
    `bmt.tp_copy` would be: every rank of `grid` holds its part of the
    sequence (dim `dim`); the result is the parts concatenated in rank
    order. Backward: the gradient summed over the group, each rank keeping
    its part (a reduce-scatter along `dim`). The runtime runs it as the
    plan's `TpAllGather` instruction.

    ```mlir
    %x = bmt.tp_all_gather %part over @tp dim 1 : !bmt.tensor
    ```
  }];
  let arguments = (ins Bmt_TensorType:$input, FlatSymbolRefAttr:$grid, I64Attr:$dim);
  let results = (outs Bmt_TensorType:$result);
  let assemblyFormat = "$input `over` $grid `dim` $dim attr-dict `:` type($input)";
}

def Bmt_TpReduceScatterOp : Bmt_Op<"tp_reduce_scatter", [AllTypesMatch<["input", "result"]>]> {
  let summary = "leave a row-parallel chain under sequence parallelism: reduce-scatter along `dim`";
  let description = [{
    Placed by `--bmt-tensor-parallel` with `sequence-parallel` where
    `bmt.tp_all_reduce` would be: the sum over `grid` of the partial
    results, of which each rank keeps its part of dim `dim` (the sequence),
    1 / T of it. Backward: the gradient all-gathered along `dim`. The
    runtime runs it as the plan's `TpReduceScatter` instruction; the size
    of `dim` must be a multiple of T.

    ```mlir
    %y = bmt.tp_reduce_scatter %partial over @tp dim 1 : !bmt.tensor
    ```
  }];
  let arguments = (ins Bmt_TensorType:$input, FlatSymbolRefAttr:$grid, I64Attr:$dim);
  let results = (outs Bmt_TensorType:$result);
  let assemblyFormat = "$input `over` $grid `dim` $dim attr-dict `:` type($input)";
}

def Bmt_TpRankOp : Bmt_Op<"tp_rank", [Pure]> {
  let summary = "this rank's index in the tensor-parallel group";
  let description = [{
    Placed by `--bmt-tensor-parallel` where the program needs to know which
    slice a rank holds (the vocab offset of a vocab-parallel embedding), so
    that one program serves every TP rank. The runtime runs it as the plan's
    `TpRank` instruction: an int, like a constant.

    ```mlir
    %t = bmt.tp_rank over @tp
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$grid);
  let results = (outs I64:$result);
  let assemblyFormat = "`over` $grid attr-dict";
}

//===----------------------------------------------------------------------===//
// Mixture of experts (added by --bmt-moe-layers)
//===----------------------------------------------------------------------===//

def Bmt_MoeDispatchOp : Bmt_Op<"moe_dispatch"> {
  let summary = "sort a MoE layer's token copies by expert (transformers' grouped_mm dispatch)";
  let description = [{
    Made by `--bmt-moe-layers` (docs/passes/moe-layers.md) from the ATen ops
    that transformers' grouped_mm experts record before their first
    `aten::_grouped_mm`. With `hidden` [T, H], `expert_ids` [T, K] (int64,
    the top-k experts of each token) and E = `num_experts`:

    - `permutation` [T*K] int64 and `sorted_ids` [T*K] int64: `aten::sort`
      (not stable, ascending) of `expert_ids` flattened;
    - `rows` [T*K, H]: `hidden[permutation floordiv K]`, each token copied
      once per chosen expert, grouped by expert;
    - `offsets` [E] int32: `cumsum(histc(float(sorted_ids), E, 0, E - 1))`,
      the end of each expert's rows, as `aten::_grouped_mm` reads them.

    The results equal those ATen ops' bit for bit. Without `weights` the
    routing weights are not an operand: the layer's own ops index them by
    `permutation`, as the original program does. Under expert parallelism
    (`--bmt-moe-layers=expert-parallel=E`) the routing weights [T, K] are
    the operand `weights` and the result `routed_weights` is
    `reshape(weights, [-1])[permutation]`: at run time rows, sorted ids,
    offsets and routed weights are those of the rows this rank's experts
    compute, received from the other ranks of its expert group (the
    permutation stays this rank's own).

    ```mlir
    %rows, %sorted, %offsets, %perm = bmt.moe_dispatch %hidden, %ids experts 8 : !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor
    %rows, %sorted, %offsets, %perm, %w = bmt.moe_dispatch %hidden, %ids weights %weights experts 8 : !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor, !bmt.tensor
    ```
  }];
  let arguments = (ins Bmt_TensorType:$hidden, Bmt_TensorType:$expert_ids,
                       Optional<Bmt_TensorType>:$weights, I64Attr:$num_experts);
  let results = (outs Bmt_TensorType:$rows, Bmt_TensorType:$sorted_ids,
                      Bmt_TensorType:$offsets, Bmt_TensorType:$permutation,
                      Optional<Bmt_TensorType>:$routed_weights);
  let assemblyFormat = "$hidden `,` $expert_ids (`weights` $weights^)? `experts` $num_experts attr-dict `:` type(results)";
  let hasVerifier = 1;
}

def Bmt_MoeCombineOp : Bmt_Op<"moe_combine"> {
  let summary = "put a MoE layer's expert outputs back in token order and sum each token's K copies";
  let description = [{
    Made by `--bmt-moe-layers` from the ATen ops after the experts' last
    `aten::_grouped_mm`: with `rows` [T*K, H] in the order of
    `permutation` (a `bmt.moe_dispatch` result) and K = `top_k`, the result
    [T, H] is `rows[inverse(permutation)].view(T, K, H).sum(1)`, the
    inverse made as transformers makes it (`index_put_` of `arange(T*K)`
    at `permutation`). Any weighting by the routing weights stays in the
    layer's ops before it.

    ```mlir
    %out = bmt.moe_combine %rows, %perm top_k %k : !bmt.tensor
    ```
  }];
  let arguments = (ins Bmt_TensorType:$rows, Bmt_TensorType:$permutation, I64:$top_k);
  let results = (outs Bmt_TensorType:$result);
  let assemblyFormat = "$rows `,` $permutation `top_k` $top_k attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Low-rank adapters (added by --bmt-lora)
//===----------------------------------------------------------------------===//

def Bmt_LoraAdapterOp : Bmt_Op<"lora_adapter"> {
  let summary = "a LoRA adapter's output added to its base layer's (peft's LoRA Linear)";
  let description = [{
    Made by `--bmt-lora` (docs/passes/lora.md). With `base` [..., out] the
    frozen layer's output for `input` [..., in], `lora_A` [r, in] and
    `lora_B` [out, r], the result is

      base + scale * linear(linear(dropout(input, p = dropout), lora_A), lora_B)

    (dropout as `aten::native_dropout` in training, from the default
    generator). The runtime runs it as one autograd function: it keeps no
    dropout mask (it draws it again from the saved generator state in
    backward) and adds the adapter into `base` in place inside its last
    matmul. With tensor parallelism `base` may be a row-parallel partial
    sum; `input_parts` = T > 1 says that `input` is this TP rank's part of
    an input split T ways along its last dim (a row-parallel layer's), and
    its dropout mask is then that part of the mask drawn for the whole
    input, so that every T draws the masks of one rank.

    ```mlir
    %y = bmt.lora_adapter %base, %x, %a, %b scale 2.0 dropout 0.05 : !bmt.tensor
    %z = bmt.lora_adapter %base, %x, %a, %b scale 2.0 dropout 0.05 input_parts 2 : !bmt.tensor
    ```
  }];
  let arguments = (ins Bmt_TensorType:$base, Bmt_TensorType:$input, Bmt_TensorType:$lora_a,
                       Bmt_TensorType:$lora_b, F64Attr:$scale, F64Attr:$dropout,
                       DefaultValuedAttr<I64Attr, "1">:$input_parts);
  let results = (outs Bmt_TensorType:$result);
  let assemblyFormat = "$base `,` $input `,` $lora_a `,` $lora_b `scale` $scale `dropout` $dropout (`input_parts` $input_parts^)? attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Computation
//===----------------------------------------------------------------------===//

def Bmt_AtenOp : Bmt_Op<"aten"> {
  let summary = "a call of a PyTorch operator through its schema";
  let description = [{
    Calls the operator `name` (qualified name and overload, e.g.
    `aten::softmax.int`) with every schema argument in order. Constant
    arguments are attributes in `args`; arguments computed at run time are
    operands, marked in `args` by `#bmt.operand`. Lists (`int[]`, `Tensor[]`)
    are nested arrays whose elements may be constants or operands. Integers
    are i64, floats f64, `None` is `#bmt.none`.

    A schema that returns a list (`Tensor[]`) has as many results as the
    list has elements where the program uses them; the list itself is never a
    value.

    ```mlir
    %1 = bmt.aten "aten::softmax.int"(%0, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
    %2 = bmt.aten "aten::view"(%1, [%n, -1, 64]) : (!bmt.tensor, i64) -> !bmt.tensor
    ```

    The operator must be in bmt's operator registry (include/bmt/Dialect/
    AtenOps.def), which also gives its argument and result counts.
  }];
  let arguments = (ins StrAttr:$name, ArrayAttr:$args,
                       Variadic<Bmt_AnyValue>:$operands);
  let results = (outs Variadic<Bmt_AnyValue>:$results);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The operator's qualified name without overload, e.g. "aten::softmax".
    ::llvm::StringRef getOperatorName();
    /// The overload name, e.g. "int"; empty for the default overload.
    ::llvm::StringRef getOverloadName();
  }];
}

def Bmt_ConstantOp : Bmt_Op<"constant", [Pure, ConstantLike,
    DeclareOpInterfaceMethods<InferTypeOpInterface>]> {
  let summary = "a constant value where one is needed as an SSA value";
  let description = [{
    Constants are attributes of the ops that use them; this op makes one a
    value where it flows into a call or a function result. `value` is an
    i64, f64 or bool attribute, `#bmt.none`, a string, a `#bmt.device` or an
    elements attribute (a constant tensor, whose value is `!bmt.tensor`).
    The result type follows from the attribute.

    ```mlir
    %0 = bmt.constant 3 : i64
    %1 = bmt.constant #bmt.none
    %2 = bmt.constant dense<[1.0, 2.0]> : tensor<2xf32>
    ```
  }];
  let arguments = (ins AnyAttr:$value);
  let results = (outs Bmt_AnyValue:$result);
  let assemblyFormat = "$value attr-dict";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Bmt_NumToTensorOp : Bmt_Op<"num_to_tensor", [Pure]> {
  let summary = "a 0-dimensional tensor holding a scalar (TorchScript prim::NumToTensor)";
  let arguments = (ins AnyTypeOf<[I64, F64, I1, Bmt_NumberType]>:$input);
  let results = (outs Bmt_TensorType:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
}

def Bmt_FusedOp : Bmt_Op<"fused", [IsolatedFromAbove,
    SingleBlockImplicitTerminator<"::bmt::YieldOp">]> {
  let summary = "a region of pointwise ops (and one last-dimension reduction) run as one kernel";
  let description = [{
    Made by `--bmt-fuse-elementwise` (docs/passes/fuse-elementwise.md). The body holds the
    original `bmt.aten` ops (and the scalar `bmt.constant`s they read) over
    the block arguments, which stand for the operands in order; `bmt.yield`
    gives the results: the region's last value, and values of the body that
    ops after the region read too (a residual sum that a norm in the body
    reads), each element-valued. `kind` is `"pointwise"` (every op elementwise,
    with broadcasting and dtype casts) or `"row"` (one `aten::mean.dim` or
    `aten::sum.dim_IntList` over the last dimension with keepdim, and the
    pointwise ops before and after it: a normalization). A pointwise body
    may also hold rotate_half of an operand (`aten::slice.Tensor` of its
    last dim's halves, `aten::neg`, `aten::cat`, and the half computed from
    its size: `aten::size.int`, `bmt.num_to_tensor`, `aten::floor_divide`,
    `aten::Int.Tensor`). The runtime runs
    the body as one generated kernel forward and one backward
    (docs/runtime/fusion.md), or op by op where it cannot.

    ```mlir
    %y = bmt.fused "row"(%x, %w) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor {
    ^bb0(%a: !bmt.tensor, %b: !bmt.tensor):
      %0 = bmt.aten "aten::pow.Tensor_Scalar"(%a, 2) : (!bmt.tensor) -> !bmt.tensor
      ...
      bmt.yield %7 : !bmt.tensor
    }
    ```
  }];
  let arguments = (ins StrAttr:$kind, Variadic<Bmt_TensorType>:$inputs);
  let results = (outs Variadic<Bmt_TensorType>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$kind `(` $inputs `)` attr-dict `:` functional-type($inputs, results) $body";
  let hasVerifier = 1;
}

def Bmt_YieldOp : Bmt_Op<"yield", [Pure, Terminator,
    HasParent<"::bmt::FusedOp">]> {
  let summary = "the result of a bmt.fused body";
  let arguments = (ins Variadic<Bmt_AnyValue>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
  let builders = [OpBuilder<(ins), [{ }]>];
}

#endif // BMT_OPS_TD
