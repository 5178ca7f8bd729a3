//===- TensorParallelChainBuilderImpl.h - the chain builder's state -*- C++ -*-===//
//
// Private to the chain analysis of bmt-tensor-parallel: the builder's state
// and its propagation steps, defined in TensorParallelChainBuilder.cpp
// (the walk, the ShardingInterface rules, matmuls, replicated k/v, fused
// projections) and TensorParallelViewRules.cpp (the pass's own rules for
// views, reshapes, slices and splits). Every step returns LogicalResult or
// FailureOr; fail() records the reason.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_TENSORPARALLELCHAINBUILDERIMPL_H
#define BMT_PASSES_TENSORPARALLELCHAINBUILDERIMPL_H

#include "TensorParallelChainBuilder.h"

#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/Twine.h"

#include <optional>

namespace bmt::tp {

using mlir::FailureOr;
using mlir::LogicalResult;
using mlir::OpOperand;
using mlir::Operation;
using mlir::Value;
using llvm::StringRef;

struct ChainBuilder::Impl {
  Impl(ProgramIndex &program, int64_t tensorParallel, bool printShadow)
      : program(program), tensorParallel(tensorParallel), printShadow(printShadow) {}

  /// The calls, parameter reads and block functions of the module.
  ProgramIndex &program;
  int64_t tensorParallel;
  bool printShadow;
  /// Whether `p` is read only by `v`'s get_global, and `v` used once.
  bool usedOnlyHere(bmt::ParameterOp p, Value v);

  std::optional<MatmulShape> matmulShape(bmt::AtenOp op) { return bmt::tp::matmulShape(program, op); }

  /// The reason of the last failure.
  ChainError error;

  /// Records why the chain fails at `op` and returns failure.
  LogicalResult fail(Operation *op, const llvm::Twine &message, bool fatal = false);

  LogicalResult checkDivides(Operation *op, StringRef what, int64_t size, int64_t by);

  /// The split of `v` in the chain being built, if any.
  llvm::DenseMap<Value, Split> splits;

  LogicalResult assign(Value v, Split s, llvm::SmallVector<Value> &work);

  /// Normalizes a dim argument against rank `rank` (-1 unknown); none when
  /// the rank is needed and unknown.
  static std::optional<int64_t> negDim(int64_t d, int64_t rank);

  /// Propagates the chain from the values in `work`.
  LogicalResult propagate(llvm::SmallVector<Value> &work, Chain &chain);

  LogicalResult step(OpOperand &use, const Split &s, llvm::SmallVector<Value> &work, Chain &chain);

  /// What the ShardingInterface of `op` (lib/Dialect/ShardingInterfaceImpl.cpp)
  /// says of it when its operands are split as `splits` records, `s` the
  /// split just reached: upstream's getShardingOption from the operands'
  /// shardings over @tp, then getShardingAnnotations for every operand and
  /// result. The interface reads ranks from ranked tensor types, so it is
  /// asked about a copy of `op` with ranked operands (cloneWithRankedTypes):
  /// a value's rank where the pass knows it (the views that made it, a
  /// parameter's shape), else that of `s` (or, unknown, at least 4 and at
  /// least -s.dim; dims count from the end, as broadcasting aligns them).
  struct Propagated {
    bool rule = false;     // the interface has a rule for `op` at these ranks
    bool conflict = false; // the operands' splits give no one sharding option
    bool reduced = false;  // a split dim is one `op` reduces (contracts)
    /// Per operand and result: its split dim in the annotation (from the
    /// end); none when replicated or no tensor.
    llvm::SmallVector<std::optional<int64_t>> operandDims, resultDims;
    llvm::SmallVector<int64_t> resultRanks;
  };
  Propagated consult(Operation *op, const Split &s);

  /// Splits the results of `op` as its ShardingInterface rule says (a
  /// result the rule leaves replicated, like type_as's dtype source, is
  /// not split); `reduced` is the failure when the split dim is one `op`
  /// reduces.
  LogicalResult byInterface(Operation *op, const Split &s, llvm::SmallVector<Value> &work,
                            const llvm::Twine &reduced);

  /// Where a transpose, permute or unsqueeze moves the split dim: its
  /// ShardingInterface rule (a permutation of the loops).
  FailureOr<int64_t> dimByInterface(bmt::AtenOp op, const Split &s);

