//===- CausalMaskTensors.cpp - the abstract value of a tensor -------------===//
//
// Prover::eval (CausalMaskProver.h): the abstract value (a position, a mask
// of bounds, or a constant) of each tensor op a mask is computed by.
//
//===----------------------------------------------------------------------===//

#include "CausalMaskProver.h"

#include "bmt/Dialect/AtenRegistry.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSwitch.h"

#include <algorithm>

using namespace mlir;
using bmt::AtenOpId;

namespace bmt::causal_mask {

LogicalResult Prover::broadcast(Term &a, Term &b, SmallVector<Dim, 4> &dims) {
  unsigned rank = std::max(a.rank(), b.rank());
  for (Term *t : {&a, &b}) {
    unsigned by = rank - t->rank();
    t->shift(by);
    t->dims.insert(t->dims.begin(), by, Dim{});
  }
  dims.clear();
  for (unsigned i = 0; i < rank; ++i) {
    const Dim &x = a.dims[i], &y = b.dims[i];
    if (x.one)
      dims.push_back(y);
    else if (y.one || x.size == y.size)
      dims.push_back(x);
    else
      return fail("the query and key lengths are not provably equal");
  }
  return success();
}

FailureOr<Term> Prover::onesOfList(bmt::AtenOp op, unsigned index, Value result, bool isBool,
                                   const CallStack &stack, unsigned depth) {
  std::optional<SmallVector<AtenArg>> list = listArgument(op, index);
  if (!list)
    return fail("sizes of " + op.getName() + " are not a list");
  Term t;
  t.isBool = isBool;
  for (int64_t d = 0; d < static_cast<int64_t>(list->size()); ++d)
    t.dims.push_back(Dim::ofSym(dimOf(result, d, stack, depth + 1)));
  return t;
}

FailureOr<Term> Prover::eval(Value v, const CallStack &stack, unsigned depth) {
  if (depth > kMaxDepth || ++steps > kMaxSteps)
    return fail("the mask's computation is too deep");
  values.insert(v);
  if (std::optional<StringRef> name = programInput(v)) {
    if (*name != "attention_mask")
      return fail("the mask reads the program input '" + *name + "'");
    if (!assumeUnpadded)
      return fail("the mask reads attention_mask (padding) and assume-unpadded is off");
    Value ids = sibling(v, "input_ids");
    if (!ids)
      return fail("the program has attention_mask but no input_ids");
    Term t; // all ones, of input_ids' [batch, seq] shape
    t.dims = {Dim::ofSym(Sym::dimOf(ids, 0, CallStack{})),
              Dim::ofSym(Sym::dimOf(ids, 1, CallStack{}))};
    return t;
  }
  if (auto hops = through(v, stack); !hops.empty()) {
    FailureOr<Term> t = eval(hops[0].first, hops[0].second, depth + 1);
    if (failed(t))
      return failure();
    for (auto &[w, st] : ArrayRef(hops).drop_front()) {
      FailureOr<Term> other = eval(w, st, depth + 1);
      if (failed(other))
        return failure();
      if (!(*other == *t))
        return fail("the mask differs between the call sites of a function");
    }
    return t;
  }
  if (isa<BlockArgument>(v))
    return fail("the mask comes from outside the program");
  auto op = v.getDefiningOp<bmt::AtenOp>();
  if (!op || op->getNumResults() != 1)
    return fail("the mask is computed by an op the pass does not reason about");
  ops.insert(op);
  StringRef name = op.getName(); // for messages
  std::optional<AtenOpId> id = bmt::atenOpId(op);
  auto operandTerm = [&](unsigned index) -> FailureOr<Term> {
    std::optional<AtenArg> a = argument(op, index);
    if (!a || !a->getOperand())
      return fail("operand " + Twine(index) + " of " + name + " is not a tensor");
    return eval(a->getOperand(), stack, depth + 1);
  };
  // Operands 0 and 1 (a binary op's).
  auto operandTerms = [&]() -> FailureOr<std::pair<Term, Term>> {
    FailureOr<Term> a = operandTerm(0);
    if (failed(a))
      return failure();
    FailureOr<Term> b = operandTerm(1);
    if (failed(b))
      return failure();
    return std::make_pair(std::move(*a), std::move(*b));
  };
  auto constantArg = [&](auto key) -> std::optional<int64_t> {
    std::optional<AtenArg> a = argument(op, key);
    if (!a)
      return std::nullopt;
    if (a->getOperand())
      if (Operation *def = a->getOperand().getDefiningOp(); def && isa<bmt::ConstantOp>(def))
        ops.insert(def);
    return a->getInt();
  };
  auto normalizeDim = [](int64_t d, unsigned rank) -> std::optional<unsigned> {
    if (d < 0)
      d += rank;
    if (d < 0 || d >= static_cast<int64_t>(rank))
      return std::nullopt;
    return static_cast<unsigned>(d);
  };

  // arange(n), arange(0, n), arange(0, n, 1): the coordinate along dim 0.
  if (id == AtenOpId::arange || id == AtenOpId::arange_start ||
      id == AtenOpId::arange_start_step) {
    unsigned endIndex = id == AtenOpId::arange ? 0 : 1;
    if (endIndex == 1 && constantArg(0) != 0)
      return fail("an arange that does not start at 0");
    if (id == AtenOpId::arange_start_step && constantArg(2) != 1)
      return fail("an arange with a step other than 1");
    std::optional<int64_t> dtype = dtypeArgument(op);
    if (!dtype || (*dtype != -1 && *dtype != kLong))
      return fail("an arange of another dtype than int64");
    std::optional<AtenArg> end = argument(op, endIndex);
    if (!end)
      return fail("an arange without an end");
    std::optional<int64_t> endConstant = end->getOperand() ? std::nullopt : end->getInt();
    if (end->getOperand() ? !end->getOperand().getType().isInteger(64) : !endConstant)
      return fail("an arange whose end is not an integer");
    Sym n = end->getOperand() ? intOf(end->getOperand(), stack, depth + 1) : Sym::of(*endConstant);
    Term t;
    t.kind = Term::Kind::Index;
    t.dims = {Dim{false, n}}; // even when n is 1: the coordinate is the arange's
    return t;
  }

  // The sum of two integer constants (broadcast). Anything else with no
  // constant operand is an offset that is not a constant, as below.
  if (id == AtenOpId::add_Tensor && !constantArg(0) && !constantArg(1)) {
    std::string before = why;
    FailureOr<Term> a = operandTerm(0);
    FailureOr<Term> b = succeeded(a) ? operandTerm(1) : FailureOr<Term>(failure());
    std::optional<int64_t> alpha = constantArg(2);
    SmallVector<Dim, 4> dims;
    if (failed(a) || failed(b) || a->kind != Term::Kind::Constant ||
        b->kind != Term::Kind::Constant || a->isBool || b->isBool || !alpha ||
        std::abs(*alpha) > 1 || std::abs(a->value) > kMaxOffset ||
        std::abs(b->value) > kMaxOffset || failed(broadcast(*a, *b, dims))) {
      why = before;
      return fail("an offset that is not a constant");
    }
    return Term::constant(dims, a->value + *alpha * b->value, /*isBool=*/false);
  }

  // index + c, index - c, c + index: the offset moves.
  if (id == AtenOpId::add_Tensor || id == AtenOpId::add_Scalar || id == AtenOpId::sub_Tensor ||
      id == AtenOpId::sub_Scalar) {
    bool sub = id == AtenOpId::sub_Tensor || id == AtenOpId::sub_Scalar;
    std::optional<int64_t> alpha = constantArg(2);
    std::optional<AtenArg> a = argument(op, 0), b = argument(op, 1);
    if (!alpha || !a || !b)
      return fail("an offset that is not a constant");
    Value indexValue = a->getOperand();
    std::optional<int64_t> c = constantArg(1);
    if (!c && id == AtenOpId::add_Tensor && b->getOperand() && *alpha == 1) {
      c = constantArg(0); // c + index
      indexValue = b->getOperand();
    }
    if (!c || !indexValue)
      return fail("an offset that is not a constant");
    FailureOr<Term> t = eval(indexValue, stack, depth + 1);
    if (failed(t))
      return failure();
    int64_t delta = (sub ? -1 : 1) * *alpha * *c;
    if (t->kind == Term::Kind::Constant && !t->isBool && std::abs(delta) <= kMaxOffset &&
        std::abs(t->value + delta) <= kMaxOffset) {
      t->value += delta;
      return t;
    }
    if (t->kind != Term::Kind::Index || std::abs(delta) > kMaxOffset ||
        std::abs(t->offset + delta) > kMaxOffset)
      return fail("arithmetic on the mask other than a constant offset of a position");
    t->offset += delta;
    return t;
  }

  // x * 0 of a position or an integer constant: zeros.
  if (id == AtenOpId::mul_Scalar) {
    FailureOr<Term> t = operandTerm(0);
    if (failed(t))
      return failure();
    if (constantArg(1) != 0 || (t->kind != Term::Kind::Index &&
                                (t->kind != Term::Kind::Constant || t->isBool)))
      return fail("a product on the mask other than an integer times 0");
    return Term::constant(t->dims, 0, /*isBool=*/false);
  }

  // Views and copies that keep every element.
  if (id == AtenOpId::contiguous || id == AtenOpId::clone || id == AtenOpId::alias ||
      id == AtenOpId::detach || id == AtenOpId::lift_fresh_copy)
    return operandTerm(0);
  if (id == AtenOpId::unsqueeze) {
    FailureOr<Term> t = operandTerm(0);
    std::optional<int64_t> d = constantArg(1);
    if (failed(t))
      return failure();
    std::optional<unsigned> at = d ? normalizeDim(*d, t->rank() + 1) : std::nullopt;
    if (!at)
      return fail("an unsqueeze the pass cannot place");
    t->insertDim(*at);
    return t;
  }
  if (id == AtenOpId::slice_Tensor) { // only x[:] along a dimension
    FailureOr<Term> t = operandTerm(0);
    if (failed(t))
      return failure();
    std::optional<AtenArg> start = argument(op, 2), end = argument(op, 3);
    bool fromStart = isNone(start) || (start && start->getInt() == 0);
    bool toEnd = isNone(end) || (end && end->getInt() == kSliceToEnd);
    if (fromStart && toEnd && constantArg(4) == 1)
      return t;
    // x[:, :1]: the first element along `d`, a size-1 dimension. A
    // position along `d` becomes the constant it holds there
    // (find_packed_sequence_indices' `position_ids[:, :1] - 1`).
    std::optional<int64_t> d = constantArg(1);
    std::optional<unsigned> at = d ? normalizeDim(*d, t->rank()) : std::nullopt;
    if (fromStart && end && end->getInt() == 1 && constantArg(4) == 1 && at) {
      if (t->kind == Term::Kind::Index && t->axis == *at) {
        Term first = Term::constant(t->dims, t->offset, /*isBool=*/false);
        first.dims[*at] = Dim{};
        return first;
      }
      if (t->kind == Term::Kind::Constant ||
          (t->kind == Term::Kind::Mask && t->bounds.empty())) {
        t->dims[*at] = Dim{};
        return t;
      }
    }
    return fail("a slice of the mask that drops elements (an offset or a window)");
  }

  // diff(p, dim=d, prepend=p[:, :1] - 1) of a position p along d: all
  // ones (transformers' packed-sequence detection on position_ids that
  // are an arange, where no sequence starts after the first token).
  if (id == AtenOpId::diff) {
    FailureOr<Term> x = operandTerm(0);
    if (failed(x))
      return failure();
    std::optional<int64_t> d = constantArg("dim");
    std::optional<unsigned> at = d ? normalizeDim(*d, x->rank()) : std::nullopt;
    std::optional<AtenArg> prepend = argument(op, "prepend");
    if (constantArg("n") != 1 || !isNone(argument(op, "append")) || !prepend || !prepend->getOperand() ||
        x->kind != Term::Kind::Index || !at || x->axis != *at)
      return fail("a diff other than of a position along its dimension with a prepend");
    FailureOr<Term> p = eval(prepend->getOperand(), stack, depth + 1);
    if (failed(p))
      return failure();
    bool sameOtherDims = p->rank() == x->rank();
    for (unsigned i = 0; sameOtherDims && i < x->rank(); ++i)
      sameOtherDims = i == *at ? p->dims[i].one : p->dims[i] == x->dims[i];
    if (p->kind != Term::Kind::Constant || p->isBool || p->value != x->offset - 1 ||
        !sameOtherDims)
      return fail("a diff whose prepend is not the position before the first");
    return Term::constant(x->dims, 1, /*isBool=*/false);
  }

  // cumsum of zeros (or of false): zeros, in int64.
  if (id == AtenOpId::cumsum) {
    FailureOr<Term> x = operandTerm(0);
    if (failed(x))
      return failure();
    std::optional<int64_t> d = constantArg("dim");
    std::optional<int64_t> dtype = dtypeArgument(op);
    if (x->kind != Term::Kind::Constant || x->value != 0 || !d ||
        !normalizeDim(*d, x->rank()) || !dtype || (*dtype != -1 && *dtype != kLong))
      return fail("a cumsum of something else than zeros");
    return Term::constant(x->dims, 0, /*isBool=*/false);
  }

  // An integer constant compared with a number, or with another one.
  if (id == AtenOpId::eq_Scalar || id == AtenOpId::ne_Scalar) {
    FailureOr<Term> a = operandTerm(0);
    if (failed(a))
      return failure();
    std::optional<int64_t> c = constantArg(1);
    if (a->kind != Term::Kind::Constant || a->isBool || !c)
      return fail("an equality of something else than a constant with a number");
    bool equal = a->value == *c;
    return Term::constant(a->dims, equal == (id == AtenOpId::eq_Scalar), /*isBool=*/true);
  }
  if (id == AtenOpId::eq_Tensor || id == AtenOpId::ne_Tensor) {
    FailureOr<std::pair<Term, Term>> ab = operandTerms();
    if (failed(ab))
      return failure();
    Term *a = &ab->first, *b = &ab->second;
    if (a->kind != Term::Kind::Constant || b->kind != Term::Kind::Constant ||
        a->isBool != b->isBool)
      return fail("an equality of something else than two constants (packed sequences)");
    SmallVector<Dim, 4> dims;
    if (failed(broadcast(*a, *b, dims)))
      return failure();
    bool equal = a->value == b->value;
    return Term::constant(dims, equal == (id == AtenOpId::eq_Tensor), /*isBool=*/true);
  }
  if (id == AtenOpId::expand) {
    FailureOr<Term> t = operandTerm(0);
    if (failed(t))
      return failure();
    std::optional<SmallVector<AtenArg>> sizes = listArgument(op, 1);
    if (!sizes || sizes->size() < t->rank())
      return fail("an expand the pass cannot read");
    unsigned by = sizes->size() - t->rank();
    t->shift(by);
    t->dims.insert(t->dims.begin(), by, Dim{});
    for (unsigned d = 0; d < sizes->size(); ++d) {
      AtenArg e = (*sizes)[d];
      std::optional<int64_t> c = e.getOperand() ? std::nullopt : e.getInt();
      if (c == -1 && d >= by)
        continue; // keeps the size
      Sym s = e.getOperand() ? intOf(e.getOperand(), stack, depth + 1)
                      : (c ? Sym::of(*c) : Sym::valueOf(v, stack));
      if (!e.getOperand() && (!c || *c < 0))
        return fail("an expand the pass cannot read");
      Dim &dim = t->dims[d];
      if (dim.one)
        dim = Dim::ofSym(s); // a broadcast dimension grows: no coordinate varies along it
      else if (dim.size != s)
        return fail("the query and key lengths are not provably equal");
    }
    return t;
  }

  // Conversions: an index stays an index in int64; a mask becomes boolean.
  if (id == AtenOpId::to_dtype || id == AtenOpId::to_dtype_layout || id == AtenOpId::to_device) {
    FailureOr<Term> t = operandTerm(0);
    if (failed(t))
      return failure();
    std::optional<int64_t> dtype = dtypeArgument(op);
    if (!dtype)
      return fail("a conversion to a dtype that is not a constant");
    if (*dtype == -1)
      return t;
    if (t->kind == Term::Kind::Constant) {
      if (*dtype == kBool)
        return Term::constant(t->dims, t->value != 0, /*isBool=*/true);
      if (*dtype != kLong)
        return fail("a constant converted to another dtype than int64 or bool");
      return Term::constant(t->dims, t->value, /*isBool=*/false);
    }
    if (t->kind == Term::Kind::Index) {
      if (*dtype != kLong)
        return fail("a position converted to another dtype than int64");
      return t;
    }
    if (*dtype == kBool)
      t->isBool = true;
    else if (!t->bounds.empty())
      return fail("a comparison converted to a number (an additive mask)");
    else
      t->isBool = false;
    return t;
  }

  // Comparisons of two positions: one bound.
  if (id == AtenOpId::le_Tensor || id == AtenOpId::lt_Tensor || id == AtenOpId::ge_Tensor ||
      id == AtenOpId::gt_Tensor) {
    FailureOr<std::pair<Term, Term>> ab = operandTerms();
    if (failed(ab))
      return failure();
    Term *a = &ab->first, *b = &ab->second;
    if (a->kind != Term::Kind::Index || b->kind != Term::Kind::Index)
      return fail("a comparison of something else than two positions");
    Term t;
    t.isBool = true;
    if (failed(broadcast(*a, *b, t.dims)))
      return failure();
    // a: x_i + oa, b: x_j + ob.
    unsigned i = a->axis, j = b->axis;
    int64_t oa = a->offset, ob = b->offset;
    Bound bound;
    if (id == AtenOpId::le_Tensor || id == AtenOpId::lt_Tensor)
      bound = {i, j, ob - oa - (id == AtenOpId::lt_Tensor)}; // x_i - x_j <= ob - oa
    else
      bound = {j, i, oa - ob - (id == AtenOpId::gt_Tensor)}; // x_j - x_i <= oa - ob
    if (bound.a == bound.b) {
      if (bound.c < 0)
        return fail("a comparison that is always false");
    } else {
      t.bounds.push_back(bound);
    }
    return t;
  }

  // A position compared with a constant: true everywhere, or not handled
  // (bidirectional_mask_function's `q_idx >= 0`).
  if (id == AtenOpId::ge_Scalar || id == AtenOpId::gt_Scalar) {
    FailureOr<Term> a = operandTerm(0);
    if (failed(a))
      return failure();
    std::optional<int64_t> c = constantArg(1);
    if (a->kind != Term::Kind::Index || !c)
      return fail("a comparison of something else than a position with a constant");
    // x + offset >= c (> c) for every x >= 0.
    if (a->offset < *c + (id == AtenOpId::gt_Scalar))
      return fail("a position compared with a constant (a window or an offset)");
    Term t;
    t.isBool = true;
    t.dims = a->dims;
    return t;
  }

  // Conjunctions.
  if (id == AtenOpId::and_Tensor || id == AtenOpId::logical_and) {
    FailureOr<std::pair<Term, Term>> ab = operandTerms();
    if (failed(ab))
      return failure();
    Term *a = &ab->first, *b = &ab->second;
    if (a->kind == Term::Kind::Constant || b->kind == Term::Kind::Constant)
      return fail("a conjunction with a constant that is not true (zeros, or false)");
    if (a->kind != Term::Kind::Mask || b->kind != Term::Kind::Mask)
      return fail("a conjunction with a position");
    // `&` of two booleans is their conjunction; of numbers it is bitwise.
    if (id == AtenOpId::and_Tensor && (!a->isBool || !b->isBool))
      return fail("a bitwise and of numbers");
    Term t;
    t.isBool = true;
    if (failed(broadcast(*a, *b, t.dims)))
      return failure();
    t.bounds = a->bounds;
    t.bounds.append(b->bounds.begin(), b->bounds.end());
    llvm::sort(t.bounds);
    t.bounds.erase(std::unique(t.bounds.begin(), t.bounds.end()), t.bounds.end());
    return t;
  }

  // Ones: the neutral terms of and_masks, a padding mask without padding.
  if (id == AtenOpId::new_ones) {
    std::optional<int64_t> dtype = dtypeArgument(op);
    return onesOfList(op, 1, v, dtype == kBool, stack, depth);
  }
  if (id == AtenOpId::ones) {
    std::optional<int64_t> dtype = dtypeArgument(op);
    return onesOfList(op, 0, v, dtype == kBool, stack, depth);
  }
  if (id == AtenOpId::full || id == AtenOpId::new_full) {
    unsigned sizes = id == AtenOpId::full ? 0 : 1;
    std::optional<AtenArg> fill = argument(op, "fill_value");
    // True written in the args (a 0-dim bool operand is not looked into),
    // or a nonzero integer.
    bool nonzero = fill && ((!fill->isOperand() && fill->getBool() == true) ||
                            (fill->getInt() && *fill->getInt() != 0));
    if (!nonzero)
      return fail("a fill the pass does not know to be nonzero");
    std::optional<int64_t> dtype = dtypeArgument(op);
    return onesOfList(op, sizes, v, dtype == kBool, stack, depth);
  }
  if (id == AtenOpId::view || id == AtenOpId::reshape) { // of ones: still ones
    FailureOr<Term> t = operandTerm(0);
    if (failed(t))
      return failure();
    if (t->kind != Term::Kind::Mask || !t->bounds.empty())
      return fail("a view of a mask");
    return onesOfList(op, 1, v, t->isBool, stack, depth);
  }

  // Indexing a tensor of ones with positions: ones of the positions' shape.
  if (id == AtenOpId::index_Tensor) {
    FailureOr<Term> source = operandTerm(0);
    if (failed(source))
      return failure();
    if ((source->kind != Term::Kind::Mask || !source->bounds.empty()) &&
        source->kind != Term::Kind::Constant)
      return fail("indexing a tensor that is not all ones or a constant");
    std::optional<SmallVector<AtenArg>> indices = listArgument(op, 1);
    if (!indices || indices->empty() || indices->size() > source->rank())
      return fail("an index the pass cannot read");
    Term t; // ones, or the source's constant: every element is one of the source's
    t.kind = source->kind;
    t.value = source->value;
    t.isBool = source->isBool;
    for (const AtenArg &index : *indices) {
      if (!index.getOperand())
        return fail("an index with None");
      FailureOr<Term> i = eval(index.getOperand(), stack, depth + 1);
      if (failed(i))
        return failure();
      if (i->kind != Term::Kind::Index)
        return fail("an index that is not a position");
      Term shape;
      shape.dims = i->dims;
      SmallVector<Dim, 4> dims;
      if (failed(broadcast(t, shape, dims)))
        return failure();
      t.dims = dims;
    }
    t.dims.append(source->dims.begin() + indices->size(), source->dims.end());
    return t;
  }

  return fail("the mask is computed by " + name + ", which the pass does not reason about");
}

} // namespace bmt::causal_mask
