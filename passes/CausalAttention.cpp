//===- CausalAttention.cpp - the bmt-causal-attention pass ----------------===//
//
// Hugging Face's transformers 5 builds the mask of its SDPA attention with
// index arithmetic (masking_utils.sdpa_mask): aranges of the query and key
// positions, `kv_idx <= q_idx`, ANDed with `attention_mask[batch_idx,
// kv_idx]`, expanded to [batch, 1, q, kv]. Under tracing it cannot take its
// own shortcut (attn_mask=None, is_causal=True), so every
// aten::scaled_dot_product_attention of a trace or an export gets an
// explicit boolean mask, and the GPU kernels compute the whole square
// instead of its lower triangle.
//
// The pass evaluates the mask's computation symbolically: an integer tensor
// as "the coordinate along one dimension plus a constant", a boolean tensor
// as a conjunction of difference bounds x_a - x_b <= c between coordinates,
// sizes as symbols followed through views, factories and calls. Where the
// mask is exactly kv <= q over query and key lengths that are provably
// equal, the call becomes attn_mask=None, is_causal=True, and the mask's
// computation, now dead, is removed. Lookups of a tensor proven constant
// (transformers' packed-sequence ids of a model traced without
// attention_mask) are then folded in every attention, SDPA or not. See
// passes/Passes.td for the contract.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSwitch.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>

namespace bmt {
#define GEN_PASS_DEF_CAUSALATTENTION
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;

namespace {

/// What assume-unpadded adds to the module attribute `bmt.assumptions` when
/// a rewrite needed it; the exporter puts it in the runtime plan, and
/// bmt-run --dump refuses batches that break it.
constexpr llvm::StringLiteral kAssumption = "attention_mask all ones";
/// Bounds on one proof: calls followed in a row, values evaluated.
constexpr unsigned kMaxDepth = 64;
constexpr unsigned kMaxSteps = 20000;
/// Offsets beyond this are not reasoned about (no overflow in the bounds).
constexpr int64_t kMaxOffset = int64_t(1) << 40;
/// c10::ScalarType codes.
constexpr int64_t kLong = 4, kBool = 11;
/// The `end` of a slice to the end of a dimension (Python's `x[:]`).
constexpr int64_t kSliceToEnd = std::numeric_limits<int64_t>::max();

//===----------------------------------------------------------------------===//
// Reading bmt.aten arguments
//===----------------------------------------------------------------------===//

/// One schema argument of a bmt.aten op: its operand, or its constant.
struct Arg {
  Value value;
  Attribute attr;
};

unsigned operandsIn(Attribute attr) {
  if (isa<bmt::OperandAttr>(attr))
    return 1;
  unsigned n = 0;
  if (auto list = dyn_cast<ArrayAttr>(attr))
    for (Attribute e : list)
      n += operandsIn(e);
  return n;
}

/// The position among `op`'s operands of the first operand of argument `index`.
unsigned firstOperandOf(bmt::AtenOp op, unsigned index) {
  unsigned n = 0;
  for (unsigned i = 0; i < index; ++i)
    n += operandsIn(op.getArgs()[i]);
  return n;
}

/// Schema argument `index` of `op`; none if out of range or a list.
std::optional<Arg> argument(bmt::AtenOp op, unsigned index) {
  ArrayAttr args = op.getArgs();
  if (index >= args.size() || isa<ArrayAttr>(args[index]))
    return std::nullopt;
  if (isa<bmt::OperandAttr>(args[index]))
    return Arg{op->getOperand(firstOperandOf(op, index)), Attribute()};
  return Arg{Value(), args[index]};
}

/// The elements of list argument `index` of `op` (a flat list).
std::optional<SmallVector<Arg>> listArgument(bmt::AtenOp op, unsigned index) {
  ArrayAttr args = op.getArgs();
  if (index >= args.size())
    return std::nullopt;
  auto list = dyn_cast<ArrayAttr>(args[index]);
  if (!list)
    return std::nullopt;
  unsigned operand = firstOperandOf(op, index);
  SmallVector<Arg> out;
  for (Attribute e : list) {
    if (isa<ArrayAttr>(e))
      return std::nullopt;
    if (isa<bmt::OperandAttr>(e))
      out.push_back({op->getOperand(operand++), Attribute()});
    else
      out.push_back({Value(), e});
  }
  return out;
}

/// The integer an argument holds when it is a constant: an i64 attribute, a
/// `bmt.constant` integer, or a 0-dim integer tensor constant
/// (`dense<0> : tensor<i64>`, as a trace records `arange(n) + 0`).
std::optional<int64_t> constantInt(Arg arg) {
  Attribute attr = arg.attr;
  if (arg.value) {
    auto c = arg.value.getDefiningOp<bmt::ConstantOp>();
    if (!c)
      return std::nullopt;
    attr = c.getValue();
  }
  if (auto dense = dyn_cast_or_null<DenseElementsAttr>(attr)) {
    Type element = dense.getElementType();
    if (dense.getType().getRank() != 0 || !isa<IntegerType>(element) || element.isInteger(1))
      return std::nullopt;
    return dense.getSplatValue<APInt>().getSExtValue();
  }
  auto i = dyn_cast_or_null<IntegerAttr>(attr);
  if (!i || i.getType().isInteger(1))
    return std::nullopt;
  return i.getValue().getSExtValue();
}

bool isNone(const std::optional<Arg> &arg) {
  return arg && !arg->value && isa_and_nonnull<bmt::NoneAttr>(arg->attr);
}

/// The dtype argument `index` of a conversion or factory: the c10 code,
/// -1 for None (keep / default), none when not a constant.
std::optional<int64_t> dtypeArgument(bmt::AtenOp op, unsigned index) {
  std::optional<Arg> arg = argument(op, index);
  if (isNone(arg))
    return -1;
  if (!arg)
    return std::nullopt;
  return constantInt(*arg);
}

/// Whether `op` writes one of its inputs (`add_`, `masked_fill_`, `__iand__`).
bool isInPlace(bmt::AtenOp op) {
  StringRef name = op.getOperatorName();
  name = name.substr(name.find("::") == StringRef::npos ? 0 : name.find("::") + 2);
  if (name.starts_with("__i") && name.ends_with("__"))
    return true;
  return name.ends_with("_") && !name.ends_with("__");
}

/// Whether `op`'s results may share memory with its operands (views,
/// conversions that return their input unchanged, in-place ops).
bool mayAlias(bmt::AtenOp op) {
  if (isInPlace(op))
    return true;
  if (const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName()))
    if (info->kind == bmt::AtenOpKind::View || info->kind == bmt::AtenOpKind::Copy)
      return true;
  return llvm::StringSwitch<bool>(op.getName())
      .Cases({"aten::slice.Tensor", "aten::select.int", "aten::narrow"}, true)
      .Default(false);
}

//===----------------------------------------------------------------------===//
// The abstract values
//===----------------------------------------------------------------------===//

/// A size: a constant; dimension `dim` of a tensor that nothing more is
/// known about (a program input, an op the pass does not look into); or an
/// i64 value that nothing more is known about. Equal symbols are equal
/// sizes at run time; different ones may still be equal. A symbol read
/// inside a callee carries the calls that led there (`context`): the same
/// value of a function called twice is two sizes.
struct Sym {
  enum class Kind { Constant, Dim, Value } kind = Kind::Value;
  int64_t constant = 0;
  Value base;
  int64_t dim = 0;
  SmallVector<Operation *, 2> context;

