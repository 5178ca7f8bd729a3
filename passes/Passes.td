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
    `--bmt-find-blocks` and `--bmt-zero` it also prints the block lists
    (with the parameters per block and outside the blocks) and the storage
    groups; after `--bmt-checkpoint` and `--bmt-overlap` their decisions;
    and with `world-size=N` the per-rank memory estimate of
    docs/passes/memory-estimate.md
    (parameter, gradient and AdamW shards, gathered buffers, activations for
    `micro-batch` x `seq-len` tokens):

    ```
      blocks: 12 in transformer.h (transformer.h.0 ... transformer.h.11), 7087872 parameters each
      outside blocks: 39385344 parameters
      storage groups: 13 (474.7 MiB, 497759232 bytes), ZeRO-3
      checkpoint: 12 of 12 blocks recomputed (mode all)
      overlap: prefetch depth 1
      memory per rank at world size 8 (micro-batch 1, seq-len 1024): about 1.2 GiB (1307911680 bytes)
        parameter, gradient and optimizer shards: 237.4 MiB
        ...
    ```
  }];
  let options = [
    Option<"worldSize", "world-size", "int64_t", "0",
           "estimate per-rank memory for this many ranks (0: no estimate)">,
    Option<"microBatch", "micro-batch", "int64_t", "0",
           "sequences per rank for the activation estimate (0: the module's "
           "bmt.checkpoint_plan, else 1)">,
    Option<"seqLen", "seq-len", "int64_t", "0",
           "tokens per sequence for the activation estimate (0: the module's "
           "bmt.checkpoint_plan, else 1024)">,
  ];
}

def Freeze : Pass<"bmt-freeze", "::mlir::ModuleOp"> {
  let summary = "Mark the parameters whose names match glob patterns frozen (not trained)";
  let description = [{
    Clears `requires_grad` on every `bmt.parameter` whose state-dict name
    (or one of its tied aliases) matches one of `patterns`, a comma-separated
    list of globs: `*` any characters (dots included), `?` one character,
    `[0-3]` / `[!0]` a character class, `{a,b}` alternatives (commas inside
    braces or brackets do not separate patterns). A name must match a
    pattern whole: `model.layers.1.*` matches `model.layers.1.mlp.up_proj.weight`
    and not `model.layers.11.mlp.up_proj.weight`.

    A frozen parameter keeps its working dtype; bmt-zero puts it in a
    frozen storage group of its block, sharded over the ranks and gathered
    like the trainable ones (no float32 master, no optimizer state, no
    gradient); it is still written by `bmt-run --save-params`.

    Errors (one line each): a pattern that is empty or not a glob, a
    pattern that matches no parameter, and patterns that freeze every
    parameter (nothing would train). Prints a remark with the count.
  }];
  let options = [
    Option<"patterns", "patterns", "std::string", "\"\"",
           "comma-separated globs over parameter names (state-dict names)">,
  ];
}

