//===- TensorSplit.h - a parameter's split over the TP group ----*- C++ -*-===//
//
// `--bmt-tensor-parallel` marks each parameter it splits with
// `bmt.tensor_split = {dim, chunks[, padded_size]}` (a replicated one whose
// gradient differs per TP rank, GQA's k/v projections when T exceeds the kv
// heads: `{dim = -1, chunks = 1, reduce_grad = true}`) and the module with
// `bmt.tensor_parallel = T`; the parameter's type stays the global shape.
// These read them back: the later passes (bmt-zero, the memory estimate)
// and the exporter (the plan's TensorSplit, docs/sharded-format.md) size
// and slice by the same rule: along `dim`, P = padded_size (or the size)
// elements in `chunks` equal chunks, each split T ways; a rank holds P / T.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_DIALECT_TENSORSPLIT_H
#define BMT_DIALECT_TENSORSPLIT_H

#include "bmt/Dialect/BmtDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

#include <cstdint>

namespace bmt {

/// A parameter's split; dim == -1 when it is replicated.
struct ParameterSplit {
  int64_t dim = -1;
  int64_t chunks = 1;
  int64_t paddedSize = 0; ///< 0: no padding
  bool reduceGrad = false; ///< replicated, gradient summed over the TP group
};

/// T of the module (`bmt.tensor_parallel`; 1 without it).
inline int64_t tensorParallelOf(mlir::ModuleOp module) {
  auto t = module ? module->getAttrOfType<mlir::IntegerAttr>("bmt.tensor_parallel") : nullptr;
  return t ? t.getInt() : 1;
}

/// The split `bmt.tensor_split` of `op` (a bmt.parameter or bmt.buffer)
/// records; replicated without the attribute.
inline ParameterSplit parameterSplitOf(mlir::Operation *op) {
  ParameterSplit s;
  auto d = op->getAttrOfType<mlir::DictionaryAttr>("bmt.tensor_split");
  if (!d)
    return s;
  if (auto a = d.getAs<mlir::IntegerAttr>("dim"))
    s.dim = a.getInt();
  if (auto a = d.getAs<mlir::IntegerAttr>("chunks"))
    s.chunks = a.getInt();
  if (auto a = d.getAs<mlir::IntegerAttr>("padded_size"))
    s.paddedSize = a.getInt();
  if (auto a = d.getAs<mlir::BoolAttr>("reduce_grad"))
    s.reduceGrad = a.getValue();
  return s;
}

/// Records `split` on `op` as `bmt.tensor_split` (the only writer of the
/// attribute; padded_size and reduce_grad only when set).
inline void setParameterSplit(mlir::Operation *op, const ParameterSplit &split) {
  mlir::Builder b(op->getContext());
  llvm::SmallVector<mlir::NamedAttribute, 4> fields{b.getNamedAttr("dim", b.getI64IntegerAttr(split.dim)),
                                                    b.getNamedAttr("chunks", b.getI64IntegerAttr(split.chunks))};
  if (split.paddedSize)
    fields.push_back(b.getNamedAttr("padded_size", b.getI64IntegerAttr(split.paddedSize)));
  if (split.reduceGrad)
    fields.push_back(b.getNamedAttr("reduce_grad", b.getBoolAttr(true)));
  op->setAttr("bmt.tensor_split", b.getDictionaryAttr(fields));
}

/// Whether `op` carries a `bmt.tensor_split`.
inline bool hasParameterSplit(mlir::Operation *op) { return op->hasAttr("bmt.tensor_split"); }

/// The split of a whole parameter whose gradient is summed over the TP group.
inline ParameterSplit reduceGradSplit() { return ParameterSplit{-1, 1, 0, true}; }

/// Elements of one TP rank's slice of a tensor of global `shape` split by
/// `split` over `tensorParallel` ranks (all of them when replicated).
inline int64_t localNumElements(llvm::ArrayRef<int64_t> shape, const ParameterSplit &split,
                                int64_t tensorParallel) {
  int64_t n = 1;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    int64_t size = shape[i];
    if (i == split.dim) {
      int64_t padded = split.paddedSize ? split.paddedSize : size;
      size = padded / tensorParallel;
    }
    n *= size;
  }
  return n;
}

/// localNumElements of parameter `p` in its module.
inline int64_t localNumElements(ParameterOp p) {
  auto module = p->getParentOfType<mlir::ModuleOp>();
  return localNumElements(mlir::cast<mlir::RankedTensorType>(p.getType()).getShape(),
                          parameterSplitOf(p), tensorParallelOf(module));
}

} // namespace bmt

#endif // BMT_DIALECT_TENSORSPLIT_H