  static Sym of(int64_t c) { return {Kind::Constant, c, Value(), 0, {}}; }
  template <typename Stack> static Sym dimOf(Value t, int64_t d, const Stack &stack) {
    Sym s{Kind::Dim, 0, t, d, {}};
    for (auto call : stack)
      s.context.push_back(call.getOperation());
    return s;
  }
  template <typename Stack> static Sym valueOf(Value v, const Stack &stack) {
    Sym s = dimOf(v, 0, stack);
    s.kind = Kind::Value;
    return s;
  }
  bool operator==(const Sym &o) const {
    return kind == o.kind && constant == o.constant && base == o.base && dim == o.dim &&
           context == o.context;
  }
  bool operator!=(const Sym &o) const { return !(*this == o); }
};

/// One dimension of an abstract tensor: size 1 (it broadcasts), or `size`.
struct Dim {
  bool one = true;
  Sym size;

  static Dim ofSym(const Sym &s) {
    if (s.kind == Sym::Kind::Constant && s.constant == 1)
      return Dim{};
    return Dim{false, s};
  }
  bool operator==(const Dim &o) const { return one == o.one && (one || size == o.size); }
};

/// x_a - x_b <= c, where x_i is the coordinate along dimension i.
struct Bound {
  unsigned a = 0, b = 0;
  int64_t c = 0;
  bool operator==(const Bound &o) const { return a == o.a && b == o.b && c == o.c; }
  bool operator<(const Bound &o) const {
    return std::tie(a, b, c) < std::tie(o.a, o.b, o.c);
  }
};

/// An abstract tensor: an integer one whose element is x_axis + offset (an
/// arange, moved to dimension `axis`); a mask whose element is nonzero
/// exactly where every bound holds (no bounds: all nonzero, e.g. ones); or
/// a tensor whose every element is `value` (int64, or a boolean false: a
/// boolean true is a mask without bounds), such as the packed-sequence ids
/// transformers derives from position_ids that are an arange.
struct Term {
  enum class Kind { Index, Mask, Constant } kind = Kind::Mask;
  SmallVector<Dim, 4> dims;
  unsigned axis = 0;   ///< Index
  int64_t offset = 0;  ///< Index
  SmallVector<Bound, 2> bounds; ///< Mask, sorted
  bool isBool = false;          ///< Mask: dtype bool (else numeric ones); Constant: false
  int64_t value = 0;            ///< Constant

  /// Every element `value` (`isBool`: value != 0 as a boolean).
  static Term constant(SmallVector<Dim, 4> dims, int64_t value, bool isBool) {
    Term t;
    t.dims = std::move(dims);
    t.isBool = isBool;
    if (isBool && value != 0)
      return t; // true everywhere: a mask without bounds
    t.kind = Kind::Constant;
    t.value = isBool ? 0 : value;
    return t;
  }

  unsigned rank() const { return dims.size(); }
  bool operator==(const Term &o) const {
    return kind == o.kind && dims == o.dims && axis == o.axis && offset == o.offset &&
           bounds == o.bounds && isBool == o.isBool && value == o.value;
  }
  /// Moves every coordinate `by` dimensions to the right (a broadcast to a
  /// higher rank prepends dimensions).
  void shift(unsigned by) {
    axis += by;
    for (Bound &b : bounds) {
      b.a += by;
      b.b += by;
    }
  }
  /// Inserts a size-1 dimension at `d`.
  void insertDim(unsigned d) {
    dims.insert(dims.begin() + d, Dim{});
    if (kind == Kind::Index && axis >= d)
      ++axis;
    for (Bound &b : bounds) {
      b.a += b.a >= d;
      b.b += b.b >= d;
    }
  }
};

/// The calls of each function.
using CallSites = DenseMap<Operation *, SmallVector<func::CallOp>>;
/// The calls whose callees a value was followed into (innermost last).
using CallStack = SmallVector<func::CallOp, 4>;

//===----------------------------------------------------------------------===//
// The prover
//===----------------------------------------------------------------------===//

class Prover {
public:
  Prover(ModuleOp module, const CallSites &callers, bool assumeUnpadded)
      : module(module), callers(callers), assumeUnpadded(assumeUnpadded) {}

