//===- CausalMaskProver.h - proving an attention mask causal ---*- C++ -*-===//
//
// The analysis behind bmt-causal-attention (passes/CausalAttention.cpp): it
// evaluates a mask's computation symbolically: an integer tensor as "the
// coordinate along one dimension plus a constant", a boolean tensor as a
// conjunction of difference bounds x_a - x_b <= c between coordinates,
// sizes as symbols followed through views, factories and calls.
// Prover::prove succeeds when a mask is exactly kv <= q over query and key
// lengths that are provably equal; Prover::constantLookup finds lookups of
// a tensor proven constant. CausalMaskProver.cpp holds the entry points,
// call boundaries, sizes and in-place writes; CausalMaskTensors.cpp the
// abstract value of each tensor op.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_CAUSALMASKPROVER_H
#define BMT_PASSES_CAUSALMASKPROVER_H

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/BmtDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

namespace bmt::causal_mask {

using bmt::AtenArg;
using llvm::ArrayRef;
using llvm::DenseMap;
using llvm::SmallVector;
using llvm::StringRef;
using llvm::Twine;
using mlir::FailureOr;
using mlir::LogicalResult;
using mlir::ModuleOp;
using mlir::Operation;
using mlir::RankedTensorType;
using mlir::Value;
namespace func = mlir::func;

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

/// Schema argument `key` (an index or a name) of `op`; none if there is no
/// such argument or it is a list.
template <typename Key> std::optional<AtenArg> argument(bmt::AtenOp op, Key key) {
  std::optional<AtenArg> arg = bmt::getAtenArg(op, key);
  if (!arg || arg->isList())
    return std::nullopt;
  return arg;
}

/// The elements of list argument `index` of `op` (a flat list).
std::optional<SmallVector<AtenArg>> listArgument(bmt::AtenOp op, unsigned index);

/// Whether `arg` is there and is None.
bool isNone(const std::optional<AtenArg> &arg);

/// The `dtype` argument of a conversion or factory: the c10 code, -1 for
/// None (keep / default), none when not a constant.
std::optional<int64_t> dtypeArgument(bmt::AtenOp op);

/// Whether `op` writes one of its inputs (`add_`, `masked_fill_`).
bool isInPlace(bmt::AtenOp op);

/// Whether `op`'s results may share memory with its operands (views,
/// conversions that return their input unchanged, in-place ops), or are a
/// copy of them (clone, cat: followed too, to stay on the safe side).
bool mayAlias(bmt::AtenOp op);

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
  LogicalResult prove(Value mask);

  /// For `source[i0, i1, ...]` (aten::index.Tensor), the int64 constant
  /// every element of `source` holds, when a position indexes each of its
  /// dimensions: then the lookup is that constant at every index, whatever
  /// the source's shape (the packed-sequence ids of a model traced without
  /// attention_mask).
  std::optional<int64_t> constantLookup(bmt::AtenOp index);

  /// The first reason the last proof failed.
  const std::string &reason() const { return why; }
  /// The ops and values a successful proof went through.
  const llvm::SetVector<Operation *> &visitedOps() const { return ops; }
  const llvm::SetVector<Value> &visitedValues() const { return values; }

private:
  LogicalResult fail(const Twine &message) {
    if (why.empty())
      why = message.str();
    return mlir::failure();
  }

  /// Where `v` comes from across a call boundary: for an argument of a
  /// private function, the operand of the call on `stack`, or of every call
  /// site when the stack is empty; for the result of a call, the callee's
  /// returned value (the call pushed). Empty for anything else.
  SmallVector<std::pair<Value, CallStack>> through(Value v, const CallStack &stack);

  /// The name (`bmt.name`) of `v` when it is an input of the program: an
  /// argument of a public function (`@forward`) with no call site.
  std::optional<StringRef> programInput(Value v);

  /// The input named `name` of the function that has program input `v`.
  Value sibling(Value v, StringRef name);

  /// Under assume-unpadded, the inputs input_ids and attention_mask are
  /// [batch, seq] of one shape (bmt-run feeds them so; --dump checks it).
  bool assumedShape(StringRef name) {
    return assumeUnpadded && (name == "input_ids" || name == "attention_mask");
  }

  // --- sizes (CausalMaskProver.cpp) -------------------------------------------

  /// The type of the parameter or buffer `t` reads, if it is a bmt.get_global.
  RankedTensorType globalType(Value t);

  /// For a binary elementwise op with a 0-dim operand (`x * scale`, Gemma's
  /// scaled embedding): the other operand, whose shape the result has.
  Value shapeOperand(bmt::AtenOp op, const CallStack &stack, unsigned depth);

  /// The rank of tensor `t`, where the program tells it.
  std::optional<int64_t> rankOf(Value t, const CallStack &stack, unsigned depth);

  /// Ops whose result has the shape of their first operand.
  static bool preservesShape(bmt::AtenOp op);

  /// The size of dimension `d` (d >= 0, or from the end when negative) of `t`.
  Sym dimOf(Value t, int64_t d, const CallStack &stack, unsigned depth);

  /// The value of i64 `v` as a size symbol.
  Sym intOf(Value v, const CallStack &stack, unsigned depth);

  /// The integer a 0-dim tensor holds, as a size symbol: num_to_tensor of
  /// an i64, plus or minus a constant 0 (a trace's `size + 0`).
  std::optional<Sym> scalarOf(Value t, const CallStack &stack, unsigned depth);

  // --- tensors (CausalMaskTensors.cpp) ----------------------------------------

  /// `a` and `b` broadcast together: both moved to the common rank, dims
  /// merged; fails when two sizes are not provably equal.
  LogicalResult broadcast(Term &a, Term &b, SmallVector<Dim, 4> &dims);

  /// A mask of all ones with the sizes of list argument `index` of `op`.
  FailureOr<Term> onesOfList(bmt::AtenOp op, unsigned index, Value result, bool isBool,
                             const CallStack &stack, unsigned depth);

  /// The abstract value of tensor `v`.
  FailureOr<Term> eval(Value v, const CallStack &stack, unsigned depth);

  // --- writes (CausalMaskProver.cpp) ------------------------------------------

  /// Whether something may write `v` in place: an in-place op on it or on
  /// a view of it, here or in a function it is passed to or returned from.
  bool mayBeWritten(Value v);

  ModuleOp module;
  const CallSites &callers;
  bool assumeUnpadded;
  unsigned steps = 0;
  std::string why;
  llvm::SetVector<Operation *> ops;
  llvm::SetVector<Value> values;
};

} // namespace bmt::causal_mask

#endif // BMT_PASSES_CAUSALMASKPROVER_H