  /// softmax, norms, mean / sum / amax: by their ShardingInterface rule,
  /// which allows no split of a dim they reduce. A reduced dim counted from
  /// the front needs the rank, which the pass may not know.
  LogicalResult reduction(bmt::AtenOp op, const Split &s, llvm::SmallVector<Value> &work);

  LogicalResult matmul(bmt::AtenOp op, OpOperand &use, const Split &s, llvm::SmallVector<Value> &work,
                       Chain &chain);

  /// True while a chain is built with its narrower column matmuls (GQA's
  /// k and v projections) replicated.
  bool replicateKv = false;

  /// With replicated k/v (`replicateKv`): when `v`, a replicated operand of
  /// a per-head matmul or attention whose other operand `s` is split by
  /// heads, is (through transposes) the repeat of the kv heads to the H
  /// query heads, `reshape(expand(unsqueeze(kv, 2), [b, kv, n_rep, s, d]),
  /// [b, kv * n_rep, s, d])` (Hugging Face's repeat_kv, TorchScript and
  /// torch.export alike), records that the repeat's result is narrowed to
  /// the rank's heads and propagates it as split by heads. The narrow is
  /// exact: query head h attends with repeated head h, which is kv head
  /// h / n_rep, whichever rank holds h.
  LogicalResult narrowRepeat(Value v, const Split &s, llvm::SmallVector<Value> &work, Chain &chain);

  /// With replicated k/v: every value computed from the replicated
  /// projections ends in a narrowed repeat or is read for its sizes only
  /// (another reader would compute from all kv heads on every rank, and
  /// its gradient would be summed T times by reduce_grad and tp_copy).
  LogicalResult checkReplicated(Chain &chain);

  LogicalResult edit(Chain &chain, bmt::AtenOp op, unsigned arg, int elem, int64_t global,
                     StringRef what);

  LogicalResult view(bmt::AtenOp op, OpOperand &use, const Split &s, llvm::SmallVector<Value> &work,
                     Chain &chain);

  /// A slice [start, end) of a fused projection's output along the split
  /// dim that takes one of its `chunks` equal parts; each rank holds its
  /// 1 / T of every part, in the parts' order, so the bounds become
  /// [start / T, end / T) (an end past the width stays).
  LogicalResult fusedSlice(bmt::AtenOp op, const Split &s, llvm::SmallVector<Value> &work, Chain &chain);

  /// view/reshape: which dim of the new shape holds the split, from the
  /// entries after it (docs/passes/tensor-parallel.md lists the cases).
  LogicalResult reshape(bmt::AtenOp op, const Split &s, llvm::SmallVector<Value> &work, Chain &chain);

  /// Whether `v` is aten::size.int of a value (the local size at run time).
  static bool isLocalSize(Value v);

  /// The value `v` stands for in the outermost function that still feeds
  /// only through calls, with the call operands on the way.
  Value traceInput(Value v, llvm::SmallVector<OpOperand *> &path);
  /// aten::type_as(x, v): only v's dtype is read.
  static bool type_as_other(Operation *op, Value v);
  /// Whether every use of `v` is a matmul's input, a metadata read, or a
  /// call (of a function called once) whose argument is such a value.
  bool feedsOnlyMatmuls(Value v);

  bool isMatmulInput(OpOperand &u);

  static unsigned inputOperand(bmt::AtenOp op, const MatmulShape &m);

  /// How many chunks the output of a column matmul has: the number of
  /// results of the aten::split (or, read without a view, aten::chunk) along
  /// the last dim that takes it apart into equal parts, or of the slices
  /// that do (Phi-3's qkv_proj: [..., 0:q], [..., q:2q], [..., 2q:]), else 1.
  /// With slices along a dim counted from the front, `rank` is set to the
  /// output's rank (the sliced dim is its last).
  int64_t fusedChunks(bmt::AtenOp op, const MatmulShape &m, int64_t *rank = nullptr);

  /// The number of equal parts of [0, `width`) that the uses of `v`, all
  /// aten::slice.Tensor along one dim with constant bounds and step 1,
  /// take (each one part; the last may end at the end), else 0. A dim
  /// counted from the front is taken as the last, and `rank` set.
  int64_t slicedChunks(Value v, int64_t width, int64_t *rank);

  /// One chain from `seeds` (ChainBuilder::build).
  FailureOr<Chain> build(Value input, llvm::ArrayRef<ChainSeed> seeds, bool replicate);
};

} // namespace bmt::tp

#endif // BMT_PASSES_TENSORPARALLELCHAINBUILDERIMPL_H
