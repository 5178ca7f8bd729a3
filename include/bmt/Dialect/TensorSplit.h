//===- TensorSplit.h - a parameter's split over the TP group ----*- C++ -*-===//
//
// `--bmt-tensor-parallel` marks each parameter it splits with
// `bmt.tensor_split = #bmt.tensor_split<dim = D, chunks = C[, padded_size = P]>`
// (a replicated one whose gradient differs per TP rank, GQA's k/v
// projections when T exceeds the kv heads: `<dim = -1, chunks = 1,
// reduce_grad = true>`) and the module with `bmt.tensor_parallel = T`; the
// parameter's type stays the global shape. A split over the expert group
// (`over = "expert"`, E = `bmt.expert_parallel`) cuts an expert parameter's
// dim 0 E ways instead. These read them back: the later
// passes (bmt-zero, the memory estimate) and the exporter (the plan's
// TensorSplit, docs/sharded-format.md) size and slice by one rule,
// bmt/Plan/SplitRule.h's.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_DIALECT_TENSORSPLIT_H
#define BMT_DIALECT_TENSORSPLIT_H

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Plan/SplitRule.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

#include <algorithm>
#include <cstdint>

namespace bmt {

/// A parameter's split; dim == -1 when it is replicated (bmt::TensorSplit).
using ParameterSplit = TensorSplit;

/// T of the module (`bmt.tensor_parallel`; 1 without it).
inline int64_t tensorParallelOf(mlir::ModuleOp module) {
  auto t = module ? module->getAttrOfType<mlir::IntegerAttr>("bmt.tensor_parallel") : nullptr;
  return t ? t.getInt() : 1;
}

/// E of the module (`bmt.expert_parallel`; 1 without it).
inline int64_t expertParallelOf(mlir::ModuleOp module) {
  auto e = module ? module->getAttrOfType<mlir::IntegerAttr>("bmt.expert_parallel") : nullptr;
  return e ? e.getInt() : 1;
}

/// The size of the group `split` runs over in `module`: E for a split over
/// the expert group, else T.
inline int64_t splitRanksOf(mlir::ModuleOp module, const TensorSplit &split) {
  return split.isExpertSplit() ? expertParallelOf(module) : tensorParallelOf(module);
}

/// The split `bmt.tensor_split` of `op` (a bmt.parameter or bmt.buffer)
/// records; replicated without the attribute.
inline ParameterSplit parameterSplitOf(mlir::Operation *op) {
  ParameterSplit s;
  if (auto a = op->getAttrOfType<TensorSplitAttr>("bmt.tensor_split")) {
    s.dim = a.getDim();
    s.chunks = a.getChunks();
    s.paddedSize = a.getPaddedSize();
    s.reduceGrad = a.getReduceGrad();
    s.over = a.getOver() == "expert" ? SplitGroup::Expert : SplitGroup::Tensor;
  }
  return s;
}

/// Records `split` on `op` as `bmt.tensor_split` (the only writer of the
/// attribute; padded_size and reduce_grad are printed only when set).
inline void setParameterSplit(mlir::Operation *op, const ParameterSplit &split) {
  op->setAttr("bmt.tensor_split",
              TensorSplitAttr::get(op->getContext(), split.dim, split.chunks, split.paddedSize,
                                   split.reduceGrad,
                                   split.over == SplitGroup::Expert ? "expert" : "tensor"));
}

/// Whether `op` carries a `bmt.tensor_split`.
inline bool hasParameterSplit(mlir::Operation *op) {
  return static_cast<bool>(op->getAttrOfType<TensorSplitAttr>("bmt.tensor_split"));
}

/// The split of a whole parameter whose gradient is summed over the TP group.
inline ParameterSplit reduceGradSplit() { return ParameterSplit{-1, 1, 0, true}; }

/// Elements of one rank's slice of a tensor of global `shape` split by
/// `split` over `tensorParallel` ranks (E for a split over the expert
/// group; all of them when replicated).
inline int64_t localNumElements(llvm::ArrayRef<int64_t> shape, const ParameterSplit &split,
                                int64_t tensorParallel) {
  return split::localNumel(std::vector<int64_t>(shape.begin(), shape.end()), split,
                           tensorParallel);
}

/// localNumElements of parameter `p` in its module.
inline int64_t localNumElements(ParameterOp p) {
  auto module = p->getParentOfType<mlir::ModuleOp>();
  const ParameterSplit split = parameterSplitOf(p);
  return localNumElements(mlir::cast<mlir::RankedTensorType>(p.getType()).getShape(), split,
                          splitRanksOf(module, split));
}

/// bmt-zero's layout of a storage group of `members` (parameters of one
/// element type, in this order): each member's offset at the next multiple
/// of `alignmentBytes` after the one before, and the group's size rounded
/// up to it, in elements of a rank's slices (localNumElements).
struct StorageLayout {
  llvm::SmallVector<int64_t> offsets;
  int64_t size = 0;
};
inline StorageLayout storageLayout(llvm::ArrayRef<ParameterOp> members, int64_t alignmentBytes) {
  StorageLayout layout;
  if (members.empty())
    return layout;
  ParameterOp first = members.front(); // (an op handle's accessors are not const)
  mlir::Type element = mlir::cast<mlir::RankedTensorType>(first.getType()).getElementType();
  const int64_t elementBytes = std::max<int64_t>(1, element.getIntOrFloatBitWidth() / 8);
  const int64_t align = std::max<int64_t>(1, alignmentBytes / elementBytes);
  int64_t end = 0;
  for (ParameterOp p : members) { // (a copy: the handle's accessors are not const)
    const int64_t offset = (end + align - 1) / align * align;
    layout.offsets.push_back(offset);
    end = offset + localNumElements(p);
  }
  layout.size = (end + align - 1) / align * align;
  return layout;
}

} // namespace bmt

#endif // BMT_DIALECT_TENSORSPLIT_H