def Lora : Pass<"bmt-lora", "::mlir::ModuleOp"> {
  let summary = "Add low-rank adapters (LoRA) to the target linear layers and freeze the base";
  let description = [{
    `spec` is `r=16,alpha=32,dropout=0.05,targets=q_proj,k_proj,v_proj,o_proj`
    (alpha defaults to r, dropout to 0; `targets=all-linear` adapts every
    linear layer but the output head: `lm_head`, a tied weight, or one an
    embedding reads). A target names the last component(s) of a module path
    (the weight's state-dict name without `.weight`).

    For each `aten::linear(x, W, b)` (or GPT-2's Conv1D, `aten::addmm(b, x,
    W, 1, 1)` with W [in, out], as peft's fan_in_fan_out) whose weight is a
    target's, adds `<module>.lora_A.weight` [r, in] and
    `<module>.lora_B.weight` [out, r] after W (trainable; their values are
    made by the exporter from `bmt.generated_init`: A uniform in
    ±1/sqrt(in), Kaiming-uniform with a = sqrt(5) as peft; B zeros, so the
    adapted model equals the base at step 0) and rewrites the result to
    `y + (alpha / r) * linear(linear(dropout(x, p, train=True), A), B)`.
    Every other parameter is frozen (bmt-freeze's machinery).

    Errors: a bad spec, targets that match no linear layer, a target weight
    read by several matmuls.
  }];
  let options = [
    Option<"spec", "spec", "std::string", "\"\"",
           "r=N[,alpha=A][,dropout=P],targets=M1,M2,... or targets=all-linear">,
  ];
  let dependentDialects = ["::bmt::BmtDialect"];
}

def FuseGelu : Pass<"bmt-fuse-gelu", "::mlir::ModuleOp"> {
  let summary = "Replace GELU written out as elementwise ATen ops by one aten::gelu";
  let description = [{
    Hugging Face's NewGELUActivation (`gelu_new`: GPT-2, GPT-J, Phi,
    CodeGen, GPT-Neo) computes
    `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))` in Python, so
    a trace or an export records eight elementwise ops, each a kernel of its
    own in forward and more in backward, each keeping a full-size
    intermediate for the backward. This pass replaces such a tree by
    `bmt.aten "aten::gelu"(%x, "tanh")`, and
    `0.5 * x * (1 + erf(x / sqrt(2)))` by `bmt.aten "aten::gelu"(%x, "none")`:
    one kernel forward, one backward, one saved input.

    The pass reads the tree of arithmetic ops under each candidate root
    (`aten::add`, `sub`, `rsub`, `mul`, `div` by a constant, `neg`, `pow` by
    a whole constant, one `tanh` or `erf`; `.Tensor` and `.Scalar`
    overloads; constants as `args` or as 0-dim `bmt.constant` tensors) as a
    polynomial in its one input `x` and the `tanh`/`erf`, and fuses when
    the coefficients are GELU's within a relative 1e-6. So every operand
    order and association computes the same thing (TorchScript's and
    torch.export's forms of `gelu_new`, FastGELU's
    `x * 0.7978845608 * (1 + 0.044715 * x * x)`, BLOOM's constant
    0.79788456) matches. Every op of the tree except the root must have no
    user outside the tree and lie in the root's block; otherwise, or with
    another constant, or with any other leaf than `x`, the code is left as
    it is. Dead constants of a fused tree are erased.

    Emits one remark: the number fused, by kind, and the first and last
    function that had one ("bmt-fuse-gelu: 2 GELUs fused into aten::gelu
    (2 approximate="tanh", 0 exact) in 2 functions
    (transformer.h.0.mlp.act.forward ... transformer.h.1.mlp.act.forward)"),
    or that there was none.
  }];
  let dependentDialects = ["::bmt::BmtDialect"];
}

def MoeLayers : Pass<"bmt-moe-layers", "::mlir::ModuleOp"> {
  let summary = "Lower each mixture-of-experts layer's token permutation to bmt.moe_dispatch and bmt.moe_combine";
  let description = [{
    transformers' grouped_mm experts (Mixtral, Qwen2/3-MoE, OLMoE, gpt-oss,
    DeepSeek-V3) take the top-k expert ids [T, K], the hidden states [T, H]
    and the routing weights, and record around their experts:

    - dispatch: `reshape(ids, [-1])`, `aten::sort` (ascending, dim -1 or
      0), `hidden[perm floordiv K]` with K = `size(ids, -1)`, and
      `cumsum(histc(to(sorted, float32), E, 0, E - 1), 0, int32)`, the
      offsets of the grouped matmuls;
    - combine: the inverse permutation `empty_like(perm).index_put_([perm],
      arange(perm.size(0)))`, the expert rows gathered by it, viewed
      `[size(hidden, 0), K, size(hidden, -1)]` and summed over dim 1.

    The pass replaces the dispatch by one `bmt.moe_dispatch` (rows, sorted
    ids, offsets, permutation) and the combine by one `bmt.moe_combine`,
    where expert parallelism exchanges rows between ranks.
    The experts' own ops stay as they were, reading the dispatch's
    results: the grouped matmuls, the activation, the padding mask
    `ge.Scalar(sorted ids, E)`, per-expert biases indexed by the sorted ids,
    and the routing weights indexed by the permutation and multiplied
    where the model multiplies them.

    A torch.export `.pt2` records K as a 0-dim constant and arange's end
    and the view's T and H as the export's sizes (constants or products of
    symbolic sizes): the view's K must then equal that constant, and the
    combine reads it as a new `bmt.constant`.

    The match is strict: ids and hidden are arguments of the function, E
    (histc's bins) equals the leading dim of the 3-D parameter every
    grouped matmul reading the offsets multiplies by, every constant is
    the expected one, and every intermediate value has no user outside
    the pattern (the sorted ids and the permutation only the users named
    above). Anything else leaves the function as it is, and the program
    runs its ATen ops as before.

    Emits one remark: the number of layers lowered and the first and last
    function ("bmt-moe-layers: 2 mixture-of-experts layers lowered to
    bmt.moe_dispatch / bmt.moe_combine (model.layers.0.mlp.experts.forward
    ... model.layers.1.mlp.experts.forward)"), or that there was none.

    With `expert-parallel=E` > 1 (expert parallelism, docs/passes/moe-layers.md)
    each dispatch also takes the layer's routing weights (the tensor the
    layer indexed by the permutation) and gives them in the rows' order,
    the module records `bmt.expert_parallel = E`, and it is an error when a
    layer's expert count is not a multiple of E, when no layer is lowered,
    or after bmt-tensor-parallel (run it before, as the default pipeline
    does).
  }];
  let options = [
    Option<"expertParallel", "expert-parallel", "int64_t", "1",
           "ranks of one expert group (1: no expert parallelism)">,
    Option<"splitExpertWeights", "split-expert-weights", "bool", "true",
           "with expert-parallel > 1 (on by default), mark each expert parameter "
           "split over the expert group (each rank stores only its position's "
           "experts); false stores every expert on every rank">,
  ];
  let dependentDialects = ["::bmt::BmtDialect"];
}

def GroupedQueryAttention : Pass<"bmt-grouped-query-attention", "::mlir::ModuleOp"> {
  let summary = "Let aten::scaled_dot_product_attention read the kv heads (enable_gqa) instead of repeat_kv's copies";
  let description = [{
    Grouped-query and multi-query attention (LLaMA, Mistral, Qwen, Gemma)
    have fewer key/value heads than query heads; transformers repeats k and
    v to the query heads first (`repeat_kv`: `x[:, :, None, :, :]` expanded
    to `[b, kv, n, s, d]`, reshaped to `[b, kv * n, s, d]`). The reshape of
    the expanded view copies the kv tensor n times, and its backward sums
    the n copies (`ExpandBackward0`). `aten::scaled_dot_product_attention`
    with `enable_gqa=True` takes the kv heads as they are and pairs query
    head h with kv head h / n, the pairing `repeat_kv` makes.

    The pass rewrites a call whose `enable_gqa` is false and whose key and
    value are both such repeats with the same n > 1 to read the kv tensors
    with `enable_gqa=True`. A repeat is matched exactly: a `reshape` (or
    `view`) of an `expand` whose third size is the constant n and whose
    other sizes are -1 or `aten::size` of the kv tensor's dims in order
    (no broadcast of a dim of 1), or numbers (a static torch.export records
    every size as a number; they are taken as the kv tensor's own, since
    the IR has no shapes to check them against), of an `unsqueeze` at dim 2 (or -3) of a
    tensor, full slices `x[:]` allowed around it; the reshape's sizes keep
    the expand's first, fourth and fifth. Anything else (a `repeat_interleave`,
    a narrow after the repeat as tensor parallelism's replicated k/v makes,
    different n for k and v) is left as it is. The repeats and the size
    arithmetic that nothing reads afterwards are erased.

    Off in the default pipeline unless `grouped-query-attention=true`
    (bmt-opt `--grouped-query-attention`); on CUDA the cuDNN kernel takes
    the call (bench/gpu_attention_gqa.py). Emits one remark: the number of
    calls rewritten and ops removed, or that none matched (with the number
    of calls left as they are).
  }];
  let dependentDialects = ["::bmt::BmtDialect"];
}

def FuseElementwise : Pass<"bmt-fuse-elementwise", "::mlir::ModuleOp"> {
  let summary = "Group pointwise ATen ops and one last-dim reduction into bmt.fused regions";
  let description = [{
    A model's normalizations, activations, residual adds, RoPE and dtype
    casts are chains of pointwise ATen ops, each a kernel of its own that
    reads and writes the whole activation (and more kernels in backward).
    This pass groups them: in each function block, walking backwards, every
    op not yet taken that can be in a region is a root, and the region grows
    through producers in the same block that can be in one and whose every
    use is already in the region, with at most one reduction. With
    `second-results`, up to two pointwise producers whose other uses all
    come after the root join as well, as further results of the region (a
    residual sum that the norm in the region reads, read again by the next
    residual add), where each such value is element-valued (not derived
    from the reduction alone) and the region reads no rotate_half; else the
    region is grown without them. Off by default: on one H200 such row
    regions were slower than the separate add (docs/passes/fuse-elementwise.md).
    The region becomes one `bmt.fused` op whose body
    holds the ops (and clones of the scalar constants they read); its kind
    is "row" when it holds the reduction, else "pointwise". Regions of one
    op are left alone, except `layer_norm`, which is a "row" region even
    alone.

    The ops a region may hold are those of
    include/bmt/Dialect/FusibleOps.def (add, sub, rsub, mul, div,
    pow by a constant, neg, sqrt, rsqrt, exp, log, tanh, sigmoid, relu,
    silu, erf, cos, sin, gelu, `to.dtype` to a floating dtype,
    `mean.dim` / `sum.dim_IntList` over `[-1]` with keepdim, and
    `layer_norm` over the last dim: one constant length, checked per call by
    the runtime; it is the region's reduction) that the operator registry
    flags neither in-place nor random, with every non-tensor argument a
    constant. Anything else stops a region: in-place
    ops, views, matmuls, a reduction over another dim, an op whose result
    is also used outside the region before the root, or by a third result
    (it becomes an input), an op reading a value that an in-place op (or a
    call whose callee writes that argument) overwrites after it, the value
    or a view of it (the region runs at its root's place and the runtime
    saves its inputs for the backward).

    One form of slices and cat joins a region whole: HF's rotate_half,
    `cat([-x[..., h:], x[..., :h]], -1)` (either half negated, or neither),
    h a constant or `size(x, dim) // 2` computed in the trace (size.int,
    num_to_tensor, floor_divide by 2, Int.Tensor, each used once), each
    slice and neg used only by the cat, x not computed by a fusible op (the
    runtime reads halves of a region input), never in a region with a
    reduction. The runtime checks per call that the sliced dim is x's last
    and h half of it, else runs the body op by op.

    With `inline-calls`, calls of private parameter-free functions whose
    body is fusible non-reduction ops only (an activation submodule such as
    LLaMA's SiLU `act_fn`) are inlined first, so that their ops can join the
    caller's region (SwiGLU's `silu(gate) * up`); with `second-results`
    too, so are functions that read parameters and hold one reduction (a
    norm submodule: RMSNorm, LayerNorm), so that the residual add before a
    norm can join its region, and such a callee left without calls is
    erased (its parameters are then read where the calls were). Off in the
    pass by default, on in the default pipeline (`fuse-inline-calls`;
    `fuse-second-results`, off).

    Runs in the default pipeline (its option `fuse-elementwise`, on;
    `fuse-elementwise=false` or bmt-opt `--fuse-elementwise=false` for a
    plan of plain ATen ops).
    Emits one remark: ops, regions (how many with a reduction, how many
    rotate_half they hold, how many have a second result), the first and
    last function that has one, and
    the calls inlined.
  }];
  let options = [
    Option<"inlineCalls", "inline-calls", "bool", "false",
           "inline calls of activation submodules first (and norm submodules, "
           "with second-results)">,
    Option<"secondResults", "second-results", "bool", "false",
           "let a region return values read after its root too (a residual sum "
           "and the norm after it in one region)">,
  ];
  let dependentDialects = ["::bmt::BmtDialect"];
}

