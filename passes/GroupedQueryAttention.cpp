//===- GroupedQueryAttention.cpp - the bmt-grouped-query-attention pass ---===//
//
// Models with fewer key/value heads than query heads (grouped-query and
// multi-query attention: LLaMA, Mistral, Qwen, Gemma) repeat k and v to the
// query heads before attention (transformers' repeat_kv: x[:, :, None]
// expanded to [b, kv, n, s, d], reshaped to [b, kv * n, s, d]). The reshape
// of the expanded view copies n times the kv tensor, and its backward sums
// the copies again. aten::scaled_dot_product_attention takes the kv heads
// as they are with enable_gqa=True (query head h reads kv head h / n, the
// same pairing as repeat_kv's). This pass makes that rewrite where both k
// and v of a call are such repeats of the same n, and erases the repeats
// nothing else reads. See passes/Passes.td.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"

#include <limits>
#include <optional>

namespace bmt {
#define GEN_PASS_DEF_GROUPEDQUERYATTENTION
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;
using bmt::AtenOpId;

namespace {

bmt::AtenOp atenDef(Value v, AtenOpId id) {
  auto op = v ? v.getDefiningOp<bmt::AtenOp>() : bmt::AtenOp();
  return op && bmt::atenOpId(op) == id ? op : bmt::AtenOp();
}

/// Whether `slice` is x[..., :, ...] along some dim: start 0 or None, end
/// None or INT64_MAX, step 1.
bool isFullSlice(bmt::AtenOp slice) {
  std::optional<bmt::AtenArg> start = bmt::getAtenArg(slice, "start");
  std::optional<bmt::AtenArg> end = bmt::getAtenArg(slice, "end");
  std::optional<bmt::AtenArg> step = bmt::getAtenArg(slice, "step");
  if (!start || !end || !step)
    return false;
  bool startOk = start->isNone() || start->getInt() == 0;
  bool endOk = end->isNone() || end->getInt() == std::numeric_limits<int64_t>::max();
  return startOk && endOk && step->getInt() == 1;
}

/// `v` and the values full slices of it were taken from, `v` first: the
/// last is the tensor before any full slice (all of one shape).
SmallVector<Value> throughFullSlices(Value v) {
  SmallVector<Value> chain{v};
  while (bmt::AtenOp s = atenDef(v, AtenOpId::slice_Tensor)) {
    if (!isFullSlice(s))
      break;
    v = s->getOperand(0);
    chain.push_back(v);
  }
  return chain;
}

/// Whether list element `e` is -1, aten::size.int(x, dim) of one of
/// `sources` (views of one tensor, all of its shape), or a positive
/// constant (a static export records sizes as numbers; they are taken as
/// the tensor's own, see Passes.td).
bool isSizeOf(const bmt::AtenArg &e, ArrayRef<Value> sources, int64_t dim) {
  if (std::optional<int64_t> c = e.getInt())
    return *c == -1 || *c > 0;
  bmt::AtenOp size = atenDef(e.getOperand(), AtenOpId::size_int);
  if (!size)
    return false;
  std::optional<bmt::AtenArg> d = bmt::getAtenArg(size, "dim");
  return d && d->getInt() == dim && llvm::is_contained(sources, size->getOperand(0));
}

/// Whether two list elements are the same constant or the same value.
bool sameElement(const bmt::AtenArg &a, const bmt::AtenArg &b) {
  if (a.isOperand() || b.isOperand())
    return a.getOperand() == b.getOperand();
  return a.getInt() && a.getInt() == b.getInt();
}

/// A value repeat_kv made: reshape(expand(x[:, :, None], [b, kv, n, s, d]),
/// [b, kv * n, s, d]) of a 4-d x (full slices allowed around the
/// unsqueeze, as traces record `x[:, :, None, :, :]`).
struct Repeat {
  Value kv;      ///< x: [b, kv, s, d]
  int64_t n = 0; ///< query heads per kv head
};

std::optional<Repeat> matchRepeat(Value v) {
  bmt::AtenOp reshape = atenDef(v, AtenOpId::reshape);
  if (!reshape)
    reshape = atenDef(v, AtenOpId::view);
  if (!reshape)
    return std::nullopt;
  bmt::AtenOp expand = atenDef(reshape->getOperand(0), AtenOpId::expand);
  if (!expand)
    return std::nullopt;
  std::optional<bmt::AtenArg> shape = bmt::getAtenArg(reshape, 1);
  std::optional<bmt::AtenArg> sizes = bmt::getAtenArg(expand, "size");
  if (!shape || !sizes || shape->getElements().size() != 4 || sizes->getElements().size() != 5)
    return std::nullopt;
  ArrayRef<bmt::AtenArg> to = shape->getElements(), ex = sizes->getElements();
  std::optional<int64_t> n = ex[2].getInt();
  if (!n || *n < 1)
    return std::nullopt;
  // Below the expand: full slices, unsqueeze at dim 2 of the 4-d x, full slices.
  bmt::AtenOp unsqueeze = atenDef(throughFullSlices(expand->getOperand(0)).back(), AtenOpId::unsqueeze);
  if (!unsqueeze)
    return std::nullopt;
  std::optional<bmt::AtenArg> dim = bmt::getAtenArg(unsqueeze, "dim");
  if (!dim || (dim->getInt() != 2 && dim->getInt() != -3))
    return std::nullopt;
  SmallVector<Value> below = throughFullSlices(unsqueeze->getOperand(0));
  Value x = below.back();
  // expand keeps every dim of x (no broadcast of a batch or kv dim of 1);
  // the reshape merges kv and n (b, s, d as the expand's: then its second
  // size is kv * n, the element count fixing it).
  if (!isSizeOf(ex[0], below, 0) || !isSizeOf(ex[1], below, 1) || !isSizeOf(ex[3], below, 2) ||
      !isSizeOf(ex[4], below, 3))
    return std::nullopt;
  // The reshape's size of x's dim d: the expand's (not -1), or where the
  // expand kept the dim (-1), x's size as isSizeOf takes it.
  auto keeps = [&](const bmt::AtenArg &t, const bmt::AtenArg &e, int64_t d) {
    if (t.getInt() == -1)
      return false;
    return e.getInt() == -1 ? isSizeOf(t, below, d) : sameElement(t, e);
  };
  if (!keeps(to[0], ex[0], 0) || !keeps(to[2], ex[3], 2) || !keeps(to[3], ex[4], 3))
    return std::nullopt;
  if (to[1].getInt() && ex[1].getInt() && *to[1].getInt() != -1 && *ex[1].getInt() != -1 &&
      *to[1].getInt() != *ex[1].getInt() * *n)
    return std::nullopt;
  return Repeat{x, *n};
}

struct GroupedQueryAttentionPass
    : bmt::impl::GroupedQueryAttentionBase<GroupedQueryAttentionPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    OpBuilder builder(module.getContext());
    int64_t rewritten = 0, erased = 0;
    SmallVector<bmt::AtenOp> calls;
    module.walk([&](bmt::AtenOp op) {
      if (bmt::atenOpId(op) == AtenOpId::scaled_dot_product_attention)
        calls.push_back(op);
    });
    for (bmt::AtenOp sdpa : calls) {
      std::optional<bmt::AtenArg> gqa = bmt::getAtenArg(sdpa, "enable_gqa");
      std::optional<bmt::AtenArg> key = bmt::getAtenArg(sdpa, "key");
      std::optional<bmt::AtenArg> value = bmt::getAtenArg(sdpa, "value");
      if (!gqa || gqa->getBool() != false || !key || !value || !key->isOperand() ||
          !value->isOperand())
        continue;
      std::optional<Repeat> k = matchRepeat(key->getOperand());
      std::optional<Repeat> v = matchRepeat(value->getOperand());
      if (!k || !v || k->n != v->n || k->n == 1)
        continue;
      builder.setInsertionPoint(sdpa);
      const bmt::AtenOpInfo *info = bmt::lookupAtenOp(sdpa.getName());
      SmallVector<Attribute> args(sdpa.getArgs().begin(), sdpa.getArgs().end());
      args[info->argIndex("enable_gqa")] = builder.getBoolAttr(true);
      SmallVector<Value> operands(sdpa->getOperands());
      operands[key->getOperandNumber()] = k->kv;
      operands[value->getOperandNumber()] = v->kv;
      auto call = bmt::AtenOp::create(builder, sdpa.getLoc(), sdpa->getResultTypes(),
                                      sdpa.getNameAttr(), builder.getArrayAttr(args), operands);
      call->setDiscardableAttrs(sdpa->getDiscardableAttrDictionary());
      sdpa->replaceAllUsesWith(call);
      sdpa->erase();
      ++rewritten;
      erased += eraseDead({key->getOperand(), value->getOperand()});
    }
    if (rewritten == 0) {
      emitRemark(module.getLoc())
          << "bmt-grouped-query-attention: no aten::scaled_dot_product_attention whose key and "
             "value are repeat_kv's repeats of fewer heads (" << calls.size() << " call"
          << (calls.size() == 1 ? "" : "s") << " left as they are)";
      return;
    }
    emitRemark(module.getLoc())
        << "bmt-grouped-query-attention: " << rewritten << " aten::scaled_dot_product_attention "
        << (rewritten == 1 ? "call reads" : "calls read")
        << " the key/value heads with enable_gqa=True instead of their repeats; " << erased << " op"
        << (erased == 1 ? "" : "s") << " removed";
  }

  /// Erases the ops that computed `roots` once nothing reads them: the
  /// repeats' views and copies and the size arithmetic only they used.
  /// Only ops without side effects are taken: views, sizes and integer
  /// arithmetic of the registry, bmt.num_to_tensor, bmt.constant.
  static int64_t eraseDead(ArrayRef<Value> roots) {
    int64_t count = 0;
    SmallVector<Value> work(roots.begin(), roots.end());
    while (!work.empty()) {
      Value v = work.pop_back_val();
      Operation *op = v.getDefiningOp();
      if (!op || !op->use_empty() || !removable(op))
        continue;
      for (Value operand : op->getOperands())
        work.push_back(operand);
      op->erase();
      ++count;
    }
    return count;
  }

  static bool removable(Operation *op) {
    if (isa<bmt::NumToTensorOp, bmt::ConstantOp>(op))
      return true;
    return bmt::isAten(op, {AtenOpId::reshape, AtenOpId::view, AtenOpId::expand,
                            AtenOpId::slice_Tensor, AtenOpId::unsqueeze, AtenOpId::size_int,
                            AtenOpId::mul_Tensor, AtenOpId::Int_Tensor});
  }
};

} // namespace
