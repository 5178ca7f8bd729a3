//===- CausalMaskProver.cpp - proving an attention mask causal ------------===//
//
// The prover's entry points, how values cross call boundaries, sizes, and
// whether a value may be written in place (CausalMaskProver.h).
//
//===----------------------------------------------------------------------===//

#include "CausalMaskProver.h"

#include "bmt/Dialect/AtenRegistry.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/DenseSet.h"

#include <algorithm>

using namespace mlir;
using bmt::AtenOpId;

namespace bmt::causal_mask {

std::optional<SmallVector<AtenArg>> listArgument(bmt::AtenOp op, unsigned index) {
  std::optional<AtenArg> arg = bmt::getAtenArg(op, index);
  if (!arg || !arg->isList())
    return std::nullopt;
  for (const AtenArg &e : arg->getElements())
    if (e.isList())
      return std::nullopt;
  return SmallVector<AtenArg>(arg->getElements().begin(), arg->getElements().end());
}

bool isNone(const std::optional<AtenArg> &arg) { return arg && arg->isNone(); }

std::optional<int64_t> dtypeArgument(bmt::AtenOp op) {
  std::optional<AtenArg> arg = argument(op, "dtype");
  if (isNone(arg))
    return -1;
  if (!arg)
    return std::nullopt;
  return arg->getInt();
}

bool isInPlace(bmt::AtenOp op) {
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
  return info && info->isInPlace();
}

bool mayAlias(bmt::AtenOp op) {
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
  return info && (info->mayAlias() || info->kind == bmt::AtenOpKind::Copy);
}

LogicalResult Prover::prove(Value mask) {
  FailureOr<Term> t = eval(mask, {}, 0);
  if (failed(t))
    return failure();
  if (t->kind != Term::Kind::Mask || !t->isBool)
    return fail("the mask is not a boolean tensor of comparisons");
  if (t->rank() != 4)
    return fail("the mask is not [batch, heads, q, kv]");
  std::optional<int64_t> upper, lower;
  for (const Bound &b : t->bounds) {
    if (b.a == 3 && b.b == 2)
      upper = upper ? std::min(*upper, b.c) : b.c; // kv - q <= c
    else if (b.a == 2 && b.b == 3)
      lower = lower ? std::max(*lower, -b.c) : -b.c; // kv - q >= -c
    else
      return fail("the mask compares other coordinates than the query and key positions");
  }
  if (!upper || *upper != 0)
    return fail("the mask is not kv <= q");
  const Dim &q = t->dims[2], &kv = t->dims[3];
  if (q.one || kv.one || q.size != kv.size)
    return fail("the query and key lengths are not provably equal");
  if (lower) {
    // kv - q >= lower is implied when every pair satisfies it: n - 1 <= -lower.
    if (q.size.kind != Sym::Kind::Constant || q.size.constant - 1 > -*lower)
      return fail("the mask also bounds kv - q from below (a sliding window)");
  }
  for (Value v : values)
    if (mayBeWritten(v))
      return fail("the mask's computation may be written in place");
  return success();
}

std::optional<int64_t> Prover::constantLookup(bmt::AtenOp index) {
  std::optional<AtenArg> source = argument(index, 0);
  std::optional<SmallVector<AtenArg>> indices = listArgument(index, 1);
  if (!source || !source->getOperand() || !indices || indices->empty())
    return std::nullopt;
  FailureOr<Term> t = eval(source->getOperand(), {}, 0);
  if (failed(t) || t->kind != Term::Kind::Constant || t->isBool ||
      t->rank() != indices->size())
    return std::nullopt;
  for (const AtenArg &i : *indices) {
    if (!i.getOperand())
      return std::nullopt;
    FailureOr<Term> position = eval(i.getOperand(), {}, 0);
    if (failed(position) || position->kind != Term::Kind::Index)
      return std::nullopt;
  }
  for (Value v : values)
    if (mayBeWritten(v))
      return std::nullopt;
  return t->value;
}

SmallVector<std::pair<Value, CallStack>> Prover::through(Value v, const CallStack &stack) {
  SmallVector<std::pair<Value, CallStack>> out;
  if (auto arg = dyn_cast<BlockArgument>(v)) {
    auto f = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
    if (!f || arg.getOwner() != &f.getBody().front())
      return out;
    if (!stack.empty()) {
      CallStack rest = stack;
      func::CallOp call = rest.pop_back_val();
      if (call.getCallee() == f.getSymName())
        out.push_back({call.getOperand(arg.getArgNumber()), rest});
      return out;
    }
    if (!f.isPrivate())
      return out;
    auto it = callers.find(f);
    if (it != callers.end())
      for (func::CallOp call : it->second)
        out.push_back({call.getOperand(arg.getArgNumber()), CallStack{}});
    return out;
  }
  if (auto call = v.getDefiningOp<func::CallOp>()) {
    auto callee = module.lookupSymbol<func::FuncOp>(call.getCallee());
    if (!callee || callee.isExternal())
      return out;
    auto ret = dyn_cast<func::ReturnOp>(callee.getBody().back().getTerminator());
    if (!ret)
      return out;
    CallStack deeper = stack;
    deeper.push_back(call);
    out.push_back({ret.getOperand(cast<OpResult>(v).getResultNumber()), deeper});
  }
  return out;
}

std::optional<StringRef> Prover::programInput(Value v) {
  auto arg = dyn_cast<BlockArgument>(v);
  if (!arg)
    return std::nullopt;
  auto f = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
  if (!f || f.isPrivate() || callers.count(f))
    return std::nullopt;
  if (auto name = f.getArgAttrOfType<StringAttr>(arg.getArgNumber(), "bmt.name"))
    return name.getValue();
  return StringRef();
}

Value Prover::sibling(Value v, StringRef name) {
  auto f = cast<func::FuncOp>(cast<BlockArgument>(v).getOwner()->getParentOp());
  for (unsigned i = 0; i < f.getNumArguments(); ++i)
    if (auto n = f.getArgAttrOfType<StringAttr>(i, "bmt.name"); n && n.getValue() == name)
      return f.getArgument(i);
  return Value();
}

RankedTensorType Prover::globalType(Value t) {
  auto get = t.getDefiningOp<bmt::GetGlobalOp>();
  if (!get)
    return nullptr;
  Operation *global = module.lookupSymbol(get.getGlobal());
  if (auto p = dyn_cast_or_null<bmt::ParameterOp>(global))
    return dyn_cast<RankedTensorType>(p.getType());
  if (auto b = dyn_cast_or_null<bmt::BufferOp>(global))
    return dyn_cast<RankedTensorType>(b.getType());
  return nullptr;
}

Value Prover::shapeOperand(bmt::AtenOp op, const CallStack &stack, unsigned depth) {
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
  if (!info || info->kind != bmt::AtenOpKind::Elementwise || isInPlace(op))
    return Value();
  std::optional<AtenArg> a = argument(op, 0), b = argument(op, 1);
  if (!a || !b || !a->getOperand() || !b->getOperand() || !isa<bmt::TensorType>(b->getOperand().getType()))
    return Value();
  if (rankOf(b->getOperand(), stack, depth + 1) == 0)
    return a->getOperand();
  if (rankOf(a->getOperand(), stack, depth + 1) == 0)
    return b->getOperand();
  return Value();
}

std::optional<int64_t> Prover::rankOf(Value t, const CallStack &stack, unsigned depth) {
  if (depth > kMaxDepth || ++steps > kMaxSteps)
    return std::nullopt;
  if (std::optional<StringRef> name = programInput(t))
    return assumedShape(*name) ? std::optional<int64_t>(2) : std::nullopt;
  if (auto hops = through(t, stack); !hops.empty()) {
    std::optional<int64_t> r = rankOf(hops[0].first, hops[0].second, depth + 1);
    for (auto &[v, s] : ArrayRef(hops).drop_front())
      if (rankOf(v, s, depth + 1) != r)
        return std::nullopt;
    return r;
  }
  if (auto c = t.getDefiningOp<bmt::ConstantOp>())
    if (auto dense = dyn_cast<DenseElementsAttr>(c.getValue()))
      return dense.getType().getRank();
  if (RankedTensorType type = globalType(t))
    return type.getRank();
  auto op = t.getDefiningOp<bmt::AtenOp>();
  if (!op || op->getNumResults() != 1)
    return std::nullopt;
  if (Value other = shapeOperand(op, stack, depth))
    return rankOf(other, stack, depth + 1);
  std::optional<AtenOpId> id = bmt::atenOpId(op);
  std::optional<AtenArg> x = argument(op, 0);
  auto listLength = [&](unsigned index) -> std::optional<int64_t> {
    if (auto list = listArgument(op, index))
      return static_cast<int64_t>(list->size());
    return std::nullopt;
  };
  auto plus1 = [](std::optional<int64_t> r) {
    return r ? std::optional<int64_t>(*r + 1) : std::nullopt;
  };
  if (id == AtenOpId::view || id == AtenOpId::reshape || id == AtenOpId::expand ||
      id == AtenOpId::new_ones || id == AtenOpId::new_zeros || id == AtenOpId::new_full)
    return listLength(1);
  if (id == AtenOpId::ones || id == AtenOpId::zeros || id == AtenOpId::full)
    return listLength(0);
  if (id == AtenOpId::arange || id == AtenOpId::arange_start ||
      id == AtenOpId::arange_start_step)
    return 1;
  if (id == AtenOpId::unsqueeze && x && x->getOperand())
    return plus1(rankOf(x->getOperand(), stack, depth + 1));
  if (id == AtenOpId::embedding) {
    std::optional<AtenArg> indices = argument(op, 1);
    if (indices && indices->getOperand())
      return plus1(rankOf(indices->getOperand(), stack, depth + 1));
    return std::nullopt;
  }
  if (x && x->getOperand() && preservesShape(op))
    return rankOf(x->getOperand(), stack, depth + 1);
  return std::nullopt;
}

bool Prover::preservesShape(bmt::AtenOp op) {
  if (bmt::isAten(op, {AtenOpId::to_dtype, AtenOpId::to_device, AtenOpId::to_dtype_layout,
                       AtenOpId::to_other, AtenOpId::type_as, AtenOpId::contiguous,
                       AtenOpId::clone, AtenOpId::detach, AtenOpId::alias,
                       AtenOpId::lift_fresh_copy, AtenOpId::dropout, AtenOpId::zeros_like,
                       AtenOpId::ones_like, AtenOpId::full_like}))
    return true;
  // Unary elementwise ops (neg, exp, ...).
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
  return info && info->kind == bmt::AtenOpKind::Elementwise && op->getNumOperands() == 1 &&
         info->numArgs == 1;
}

Sym Prover::dimOf(Value t, int64_t d, const CallStack &stack, unsigned depth) {
  Sym opaque = Sym::dimOf(t, d, stack);
  if (depth > kMaxDepth || ++steps > kMaxSteps)
    return opaque;
  if (d < 0) {
    std::optional<int64_t> r = rankOf(t, stack, depth + 1);
    if (!r || d + *r < 0)
      return opaque;
    d += *r;
    opaque = Sym::dimOf(t, d, stack);
  }
  if (std::optional<StringRef> name = programInput(t)) {
    // Under the assumption attention_mask has input_ids' shape.
    if (*name == "attention_mask" && assumeUnpadded && d < 2)
      if (Value ids = sibling(t, "input_ids"))
        return Sym::dimOf(ids, d, CallStack{});
    return opaque;
  }
  if (auto hops = through(t, stack); !hops.empty()) {
    Sym s = dimOf(hops[0].first, d, hops[0].second, depth + 1);
    for (auto &[v, st] : ArrayRef(hops).drop_front())
      if (dimOf(v, d, st, depth + 1) != s)
        return opaque;
    return s;
  }
  if (auto c = t.getDefiningOp<bmt::ConstantOp>())
    if (auto dense = dyn_cast<DenseElementsAttr>(c.getValue()))
      return d < dense.getType().getRank() ? Sym::of(dense.getType().getDimSize(d)) : opaque;
  if (RankedTensorType type = globalType(t))
    return d < type.getRank() ? Sym::of(type.getDimSize(d)) : opaque;
  auto op = t.getDefiningOp<bmt::AtenOp>();
  if (!op || op->getNumResults() != 1)
    return opaque;
  ops.insert(op);
  if (Value other = shapeOperand(op, stack, depth))
    return dimOf(other, d, stack, depth + 1);
  std::optional<AtenArg> x = argument(op, 0);
  std::optional<AtenOpId> id = bmt::atenOpId(op);

  // A size given by element d of list argument `index`.
  auto fromList = [&](unsigned index, bool minusOneKeeps) -> Sym {
    std::optional<SmallVector<AtenArg>> list = listArgument(op, index);
    if (!list || d >= static_cast<int64_t>(list->size()))
      return opaque;
    AtenArg e = (*list)[d];
    if (e.getOperand())
      return intOf(e.getOperand(), stack, depth + 1);
    std::optional<int64_t> c = e.getInt();
    if (!c)
      return opaque;
    if (*c >= 0)
      return Sym::of(*c);
    if (*c != -1 || !x || !x->getOperand())
      return opaque;
    std::optional<int64_t> r = rankOf(x->getOperand(), stack, depth + 1);
    if (!r)
      return opaque;
    int64_t n = static_cast<int64_t>(list->size());
    if (minusOneKeeps) // expand: -1 keeps the input's size (aligned right)
      return d - (n - *r) >= 0 ? dimOf(x->getOperand(), d - (n - *r), stack, depth + 1) : opaque;
    // view/reshape: -1 is what the other sizes leave; the input's size at
    // d when every other size is the input's own.
    if (*r != n)
      return opaque;
    for (int64_t i = 0; i < n; ++i) {
      if (i == d)
        continue;
      AtenArg other = (*list)[i];
      Sym s = other.getOperand() ? intOf(other.getOperand(), stack, depth + 1)
                          : (other.getInt() ? Sym::of(*other.getInt()) : opaque);
      if (s != dimOf(x->getOperand(), i, stack, depth + 1))
        return opaque;
    }
    return dimOf(x->getOperand(), d, stack, depth + 1);
  };

  if (id == AtenOpId::view || id == AtenOpId::reshape)
    return fromList(1, /*minusOneKeeps=*/false);
  if (id == AtenOpId::expand)
    return fromList(1, /*minusOneKeeps=*/true);
  if (id == AtenOpId::new_ones || id == AtenOpId::new_zeros || id == AtenOpId::new_full)
    return fromList(1, false);
  if (id == AtenOpId::ones || id == AtenOpId::zeros || id == AtenOpId::full)
    return fromList(0, false);
  if (id == AtenOpId::unsqueeze) {
    std::optional<int64_t> k = argument(op, 1) ? argument(op, 1)->getInt() : std::nullopt;
    if (!k || !x || !x->getOperand())
      return opaque;
    if (*k < 0) {
      std::optional<int64_t> r = rankOf(x->getOperand(), stack, depth + 1);
      if (!r)
        return opaque;
      *k += *r + 1;
    }
    if (d == *k)
      return Sym::of(1);
    return dimOf(x->getOperand(), d < *k ? d : d - 1, stack, depth + 1);
  }
  if (id == AtenOpId::embedding) {
    std::optional<AtenArg> indices = argument(op, 1);
    if (!indices || !indices->getOperand())
      return opaque;
    std::optional<int64_t> r = rankOf(indices->getOperand(), stack, depth + 1);
    if (!r || d >= *r)
      return opaque;
    return dimOf(indices->getOperand(), d, stack, depth + 1);
  }
  if (id == AtenOpId::arange && d == 0) {
    std::optional<AtenArg> end = argument(op, 0);
    if (end && end->getOperand())
      return intOf(end->getOperand(), stack, depth + 1);
    if (std::optional<int64_t> c = end ? end->getInt() : std::nullopt)
      return Sym::of(*c);
    return opaque;
  }
  if (x && x->getOperand() && preservesShape(op))
    return dimOf(x->getOperand(), d, stack, depth + 1);
  return opaque;
}

Sym Prover::intOf(Value v, const CallStack &stack, unsigned depth) {
  Sym opaque = Sym::valueOf(v, stack);
  if (depth > kMaxDepth || ++steps > kMaxSteps)
    return opaque;
  if (std::optional<int64_t> c = bmt::getConstantInt(v))
    return Sym::of(*c);
  if (auto hops = through(v, stack); !hops.empty()) {
    Sym s = intOf(hops[0].first, hops[0].second, depth + 1);
    for (auto &[w, st] : ArrayRef(hops).drop_front())
      if (intOf(w, st, depth + 1) != s)
        return opaque;
    return s;
  }
  auto op = v.getDefiningOp<bmt::AtenOp>();
  if (!op)
    return opaque;
  ops.insert(op);
  if (bmt::atenOpId(op) == AtenOpId::size_int) {
    std::optional<AtenArg> t = argument(op, 0), d = argument(op, 1);
    std::optional<int64_t> dim = d ? d->getInt() : std::nullopt;
    if (t && t->getOperand() && dim)
      return dimOf(t->getOperand(), *dim, stack, depth + 1);
    return opaque;
  }
  if (bmt::atenOpId(op) == AtenOpId::Int_Tensor || bmt::atenOpId(op) == AtenOpId::ScalarImplicit)
    if (std::optional<AtenArg> t = argument(op, 0); t && t->getOperand())
      return scalarOf(t->getOperand(), stack, depth + 1).value_or(opaque);
  return opaque;
}

std::optional<Sym> Prover::scalarOf(Value t, const CallStack &stack, unsigned depth) {
  if (depth > kMaxDepth)
    return std::nullopt;
  if (auto n = t.getDefiningOp<bmt::NumToTensorOp>()) {
    ops.insert(n);
    if (n.getInput().getType().isInteger(64))
      return intOf(n.getInput(), stack, depth + 1);
    return std::nullopt;
  }
  if (std::optional<int64_t> c = bmt::getConstantInt(t))
    return Sym::of(*c);
  auto op = t.getDefiningOp<bmt::AtenOp>();
  if (!op)
    return std::nullopt;
  std::optional<AtenOpId> id = bmt::atenOpId(op);
  if (id == AtenOpId::add_Tensor || id == AtenOpId::sub_Tensor || id == AtenOpId::add_Scalar ||
      id == AtenOpId::sub_Scalar) {
    std::optional<AtenArg> a = argument(op, 0), b = argument(op, 1);
    if (!a || !b || !a->getOperand() || b->getInt() != 0)
      return std::nullopt;
    ops.insert(op);
    return scalarOf(a->getOperand(), stack, depth + 1);
  }
  return std::nullopt;
}

bool Prover::mayBeWritten(Value v) {
  SmallVector<Value> work{v};
  DenseSet<Value> seen;
  while (!work.empty()) {
    Value x = work.pop_back_val();
    if (!seen.insert(x).second)
      continue;
    for (OpOperand &use : x.getUses()) {
      Operation *user = use.getOwner();
      if (auto aten = dyn_cast<bmt::AtenOp>(user)) {
        if (isInPlace(aten))
          return true;
        if (mayAlias(aten))
          work.append(user->result_begin(), user->result_end());
      } else if (auto call = dyn_cast<func::CallOp>(user)) {
        auto callee = module.lookupSymbol<func::FuncOp>(call.getCallee());
        if (!callee || callee.isExternal())
          return true;
        work.push_back(callee.getArgument(use.getOperandNumber()));
      } else if (auto ret = dyn_cast<func::ReturnOp>(user)) {
        auto f = ret->getParentOfType<func::FuncOp>();
        if (!f.isPrivate())
          continue; // a result of the program: read after the step
        if (auto it = callers.find(f); it != callers.end())
          for (func::CallOp call : it->second)
            work.push_back(call.getResult(use.getOperandNumber()));
      }
    }
  }
  return false;
}

} // namespace bmt::causal_mask
