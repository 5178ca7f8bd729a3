//===- Plan.h - the runtime plan inside sharded.pt --------------*- C++ -*-===//
//
// The plan is what bmt-run executes: the compiled program as a flat list of
// instructions per function, the parameters and buffers with the place of
// their bytes in the archive, and the training objective. It is written by
// the exporter (lib/Export) and read by the runtime without MLIR.
//
// Serialized as an IValue (nested tuples, lists, strings, ints, tensors)
// with torch::jit::pickle_save into the archive record `plan.pkl`; see
// docs/sharded-format.md for the record layout. The format is versioned:
// readers take versions kOldestPlanFormatVersion to kPlanFormatVersion and
// reject any other; writers write the oldest version that can hold the plan
// (formatVersionOf), so a plan that needs nothing new stays readable by
// older bmt-run binaries.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PLAN_PLAN_H
#define BMT_PLAN_PLAN_H

#include "bmt/Plan/SplitRule.h"

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace bmt::plan {

/// Version of the plan and archive layout. Bumped on any incompatible change.
/// 3 adds `assumptions` (version 2 plans have none); 4 adds storage groups
/// split into several records (StorageGroup::parts); 5 adds Fused
/// instructions (bmt-opt --bmt-fuse-elementwise); 6 adds tensor
/// parallelism (TensorSplit, StorageGroup::tpRank, Plan::tensorParallel,
/// vocabParallel, vocabSize, the Tp* instructions); 7 adds the MoeDispatch
/// and MoeCombine instructions (bmt-opt --bmt-moe-layers); 8 adds pipeline
/// stages (Plan::pipelineStages, pipelineBlockList, pipelineFirstBlocks)
/// and splits over the expert group (TensorSplit::over, StorageGroup::epRank);
/// 9 adds frozen storage groups (StorageGroup::frozen); 10 adds virtual
/// pipeline stages (Plan::pipelineVirtualStages); 11 adds the LoraAdapter
/// instruction.
constexpr int64_t kPlanFormatVersion = 11;
/// The oldest version readers still take.
constexpr int64_t kOldestPlanFormatVersion = 2;

/// An assumption the compiler made about the inputs (bmt-opt's
/// bmt-causal-attention with assume-unpadded): the program input
/// attention_mask is all ones, of input_ids' [batch, seq] shape. Training
/// feeds such masks; bmt-run --dump checks its batches against it.
inline constexpr const char *kAssumeAttentionMaskAllOnes = "attention_mask all ones";

/// A malformed plan or archive; the message names what is wrong.
class PlanError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Version 6: how a tensor is split over the tensor-parallel (TP) group of
/// T ranks (bmt/Plan/SplitRule.h states the rule); version 8: or, `over`
/// the expert group, an expert parameter over the E ranks of an expert
/// group. The tensor's `shape` stays the global, unpadded one. See
/// localShape() and docs/sharded-format.md.
using TensorSplit = bmt::TensorSplit;

/// A parameter or buffer of the model.
struct TensorInfo {
  std::string name;                 ///< dotted path, e.g. "transformer.h.0.ln_1.weight"
  std::vector<std::string> aliases; ///< other names of the same (tied) tensor
  bool isParameter = true;          ///< false for buffers
  bool requiresGrad = true;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  std::string record; ///< archive record holding the bytes (row-major, contiguous)
  int64_t offset = 0; ///< byte offset of the tensor in `record`
  /// Index of the storage group holding this parameter, or -1 (buffers,
  /// plans without ZeRO, frozen parameters before version 9): such tensors
  /// have a record of their own and every rank reads them whole. A member of group g has
  /// record == groups[g].record and offset == its byte offset in the
  /// group's buffer (record is empty when the group is split into parts).
  int64_t group = -1;
  /// Non-empty in a weights-free plan (bmt-opt --random-init): the tensor
  /// has no bytes in the archive and is initialized at load by this rule:
  /// "zeros", "ones" or "normal:<std>" (mean 0). record is then empty.
  std::string init;
  /// CRC-32 (zlib's polynomial) of the tensor's bytes; readers check it,
  /// since the zip container's own CRCs are not checked by LibTorch.
  int64_t crc32 = 0;
  /// Version 6: the split over the TP group (default: replicated); version
  /// 8: or over the expert group (split.over).
  TensorSplit split;

  int64_t numel() const;
  int64_t nbytes() const;
  /// The shape of one rank's slice with T = `tensorParallel` ranks per TP
  /// group and E = `expertParallel` per expert group: shape[dim] replaced
  /// by P / T for a split over the TP group, by shape[0] / E for one over
  /// the expert group; `shape` itself when not split. An expert split is
  /// no TP split: with E = 1 (the default) it gives the global shape.
  std::vector<int64_t> localShape(int64_t tensorParallel, int64_t expertParallel = 1) const;
  int64_t localNumel(int64_t tensorParallel, int64_t expertParallel = 1) const;
};

/// One argument of an instruction: a register, a constant, or a list of
/// arguments (for `int[]`, `Tensor[]`, `Tensor?[]` schema arguments).
struct Arg {
  enum class Kind { Register, Constant, List };
  Kind kind = Kind::Constant;
  int64_t reg = -1;          ///< Register: index into the function's registers
  c10::IValue constant;      ///< Constant
  std::vector<Arg> elements; ///< List

  static Arg ofRegister(int64_t r);
  static Arg ofConstant(c10::IValue v);
};

/// One step of a function.
struct Instruction {
  enum class Kind {
    Aten,        ///< call operator `op` with `args`; results in `results`
    Call,        ///< call function `target` with `args` (registers)
    Global,      ///< results[0] = tensor `target` of the plan
    Constant,    ///< results[0] = args[0].constant
    NumToTensor, ///< results[0] = 0-dim tensor of scalar args[0]
    Gather,      ///< start the all-gather of storage group `target` (ZeRO)
    Release,     ///< free the gathered buffer of group `target` (ZeRO-3)
    /// Version 5: results[0] = the fused region whose body is function
    /// `target` (params: the region's inputs, Aten, Constant and, for
    /// rotate_half's half size, NumToTensor instructions only, one return)
    /// applied to `args` (registers); `op`
    /// is its kind, "pointwise" or "row". Run as one generated kernel
    /// forward and one backward (include/bmt/Runtime/fusion/Region.h), or
    /// as the body's calls where the generator does not take the inputs.
    Fused,
    /// Version 6, tensor parallelism, on the TP group (sums):
    /// results[0] = the sum over the TP group of register args[0]; the
    /// gradient passes unchanged (Megatron-LM's "g").
    TpAllReduce,
    /// results[0] = args[0]; the gradient is summed over the TP group
    /// (Megatron-LM's "f", before a column-parallel matmul).
    TpCopy,
    /// results[0] = the TP rank (an int, like a Constant instruction).
    TpRank,
    /// results[0] = args[0] gathered from the TP group along dim `op` (a
    /// decimal string); backward: reduce-scatter along that dim.
    TpAllGather,
    /// results[0] = the sum over the TP group of args[0], scattered along
    /// dim `op` (a decimal string); backward: all-gather along that dim.
    TpReduceScatter,
    /// Version 7, a mixture-of-experts layer's token permutation
    /// (bmt.moe_dispatch; runtime/exec/Moe.h): args = registers [hidden
    /// [T, H], expert ids [T, K] int64], `op` = the expert count E (a
    /// decimal string); results = [rows [T*K, H] sorted by expert, sorted
    /// ids [T*K], offsets [E] int32, permutation [T*K]].
    MoeDispatch,
    /// Version 7 (bmt.moe_combine): args = registers [expert rows [T*K, H]
    /// in sorted order, the permutation, K (an int)]; results[0] = [T, H],
    /// each token's K rows back in token order, summed.
    MoeCombine,
    /// Version 11 (bmt.lora_adapter; runtime/exec/LoraAdapter.h): args =
    /// registers [base [..., out], input [..., in], A [r, in], B [out, r]]
    /// and constants [scale, dropout] (floats) and input parts (an int: T
    /// where input is the TP rank's part of an input split along its last
    /// dim, else 1); results[0] = base + scale * linear(linear(dropout(input),
    /// A), B).
    LoraAdapter,
  };
  Kind kind = Kind::Aten;
  std::string op;               ///< Aten: "aten::softmax.int"
  std::vector<Arg> args;
  int64_t target = -1;          ///< Call: function index; Global: tensor index
  std::vector<int64_t> results; ///< registers written
  std::string location;         ///< source location for messages ("f.py:3:1"), may be empty
  /// Call of a block (bmt.block_list member): the list's name and the
  /// block's index in it; empty / -1 for other calls.
  std::string blockList;
  int64_t blockIndex = -1;
  /// Call of a block: recompute it in backward instead of keeping its
  /// activations (activation checkpointing).
  bool checkpoint = false;
};

/// One function of the program (a submodule's forward).
struct Function {
  std::string name;       ///< symbol, e.g. "transformer.h.0.forward"
  std::string modulePath; ///< e.g. "transformer.h.0"
  int64_t numRegisters = 0;
  std::vector<int64_t> params;  ///< registers holding the arguments
  std::vector<Instruction> body;
  std::vector<int64_t> returns; ///< registers returned
  std::vector<std::string> paramNames;  ///< "input_ids", ... (may be empty strings)
  std::vector<std::string> resultNames; ///< "logits", ...
};

/// Parameters stored as one flat buffer (a bmt.storage_group), trainable
/// ones or (version 9, `frozen`) frozen ones:
/// member i occupies elements [offsets[i], offsets[i] + numel) of a buffer of
/// `size` elements of `dtype`; the gaps are alignment padding (zeros). With
/// world size N (or hybrid shard group size G), rank r holds elements
/// [r * ceil(size / N), (r + 1) * ceil(size / N)) of the buffer padded with
/// zeros to N * ceil(size / N); see shardRange().
struct StorageGroup {
  std::string name;          ///< "transformer.h.0.float32"
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> members; ///< plan tensor indices
  std::vector<int64_t> offsets; ///< element offset of each member
  int64_t size = 0;          ///< elements in the buffer
  std::string blockList;     ///< the block list it belongs to, "" outside blocks
  int64_t blockIndex = -1;   ///< the block's index in blockList, -1 outside
  std::string record;        ///< archive record holding the `size` elements
  /// Version 4: the buffer split into records, part k holding elements
  /// [k * partSize, min((k + 1) * partSize, size)) in record parts[k]
  /// (`record` is then empty), so that a writer holds one part at a time.
  /// Empty for a group in one record (or none: weights-free).
  std::vector<std::string> parts;
  int64_t partSize = 0;
  /// Version 6, T > 1: the TP rank whose local slices the group holds
  /// (-1 when T == 1). Every group exists T times, tpRank 0..T-1, with the
  /// same name, members, offsets and size; TensorInfo::group and the
  /// Gather/Release targets name the tpRank 0 copy (tpGroup() finds the
  /// others). Members' offsets and `size` count local elements.
  int64_t tpRank = -1;
  /// Version 6, T > 1: CRC-32 of each member's bytes in this copy (its
  /// local slice), in `members` order, checked instead of TensorInfo::crc32
  /// (which writeArchive sets to the tp_rank 0 copy's). Empty when the group
  /// has no record (weights-free) or T == 1.
  std::vector<int64_t> crc32s;
  /// Version 8, expert parallelism: -1, or the position p in the expert
  /// group whose slices this copy holds. Such a group holds only expert
  /// parameters split over the expert group (TensorSplit::over), exists E
  /// times (epRank 0..E-1: the same name, members, offsets and size, which
  /// count local elements, experts [p*X/E, (p+1)*X/E)), and TensorInfo::
  /// group and the Gather/Release targets name the epRank 0 copy. Its shards
  /// run over the N/E ranks of position p (docs/sharded-format.md).
  int64_t epRank = -1;
  /// Per-chunk checksums of this copy's flat buffer, so that a rank that
  /// reads a range of it checks every byte it reads: chunk k is bytes
  /// [k * chunkBytes, min((k + 1) * chunkBytes, nbytes())) of the buffer,
  /// chunkCrc32s[k] its CRC-32. chunkBytes 0 (chunkCrc32s empty): none, in
  /// a weights-free group or an archive written before them (readers then
  /// read every member a range touches whole and check its crc32).
  int64_t chunkBytes = 0;
  std::vector<int64_t> chunkCrc32s;
  /// Version 9: the members are frozen parameters (requires_grad false):
  /// the group is sharded and gathered like the others, but has no
  /// gradient, no master and no optimizer state. A group holds either
  /// frozen or trainable parameters, never both.
  bool frozen = false;

  int64_t nbytes() const { return size * static_cast<int64_t>(c10::elementSize(dtype)); }
};

/// Elements [begin, end) of a buffer of `size` elements that shard `rank`
/// of `shards` holds: shard length ceil(size / shards); the range is clipped
/// to the buffer, so the last shards may hold fewer (or no) real elements.
struct ShardRange {
  int64_t begin = 0, end = 0; ///< clipped to [0, size]
  int64_t shardSize = 0;      ///< ceil(size / shards), the padded shard length
};
ShardRange shardRange(int64_t size, int64_t rank, int64_t shards);

/// The plan's name of a dtype ("float32", "bfloat16", ...) and back. Throw
/// PlanError for a dtype the plan format has no name for.
std::string dtypeName(c10::ScalarType dtype);
c10::ScalarType dtypeFromName(const std::string &name);

/// TP rank `tpRank`'s slice (of `tensorParallel` ranks) of the global
/// tensor `global` (shape TensorInfo::shape) by `split`'s rule: padded with
/// zeros at the end of split.dim to paddedSize, then the rank's part of
/// each of the `chunks` chunks, concatenated. `global` itself when not
/// split. Returns a new contiguous tensor; throws PlanError when `global`'s
/// shape does not fit the split.
at::Tensor tpSlice(const at::Tensor &global, const TensorSplit &split, int64_t tensorParallel,
                   int64_t tpRank);

/// The inverse of tpSlice: the global tensor (shape `shape`, padding
/// dropped) from the `tensorParallel` slices `slices` (TP rank order, each
/// of the local shape). Returns a new contiguous tensor; PlanError when the
/// slices do not fit.
at::Tensor tpUnslice(const std::vector<at::Tensor> &slices, const TensorSplit &split,
                     const std::vector<int64_t> &shape);

/// CRC-32 (IEEE 802.3, zlib's crc32) of `nbytes` bytes at `data`: the
/// checksum of sharded.pt's tensors and of checkpoint shards. With
/// `previous`, the CRC-32 of the bytes that gave `previous` followed by
/// these (a checksum computed piece by piece).
uint32_t crc32(const void *data, size_t nbytes);
uint32_t crc32(const void *data, size_t nbytes, uint32_t previous);

/// The whole plan.
struct Plan {
  /// The version read (fromIValue); writers write formatVersionOf(plan).
  int64_t version = kPlanFormatVersion;
  std::string source;    ///< the model file it was compiled from
  std::string modelType; ///< root module class, e.g. "transformers...GPT2LMHeadModel"
  std::string objective; ///< "causal-lm", "masked-lm" or "span-corruption" (objectiveFor)
  std::vector<TensorInfo> tensors;
  std::vector<Function> functions;
  int64_t entry = 0; ///< index of the function to run ("forward")
  /// ZeRO: 0 = no storage groups (every rank holds every tensor), 2 or 3.
  int64_t zeroStage = 0;
  /// Hybrid sharding: shard within groups of this many ranks, replicate
  /// across groups (0 = shard across all ranks).
  int64_t shardGroupSize = 0;
  /// All-gathers started ahead of the block being run (bmt-overlap).
  int64_t prefetchDepth = 1;
  std::vector<StorageGroup> groups;
  /// What the compiler assumed about the inputs (the module attribute
  /// bmt.assumptions); each is one of the kAssume* strings. A runtime that
  /// feeds other inputs must refuse them.
  std::vector<std::string> assumptions;
  /// Version 6: T, the size of the tensor-parallel group (1: none). The
  /// world size must be a multiple of T; TP rank = rank % T, data-parallel
  /// rank = rank / T.
  int64_t tensorParallel = 1;
  /// Version 6: the entry's `logits` hold vocab entries [t*Vp/T, (t+1)*Vp/T)
  /// of the padded vocab Vp on TP rank t (a vocab-parallel LM head).
  bool vocabParallel = false;
  /// Version 6, vocabParallel: the real vocab size V; logits at vocab index
  /// >= V (padding) are ignored by the loss. 0 when not vocab-parallel.
  int64_t vocabSize = 0;
  /// Version 7, field `expert_parallel` (written only when > 1): E, the size
  /// of the expert group (docs/passes/moe-layers.md, "Expert parallelism").
  /// The world size must be a multiple of E; ranks [g*E, (g+1)*E) form expert
  /// group g, and rank r computes experts [(r%E)*X/E, (r%E+1)*X/E) of each
  /// MoE layer's X. Not with tensorParallel > 1.
  int64_t expertParallel = 1;
  /// Version 8, field `pipeline` (written only when P > 1): P, the pipeline
  /// stages of bmt-opt --pipeline-parallel (docs/passes/pipeline.md). Stage
  /// s runs blocks [pipelineFirstBlocks[s], pipelineFirstBlocks[s + 1]) of
  /// the block list pipelineBlockList, stage 0 also the entry's ops before
  /// the first block, stage P - 1 those after the last. The world size must
  /// be a multiple of P; rank r runs stage r / (world size / P).
  int64_t pipelineStages = 1;
  std::string pipelineBlockList;
  std::vector<int64_t> pipelineFirstBlocks;
  /// Version 10, `pipeline.virtual_stages` (written only when V > 1): V,
  /// bmt-opt --virtual-stages. The blocks are then cut into P x V chunks
  /// (pipelineFirstBlocks has P x V entries, chunk c's first block at c)
  /// and stage s runs chunks s, s + P, ..., s + (V - 1) P (interleaved
  /// 1F1B); chunk 0 also the ops before the first block, chunk P V - 1
  /// those after the last.
  int64_t pipelineVirtualStages = 1;

  /// The index of the tensor named `name` (or aliased so), or -1.
  int64_t findTensor(const std::string &name) const;
  /// Whether `assumptions` holds `assumption`.
  bool assumes(const std::string &assumption) const;
  /// The index of the copy of storage group `group` (a tpRank 0 or -1
  /// copy) that TP rank `tpRank` uses: `group` itself when T == 1.
  int64_t tpGroup(int64_t group, int64_t tpRank) const;
  /// The index of the copy of storage group `group` (an epRank 0 or -1
  /// copy) that position `epRank` of an expert group uses: `group` itself
  /// when the group is not split over the expert group.
  int64_t epGroup(int64_t group, int64_t epRank) const;
  /// Whether any tensor is split over the expert group.
  bool splitsExperts() const;
};

/// The version a writer gives `plan`: 2; 3 when it has assumptions; 4 when
/// a storage group is split into parts; 5 when a function has a Fused
/// instruction; 6 when anything of tensor parallelism is non-default
/// (T > 1, a TensorSplit, a tpRank, vocabParallel, a Tp* instruction); 7
/// when a function has a MoeDispatch or MoeCombine instruction; 8 when
/// pipelineStages > 1, a tensor is split over the expert group or a group
/// has an epRank; 9 when a group is frozen; 10 with virtual stages; 11
/// when a function has a LoraAdapter instruction. An
/// older reader must refuse such a plan rather than ignore what it does not
/// know; a plan with T == 1 and nothing else new is written as before.
int64_t formatVersionOf(const Plan &plan);

/// Plan <-> IValue. fromIValue throws PlanError on a malformed value, a
/// version it does not read (naming the versions it reads), or an
/// assumption it does not know; for version 6 also on a split, group copy
/// or vocab field inconsistent with tensor_parallel (naming the field);
/// for version 8 on an expert split or ep_rank copy inconsistent with
/// expert_parallel.
c10::IValue toIValue(const Plan &plan);
Plan fromIValue(const c10::IValue &value);

/// The objective bmt trains a model with: "span-corruption" (T5's) when
/// the entry function takes decoder_input_ids (an encoder-decoder), else
/// from the root class name: "masked-lm" for *ForMaskedLM /
/// *ForPreTraining, else "causal-lm".
std::string objectiveFor(const Plan &plan);

} // namespace bmt::plan

#endif // BMT_PLAN_PLAN_H
