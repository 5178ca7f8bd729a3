//===- MoeSentinelMasks.cpp - bmt-moe-layers: masks that never fire ------===//
//
// transformers' grouped_mm experts zero the rows of expert ids >= E (the
// sentinels of its own expert parallelism) before and after each grouped
// matmul: three masked_fills over [T*K, 2F] and [T*K, H] forward and three
// more backward, 10-12 % of a Qwen3-MoE step on an H100 (bench/RESULTS.md).
// When the ids are a router's top-k over E scores, no id is >= E and every
// such mask is all false; the fills are dropped. Anything not proven keeps
// its masks.
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

/// Whether `v` is the indices of a top-k over the last dim of a tensor of
/// last dim `numExperts`, possibly returned through calls.
bool isTopKIds(Value v, int64_t numExperts, SymbolTable &symbols, int depth = 0) {
  if (!v || depth > kMaxDepth)
    return false;
  auto result = dyn_cast<OpResult>(v);
  if (!result)
    return false;
  Operation *op = result.getOwner();
  if (auto call = dyn_cast<func::CallOp>(op)) {
    auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
    if (!callee || callee.isExternal())
      return false;
    auto ret = dyn_cast<func::ReturnOp>(callee.getBody().back().getTerminator());
    return ret && isTopKIds(ret.getOperand(result.getResultNumber()), numExperts, symbols,
                            depth + 1);
  }
  if (bmt::atenOpId(op) != AtenOpId::topk || result.getResultNumber() != 1)
    return false;
  std::optional<bmt::AtenArg> dim = bmt::getAtenArg(cast<bmt::AtenOp>(op), "dim");
  if (!dim || dim->getInt() != -1)
    return false;
  return lastDim(operandArg(op, "self"), symbols) == numExperts;
}

} // namespace

bool bmt::routerIdsBelow(func::FuncOp experts, unsigned idsArg, int64_t numExperts,
                         SymbolTable &symbols) {
  auto module = experts->getParentOfType<ModuleOp>();
  std::optional<SymbolTable::UseRange> uses = SymbolTable::getSymbolUses(experts, module);
  if (!uses || uses->empty())
    return false;
  for (const SymbolTable::SymbolUse &use : *uses) {
    auto call = dyn_cast<func::CallOp>(use.getUser());
    if (!call || call.getCallee() != experts.getSymName() || idsArg >= call.getNumOperands() ||
        !isTopKIds(call.getOperand(idsArg), numExperts, symbols))
      return false;
  }
  return true;
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
