//===- MoeRouter.cpp - bmt-moe-layers: what the router's top-k proves ----===//
//
// Two facts about a MoE layer's router, found from the ids its experts
// receive back to the aten::topk that chose them.
//
// Masks that never fire. transformers' grouped_mm experts zero the rows of expert ids >= E (the
// sentinels of its own expert parallelism) before and after each grouped
// matmul: three masked_fills over [T*K, 2F] and [T*K, H] forward and three
// more backward, 10-12 % of a Qwen3-MoE step on an H100 (bench/RESULTS.md).
// When the ids are a router's top-k over E scores, no id is >= E and every
// such mask is all false; the fills are dropped. Anything not proven keeps
// its masks.
//
// The score-correction bias. DeepSeek-V3's router chooses its top-k over
// sigmoid(scores) + b, b a buffer of E values that training moves toward
// balanced loads (auxiliary-loss-free balancing, arXiv:2412.19437 sec.
// 2.1.2); the runtime needs to know which buffer that is.
//
//===----------------------------------------------------------------------===//

#include "MoeLayers.h"

#include "bmt/Dialect/AtenArgs.h"

#include "llvm/ADT/STLExtras.h"

#include <optional>

using namespace mlir;
using bmt::AtenOpId;

namespace {

/// How deep the search through producers and calls goes.
constexpr int kMaxDepth = 32;

Value operandArg(Operation *op, StringRef name) {
  std::optional<bmt::AtenArg> arg = bmt::getAtenArg(cast<bmt::AtenOp>(op), name);
  return arg && arg->isOperand() ? arg->getOperand() : Value();
}

/// The ranked type of the parameter or buffer `v` reads (get_global, maybe
/// through aten::to.dtype), or null.
RankedTensorType globalType(Value v, SymbolTable &symbols) {
  if (bmt::atenOpId(v.getDefiningOp()) == AtenOpId::to_dtype)
    v = operandArg(v.getDefiningOp(), "self");
  auto get = v ? v.getDefiningOp<bmt::GetGlobalOp>() : bmt::GetGlobalOp();
  if (!get)
    return {};
  Operation *global = symbols.lookup(get.getGlobal());
  if (auto p = dyn_cast_or_null<bmt::ParameterOp>(global))
    return dyn_cast<RankedTensorType>(p.getType());
  if (auto b = dyn_cast_or_null<bmt::BufferOp>(global))
    return dyn_cast<RankedTensorType>(b.getType());
  return {};
}

/// The size of the last dim of `v` when the ops producing it fix it; only
/// sizes > 1 are returned (a broadcast can widen a last dim of 1).
std::optional<int64_t> lastDim(Value v, SymbolTable &symbols, int depth = 0) {
  if (!v || depth > kMaxDepth)
    return std::nullopt;
  if (RankedTensorType type = globalType(v, symbols)) {
    if (type.getRank() < 1 || type.isDynamicDim(type.getRank() - 1))
      return std::nullopt;
    int64_t d = type.getDimSize(type.getRank() - 1);
    return d > 1 ? std::optional<int64_t>(d) : std::nullopt;
  }
  Operation *op = v.getDefiningOp();
  std::optional<AtenOpId> id = bmt::atenOpId(op);
  if (!id)
    return std::nullopt;
  switch (*id) {
  case AtenOpId::linear: {
    // [..., in] x [out, in]^T: the weight's rows.
    RankedTensorType w = globalType(operandArg(op, "weight"), symbols);
    if (!w || w.getRank() != 2 || w.isDynamicDim(0) || w.getDimSize(0) < 2)
      return std::nullopt;
    return w.getDimSize(0);
  }
  case AtenOpId::to_dtype:
  case AtenOpId::softmax_int:
  case AtenOpId::log_softmax_int:
  case AtenOpId::sigmoid:
    return lastDim(operandArg(op, "self"), symbols, depth + 1);
  case AtenOpId::masked_fill_Scalar:
    return lastDim(operandArg(op, "self"), symbols, depth + 1);
  case AtenOpId::add_Tensor:
  case AtenOpId::sub_Tensor:
  case AtenOpId::mul_Tensor:
  case AtenOpId::div_Tensor: {
    // Broadcasting: a last dim > 1 of either operand is the result's.
    std::optional<int64_t> a = lastDim(operandArg(op, "self"), symbols, depth + 1);
    std::optional<int64_t> b = lastDim(operandArg(op, "other"), symbols, depth + 1);
    if (a && b && *a != *b)
      return std::nullopt;
    return a ? a : b;
  }
  case AtenOpId::view:
  case AtenOpId::reshape: {
    std::optional<bmt::AtenArg> shape =
        bmt::getAtenArg(cast<bmt::AtenOp>(op), *id == AtenOpId::view ? "size" : "shape");
    if (!shape || !shape->isList() || shape->getElements().empty())
      return std::nullopt;
    std::optional<int64_t> d = shape->getElements().back().getInt();
    return d && *d > 1 ? d : std::nullopt;
  }
  default:
    return std::nullopt;
  }
}

/// The aten::topk whose indices `v` is (possibly returned through calls)
/// when it takes the top-k over the last dim of a tensor of last dim
/// `numExperts`; null otherwise.
Operation *topKOfIds(Value v, int64_t numExperts, SymbolTable &symbols, int depth = 0) {
  if (!v || depth > kMaxDepth)
    return nullptr;
  auto result = dyn_cast<OpResult>(v);
  if (!result)
    return nullptr;
  Operation *op = result.getOwner();
  if (auto call = dyn_cast<func::CallOp>(op)) {
    auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
    if (!callee || callee.isExternal())
      return nullptr;
    auto ret = dyn_cast<func::ReturnOp>(callee.getBody().back().getTerminator());
    return ret ? topKOfIds(ret.getOperand(result.getResultNumber()), numExperts, symbols,
                           depth + 1)
               : nullptr;
  }
  if (bmt::atenOpId(op) != AtenOpId::topk || result.getResultNumber() != 1)
    return nullptr;
  std::optional<bmt::AtenArg> dim = bmt::getAtenArg(cast<bmt::AtenOp>(op), "dim");
  if (!dim || dim->getInt() != -1)
    return nullptr;
  return lastDim(operandArg(op, "self"), symbols) == numExperts ? op : nullptr;
}

/// The top-k of every call of `experts` that gives its argument `idsArg`;
/// empty unless each is proven (topKOfIds) and there is a call.
SmallVector<Operation *> routerTopKs(func::FuncOp experts, unsigned idsArg, int64_t numExperts,
                                     SymbolTable &symbols) {
  auto module = experts->getParentOfType<ModuleOp>();
  std::optional<SymbolTable::UseRange> uses = SymbolTable::getSymbolUses(experts, module);
  SmallVector<Operation *> topks;
  if (!uses)
    return {};
  for (const SymbolTable::SymbolUse &use : *uses) {
    auto call = dyn_cast<func::CallOp>(use.getUser());
    Operation *topk = call && call.getCallee() == experts.getSymName() &&
                              idsArg < call.getNumOperands()
                          ? topKOfIds(call.getOperand(idsArg), numExperts, symbols)
                          : nullptr;
    if (!topk)
      return {};
    topks.push_back(topk);
  }
  return topks;
}

/// The buffer of shape [numExperts] that `v` (a top-k's input) is the sum
/// of with other scores, found through masked_fill's input and dtype
/// conversions: the `add.Tensor(scores, b)` (alpha 1, either order) of
/// DeepSeek-V3's router. Null when there is none or more than one.
FlatSymbolRefAttr scoreBias(Value v, int64_t numExperts, SymbolTable &symbols) {
  for (int depth = 0; v && depth < kMaxDepth; ++depth) {
    Operation *op = v.getDefiningOp();
    std::optional<AtenOpId> id = bmt::atenOpId(op);
    if (id == AtenOpId::masked_fill_Scalar || id == AtenOpId::to_dtype) {
      v = operandArg(op, "self");
      continue;
    }
    if (id != AtenOpId::add_Tensor)
      return {};
    std::optional<bmt::AtenArg> alpha = bmt::getAtenArg(cast<bmt::AtenOp>(op), "alpha");
    if (!alpha || alpha->getInt() != 1)
      return {};
    FlatSymbolRefAttr found;
    for (StringRef name : {"self", "other"}) {
      Value x = operandArg(op, name);
      if (x && bmt::atenOpId(x.getDefiningOp()) == AtenOpId::to_dtype)
        x = operandArg(x.getDefiningOp(), "self");
      auto get = x ? x.getDefiningOp<bmt::GetGlobalOp>() : bmt::GetGlobalOp();
      auto buffer = get ? symbols.lookup<bmt::BufferOp>(get.getGlobal()) : bmt::BufferOp();
      auto type = buffer ? dyn_cast<RankedTensorType>(buffer.getType()) : RankedTensorType();
      if (!type || type.getRank() != 1 || type.getDimSize(0) != numExperts ||
          !isa<FloatType>(type.getElementType()))
        continue;
      if (found)
        return {};
      found = get.getGlobalAttr();
    }
    return found;
  }
  return {};
}

} // namespace

