//===- BmtDialect.cpp - bmt dialect registration and types ----------------===//

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Plan/SplitRule.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

#include <limits>

using namespace mlir;
using namespace bmt;

#include "bmt/Dialect/BmtDialect.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "bmt/Dialect/BmtTypes.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "bmt/Dialect/BmtAttrs.cpp.inc"

void BmtDialect::initialize() {
  registerTypes();
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "bmt/Dialect/BmtOps.cpp.inc"
      >();
}

void BmtDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "bmt/Dialect/BmtTypes.cpp.inc"
      >();
}

void BmtDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "bmt/Dialect/BmtAttrs.cpp.inc"
      >();
}

Operation *BmtDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                           Type type, Location loc) {
  return ConstantOp::create(builder, loc, type, value);
}

static bmt::TensorSplit splitOf(int64_t dim, int64_t chunks, int64_t paddedSize, bool reduceGrad,
                                bool overExperts) {
  bmt::TensorSplit s;
  s.dim = dim;
  s.chunks = chunks;
  s.paddedSize = paddedSize;
  s.reduceGrad = reduceGrad;
  s.over = overExperts ? bmt::SplitGroup::Expert : bmt::SplitGroup::Tensor;
  return s;
}

LogicalResult TensorSplitAttr::verify(function_ref<InFlightDiagnostic()> emitError, int64_t dim,
                                      int64_t chunks, int64_t paddedSize, bool reduceGrad,
                                      StringRef over) {
  if (over != "tensor" && over != "expert")
    return emitError() << "#bmt.tensor_split: over must be \"tensor\" or \"expert\", not \"" << over
                       << "\"";
  // The shape and T are not known here: the dim's upper bound and the
  // divisibility are checked on the parameter (verifyOperationAttribute).
  std::string why = bmt::split::check(splitOf(dim, chunks, paddedSize, reduceGrad, over == "expert"),
                                      std::numeric_limits<int64_t>::max(), -1, 0);
  if (!why.empty())
    return emitError() << "#bmt.tensor_split: " << why;
  return success();
}

/// `bmt.tensor_split` on a bmt.parameter or bmt.buffer: a #bmt.tensor_split
/// that fits the tensor's shape and the module's `bmt.tensor_parallel` (a
/// split over the expert group: `bmt.expert_parallel`, on a parameter).
LogicalResult BmtDialect::verifyOperationAttribute(Operation *op, NamedAttribute attr) {
  if (attr.getName() != "bmt.tensor_split")
    return success();
  auto split = dyn_cast<TensorSplitAttr>(attr.getValue());
  if (!split)
    return op->emitOpError("bmt.tensor_split must be a #bmt.tensor_split");
  RankedTensorType type;
  if (auto p = dyn_cast<ParameterOp>(op))
    type = dyn_cast<RankedTensorType>(p.getType());
  else if (auto b = dyn_cast<BufferOp>(op))
    type = dyn_cast<RankedTensorType>(b.getType());
  if (!type)
    return op->emitOpError("bmt.tensor_split is for a bmt.parameter or bmt.buffer");
  bmt::TensorSplit s = splitOf(split.getDim(), split.getChunks(), split.getPaddedSize(),
                               split.getReduceGrad(), split.getOver() == "expert");
  if (s.isExpertSplit() && !isa<ParameterOp>(op))
    return op->emitOpError("bmt.tensor_split: a split over the expert group is for a parameter");
  int64_t tp = 0; // not known: T, or E for a split over the expert group
  if (auto module = op->getParentOfType<ModuleOp>())
    if (auto t = module->getAttrOfType<IntegerAttr>(s.isExpertSplit() ? "bmt.expert_parallel"
                                                                      : "bmt.tensor_parallel"))
      tp = t.getInt();
  int64_t rank = type.getRank();
  int64_t size = s.dim >= 0 && s.dim < rank ? type.getDimSize(s.dim) : -1;
  std::string why = bmt::split::check(s, rank, size, tp);
  if (!why.empty())
    return op->emitOpError("bmt.tensor_split: ") << why;
  return success();
}