  /// Proves that boolean tensor `mask` is [.., .., n, n] with element
  /// (b, h, i, j) = (j <= i): what is_causal=True computes.
  LogicalResult prove(Value mask) {
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

  /// For `source[i0, i1, ...]` (aten::index.Tensor), the int64 constant
  /// every element of `source` holds, when a position indexes each of its
  /// dimensions: then the lookup is that constant at every index, whatever
  /// the source's shape (the packed-sequence ids of a model traced without
  /// attention_mask).
  std::optional<int64_t> constantLookup(bmt::AtenOp index) {
    std::optional<Arg> source = argument(index, 0);
    std::optional<SmallVector<Arg>> indices = listArgument(index, 1);
    if (!source || !source->value || !indices || indices->empty())
      return std::nullopt;
    FailureOr<Term> t = eval(source->value, {}, 0);
    if (failed(t) || t->kind != Term::Kind::Constant || t->isBool ||
        t->rank() != indices->size())
      return std::nullopt;
    for (const Arg &i : *indices) {
      if (!i.value)
        return std::nullopt;
      FailureOr<Term> position = eval(i.value, {}, 0);
      if (failed(position) || position->kind != Term::Kind::Index)
        return std::nullopt;
    }
    for (Value v : values)
      if (mayBeWritten(v))
        return std::nullopt;
    return t->value;
  }

  /// The first reason the last proof failed.
  const std::string &reason() const { return why; }
  /// The ops and values a successful proof went through.
  const llvm::SetVector<Operation *> &visitedOps() const { return ops; }
  const llvm::SetVector<Value> &visitedValues() const { return values; }

private:
  LogicalResult fail(const Twine &message) {
    if (why.empty())
      why = message.str();
    return failure();
  }

  /// Where `v` comes from across a call boundary: for an argument of a
  /// private function, the operand of the call on `stack`, or of every call
  /// site when the stack is empty; for the result of a call, the callee's
  /// returned value (the call pushed). Empty for anything else.
  SmallVector<std::pair<Value, CallStack>> through(Value v, const CallStack &stack) {
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

  /// The name (`bmt.name`) of `v` when it is an input of the program: an
  /// argument of a public function (`@forward`) with no call site.
  std::optional<StringRef> programInput(Value v) {
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

  /// The input named `name` of the function that has program input `v`.
  Value sibling(Value v, StringRef name) {
    auto f = cast<func::FuncOp>(cast<BlockArgument>(v).getOwner()->getParentOp());
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      if (auto n = f.getArgAttrOfType<StringAttr>(i, "bmt.name"); n && n.getValue() == name)
        return f.getArgument(i);
    return Value();
  }

  /// Under assume-unpadded, the inputs input_ids and attention_mask are
  /// [batch, seq] of one shape (bmt-run feeds them so; --dump checks it).
  bool assumedShape(StringRef name) {
    return assumeUnpadded && (name == "input_ids" || name == "attention_mask");
  }

  // --- sizes ----------------------------------------------------------------

  /// The type of the parameter or buffer `t` reads, if it is a bmt.get_global.
  RankedTensorType globalType(Value t) {
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

  /// For a binary elementwise op with a 0-dim operand (`x * scale`, Gemma's
  /// scaled embedding): the other operand, whose shape the result has.
  Value shapeOperand(bmt::AtenOp op, const CallStack &stack, unsigned depth) {
    const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
    if (!info || info->kind != bmt::AtenOpKind::Elementwise || isInPlace(op))
      return Value();
    std::optional<Arg> a = argument(op, 0), b = argument(op, 1);
    if (!a || !b || !a->value || !b->value || !isa<bmt::TensorType>(b->value.getType()))
      return Value();
    if (rankOf(b->value, stack, depth + 1) == 0)
      return a->value;
    if (rankOf(a->value, stack, depth + 1) == 0)
      return b->value;
    return Value();
  }

  /// The rank of tensor `t`, where the program tells it.
  std::optional<int64_t> rankOf(Value t, const CallStack &stack, unsigned depth) {
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
    StringRef name = op.getName();
    std::optional<Arg> x = argument(op, 0);
    auto listLength = [&](unsigned index) -> std::optional<int64_t> {
      if (auto list = listArgument(op, index))
        return static_cast<int64_t>(list->size());
      return std::nullopt;
    };
    auto plus1 = [](std::optional<int64_t> r) {
      return r ? std::optional<int64_t>(*r + 1) : std::nullopt;
    };
    if (name == "aten::view" || name == "aten::reshape" || name == "aten::expand" ||
        name == "aten::new_ones" || name == "aten::new_zeros" || name == "aten::new_full")
      return listLength(1);
    if (name == "aten::ones" || name == "aten::zeros" || name == "aten::full")
      return listLength(0);
    if (name == "aten::arange" || name == "aten::arange.start" ||
        name == "aten::arange.start_step")
      return 1;
    if (name == "aten::unsqueeze" && x && x->value)
      return plus1(rankOf(x->value, stack, depth + 1));
    if (name == "aten::embedding") {
      std::optional<Arg> indices = argument(op, 1);
      if (indices && indices->value)
        return plus1(rankOf(indices->value, stack, depth + 1));
      return std::nullopt;
    }
    if (x && x->value && preservesShape(op))
      return rankOf(x->value, stack, depth + 1);
    return std::nullopt;
  }

  /// Ops whose result has the shape of their first operand.
  static bool preservesShape(bmt::AtenOp op) {
    if (llvm::StringSwitch<bool>(op.getName())
            .Cases({"aten::to.dtype", "aten::to.device", "aten::to.dtype_layout", "aten::to.other",
                    "aten::type_as", "aten::contiguous", "aten::clone", "aten::detach",
                    "aten::alias", "aten::lift_fresh_copy", "aten::dropout", "aten::zeros_like",
                    "aten::ones_like", "aten::full_like"},
                   true)
            .Default(false))
      return true;
    // Unary elementwise ops (neg, exp, ...).
    const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
    return info && info->kind == bmt::AtenOpKind::Elementwise && op->getNumOperands() == 1 &&
           info->numArgs == 1;
  }

  /// The size of dimension `d` (d >= 0, or from the end when negative) of `t`.
  Sym dimOf(Value t, int64_t d, const CallStack &stack, unsigned depth) {
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
    std::optional<Arg> x = argument(op, 0);
    StringRef name = op.getName();

    // A size given by element d of list argument `index`.
    auto fromList = [&](unsigned index, bool minusOneKeeps) -> Sym {
      std::optional<SmallVector<Arg>> list = listArgument(op, index);
      if (!list || d >= static_cast<int64_t>(list->size()))
        return opaque;
      Arg e = (*list)[d];
      if (e.value)
        return intOf(e.value, stack, depth + 1);
      std::optional<int64_t> c = constantInt(e);
      if (!c)
        return opaque;
      if (*c >= 0)
        return Sym::of(*c);
      if (*c != -1 || !x || !x->value)
        return opaque;
      std::optional<int64_t> r = rankOf(x->value, stack, depth + 1);
      if (!r)
        return opaque;
      int64_t n = static_cast<int64_t>(list->size());
      if (minusOneKeeps) // expand: -1 keeps the input's size (aligned right)
        return d - (n - *r) >= 0 ? dimOf(x->value, d - (n - *r), stack, depth + 1) : opaque;
      // view/reshape: -1 is what the other sizes leave; the input's size at
      // d when every other size is the input's own.
      if (*r != n)
        return opaque;
      for (int64_t i = 0; i < n; ++i) {
        if (i == d)
          continue;
        Arg other = (*list)[i];
        Sym s = other.value ? intOf(other.value, stack, depth + 1)
                            : (constantInt(other) ? Sym::of(*constantInt(other)) : opaque);
        if (s != dimOf(x->value, i, stack, depth + 1))
          return opaque;
      }
      return dimOf(x->value, d, stack, depth + 1);
    };

    if (name == "aten::view" || name == "aten::reshape")
      return fromList(1, /*minusOneKeeps=*/false);
    if (name == "aten::expand")
      return fromList(1, /*minusOneKeeps=*/true);
    if (name == "aten::new_ones" || name == "aten::new_zeros" || name == "aten::new_full")
      return fromList(1, false);
    if (name == "aten::ones" || name == "aten::zeros" || name == "aten::full")
      return fromList(0, false);
    if (name == "aten::unsqueeze") {
      std::optional<int64_t> k = argument(op, 1) ? constantInt(*argument(op, 1)) : std::nullopt;
      if (!k || !x || !x->value)
        return opaque;
      if (*k < 0) {
        std::optional<int64_t> r = rankOf(x->value, stack, depth + 1);
        if (!r)
          return opaque;
        *k += *r + 1;
      }
      if (d == *k)
        return Sym::of(1);
      return dimOf(x->value, d < *k ? d : d - 1, stack, depth + 1);
    }
    if (name == "aten::embedding") {
      std::optional<Arg> indices = argument(op, 1);
      if (!indices || !indices->value)
        return opaque;
      std::optional<int64_t> r = rankOf(indices->value, stack, depth + 1);
      if (!r || d >= *r)
        return opaque;
      return dimOf(indices->value, d, stack, depth + 1);
    }
    if (name == "aten::arange" && d == 0) {
      std::optional<Arg> end = argument(op, 0);
      if (end && end->value)
        return intOf(end->value, stack, depth + 1);
      if (std::optional<int64_t> c = end ? constantInt(*end) : std::nullopt)
        return Sym::of(*c);
      return opaque;
    }
    if (x && x->value && preservesShape(op))
      return dimOf(x->value, d, stack, depth + 1);
    return opaque;
  }

  /// The value of i64 `v` as a size symbol.
  Sym intOf(Value v, const CallStack &stack, unsigned depth) {
    Sym opaque = Sym::valueOf(v, stack);
    if (depth > kMaxDepth || ++steps > kMaxSteps)
      return opaque;
    if (std::optional<int64_t> c = constantInt(Arg{v, Attribute()}))
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
    if (op.getName() == "aten::size.int") {
      std::optional<Arg> t = argument(op, 0), d = argument(op, 1);
      std::optional<int64_t> dim = d ? constantInt(*d) : std::nullopt;
      if (t && t->value && dim)
        return dimOf(t->value, *dim, stack, depth + 1);
      return opaque;
    }
    if (op.getName() == "aten::Int.Tensor" || op.getName() == "aten::ScalarImplicit")
      if (std::optional<Arg> t = argument(op, 0); t && t->value)
        return scalarOf(t->value, stack, depth + 1).value_or(opaque);
    return opaque;
  }

  /// The integer a 0-dim tensor holds, as a size symbol: num_to_tensor of
  /// an i64, plus or minus a constant 0 (a trace's `size + 0`).
  std::optional<Sym> scalarOf(Value t, const CallStack &stack, unsigned depth) {
    if (depth > kMaxDepth)
      return std::nullopt;
    if (auto n = t.getDefiningOp<bmt::NumToTensorOp>()) {
      ops.insert(n);
      if (n.getInput().getType().isInteger(64))
        return intOf(n.getInput(), stack, depth + 1);
      return std::nullopt;
    }
    if (std::optional<int64_t> c = constantInt(Arg{t, Attribute()}))
      return Sym::of(*c);
    auto op = t.getDefiningOp<bmt::AtenOp>();
    if (!op)
      return std::nullopt;
    StringRef name = op.getName();
    if (name == "aten::add.Tensor" || name == "aten::sub.Tensor" || name == "aten::add.Scalar" ||
        name == "aten::sub.Scalar") {
      std::optional<Arg> a = argument(op, 0), b = argument(op, 1);
      if (!a || !b || !a->value || constantInt(*b) != 0)
        return std::nullopt;
      ops.insert(op);
      return scalarOf(a->value, stack, depth + 1);
    }
    return std::nullopt;
  }

  // --- tensors ----------------------------------------------------------------

  /// `a` and `b` broadcast together: both moved to the common rank, dims
  /// merged; fails when two sizes are not provably equal.
  LogicalResult broadcast(Term &a, Term &b, SmallVector<Dim, 4> &dims) {
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

  /// A mask of all ones with the sizes of list argument `index` of `op`.
  FailureOr<Term> onesOfList(bmt::AtenOp op, unsigned index, Value result, bool isBool,
                             const CallStack &stack, unsigned depth) {
    std::optional<SmallVector<Arg>> list = listArgument(op, index);
    if (!list)
      return fail("sizes of " + op.getName() + " are not a list");
    Term t;
    t.isBool = isBool;
    for (int64_t d = 0; d < static_cast<int64_t>(list->size()); ++d)
      t.dims.push_back(Dim::ofSym(dimOf(result, d, stack, depth + 1)));
    return t;
  }

  /// The abstract value of tensor `v`.
  FailureOr<Term> eval(Value v, const CallStack &stack, unsigned depth) {
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
    StringRef name = op.getName();
    auto operandTerm = [&](unsigned index) -> FailureOr<Term> {
      std::optional<Arg> a = argument(op, index);
      if (!a || !a->value)
        return fail("operand " + Twine(index) + " of " + name + " is not a tensor");
      return eval(a->value, stack, depth + 1);
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
    auto constantArg = [&](unsigned index) -> std::optional<int64_t> {
      std::optional<Arg> a = argument(op, index);
      if (!a)
        return std::nullopt;
      if (a->value)
        if (Operation *def = a->value.getDefiningOp(); def && isa<bmt::ConstantOp>(def))
          ops.insert(def);
      return constantInt(*a);
    };
    auto normalizeDim = [](int64_t d, unsigned rank) -> std::optional<unsigned> {
      if (d < 0)
        d += rank;
      if (d < 0 || d >= static_cast<int64_t>(rank))
        return std::nullopt;
      return static_cast<unsigned>(d);
    };

    // arange(n), arange(0, n), arange(0, n, 1): the coordinate along dim 0.
    if (name == "aten::arange" || name == "aten::arange.start" ||
        name == "aten::arange.start_step") {
      unsigned endIndex = name == "aten::arange" ? 0 : 1;
      unsigned dtypeIndex = name == "aten::arange" ? 1 : name == "aten::arange.start" ? 2 : 3;
      if (endIndex == 1 && constantArg(0) != 0)
        return fail("an arange that does not start at 0");
      if (name == "aten::arange.start_step" && constantArg(2) != 1)
        return fail("an arange with a step other than 1");
      std::optional<int64_t> dtype = dtypeArgument(op, dtypeIndex);
      if (!dtype || (*dtype != -1 && *dtype != kLong))
        return fail("an arange of another dtype than int64");
      std::optional<Arg> end = argument(op, endIndex);
      if (!end)
        return fail("an arange without an end");
      std::optional<int64_t> endConstant = end->value ? std::nullopt : constantInt(*end);
      if (end->value ? !end->value.getType().isInteger(64) : !endConstant)
        return fail("an arange whose end is not an integer");
      Sym n = end->value ? intOf(end->value, stack, depth + 1) : Sym::of(*endConstant);
      Term t;
      t.kind = Term::Kind::Index;
      t.dims = {Dim{false, n}}; // even when n is 1: the coordinate is the arange's
      return t;
    }

    // The sum of two integer constants (broadcast). Anything else with no
    // constant operand is an offset that is not a constant, as below.
    if (name == "aten::add.Tensor" && !constantArg(0) && !constantArg(1)) {
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
    if (name == "aten::add.Tensor" || name == "aten::add.Scalar" || name == "aten::sub.Tensor" ||
        name == "aten::sub.Scalar") {
      bool sub = name.starts_with("aten::sub");
      std::optional<int64_t> alpha = constantArg(2);
      std::optional<Arg> a = argument(op, 0), b = argument(op, 1);
      if (!alpha || !a || !b)
        return fail("an offset that is not a constant");
      Value indexValue = a->value;
      std::optional<int64_t> c = constantArg(1);
      if (!c && name == "aten::add.Tensor" && b->value && *alpha == 1) {
        c = constantArg(0); // c + index
        indexValue = b->value;
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
    if (name == "aten::mul.Scalar") {
      FailureOr<Term> t = operandTerm(0);
      if (failed(t))
        return failure();
      if (constantArg(1) != 0 || (t->kind != Term::Kind::Index &&
                                  (t->kind != Term::Kind::Constant || t->isBool)))
        return fail("a product on the mask other than an integer times 0");
      return Term::constant(t->dims, 0, /*isBool=*/false);
    }

    // Views and copies that keep every element.
    if (name == "aten::contiguous" || name == "aten::clone" || name == "aten::alias" ||
        name == "aten::detach" || name == "aten::lift_fresh_copy")
      return operandTerm(0);
    if (name == "aten::unsqueeze") {
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
    if (name == "aten::slice.Tensor") { // only x[:] along a dimension
      FailureOr<Term> t = operandTerm(0);
      if (failed(t))
        return failure();
      std::optional<Arg> start = argument(op, 2), end = argument(op, 3);
      bool fromStart = isNone(start) || (start && constantInt(*start) == 0);
      bool toEnd = isNone(end) || (end && constantInt(*end) == kSliceToEnd);
      if (fromStart && toEnd && constantArg(4) == 1)
        return t;
      // x[:, :1]: the first element along `d`, a size-1 dimension. A
      // position along `d` becomes the constant it holds there
      // (find_packed_sequence_indices' `position_ids[:, :1] - 1`).
      std::optional<int64_t> d = constantArg(1);
      std::optional<unsigned> at = d ? normalizeDim(*d, t->rank()) : std::nullopt;
      if (fromStart && end && constantInt(*end) == 1 && constantArg(4) == 1 && at) {
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
    if (name == "aten::diff") {
      FailureOr<Term> x = operandTerm(0);
      if (failed(x))
        return failure();
      std::optional<int64_t> d = constantArg(2);
      std::optional<unsigned> at = d ? normalizeDim(*d, x->rank()) : std::nullopt;
      std::optional<Arg> prepend = argument(op, 3);
      if (constantArg(1) != 1 || !isNone(argument(op, 4)) || !prepend || !prepend->value ||
          x->kind != Term::Kind::Index || !at || x->axis != *at)
        return fail("a diff other than of a position along its dimension with a prepend");
      FailureOr<Term> p = eval(prepend->value, stack, depth + 1);
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
    if (name == "aten::cumsum") {
      FailureOr<Term> x = operandTerm(0);
      if (failed(x))
        return failure();
      std::optional<int64_t> d = constantArg(1);
      std::optional<int64_t> dtype = dtypeArgument(op, 2);
      if (x->kind != Term::Kind::Constant || x->value != 0 || !d ||
          !normalizeDim(*d, x->rank()) || !dtype || (*dtype != -1 && *dtype != kLong))
        return fail("a cumsum of something else than zeros");
      return Term::constant(x->dims, 0, /*isBool=*/false);
    }

    // An integer constant compared with a number, or with another one.
    if (name == "aten::eq.Scalar" || name == "aten::ne.Scalar") {
      FailureOr<Term> a = operandTerm(0);
      if (failed(a))
        return failure();
      std::optional<int64_t> c = constantArg(1);
      if (a->kind != Term::Kind::Constant || a->isBool || !c)
        return fail("an equality of something else than a constant with a number");
      bool equal = a->value == *c;
      return Term::constant(a->dims, equal == (name == "aten::eq.Scalar"), /*isBool=*/true);
    }
    if (name == "aten::eq.Tensor" || name == "aten::ne.Tensor") {
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
      return Term::constant(dims, equal == (name == "aten::eq.Tensor"), /*isBool=*/true);
    }
    if (name == "aten::expand") {
      FailureOr<Term> t = operandTerm(0);
      if (failed(t))
        return failure();
      std::optional<SmallVector<Arg>> sizes = listArgument(op, 1);
      if (!sizes || sizes->size() < t->rank())
        return fail("an expand the pass cannot read");
      unsigned by = sizes->size() - t->rank();
      t->shift(by);
      t->dims.insert(t->dims.begin(), by, Dim{});
      for (unsigned d = 0; d < sizes->size(); ++d) {
        Arg e = (*sizes)[d];
        std::optional<int64_t> c = e.value ? std::nullopt : constantInt(e);
        if (c == -1 && d >= by)
          continue; // keeps the size
        Sym s = e.value ? intOf(e.value, stack, depth + 1)
                        : (c ? Sym::of(*c) : Sym::valueOf(v, stack));
        if (!e.value && (!c || *c < 0))
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
    if (name == "aten::to.dtype" || name == "aten::to.dtype_layout" || name == "aten::to.device") {
      FailureOr<Term> t = operandTerm(0);
      if (failed(t))
        return failure();
      std::optional<int64_t> dtype = dtypeArgument(op, name == "aten::to.device" ? 2 : 1);
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
    if (name == "aten::le.Tensor" || name == "aten::lt.Tensor" || name == "aten::ge.Tensor" ||
        name == "aten::gt.Tensor") {
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
      if (name == "aten::le.Tensor" || name == "aten::lt.Tensor")
        bound = {i, j, ob - oa - (name == "aten::lt.Tensor")}; // x_i - x_j <= ob - oa
      else
        bound = {j, i, oa - ob - (name == "aten::gt.Tensor")}; // x_j - x_i <= oa - ob
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
    if (name == "aten::ge.Scalar" || name == "aten::gt.Scalar") {
      FailureOr<Term> a = operandTerm(0);
      if (failed(a))
        return failure();
      std::optional<int64_t> c = constantArg(1);
      if (a->kind != Term::Kind::Index || !c)
        return fail("a comparison of something else than a position with a constant");
      // x + offset >= c (> c) for every x >= 0.
      if (a->offset < *c + (name == "aten::gt.Scalar"))
        return fail("a position compared with a constant (a window or an offset)");
      Term t;
      t.isBool = true;
      t.dims = a->dims;
      return t;
    }

    // Conjunctions.
    if (name == "aten::__and__.Tensor" || name == "aten::logical_and") {
      FailureOr<std::pair<Term, Term>> ab = operandTerms();
      if (failed(ab))
        return failure();
      Term *a = &ab->first, *b = &ab->second;
      if (a->kind == Term::Kind::Constant || b->kind == Term::Kind::Constant)
        return fail("a conjunction with a constant that is not true (zeros, or false)");
      if (a->kind != Term::Kind::Mask || b->kind != Term::Kind::Mask)
        return fail("a conjunction with a position");
      // `&` of two booleans is their conjunction; of numbers it is bitwise.
      if (name == "aten::__and__.Tensor" && (!a->isBool || !b->isBool))
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
    if (name == "aten::new_ones") {
      std::optional<int64_t> dtype = dtypeArgument(op, 2);
      return onesOfList(op, 1, v, dtype == kBool, stack, depth);
    }
    if (name == "aten::ones") {
      std::optional<int64_t> dtype = dtypeArgument(op, 1);
      return onesOfList(op, 0, v, dtype == kBool, stack, depth);
    }
    if (name == "aten::full" || name == "aten::new_full") {
      unsigned sizes = name == "aten::full" ? 0 : 1;
      std::optional<Arg> fill = argument(op, sizes + 1);
      bool nonzero = fill && ((!fill->value && isa_and_nonnull<BoolAttr>(fill->attr) &&
                               cast<BoolAttr>(fill->attr).getValue()) ||
                              (constantInt(*fill) && *constantInt(*fill) != 0));
      if (!nonzero)
        return fail("a fill the pass does not know to be nonzero");
      std::optional<int64_t> dtype = dtypeArgument(op, sizes + 2);
      return onesOfList(op, sizes, v, dtype == kBool, stack, depth);
    }
    if (name == "aten::view" || name == "aten::reshape") { // of ones: still ones
      FailureOr<Term> t = operandTerm(0);
      if (failed(t))
        return failure();
      if (t->kind != Term::Kind::Mask || !t->bounds.empty())
        return fail("a view of a mask");
      return onesOfList(op, 1, v, t->isBool, stack, depth);
    }

    // Indexing a tensor of ones with positions: ones of the positions' shape.
    if (name == "aten::index.Tensor") {
      FailureOr<Term> source = operandTerm(0);
      if (failed(source))
        return failure();
      if ((source->kind != Term::Kind::Mask || !source->bounds.empty()) &&
          source->kind != Term::Kind::Constant)
        return fail("indexing a tensor that is not all ones or a constant");
      std::optional<SmallVector<Arg>> indices = listArgument(op, 1);
      if (!indices || indices->empty() || indices->size() > source->rank())
        return fail("an index the pass cannot read");
      Term t; // ones, or the source's constant: every element is one of the source's
      t.kind = source->kind;
      t.value = source->value;
      t.isBool = source->isBool;
      for (const Arg &index : *indices) {
        if (!index.value)
          return fail("an index with None");
        FailureOr<Term> i = eval(index.value, stack, depth + 1);
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

  /// Whether something may write `v` in place: an in-place op on it or on
  /// a view of it, here or in a function it is passed to or returned from.
  bool mayBeWritten(Value v) {
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

  ModuleOp module;
  const CallSites &callers;
  bool assumeUnpadded;
  unsigned steps = 0;
  std::string why;
  llvm::SetVector<Operation *> ops;
  llvm::SetVector<Value> values;
};

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

/// Ops the clean-up may erase once their results are unused: computations
/// without effects other than their results.
bool erasable(Operation *op) {
  if (isa<bmt::ConstantOp, bmt::NumToTensorOp>(op))
    return true;
  auto aten = dyn_cast<bmt::AtenOp>(op);
  if (!aten || isInPlace(aten))
    return false;
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(aten.getName());
  if (!info)
    return false;
  switch (info->kind) {
  case bmt::AtenOpKind::Elementwise:
  case bmt::AtenOpKind::View:
  case bmt::AtenOpKind::Copy:
  case bmt::AtenOpKind::Factory:
  case bmt::AtenOpKind::Indexing:
  case bmt::AtenOpKind::Metadata:
  case bmt::AtenOpKind::Reduction: // cumsum, diff of the packed-sequence ids
    return true;
  default:
    return false;
  }
}

struct CausalAttentionPass : bmt::impl::CausalAttentionBase<CausalAttentionPass> {
  using CausalAttentionBase::CausalAttentionBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    CallSites callers;
    module.walk([&](func::CallOp call) {
      if (auto callee = module.lookupSymbol<func::FuncOp>(call.getCallee()))
        callers[callee].push_back(call);
    });

    // Prove every masked call first, then rewrite: the proofs read the IR
    // as the program wrote it.
    struct Candidate {
      bmt::AtenOp op;
      bool assumed;
    };
    SmallVector<Candidate> rewrites;
    SmallVector<std::pair<std::string, int64_t>> leftAlone; // reason, count (first seen first)
    auto leaveAlone = [&](const std::string &reason) {
      for (auto &[r, count] : leftAlone)
        if (r == reason) {
          ++count;
          return;
        }
      leftAlone.push_back({reason, 1});
    };
    llvm::SetVector<Operation *> maskOps;
    llvm::SetVector<Value> maskValues;
    int64_t masked = 0;
    module.walk([&](bmt::AtenOp op) {
      if (op.getName() != "aten::scaled_dot_product_attention")
        return;
      std::optional<Arg> mask = argument(op, 3);
      if (!mask || isNone(mask))
        return; // no mask (or already is_causal)
      ++masked;
      std::optional<Arg> isCausal = argument(op, 5);
      if (!mask->value || !isCausal || isCausal->value || !isa<BoolAttr>(isCausal->attr) ||
          cast<BoolAttr>(isCausal->attr).getValue()) {
        leaveAlone("is_causal is not a constant false");
        return;
      }
      // Without the assumption first: it is recorded only where needed.
      Prover sound(module, callers, /*assumeUnpadded=*/false);
      if (succeeded(sound.prove(mask->value))) {
        rewrites.push_back({op, false});
        maskOps.insert(sound.visitedOps().begin(), sound.visitedOps().end());
        maskValues.insert(sound.visitedValues().begin(), sound.visitedValues().end());
        return;
      }
      if (assumeUnpadded) {
        Prover assuming(module, callers, /*assumeUnpadded=*/true);
        if (succeeded(assuming.prove(mask->value))) {
          rewrites.push_back({op, true});
          maskOps.insert(assuming.visitedOps().begin(), assuming.visitedOps().end());
          maskValues.insert(assuming.visitedValues().begin(), assuming.visitedValues().end());
          return;
        }
        leaveAlone(assuming.reason());
        return;
      }
      leaveAlone(sound.reason());
    });

    OpBuilder builder(module.getContext());
    SmallVector<Value> dropped;
    SmallVector<StringRef> functions;
    bool assumed = false;
    for (Candidate &c : rewrites) {
      dropped.push_back(argument(c.op, 3)->value);
      StringRef f = c.op->getParentOfType<func::FuncOp>().getSymName();
      if (functions.empty() || functions.back() != f)
        functions.push_back(f);
      assumed |= c.assumed;
      makeCausal(builder, c.op);
    }
    auto [erasedOps, erasedArgs] = removeDeadMask(module, callers, dropped, maskOps, maskValues);
    if (assumed)
      recordAssumption(module);
    emitSummary(module, masked, rewrites.size(), functions, assumed, erasedOps, erasedArgs,
                leftAlone);
    foldConstantLookups(module, callers);
  }

  static void emitSummary(ModuleOp module, int64_t masked, int64_t n,
                          ArrayRef<StringRef> functions, bool assumed, int64_t erasedOps,
                          int64_t erasedArgs,
                          ArrayRef<std::pair<std::string, int64_t>> leftAlone) {

    InFlightDiagnostic remark = emitRemark(module.getLoc());
    if (masked == 0) {
      remark << "bmt-causal-attention: no aten::scaled_dot_product_attention with an attn_mask";
      return;
    }
    remark << "bmt-causal-attention: " << n << " of " << masked
           << " aten::scaled_dot_product_attention with an attn_mask made causal "
              "(attn_mask=None, is_causal=True)";
    if (n > 0) {
      remark << " in " << functions.size() << " function" << (functions.size() == 1 ? "" : "s")
             << " (" << functions.front();
      if (functions.size() > 1)
        remark << " ... " << functions.back();
      remark << ")";
      if (assumed)
        remark << ", assuming " << kAssumption;
      remark << "; mask computation removed: " << erasedOps << " op" << (erasedOps == 1 ? "" : "s")
             << ", " << erasedArgs << " function argument" << (erasedArgs == 1 ? "" : "s");
    }
    if (!leftAlone.empty()) {
      remark << "; left alone:";
      bool first = true;
      for (auto &[reason, count] : leftAlone) {
        remark << (first ? " " : "; ") << count << " (" << reason << ")";
        first = false;
      }
    }
  }

  /// A model traced or exported without attention_mask computes
  /// transformers' packed-sequence ids from its position_ids
  /// (find_packed_sequence_indices: cumsum(diff(position_ids) != 1), under
  /// tracing always) and ANDs `ids[b, q] == ids[b, kv]` into the mask.
  /// With position_ids an arange the ids are zeros, but a trace at batch 1
  /// keeps them [1, seq] (transformers expands position_ids to the batch
  /// only when the sizes differ) and the lookup fails at any other batch.
  /// Each lookup `source[i0, i1, ...]` of a source proven to be the
  /// constant c everywhere becomes `i0 * 0 + i1 * 0 + ... (+ c)`: c at
  /// every index, of the indices' broadcast shape, for every batch; the
  /// source's computation, now unread, is removed. (A call the mask proof
  /// already made causal has lost its lookups with its mask.)
  void foldConstantLookups(ModuleOp module, CallSites &callers) {
    int64_t folded = 0, erasedOps = 0, erasedArgs = 0;
    SmallVector<StringRef> functions;
    OpBuilder builder(module.getContext());
    // One fold at a time: its clean-up may erase other lookups.
    DenseSet<Operation *> rejected; // live lookups that are not constant
    while (true) {
      bmt::AtenOp op;
      std::optional<int64_t> c;
      std::unique_ptr<Prover> prover;
      module.walk([&](bmt::AtenOp candidate) {
        if (candidate.getName() != "aten::index.Tensor" || rejected.contains(candidate))
          return WalkResult::advance();
        auto p = std::make_unique<Prover>(module, callers, /*assumeUnpadded=*/false);
        c = p->constantLookup(candidate);
        if (!c) {
          rejected.insert(candidate);
          return WalkResult::advance();
        }
        op = candidate;
        prover = std::move(p);
        return WalkResult::interrupt();
      });
      if (!op)
        break;
      builder.setInsertionPoint(op);
      MLIRContext *ctx = builder.getContext();
      Attribute operand = bmt::OperandAttr::get(ctx);
      Type tensor = op->getResult(0).getType();
      auto aten = [&](StringRef name, ArrayRef<Attribute> args, ValueRange operands) -> Value {
        return bmt::AtenOp::create(builder, op.getLoc(), TypeRange{tensor},
                                   builder.getStringAttr(name), builder.getArrayAttr(args),
                                   operands)
            ->getResult(0);
      };
      Value sum;
      SmallVector<Arg> indices = listArgument(op, 1).value_or(SmallVector<Arg>{});
      for (const Arg &i : indices) {
        Value zero = aten("aten::mul.Scalar", {operand, builder.getI64IntegerAttr(0)}, {i.value});
        sum = sum ? aten("aten::add.Tensor", {operand, operand, builder.getI64IntegerAttr(1)},
                         {sum, zero})
                  : zero;
      }
      if (*c != 0)
        sum = aten("aten::add.Scalar",
                   {operand, builder.getI64IntegerAttr(*c), builder.getI64IntegerAttr(1)}, {sum});
      Value source = argument(op, 0)->value;
      StringRef f = op->getParentOfType<func::FuncOp>().getSymName();
      if (functions.empty() || functions.back() != f)
        functions.push_back(f);
      op->getResult(0).replaceAllUsesWith(sum);
      op->erase();
      ++folded;
      ++erasedOps;
      auto [ops, args] = removeDeadMask(module, callers, {source}, prover->visitedOps(),
                                        prover->visitedValues());
      erasedOps += ops;
      erasedArgs += args;
    }
    if (folded == 0)
      return;
    InFlightDiagnostic remark = emitRemark(module.getLoc());
    remark << "bmt-causal-attention: " << folded << " lookup" << (folded == 1 ? "" : "s")
           << " of a constant tensor (packed-sequence ids of position_ids that are an arange: "
              "one sequence per row) folded in "
           << functions.size() << " function" << (functions.size() == 1 ? "" : "s") << " ("
           << functions.front();
    if (functions.size() > 1)
      remark << " ... " << functions.back();
    remark << "); removed: " << erasedOps << " op" << (erasedOps == 1 ? "" : "s") << ", "
           << erasedArgs << " function argument" << (erasedArgs == 1 ? "" : "s");
  }

  /// The call with attn_mask=None and is_causal=True, every other argument
  /// (dropout_p, scale, enable_gqa) as it was.
  static void makeCausal(OpBuilder &builder, bmt::AtenOp sdpa) {
    builder.setInsertionPoint(sdpa);
    SmallVector<Attribute> args(sdpa.getArgs().begin(), sdpa.getArgs().end());
    unsigned maskOperand = firstOperandOf(sdpa, 3);
    args[3] = bmt::NoneAttr::get(builder.getContext());
    args[5] = builder.getBoolAttr(true);
    SmallVector<Value> operands(sdpa->getOperands());
    operands.erase(operands.begin() + maskOperand);
    auto causal = bmt::AtenOp::create(builder, sdpa.getLoc(), sdpa->getResultTypes(),
                                      sdpa.getNameAttr(), builder.getArrayAttr(args), operands);
    causal->setDiscardableAttrs(sdpa->getDiscardableAttrDictionary());
    sdpa->replaceAllUsesWith(causal);
    sdpa->erase();
  }

  /// Erases what computed the dropped masks once nothing reads it: the ops
  /// the proofs went through, and the arguments of private functions that
  /// carried a mask (with the calls' operands). Returns the counts.
  static std::pair<int64_t, int64_t> removeDeadMask(ModuleOp module, CallSites &callers,
                                                    ArrayRef<Value> dropped,
                                                    const llvm::SetVector<Operation *> &maskOps,
                                                    const llvm::SetVector<Value> &maskValues) {
    int64_t ops = 0, args = 0;
    SmallVector<Value> work(dropped.begin(), dropped.end());
    DenseSet<Value> gone; // erased: never look at them again
    while (!work.empty()) {
      Value v = work.pop_back_val();
      if (gone.contains(v) || !v.use_empty())
        continue;
      if (auto arg = dyn_cast<BlockArgument>(v)) {
        auto f = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
        if (!f || !f.isPrivate() || !maskValues.contains(v) ||
            arg.getOwner() != &f.getBody().front())
          continue;
        // Every use of the function must be one of its calls.
        auto &calls = callers[f];
        std::optional<SymbolTable::UseRange> uses = SymbolTable::getSymbolUses(f, module);
        if (!uses || std::distance(uses->begin(), uses->end()) !=
                         static_cast<std::ptrdiff_t>(calls.size()))
          continue;
        unsigned index = arg.getArgNumber();
        for (func::CallOp call : calls) {
          Value operand = call.getOperand(index);
          call->eraseOperand(index);
          work.push_back(operand);
        }
        gone.insert(v);
        if (failed(f.eraseArgument(index)))
          return {ops, args};
        ++args;
        continue;
      }
      Operation *op = v.getDefiningOp();
      if (!op || !maskOps.contains(op) || !erasable(op) || !op->use_empty())
        continue;
      work.append(op->operand_begin(), op->operand_end());
      gone.insert(op->result_begin(), op->result_end());
      op->erase();
      ++ops;
    }
    return {ops, args};
  }

  static void recordAssumption(ModuleOp module) {
    Builder b(module.getContext());
    SmallVector<Attribute> assumptions;
    if (auto existing = module->getAttrOfType<ArrayAttr>("bmt.assumptions"))
      assumptions.assign(existing.begin(), existing.end());
    if (!llvm::is_contained(assumptions, b.getStringAttr(kAssumption)))
      assumptions.push_back(b.getStringAttr(kAssumption));
    module->setAttr("bmt.assumptions", b.getArrayAttr(assumptions));
  }
};

} // namespace
