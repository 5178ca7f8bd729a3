//===- TensorParallelChains.h - what bmt-tensor-parallel found --*- C++ -*-===//
//
// The state bmt-tensor-parallel's stages pass to one another: a chain found
// by the chain analysis (TensorParallelChainBuilder.cpp), checked against upstream
// (TensorParallelShadow.cpp), proved (TensorParallelGradients.h), rewritten,
// and described by the report (TensorParallelReport.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_TENSORPARALLELCHAINS_H
#define BMT_PASSES_TENSORPARALLELCHAINS_H

#include "bmt/Dialect/BmtDialect.h"

#include "TensorParallelGradients.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SmallVector.h"

#include <memory>
#include <optional>
#include <string>

namespace bmt::tp {

/// What every stage asks of the program: who calls a function, who reads a
/// parameter, which functions the block lists reach (TensorParallelProgram.cpp).
struct ProgramIndex {
  mlir::ModuleOp module;
  std::shared_ptr<mlir::SymbolTable> symbols;
  llvm::DenseMap<mlir::Operation *, llvm::SmallVector<mlir::func::CallOp>> callSites; // func -> calls
  llvm::DenseMap<mlir::Operation *, llvm::SmallVector<bmt::GetGlobalOp>> paramReads;
  llvm::DenseSet<mlir::Operation *> blockFuncs; // the functions a block list's calls reach

  static ProgramIndex build(mlir::ModuleOp module);
  /// The parameter `v` reads (a get_global of one), else null.
  bmt::ParameterOp paramOf(mlir::Value v);
  /// The parameter a value is, through call arguments (a tied head gets its
  /// weight as an argument); null otherwise.
  bmt::ParameterOp traceParam(mlir::Value v);
  /// Every op that reads the value of `p`, through calls: {op, operand}.
  void readersOf(bmt::ParameterOp p, llvm::SmallVector<mlir::OpOperand *> &out);
  /// Whether `f` is a block of a block list (not a function it calls).
  bool isBlockRoot(mlir::func::FuncOp f);
};

/// The weight (and bias) of a matmul with a parameter weight:
/// aten::linear(x, W[out, in], b) or aten::addmm(b, x, W[in, out]).
/// `outDim` is the weight's output dim.
struct MatmulShape {
  bmt::ParameterOp weight, bias;
  mlir::Value input, weightValue, biasValue;
  int64_t outDim, in, out;
};
std::optional<MatmulShape> matmulShape(ProgramIndex &program, bmt::AtenOp op);

/// The shape of a parameter (ranked).
llvm::ArrayRef<int64_t> shapeOf(bmt::ParameterOp p);
/// Whether `op` reads only its operands' metadata (sizes, dtype).
bool isMetadata(mlir::Operation *op);

/// How a value is split over the TP group: along `dim` (counted from the
/// end, -1 the last), whose global size is `global` (-1 unknown), made of
/// `chunks` equal parts each split T ways (fused q/k/v: 3). `sizes` holds
/// the global sizes of every dim when the rank is known (-1 per unknown
/// size), and is empty when it is not.
struct Split {
  int64_t dim = -1;
  int64_t global = -1;
  int64_t chunks = 1;
  llvm::SmallVector<int64_t> sizes;
  /// True when the dim holds attention heads (found by a view that splits
  /// the hidden dim into heads x head dim).
  bool heads = false;