def CausalAttention : Pass<"bmt-causal-attention", "::mlir::ModuleOp"> {
  let summary = "Replace a causal mask built from aranges by is_causal=True in aten::scaled_dot_product_attention";
  let description = [{
    Hugging Face's transformers 5 builds the mask of its SDPA attention from
    index arithmetic (`masking_utils.sdpa_mask`): `kv_idx <= q_idx` over
    aranges of the query and key positions, ANDed with
    `attention_mask[batch_idx, kv_idx]`, expanded to `[batch, 1, q, kv]`.
    Traced or exported, every `aten::scaled_dot_product_attention` then gets
    this explicit boolean mask and `is_causal=False`, and the kernels compute
    the whole square instead of its lower triangle. This pass rewrites such
    a call to `attn_mask=None, is_causal=True` (dropout, scale and
    enable_gqa as they were) when it proves the mask is exactly
    `kv <= q` on query and key lengths that are equal:

    - The mask's computation is evaluated symbolically, across calls: an
      integer tensor as the coordinate along one dimension plus a constant
      (`arange(n)`, `+ c`, `unsqueeze`, `x[:]`, `expand`, int64
      conversions), a boolean one as a conjunction of bounds
      `x_a - x_b <= c` between coordinates (`le`, `lt`, `ge`, `gt` of two
      positions, `&`, `logical_and`, boolean conversions), tensors of ones
      (`new_ones`, `ones`, `full` of a nonzero, their views, and indexing
      them with positions) as "true", and a tensor of one value everywhere
      (a position's first element `p[:, :1]`, `diff(p, prepend=p[:, :1] -
      1)` of a position along its dimension (ones), `==`/`!=` with a number,
      `cumsum` of zeros, `x * 0`, indexing a constant with positions) as
      that constant: transformers' packed-sequence term
      `ids[b, q] == ids[b, kv]`, ids = `cumsum(diff(position_ids) != 1)`,
      is true for position_ids that are an arange (a model traced or
      exported without attention_mask). Sizes are symbols followed through
      `aten::size`, views, factories, `embedding` and calls, so the arange
      of `inputs_embeds.shape[1]` and the one of the ones mask OPT makes
      from the same size are one length.
    - The mask must be a boolean `[b, h, n, n]` whose only bounds are
      `kv - q <= 0` (and lower bounds `kv - q >= -w` that a constant n makes
      vacuous: Mistral's sliding window in a static export with n <= w);
      the two lengths must be the same symbol (or equal constants). Any
      other term, an offset between the positions, a sliding window that
      can matter, lengths not provably equal, a mask that depends on an
      input of the program, a mask some op may write in place, or a
      function called with different masks: the call is left as it is.
    - `assume-unpadded` (off by default; on in the default pipeline):
      treats the program input `attention_mask` as all ones, of
      `input_ids`' shape `[batch, seq]`, so the padding term is true. A
      rewrite that needs this adds "attention_mask all ones" to the module
      attribute `bmt.assumptions`, which the exporter writes into the plan;
      `bmt-run --dump` refuses a batch whose attention_mask breaks it.
      A proof is tried without the assumption first.

    The mask's computation, now unread, is erased (the ops the proof went
    through, and the arguments of private functions that carried the mask
    to the attention). Emits one remark for the module: how many masked
    calls were made causal, in which functions, under which assumption,
    and why the others were left alone ("bmt-causal-attention: 2 of 2
    aten::scaled_dot_product_attention with an attn_mask made causal
    (attn_mask=None, is_causal=True) in 2 functions
    (transformer.h.0.attn.forward ... transformer.h.1.attn.forward),
    assuming attention_mask all ones; mask computation removed: 33 ops,
    4 function arguments").

    Then every other lookup `source[i0, i1, ...]` (`aten::index.Tensor`,
    a position on each dimension) of a source proven to hold one int64
    constant c everywhere becomes `i0 * 0 + i1 * 0 + ... (+ c)`, and the
    source's computation is erased: the packed-sequence ids of a model
    without attention_mask in eager attention, which a trace at batch 1
    keeps `[1, seq]` and would look up with every batch row. One more
    remark when something was folded ("bmt-causal-attention: 2 lookups of
    a constant tensor (...) folded in 1 function (model.forward); removed:
    11 ops, 0 function arguments").
  }];
  let options = [
    Option<"assumeUnpadded", "assume-unpadded", "bool", "false",
           "treat the program input attention_mask as all ones of input_ids' shape "
           "(recorded in bmt.assumptions; bmt-run --dump checks it)">,
  ];
  let dependentDialects = ["::bmt::BmtDialect"];
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
    blocks. This structural rule is the primary one.

    A second rule, the module-list rule, covers stacks whose layers are
    instances of one class but not all of the same structure, such as T5's
    `encoder.block` and `decoder.block`, whose block 0 owns the relative
    attention bias and hands the position bias to the later blocks: a run of
    two or more calls in which each call consumes a result of the previous
    one and the callees are distinct functions that use parameters, carry
    the same non-empty `bmt.module_type`, and have the module paths `P.k`,
    `P.(k+1)`, `P.(k+2)`, ... (the same parent `P`, consecutive decimal
    indices: the elements of one ModuleList). At each call the pass takes
    the structural run starting there, unless the module-list run starting
    there is longer; so a model whose layers are all identical keeps
    exactly its structural lists, and T5 gets `encoder.block.0 ... N-1`
    rather than `encoder.block.1 ... N-1` (or, with two layers, repeats
    inside the blocks).

    Each run becomes a `bmt.block_list` named by the callees' common module
    path (`transformer.h`, `model.layers`, `bert.encoder.layer`,
    `encoder.block`), and its calls get `bmt.block` and `bmt.block_index`.
    The search does not look inside a block.

    Emits a remark per block list that names the rule that made it
    ("2 blocks in transformer.h (transformer.h.0 ... transformer.h.1), rule:
    identical structure"; "2 blocks in encoder.block (encoder.block.0 ...
    encoder.block.1), rule: module list of
    transformers.models.t5.modeling_t5.T5Block (structure differs:
    encoder.block.0)", listing the blocks whose structure is not the most
    common one) and, for a model without repeated layers, a remark saying
    so; the IR is then unchanged and the whole model is sharded as one unit
    by later passes.
  }];
  let dependentDialects = ["::bmt::BmtDialect"];
}

def TensorParallel : Pass<"bmt-tensor-parallel", "::mlir::ModuleOp"> {
  let summary = "Split each block's matmul chains over a tensor-parallel group (Megatron-LM)";
  let description = [{
    After `--bmt-find-blocks`, before `--bmt-zero`. With `tensor-parallel=T`
    > 1, finds in every block the chains that start at matmuls with a
    parameter weight (`aten::linear`, Conv1D's `aten::addmm`) reading one
    replicated activation and end at a matmul that contracts the dim they
    split, by following that dim through pointwise ops, views, RoPE's
    slices and per-head attention (pointwise ops, reductions, transposes,
    per-head matmuls and attention by the upstream shard dialect's
    ShardingInterface, which lib/Dialect/ShardingInterfaceImpl.cpp
    implements for bmt.aten and bmt.fused); names are not consulted. Each
    op whose result a chain splits gets `bmt.sharding = {grid = @tp,
    split_axes = [#shard<axisarray[...]>]}`. Each chain
    becomes column-parallel (the weights split along their output dim,
    fused q/k/v projections per head within each of q, k, v) then
    row-parallel (the weight split along its input dim), with one
    `bmt.tp_copy` on the chain's input and one `bmt.tp_all_reduce` after
    the row-parallel matmul, before its bias (Megatron-LM's f and g).
    View, reshape and split sizes that name a global width or head count
    are rewritten to the local ones, so one program serves every TP rank.
    The split parameters carry `bmt.tensor_split = #bmt.tensor_split<dim = D, chunks = C>`; the
    module gets the TP group as `shard.grid @tp(shape = T)` and
    `bmt.tensor_parallel = T`. Grouped-query (or multi-query) attention
    whose kv heads T does not divide keeps its k/v projections replicated
    (`#bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>`: their gradients
    are summed over the group) and splits q and o by the query heads, each
    rank narrowing the repeated kv heads to its own (`bmt.tp_rank`). A
    size that T does not divide (query heads, ffn width) fails the compile
    with one message naming the op and the sizes; a chain whose ops the
    pass cannot follow stays replicated
    (the remark says which op). T = 1 changes nothing. With
    `sequence-parallel`, the activations between the chains are split
    along the sequence dim instead of replicated: each `bmt.tp_copy`
    becomes a `bmt.tp_all_gather` and each `bmt.tp_all_reduce` a
    `bmt.tp_reduce_scatter` along it, and the parameters read there get
    `reduce_grad`; an op there that mixes positions fails the compile.
    How a split moves through the ops with a sharding rule is decided by
    the upstream shard dialect: each chain is copied into a ranked shadow
    function, annotated with `shard.shard` on the column weights and on
    the results of the views, slices and concatenations the pass follows
    by its own rules, then run through upstream's `sharding-propagation`
    and `shard-partition`; its shardings must be the pass's and its
    collectives one all-reduce after each row-parallel matmul, else the
    compile fails naming the op (`print-shadow` prints the shadows).
    docs/passes/tensor-parallel.md has the rules.
  }];
  let options = [
    Option<"tensorParallel", "tensor-parallel", "int64_t", "1",
           "ranks of one tensor-parallel group (1: no tensor parallelism)">,
    Option<"printShadow", "print-shadow", "bool", "false",
           "print each chain's ranked shadow to stderr after upstream's sharding-propagation "
           "and after its shard-partition (for tests and debugging)">,
    Option<"sequenceParallel", "sequence-parallel", "bool", "false",
           "also split the activations between the chains (norms, residual adds) along the "
           "sequence (Megatron-LM's sequence parallelism): f and g become an all-gather and a "
           "reduce-scatter along the sequence dim (needs tensor-parallel > 1)">,
  ];
  let dependentDialects = ["::bmt::BmtDialect", "::mlir::shard::ShardDialect"];
}

def Zero : Pass<"bmt-zero", "::mlir::ModuleOp"> {
  let summary = "Lay the parameters out as flat, sharded storage groups (ZeRO-3/2)";
  let description = [{
    After `--bmt-find-blocks`: puts the trainable parameters of each block,
    per dtype, into one `bmt.storage_group` (offsets aligned to `alignment`
    bytes, in declaration order), and everything else into the groups of
    `outside_blocks` (embeddings, final norm, head). Frozen parameters
    (requires_grad false) go to `frozen` groups of their own, per owner and
    dtype (`<block>.frozen.<dtype>`): sharded and gathered the same way,
    never reduce-scattered. A parameter used by more
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

def Checkpoint : Pass<"bmt-checkpoint", "::mlir::ModuleOp"> {
  let summary = "Decide which blocks recompute their activations in backward";
  let description = [{
    After `--bmt-find-blocks` (and `--bmt-zero`, whose storage groups the
    memory estimate reads): puts `bmt.checkpoint = true` (recompute the block
    in backward, keeping only its inputs; BMTrain's CheckpointBlock) or
    `false` (keep its activations) on every `func.call` that carries
    `bmt.block`, and records the inputs of the decision in the module
    attribute `bmt.checkpoint_plan = {mode, micro_batch, seq_len,
    world_size[, budget_gib]}`.

    - `mode=all` (the default): every block is recomputed.
    - `mode=none`: no block is recomputed.
    - `mode=auto`: the per-rank memory estimate of
      docs/passes/memory-estimate.md
      (sharded parameter, gradient and AdamW state, gathered buffers of the
      live blocks, activations of `micro-batch` x `seq-len` tokens) must fit
      `budget-gib`. The pass keeps the activations of as many blocks as fit,
      choosing the LAST blocks in execution order (their activations are
      the first the backward needs), and recomputes the others. If even
      recomputing every block does not fit, it recomputes every block and
      warns with the estimate and the budget.

    Emits a remark such as
    "bmt-checkpoint: 10 of 12 blocks recomputed (estimate 3.2 GiB per rank
    of 4.0 GiB budget)". A bad option (unknown mode, `auto` without a
    positive budget, a size that is not positive) is one error and the pass
    fails. Without block lists the pass changes nothing and says so.
  }];
  let options = [
    Option<"mode", "mode", "std::string", "\"all\"",
           "which blocks to recompute: all, none or auto">,
    Option<"budgetGib", "budget-gib", "double", "0",
           "mode=auto: per-rank memory budget in GiB (required, > 0)">,
    Option<"microBatch", "micro-batch", "int64_t", "1",
           "sequences per rank per forward">,
    Option<"seqLen", "seq-len", "int64_t", "1024",
           "tokens per sequence (the program does not record the traced shape)">,
    Option<"worldSize", "world-size", "int64_t", "1",
           "ranks the parameters are sharded over (with bmt.zero's shard group size)">,
    Option<"prefetchDepth", "prefetch-depth", "int64_t", "1",
           "blocks gathered ahead (as --bmt-overlap's depth; bmt.overlap wins if present)">,
  ];
  let dependentDialects = ["::bmt::BmtDialect"];
}

def PipelineParallel : Pass<"bmt-pipeline-parallel", "::mlir::ModuleOp"> {
  let summary = "Cut the block list into contiguous pipeline stages balanced by a cost model";
  let description = [{
    After `--bmt-find-blocks`, `--bmt-zero` and `--bmt-checkpoint` (whose
    storage groups and recompute flags the cost model reads). With
    `pipeline-parallel=P` > 1, cuts the one block list into P contiguous
    stages: the ops before the first block (the embedding) run on stage 0,
    the ops after the last block (final norm, head, loss) on stage P - 1;
    before and after in the blocks' caller and, around the call down, in
    each function from `@forward` to it.
    Each block's cost is its matmul FLOPs per token (2 x the elements of
    each parameter weight of `aten::linear`, `aten::addmm`, `aten::mm`,
    `aten::matmul`), x 3 for forward and backward, + 1 forward for a
    recomputed block; the cut minimises the largest stage's FLOPs and, among
    equal cuts, the largest stage's memory estimate (1F1B keeps P - s
    micro-batches in flight on stage s; docs/passes/pipeline.md). Each block
    call gets `bmt.pipeline_stage`; the module gets `bmt.pipeline = {stages,
    block_list, first_blocks, flops, bytes, parameters, world_size}` (per
    stage: first block index, FLOPs per micro-batch, bytes per rank,
    parameter elements), which the plan records and the summary prints. A
    parameter read on stage 0 and on stage P - 1 (a tied embedding and LM
    head) stays tied: each of the two stages holds it and the runtime sums
    its gradient between them. Refused with one error naming the reason:
    P larger than the blocks, no or several block lists, a function on the
    way from `@forward` to the blocks called more than once, a parameter
    passed to a block or read between blocks or shared by blocks of
    different stages, a
    world size P x T does not divide (T: `bmt.tensor_parallel`), expert
    parallelism, mixture-of-experts layers. P = 1
    changes nothing.
    With `virtual-stages=V` > 1 the blocks are cut into P x V chunks the
    same way (chunk 0 with the ops before the blocks, chunk P V - 1 with
    those after), stage s holding chunks s, s + P, ..., s + (V - 1) P for
    interleaved 1F1B; block calls also get `bmt.pipeline_chunk`, and
    `bmt.pipeline` gets `virtual_stages` and per-chunk first blocks, FLOPs,
    bytes and parameters. Refused: V > 1 with P = 1, fewer blocks than
    P x V.
  }];
  let options = [
    Option<"pipelineParallel", "pipeline-parallel", "int64_t", "1",
           "pipeline stages (1: none)">,
    Option<"virtualStages", "virtual-stages", "int64_t", "1",
           "chunks per stage for interleaved 1F1B (1: one contiguous part per stage)">,
    Option<"worldSize", "world-size", "int64_t", "0",
           "ranks of the job (a multiple of P x T; 0: P x T, one data-parallel rank per stage)">,
    Option<"microBatch", "micro-batch", "int64_t", "0",
           "sequences per micro-batch (0: from bmt.checkpoint_plan, else 1)">,
    Option<"seqLen", "seq-len", "int64_t", "0",
           "tokens per sequence (0: from bmt.checkpoint_plan, else 1024)">,
  ];
  let dependentDialects = ["::bmt::BmtDialect"];
}

def Overlap : Pass<"bmt-overlap", "::mlir::ModuleOp"> {
  let summary = "Schedule the all-gathers (bounded prefetch) and releases of the storage groups";
  let description = [{
    After `--bmt-zero`: in each function that calls a block list (the
    `bmt.block_list`'s `caller`) inserts `bmt.all_gather @group` so that,
    when block i is called, the gathers of the groups of blocks
    i .. i+depth have been issued (each group exactly once, in block order:
    the gathers of blocks 0..depth before the call of block 0, then the
    gather of block i+depth before the call of block i). With `depth=0`
    each block's gathers come right before its call. When the module's
    `bmt.zero` says stage 3, a `bmt.release @group` follows the call of
    each block for each of its groups; under ZeRO-2 the gathered buffers
    live until the block's backward. The groups outside the blocks
    (`outside_blocks.*`) are gathered at the start of `@forward` and never
    released (the runtime keeps them for the whole step).

    The backward is not in the IR; the runtime mirrors the schedule: before
    the backward of block i it re-gathers block i (ZeRO-3) and prefetches
    blocks i-1 .. i-depth, releases block i after its backward, and
    reduce-scatters block i's gradient while block i-1's backward runs.

    Records the depth as the module attribute
    `bmt.overlap = {prefetch_depth = N : i64}`. Running it on a module that
    is already scheduled is an error ("already scheduled"). Block lists
    without storage groups are an error (run `--bmt-zero` first); a module
    with no storage groups at all is left unchanged with a remark.
  }];
  let options = [
    Option<"depth", "depth", "int64_t", "1",
           "blocks gathered ahead of the running one (0: no prefetch)">,
  ];
  let dependentDialects = ["::bmt::BmtDialect"];
}

#endif // BMT_PASSES_TD