bool bmt::routerIdsBelow(func::FuncOp experts, unsigned idsArg, int64_t numExperts,
                         SymbolTable &symbols) {
  return !routerTopKs(experts, idsArg, numExperts, symbols).empty();
}

FlatSymbolRefAttr bmt::routerScoreBias(func::FuncOp experts, unsigned idsArg,
                                       int64_t numExperts, SymbolTable &symbols) {
  FlatSymbolRefAttr bias;
  for (Operation *topk : routerTopKs(experts, idsArg, numExperts, symbols)) {
    FlatSymbolRefAttr b = scoreBias(operandArg(topk, "self"), numExperts, symbols);
    if (!b || (bias && b != bias))
      return {};
    bias = b;
  }
  return bias;
}


LogicalResult bmt::dropSentinelMasks(MoeDispatchOp dispatch) {
  int64_t numExperts = dispatch.getNumExperts();
  SmallVector<Operation *> masks; // ge.Scalar and unsqueezes, producers first
  SmallVector<Operation *> fills;
  for (Operation *user : dispatch.getSortedIds().getUsers()) {
    if (bmt::atenOpId(user) != AtenOpId::ge_Scalar)
      continue;
    std::optional<bmt::AtenArg> other = bmt::getAtenArg(cast<bmt::AtenOp>(user), "other");
    if (!other || other->getInt() != numExperts)
      return failure();
    masks.push_back(user);
  }
  for (size_t i = 0; i < masks.size(); ++i) {
    Value mask = masks[i]->getResult(0);
    for (Operation *user : mask.getUsers()) {
      std::optional<AtenOpId> id = bmt::atenOpId(user);
      if (id == AtenOpId::unsqueeze && operandArg(user, "self") == mask) {
        masks.push_back(user);
      } else if ((id == AtenOpId::masked_fill_Scalar || id == AtenOpId::masked_fill__Scalar) &&
                 operandArg(user, "mask") == mask && operandArg(user, "self") != mask) {
        fills.push_back(user);
      } else {
        return failure();
      }
    }
  }
  if (fills.empty())
    return failure();
  for (Operation *fill : fills) {
    fill->getResult(0).replaceAllUsesWith(operandArg(fill, "self"));
    fill->erase();
  }
  for (Operation *mask : llvm::reverse(masks))
    if (mask->use_empty())
      mask->erase();
  return success();
}