  bool rankKnown() const { return !sizes.empty(); }
  int64_t rank() const { return static_cast<int64_t>(sizes.size()); }
  /// The split dim as a position (needs the rank).
  int64_t pos() const { return rank() + dim; }
  void setSizes(llvm::SmallVector<int64_t> s) {
    sizes = std::move(s);
    if (rankKnown() && pos() >= 0 && pos() < rank())
      sizes[pos()] = global;
  }
};

/// A constant argument (or list element) of a bmt.aten op to rewrite to its
/// local size.
struct IntEdit {
  bmt::AtenOp op;
  unsigned arg;
  int elem; // -1: the argument itself
  int64_t value;
};

struct MatmulSite {
  bmt::AtenOp op;
  bmt::ParameterOp weight;
  bmt::ParameterOp bias; // may be null
  int64_t weightDim;     // the weight dim that is split
};

/// A repeat of replicated kv heads to the H query heads (GQA's repeat_kv:
/// expand + reshape) whose result each TP rank narrows to its own H / T
/// heads, [t * H / T, (t + 1) * H / T).
struct HeadNarrow {
  bmt::AtenOp repeat; // the reshape that makes the H heads
  int64_t pos;        // the heads dim in its result
  int64_t heads;      // H
};

/// One column-parallel -> row-parallel chain, found but not yet rewritten.
struct Chain {
  llvm::SmallVector<MatmulSite> columns;
  /// K/V projections replicated on every TP rank (T exceeds, or does not
  /// divide, the kv heads): their weights and biases get reduce_grad.
  llvm::SmallVector<MatmulSite> replicated;
  llvm::SmallVector<HeadNarrow> narrows;
  int64_t replicatedKvHeads = 0; // the kv heads of the replicated projections
  llvm::SmallVector<MatmulSite> rows;
  llvm::SmallVector<IntEdit> edits;
  llvm::MapVector<mlir::Operation *, std::pair<int64_t, int64_t>> paramSplits; // {dim, chunks}
  llvm::SmallVector<mlir::OpOperand *> copyUses; // uses of the replicated input to route through tp_copy
  mlir::Value input;
  int64_t headsGlobal = 0; // attention heads of the widest head split, 0 when none
  int64_t kvHeads = 0;     // the narrowest (GQA/MQA kv heads), 0 when none
  int64_t columnWidth = 0; // global width of the first column matmul
  int64_t widestColumn = 0; // of the widest (narrower ones: GQA's k, v)
  bool fused = false;      // a column weight holds several chunks (fused q/k/v)
  int64_t ops = 0;
  /// Every value the chain splits, and how: the `bmt.sharding` annotations.
  llvm::SmallVector<std::pair<mlir::Value, Split>> values;
  /// The split dim (from the end) that upstream's sharding-propagation
  /// decided for each result of the chain's ops that have a sharding rule
  /// (none: replicated); see TensorParallelPass::shadow.
  llvm::DenseMap<mlir::Value, std::optional<int64_t>> upstream;
};

/// Why a chain cannot be split (ChainBuilder::error()): `fatal` for sizes that
/// T does not divide (the compile fails), else the chain stays replicated.
struct ChainError {
  bool fatal = false;
  mlir::Operation *op = nullptr;
  std::string message;
  mlir::Operation *seed = nullptr; // the first column matmul of the chain
};

//===--- The rewrite (TensorParallelRewrite.cpp) --------------------------===//

/// Rewrites the chains found (none failed): the `bmt.sharding` annotations,
/// the split parameters (bmt::setParameterSplit), the local sizes, a
/// tp_copy before each chain and a tp_all_reduce after each row matmul, the
/// narrowed kv-head repeats, and the module's @tp grid.
void rewriteChains(ProgramIndex &program, int64_t tensorParallel, llvm::ArrayRef<Chain> chains);

//===--- Vocab parallelism (TensorParallelVocab.cpp) ----------------------===//

/// After the chains are rewritten: splits the LM head that makes the entry's
/// logits and the embeddings that read its (tied) weight along the vocab
/// (each rank its rows, padded when T does not divide the vocab). Returns
/// the remark's text: what was split, or why the head stays replicated.
std::string vocabParallel(ProgramIndex &program, int64_t tensorParallel);

//===--- Sequence parallelism (TensorParallelSequence.cpp) ----------------===//

/// After the chains are rewritten: splits the activations between the chains
/// along the sequence (dim 1), each tp_all_reduce a reduce-scatter and each
/// tp_copy an all-gather, and marks the parameters read there reduce_grad.
/// Returns the remark's text, or failure after one error on the op that
/// cannot be split along the sequence.
mlir::FailureOr<std::string> sequenceParallelize(ProgramIndex &program, int64_t tensorParallel);

//===--- The report (TensorParallelReport.cpp) ----------------------------===//

/// "aten::linear in model.layers.0.mlp.forward": an op's name (the ATen
/// name of a bmt.aten) and the function it is in, for errors and remarks.
std::string describe(mlir::Operation *op);

/// "model.layers.0.mlp.down_proj.weight" -> "mlp.down_proj" (the module path
/// of a matmul's weight relative to its block).
std::string shortName(mlir::ModuleOp module, mlir::SymbolTable &symbols, bmt::ParameterOp p);

/// The text of the pass's main remark after "bmt-tensor-parallel: T ranks, ":
/// blocks, the chains of the first block, the vocab and sequence parts (`vocab`
/// and `sequence`, the latter empty without sequence parallelism), the ops
/// split and the chains left replicated (`skipped`).
std::string chainReport(mlir::ModuleOp module, mlir::SymbolTable &symbols, int64_t tensorParallel,
                        llvm::ArrayRef<Chain> chains, llvm::ArrayRef<ChainError> skipped,
                        const std::string &vocab, const std::string &sequence);

/// The gradient-completion remark: how many whole parameters get reduce_grad
/// (named), how many between the chains under sequence parallelism, how many
/// are identical on every rank.
std::string gradientReport(mlir::ModuleOp module, mlir::SymbolTable &symbols,
                           llvm::ArrayRef<ParameterGradient> gradients);

} // namespace bmt::tp

#endif // BMT_PASSES_TENSORPARALLELCHAINS_H
