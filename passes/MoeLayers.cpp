//===- MoeLayers.cpp - the bmt-moe-layers pass ----------------------------===//
//
// Finds the token permutation of transformers' grouped_mm experts (sort the
// token copies by expert, count them per expert; after the experts, undo the
// sort and sum each token's K copies) and replaces its ATen ops by one
// bmt.moe_dispatch and one bmt.moe_combine, leaving the experts' own ops
// (the grouped matmuls, the activation, the masks, the routing weights) as
// they are. The match is strict: every op of both patterns, every constant
// and every user of an intermediate value must be the expected one;
// anything else leaves the function untouched. See passes/Passes.td for the
// contract and docs/passes/moe-layers.md.
//
//===----------------------------------------------------------------------===//

#include "MoeLayers.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/MoeAttrs.h"
#include "bmt/Dialect/TensorSplit.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/Support/Debug.h"

#include <optional>

#define DEBUG_TYPE "bmt-moe-layers"

namespace bmt {
#define GEN_PASS_DEF_MOELAYERS
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;
using bmt::AtenOpId;

namespace {

/// ScalarType codes the pattern casts to: float32 (histc's input) and int32
/// (the offsets _grouped_mm reads).
constexpr int64_t kFloat32 = 6;
constexpr int64_t kInt32 = 3;

/// The dispatch's ops in one function: ids [T, K] and hidden [T, H] are
/// arguments of the function.
struct DispatchMatch {
  BlockArgument hidden, ids;
  /// K: aten::size.int(ids, -1) in a trace; null in a .pt2, where K is the
  /// constant topKConstant.
  Value topK;
  std::optional<int64_t> topKConstant;
  int64_t numExperts = 0;
  bmt::AtenOp flatIds, sort, toFloat, histc, cumsum, floorDiv, rows;
  /// floor_divide's divisor: num_to_tensor(K) (a trace) or a 0-dim
  /// bmt.constant (a .pt2).
  Operation *topKTensor = nullptr;
};

/// The combine's ops: the inverse permutation made by index_put_, the
/// gather of the expert rows by it, the [T, K, H] view and the sum over K.
/// `count` (aten::size.int(perm, 0), arange's end) is null in a .pt2, whose
/// end is the export's T*K.
struct CombineMatch {
  Value expertRows;
  /// The routing weights' gathers, index(reshape(weights, [-1]), [perm]).
  SmallVector<bmt::AtenOp> weightGathers;
  bmt::AtenOp emptyLike, count, arange, indexPut, gather, view, sum;
};

/// The op of `id` defining `v`, or null.
bmt::AtenOp definingAten(Value v, AtenOpId id) {
  if (!v)
    return {};
  auto op = v.getDefiningOp<bmt::AtenOp>();
  return op && bmt::atenOpId(op) == id ? op : bmt::AtenOp();
}

/// Schema argument `name` of `op` when it is an operand; null otherwise.
Value operandArg(bmt::AtenOp op, StringRef name) {
  std::optional<bmt::AtenArg> arg = bmt::getAtenArg(op, name);
  return arg && arg->isOperand() ? arg->getOperand() : Value();
}

/// The one operand of a one-element `Tensor?[]` argument `name` of `op`.
Value singleIndex(bmt::AtenOp op, StringRef name) {
  std::optional<bmt::AtenArg> arg = bmt::getAtenArg(op, name);
  if (!arg || !arg->isList() || arg->getElements().size() != 1 ||
      !arg->getElements()[0].isOperand())
    return {};
  return arg->getElements()[0].getOperand();
}

bool intArgIs(bmt::AtenOp op, StringRef name, int64_t value) {
  std::optional<bmt::AtenArg> arg = bmt::getAtenArg(op, name);
  return arg && arg->getInt() == value;
}

bool boolArgIs(bmt::AtenOp op, StringRef name, bool value) {
  std::optional<bmt::AtenArg> arg = bmt::getAtenArg(op, name);
  return arg && arg->getBool() == value;
}

bool numberArgIs(bmt::AtenOp op, StringRef name, double value) {
  std::optional<bmt::AtenArg> arg = bmt::getAtenArg(op, name);
  return arg && arg->getNumber() == value;
}

bool noneArg(bmt::AtenOp op, StringRef name) {
  std::optional<bmt::AtenArg> arg = bmt::getAtenArg(op, name);
  return arg && arg->isNone();
}

/// Whether `v` has exactly one use, by `user`.
bool onlyUser(Value v, Operation *user) {
  return v.hasOneUse() && *v.user_begin() == user;
}

/// `aten::size.int(of, dim)` with dim one of `dims`.
bool isSizeOf(Value v, Value of, std::initializer_list<int64_t> dims) {
  bmt::AtenOp size = definingAten(v, AtenOpId::size_int);
  if (!size || operandArg(size, "self") != of)
    return false;
  std::optional<bmt::AtenArg> dim = bmt::getAtenArg(size, "dim");
  return dim && dim->getInt() && llvm::is_contained(dims, *dim->getInt());
}

/// `reshape(arg, [-1])` of a function argument: the argument.
BlockArgument flattenedArgument(Value v) {
  bmt::AtenOp reshape = definingAten(v, AtenOpId::reshape);
  if (!reshape)
    return {};
  std::optional<bmt::AtenArg> shape = bmt::getAtenArg(reshape, "shape");
  std::optional<SmallVector<int64_t>> ints = shape ? shape->getInts() : std::nullopt;
  if (!ints || *ints != SmallVector<int64_t>{-1})
    return {};
  return dyn_cast_or_null<BlockArgument>(operandArg(reshape, "self"));
}

/// The leading dim of the 3-D parameter a grouped matmul's `mat2` reads
/// (the parameter, or its transpose of the last two dims): the expert count.
FailureOr<int64_t> expertsOfWeight(Value mat2, SymbolTable &symbols) {
  if (bmt::AtenOp transpose = definingAten(mat2, AtenOpId::transpose_int)) {
    if (!intArgIs(transpose, "dim0", -2) || !intArgIs(transpose, "dim1", -1))
      return failure();
    mat2 = operandArg(transpose, "self");
  }
  auto global = mat2 ? mat2.getDefiningOp<bmt::GetGlobalOp>() : bmt::GetGlobalOp();
  if (!global)
    return failure();
  auto param = symbols.lookup<bmt::ParameterOp>(global.getGlobal());
  auto type = param ? dyn_cast<RankedTensorType>(param.getType()) : RankedTensorType();
  if (!type || type.getRank() != 3 || type.isDynamicDim(0))
    return failure();
  return type.getDimSize(0);
}

/// E from histc(float(sorted ids), E, 0, E - 1) -> cumsum(int32): the
/// offsets; every user of the offsets is a grouped matmul over a parameter
/// of E experts.
LogicalResult matchCounts(DispatchMatch &m, SymbolTable &symbols) {
  Value sorted = m.sort->getResult(0);
  for (Operation *user : sorted.getUsers())
    if (bmt::atenOpId(user) == AtenOpId::to_dtype) {
      if (m.toFloat)
        return failure();
      m.toFloat = cast<bmt::AtenOp>(user);
    }
  if (!m.toFloat || !intArgIs(m.toFloat, "dtype", kFloat32) ||
      !boolArgIs(m.toFloat, "non_blocking", false) || !boolArgIs(m.toFloat, "copy", false) ||
      !noneArg(m.toFloat, "memory_format") || !m.toFloat->getResult(0).hasOneUse())
    return failure();
  m.histc = dyn_cast<bmt::AtenOp>(*m.toFloat->getResult(0).user_begin());
  if (!m.histc || bmt::atenOpId(m.histc) != AtenOpId::histc)
    return failure();
  std::optional<bmt::AtenArg> bins = bmt::getAtenArg(m.histc, "bins");
  if (!bins || !bins->getInt() || *bins->getInt() < 1)
    return failure();
  m.numExperts = *bins->getInt();
  if (!numberArgIs(m.histc, "min", 0) || !numberArgIs(m.histc, "max", m.numExperts - 1) ||
      !m.histc->getResult(0).hasOneUse())
    return failure();
  m.cumsum = dyn_cast<bmt::AtenOp>(*m.histc->getResult(0).user_begin());
  if (!m.cumsum || bmt::atenOpId(m.cumsum) != AtenOpId::cumsum ||
      !intArgIs(m.cumsum, "dim", 0) || !intArgIs(m.cumsum, "dtype", kInt32) ||
      m.cumsum->getResult(0).use_empty())
    return failure();
  for (Operation *user : m.cumsum->getResult(0).getUsers()) {
    auto mm = dyn_cast<bmt::AtenOp>(user);
    if (!mm || bmt::atenOpId(mm) != AtenOpId::_grouped_mm ||
        operandArg(mm, "offs") != m.cumsum->getResult(0) ||
        operandArg(mm, "self") == m.cumsum->getResult(0) ||
        operandArg(mm, "mat2") == m.cumsum->getResult(0))
      return failure();
    FailureOr<int64_t> experts = expertsOfWeight(operandArg(mm, "mat2"), symbols);
    if (failed(experts) || *experts != m.numExperts) {
      LLVM_DEBUG(llvm::dbgs() << "histc bins " << m.numExperts
                              << " differ from the experts' weights\n");
      return failure();
    }
  }
  return success();
}

/// rows = hidden[perm floordiv K], K = size(ids, -1) as a 0-dim tensor (a
/// trace) or a 0-dim integer constant (a .pt2, specialized to its K).
LogicalResult matchRows(DispatchMatch &m) {
  Value perm = m.sort->getResult(1);
  for (Operation *user : perm.getUsers())
    if (bmt::atenOpId(user) == AtenOpId::floor_divide) {
      if (m.floorDiv)
        return failure();
      m.floorDiv = cast<bmt::AtenOp>(user);
    }
  if (!m.floorDiv || operandArg(m.floorDiv, "self") != perm)
    return failure();
  Value k = operandArg(m.floorDiv, "other");
  if (!k || !onlyUser(k, m.floorDiv))
    return failure();
  if (auto n = k.getDefiningOp<bmt::NumToTensorOp>()) {
    if (!isSizeOf(n.getInput(), m.ids, {-1, 1}))
      return failure();
    m.topK = n.getInput();
    m.topKTensor = n;
  } else if (auto c = k.getDefiningOp<bmt::ConstantOp>()) {
    m.topKConstant = bmt::getConstantInt(k);
    if (!m.topKConstant || *m.topKConstant < 1)
      return failure();
    m.topKTensor = c;
  } else {
    return failure();
  }
  if (!m.floorDiv->getResult(0).hasOneUse())
    return failure();
  m.rows = dyn_cast<bmt::AtenOp>(*m.floorDiv->getResult(0).user_begin());
  if (!m.rows || bmt::atenOpId(m.rows) != AtenOpId::index_Tensor ||
      singleIndex(m.rows, "indices") != m.floorDiv->getResult(0))
    return failure();
  m.hidden = dyn_cast_or_null<BlockArgument>(operandArg(m.rows, "self"));
  return success(m.hidden && m.hidden != m.ids);
}

/// `index(parameter, [ids])`: a per-expert parameter (a bias) read by the
/// sorted ids.
bool isPerExpertParameter(Operation *user, Value ids) {
  auto aten = dyn_cast<bmt::AtenOp>(user);
  if (!aten || bmt::atenOpId(aten) != AtenOpId::index_Tensor || singleIndex(aten, "indices") != ids)
    return false;
  Value table = operandArg(aten, "self");
  return table && table.getDefiningOp<bmt::GetGlobalOp>();
}

/// gpt-oss's `clamp_(sorted ids, None, E - 1)` (in place, after the counts)
/// read only by per-expert parameters.
bool isClampedForParameters(Operation *user, Value sorted, int64_t numExperts) {
  auto clamp = dyn_cast<bmt::AtenOp>(user);
  if (!clamp || bmt::atenOpId(clamp) != AtenOpId::clamp_ || operandArg(clamp, "self") != sorted ||
      !noneArg(clamp, "min") || !intArgIs(clamp, "max", numExperts - 1))
    return false;
  Value clamped = clamp->getResult(0);
  return llvm::all_of(clamped.getUsers(),
                      [&](Operation *u) { return isPerExpertParameter(u, clamped); });
}

/// The dispatch ending in `sort`: sort(reshape(ids, [-1]), -1, false), the
/// rows, the counts; the sorted ids read elsewhere only by the experts'
/// padding mask (ge.Scalar(sorted, E)) and per-expert parameters indexed by
/// them (gpt-oss's biases, clamped to E - 1 in place first).
FailureOr<DispatchMatch> matchDispatch(bmt::AtenOp sort, SymbolTable &symbols) {
  DispatchMatch m;
  m.sort = sort;
  Value flat = operandArg(sort, "self");
  m.ids = flattenedArgument(flat);
  if (!m.ids || !onlyUser(flat, sort) || !boolArgIs(sort, "descending", false))
    return failure();
  std::optional<bmt::AtenArg> dim = bmt::getAtenArg(sort, "dim");
  if (!dim || (dim->getInt() != -1 && dim->getInt() != 0))
    return failure();
  m.flatIds = flat.getDefiningOp<bmt::AtenOp>();
  if (failed(matchCounts(m, symbols)) || failed(matchRows(m)))
    return failure();
  for (Operation *user : sort->getResult(0).getUsers()) {
    if (user == m.toFloat)
      continue;
    auto aten = dyn_cast<bmt::AtenOp>(user);
    std::optional<AtenOpId> id = bmt::atenOpId(user);
    bool mask = id == AtenOpId::ge_Scalar && operandArg(aten, "self") == sort->getResult(0) &&
                intArgIs(aten, "other", m.numExperts);
    bool perExpert = isPerExpertParameter(user, sort->getResult(0)) ||
                     isClampedForParameters(user, sort->getResult(0), m.numExperts);
    if (!mask && !perExpert) {
      LLVM_DEBUG(llvm::dbgs() << "sorted ids read by " << *user << "\n");
      return failure();
    }
  }
  return m;
}

/// The combine reading `m`'s permutation: inv = empty_like(perm).index_put_(
/// [perm], arange(perm.size(0))), rows[inv].view(T, K, H).sum(1). The
/// permutation's other users may only be the rows' floor_divide and the
/// routing weights' gather (index(reshape(weights, [-1]), [perm])).
FailureOr<CombineMatch> matchCombine(const DispatchMatch &m) {
  CombineMatch c;
  Value perm = m.sort->getResult(1);
  for (Operation *user : perm.getUsers()) {
    auto aten = dyn_cast<bmt::AtenOp>(user);
    std::optional<AtenOpId> id = bmt::atenOpId(user);
    if (user == m.floorDiv)
      continue;
    if (id == AtenOpId::index_Tensor && singleIndex(aten, "indices") == perm &&
        flattenedArgument(operandArg(aten, "self"))) {
      c.weightGathers.push_back(aten); // the routing weights, permuted as the rows
      continue;
    }
    bmt::AtenOp *slot = id == AtenOpId::empty_like ? &c.emptyLike
                        : id == AtenOpId::size_int ? &c.count
                        : id == AtenOpId::index_put_ ? &c.indexPut
                                                     : nullptr;
    if (!slot || *slot) {
      LLVM_DEBUG(llvm::dbgs() << "permutation read by " << *user << "\n");
      return failure();
    }
    *slot = aten;
  }
  if (!c.emptyLike || !c.indexPut || (!c.count && !m.topKConstant))
    return failure();
  if (operandArg(c.emptyLike, "self") != perm || !noneArg(c.emptyLike, "dtype") ||
      !onlyUser(c.emptyLike->getResult(0), c.indexPut))
    return failure();
  c.arange = definingAten(operandArg(c.indexPut, "values"), AtenOpId::arange);
  if (!c.arange || !noneArg(c.arange, "dtype") || !onlyUser(c.arange->getResult(0), c.indexPut))
    return failure();
  // arange(perm.size(0)) in a trace; in a .pt2 the export's T*K, a
  // constant or a product of its symbolic sizes.
  if (c.count) {
    if (!intArgIs(c.count, "dim", 0) || !onlyUser(c.count->getResult(0), c.arange) ||
        operandArg(c.arange, "end") != c.count->getResult(0))
      return failure();
  } else {
    std::optional<bmt::AtenArg> end = bmt::getAtenArg(c.arange, "end");
    if (!end || (!end->getInt() && !(end->isOperand() && end->getOperand().getType().isInteger(64))))
      return failure();
  }
  if (operandArg(c.indexPut, "self") != c.emptyLike->getResult(0) ||
      singleIndex(c.indexPut, "indices") != perm ||
      operandArg(c.indexPut, "values") != c.arange->getResult(0) ||
      !boolArgIs(c.indexPut, "accumulate", false) || !c.indexPut->getResult(0).hasOneUse())
    return failure();
  Value inverse = c.indexPut->getResult(0);
  c.gather = dyn_cast<bmt::AtenOp>(*inverse.user_begin());
  if (!c.gather || bmt::atenOpId(c.gather) != AtenOpId::index_Tensor ||
      singleIndex(c.gather, "indices") != inverse || !c.gather->getResult(0).hasOneUse())
    return failure();
  c.expertRows = operandArg(c.gather, "self");
  c.view = dyn_cast<bmt::AtenOp>(*c.gather->getResult(0).user_begin());
  if (!c.expertRows || !c.view || bmt::atenOpId(c.view) != AtenOpId::view ||
      !c.view->getResult(0).hasOneUse())
    return failure();
  std::optional<bmt::AtenArg> size = bmt::getAtenArg(c.view, "size");
  if (!size || !size->isList() || size->getElements().size() != 3)
    return failure();
  ArrayRef<bmt::AtenArg> dims = size->getElements();
  if (m.topK) {
    // A trace: [size(hidden, 0), K, size(hidden, -1)].
    if (!dims[0].isOperand() || !isSizeOf(dims[0].getOperand(), m.hidden, {0}) ||
        !dims[1].isOperand() || dims[1].getOperand() != m.topK || !dims[2].isOperand() ||
        !isSizeOf(dims[2].getOperand(), m.hidden, {-1, 1}))
      return failure();
  } else {
    // A .pt2: [T, K, H] with K the constant, T and H the export's (static
    // or symbolic) sizes.
    auto isSize = [](const bmt::AtenArg &d) {
      return d.getInt() || (d.isOperand() && d.getOperand().getType().isInteger(64));
    };
    if (dims[1].getInt() != m.topKConstant || !isSize(dims[0]) || !isSize(dims[2]))
      return failure();
  }
  c.sum = dyn_cast<bmt::AtenOp>(*c.view->getResult(0).user_begin());
  if (!c.sum || bmt::atenOpId(c.sum) != AtenOpId::sum_dim_IntList ||
      operandArg(c.sum, "self") != c.view->getResult(0) ||
      !boolArgIs(c.sum, "keepdim", false) || !noneArg(c.sum, "dtype"))
    return failure();
  std::optional<bmt::AtenArg> sumDims = bmt::getAtenArg(c.sum, "dim");
  std::optional<SmallVector<int64_t>> ints = sumDims ? sumDims->getInts() : std::nullopt;
  if (!ints || *ints != SmallVector<int64_t>{1}) {
    LLVM_DEBUG(llvm::dbgs() << "the combine sums over other dims than K\n");
    return failure();
  }
  return c;
}

/// Whether every op of both patterns lies in the block of the sort (the
/// function body), so that the new ops dominate their users.
bool inOneBlock(DispatchMatch m, CombineMatch c) {
  Block *block = m.sort->getBlock();
  for (Operation *op : {m.flatIds.getOperation(), m.toFloat.getOperation(),
                        m.histc.getOperation(), m.cumsum.getOperation(),
                        m.floorDiv.getOperation(), m.rows.getOperation(),
                        m.topKTensor, c.emptyLike.getOperation(), c.arange.getOperation(),
                        c.indexPut.getOperation(), c.gather.getOperation(),
                        c.view.getOperation(), c.sum.getOperation()})
    if (op->getBlock() != block)
      return false;
  return (!c.count || c.count->getBlock() == block) && m.hidden.getOwner() == block &&
         m.ids.getOwner() == block && (!m.topK || m.topK.getParentBlock() == block);
}

/// Replaces both patterns: the dispatch where the sort was, the combine
/// where the sum was; the ops of both are erased, and the sizes only they
/// read. With `weights` (expert parallelism; c has one weight gather) the
/// dispatch takes the routing weights and its routed weights replace the
/// gather. Returns the dispatch.
bmt::MoeDispatchOp rewrite(DispatchMatch m, CombineMatch c, OpBuilder &builder, bool weights) {
  Type tensor = m.sort->getResult(0).getType();
  builder.setInsertionPoint(m.sort);
  bmt::AtenOp gather = weights ? c.weightGathers.front() : bmt::AtenOp();
  Value flatWeights = gather ? operandArg(gather, "self") : Value();
  SmallVector<Type> types(weights ? 5 : 4, tensor);
  auto dispatch = bmt::MoeDispatchOp::create(
      builder, m.sort.getLoc(), types, m.hidden, m.ids,
      gather ? Value(flattenedArgument(flatWeights)) : Value(),
      builder.getI64IntegerAttr(m.numExperts));
  if (gather) {
    gather->getResult(0).replaceAllUsesWith(dispatch.getRoutedWeights());
    gather->erase();
    if (flatWeights.use_empty())
      flatWeights.getDefiningOp()->erase();
  }
  builder.setInsertionPoint(c.sum);
  Value topK = m.topK;
  if (!topK)
    topK = bmt::ConstantOp::create(builder, c.sum.getLoc(),
                                   builder.getI64IntegerAttr(*m.topKConstant));
  auto combine = bmt::MoeCombineOp::create(builder, c.sum.getLoc(), c.sum->getResult(0).getType(),
                                           c.expertRows, dispatch.getPermutation(), topK);
  m.rows->getResult(0).replaceAllUsesWith(dispatch.getRows());
  m.cumsum->getResult(0).replaceAllUsesWith(dispatch.getOffsets());
  c.sum->getResult(0).replaceAllUsesWith(combine.getResult());
  SmallVector<Value> sizes;
  std::optional<bmt::AtenArg> viewSize = bmt::getAtenArg(c.view, "size");
  for (const bmt::AtenArg &d : viewSize->getElements())
    if (d.isOperand())
      sizes.push_back(d.getOperand());
  for (Operation *op : {c.sum.getOperation(), c.view.getOperation(), c.gather.getOperation(),
                        c.indexPut.getOperation(), c.arange.getOperation()})
    op->erase();
  if (c.count)
    c.count->erase();
  for (Operation *op : {c.emptyLike.getOperation(), m.rows.getOperation(),
                        m.floorDiv.getOperation(), m.topKTensor, m.cumsum.getOperation(),
                        m.histc.getOperation(), m.toFloat.getOperation()})
    op->erase();
  m.sort->getResult(0).replaceAllUsesWith(dispatch.getSortedIds());
  m.sort->getResult(1).replaceAllUsesWith(dispatch.getPermutation());
  m.sort->erase();
  m.flatIds->erase();
  for (Value size : sizes)
    if (size != m.topK && size.use_empty() && definingAten(size, AtenOpId::size_int))
      size.getDefiningOp()->erase();
  return dispatch;
}

/// The parameter a grouped matmul's `mat2` or a per-expert index reads
/// (through a transpose of the last two dims), with the get_global that
/// reads it; null when it is something else.
bmt::ParameterOp expertParameter(Value v, SymbolTable &symbols,
                                 SmallPtrSetImpl<Operation *> &reads) {
  if (bmt::AtenOp transpose = definingAten(v, AtenOpId::transpose_int))
    v = operandArg(transpose, "self");
  auto global = v ? v.getDefiningOp<bmt::GetGlobalOp>() : bmt::GetGlobalOp();
  if (!global)
    return {};
  reads.insert(global);
  return symbols.lookup<bmt::ParameterOp>(global.getGlobal());
}

/// Collects the expert parameters of the lowered layer `dispatch`: the
/// weights of the grouped matmuls reading its offsets and the per-expert
/// parameters indexed by its sorted ids (gpt-oss's biases, also through
/// its clamp_). Fails, naming what, on a per-expert table that is no
/// parameter.
LogicalResult collectExpertParameters(bmt::MoeDispatchOp dispatch, SymbolTable &symbols,
                                      SetVector<Operation *> &params,
                                      SmallPtrSetImpl<Operation *> &reads) {
  for (Operation *user : dispatch.getOffsets().getUsers()) {
    auto mm = dyn_cast<bmt::AtenOp>(user);
    if (!mm || bmt::atenOpId(mm) != AtenOpId::_grouped_mm)
      continue;
    bmt::ParameterOp p = expertParameter(operandArg(mm, "mat2"), symbols, reads);
    if (!p)
      return dispatch.emitError("bmt-moe-layers: a grouped matmul's weight is not a parameter");
    params.insert(p);
  }
  SmallVector<Value> ids{dispatch.getSortedIds()};
  for (Operation *user : dispatch.getSortedIds().getUsers())
    if (bmt::atenOpId(user) == AtenOpId::clamp_)
      ids.push_back(user->getResult(0));
  for (Value v : ids)
    for (Operation *user : v.getUsers()) {
      auto index = dyn_cast<bmt::AtenOp>(user);
      if (!index || bmt::atenOpId(index) != AtenOpId::index_Tensor ||
          singleIndex(index, "indices") != v)
        continue;
      bmt::ParameterOp p = expertParameter(operandArg(index, "self"), symbols, reads);
      if (!p)
        return dispatch.emitError("bmt-moe-layers: a per-expert tensor indexed by the sorted "
                                  "expert ids is not a parameter, which cannot be split over "
                                  "the expert group (split-expert-weights=false stores every "
                                  "expert on every rank)");
      params.insert(p);
    }
  return success();
}

/// Marks every expert parameter of the lowered layers with the split over
/// the expert group (dim 0, `over = "expert"`). Every read of such a
/// parameter must be one the layers make (a grouped matmul's weight, a
/// per-expert index): one error naming the parameter otherwise.
LogicalResult splitExpertParameters(ModuleOp module, ArrayRef<bmt::MoeDispatchOp> dispatches,
                                    SymbolTable &symbols, int64_t &count) {
  SetVector<Operation *> params;
  SmallPtrSet<Operation *, 16> reads;
  for (bmt::MoeDispatchOp d : dispatches)
    if (failed(collectExpertParameters(d, symbols, params, reads)))
      return failure();
  DenseSet<StringRef> names;
  for (Operation *p : params)
    names.insert(cast<bmt::ParameterOp>(p).getSymName());
  WalkResult walk = module.walk([&](bmt::GetGlobalOp g) {
    if (names.contains(g.getGlobal()) && !reads.contains(g)) {
      g.emitError() << "bmt-moe-layers: the expert parameter " << g.getGlobal()
                    << " is read outside its experts, so it cannot be split over the expert "
                       "group (split-expert-weights=false stores every expert on every rank)";
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  // A frozen expert (--freeze, or --lora freezing the base) would be split
  // over the group, but neither --save-params, bmt-to-hf nor a resume at
  // another E can put frozen slices back together yet.
  for (Operation *p : params)
    if (auto param = cast<bmt::ParameterOp>(p); !param.getRequiresGrad())
      return param.emitError() << "bmt-moe-layers: the expert parameter " << param.getSymName()
                               << " is frozen (--freeze, or --lora's frozen base), and frozen "
                                  "experts cannot be split over the expert group yet; compile "
                                  "with --split-expert-weights=false";
  for (Operation *p : params)
    bmt::setParameterSplit(p, bmt::expertSplit());
  count = static_cast<int64_t>(params.size());
  return success();
}

struct MoeLayersPass : bmt::impl::MoeLayersBase<MoeLayersPass> {
  using MoeLayersBase::MoeLayersBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    const int64_t ep = expertParallel;
    if (ep < 1) {
      emitError(module.getLoc()) << "bmt-moe-layers: expert-parallel must be positive, got " << ep;
      return signalPassFailure();
    }
    if (ep > 1 && bmt::tensorParallelOf(module) > 1) {
      emitError(module.getLoc()) << "bmt-moe-layers: expert-parallel " << ep
                                 << " after bmt-tensor-parallel (" << bmt::tensorParallelOf(module)
                                 << " ranks): run bmt-moe-layers before it, as the default "
                                    "pipeline does";
      return signalPassFailure();
    }
    SymbolTable symbols(module);
    OpBuilder builder(module.getContext());
    SmallVector<StringRef> functions;
    SmallVector<bmt::MoeDispatchOp> dispatches;
    int masksDropped = 0, biases = 0;
    for (auto f : module.getOps<func::FuncOp>()) {
      SmallVector<bmt::AtenOp> sorts;
      f.walk([&](bmt::AtenOp op) {
        if (bmt::atenOpId(op) == AtenOpId::sort)
          sorts.push_back(op);
      });
      for (bmt::AtenOp sort : sorts) {
        FailureOr<DispatchMatch> dispatch = matchDispatch(sort, symbols);
        if (failed(dispatch))
          continue;
        FailureOr<CombineMatch> combine = matchCombine(*dispatch);
        if (failed(combine) || !inOneBlock(*dispatch, *combine))
          continue;
        if (ep > 1 && dispatch->numExperts % ep != 0) {
          emitError(sort.getLoc()) << "bmt-moe-layers: " << f.getSymName() << " has "
                                   << dispatch->numExperts
                                   << " experts, not a multiple of expert-parallel " << ep;
          return signalPassFailure();
        }
        if (ep > 1 && combine->weightGathers.size() != 1) {
          emitError(sort.getLoc())
              << "bmt-moe-layers: " << f.getSymName()
              << ": expert parallelism needs the routing weights gathered once by the "
                 "permutation (before the combine), found "
              << combine->weightGathers.size();
          return signalPassFailure();
        }
        unsigned idsArg = dispatch->ids.getArgNumber();
        bmt::MoeDispatchOp op = rewrite(*dispatch, *combine, builder, ep > 1);
        functions.push_back(f.getSymName());
        dispatches.push_back(op);
        if (!bmt::routerIdsBelow(f, idsArg, op.getNumExperts(), symbols))
          continue;
        if (succeeded(bmt::dropSentinelMasks(op)))
          ++masksDropped;
        if (FlatSymbolRefAttr bias =
                bmt::routerScoreBias(f, idsArg, op.getNumExperts(), symbols)) {
          op->setAttr(bmt::kRouterBiasAttr, bias);
          ++biases;
        }
      }
    }
    // Functions that still call aten::_grouped_mm: experts the pattern did
    // not match. They run as their ATen ops, outside the expert load the
    // runtime logs: say so.
    SmallVector<StringRef> missed;
    for (auto f : module.getOps<func::FuncOp>()) {
      bool groupedMm = false;
      f.walk([&](bmt::AtenOp op) { groupedMm |= bmt::atenOpId(op) == AtenOpId::_grouped_mm; });
      if (groupedMm && !llvm::is_contained(functions, f.getSymName()))
        missed.push_back(f.getSymName());
    }
    if (!missed.empty()) {
      InFlightDiagnostic warning = emitWarning(module.getLoc());
      warning << "bmt-moe-layers: " << missed.size() << " function"
              << (missed.size() == 1 ? "" : "s")
              << " with aten::_grouped_mm not lowered (" << missed.front();
      if (missed.size() > 1)
        warning << " ... " << missed.back();
      warning << "): their experts run as ATen ops, outside the logged expert load";
    }
    if (functions.empty() && ep > 1) {
      emitError(module.getLoc()) << "bmt-moe-layers: expert-parallel " << ep
                                 << " but the model has no mixture-of-experts layer this pass "
                                    "lowers";
      return signalPassFailure();
    }
    if (ep > 1)
      module->setAttr("bmt.expert_parallel", builder.getI64IntegerAttr(ep));
    int64_t splitParams = 0;
    if (ep > 1 && splitExpertWeights &&
        failed(splitExpertParameters(module, dispatches, symbols, splitParams)))
      return signalPassFailure();
    InFlightDiagnostic remark = emitRemark(module.getLoc());
    if (functions.empty()) {
      remark << "bmt-moe-layers: no mixture-of-experts layer";
      return;
    }
    remark << "bmt-moe-layers: " << functions.size() << " mixture-of-experts layer"
           << (functions.size() == 1 ? "" : "s")
           << " lowered to bmt.moe_dispatch / bmt.moe_combine (" << functions.front();
    if (functions.size() > 1)
      remark << " ... " << functions.back();
    remark << "); masks of expert ids >= E dropped in " << masksDropped
           << " (their ids are a router's top-k over E)";
    if (biases > 0)
      remark << "; " << biases << " router" << (biases == 1 ? "" : "s")
             << " with a score-correction bias";
    if (ep > 1)
      remark << "; experts split over expert groups of " << ep << " ranks";
    if (splitParams > 0)
      remark << "; " << splitParams << " expert parameters split over the expert group";
  }
};

} // namespace
