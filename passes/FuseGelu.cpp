//===- FuseGelu.cpp - the bmt-fuse-gelu pass ------------------------------===//
//
// Finds GELU activations written out as elementwise ATen ops (Hugging Face's
// NewGELUActivation "gelu_new" of GPT-2, GPT-J, Phi, CodeGen; FastGELU;
// BLOOM's gelu; the erf form of GELUActivation(use_gelu_python=True)) and
// replaces each by one `aten::gelu` call. Rather than matching one operand
// order and association, the pass evaluates the tree of single-use
// arithmetic ops under a candidate root symbolically, as a polynomial in the
// input x and one tanh or erf of a polynomial in x, and compares the
// coefficients with GELU's. See passes/Passes.td for the contract.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/MathExtras.h"

#include <cmath>
#include <map>
#include <optional>
#include <utility>

namespace bmt {
#define GEN_PASS_DEF_FUSEGELU
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;
using bmt::AtenOpId;

namespace {

/// Relative tolerance of a coefficient: the traces print f64 constants with
/// 17 digits, but models write sqrt(2/pi) as 0.7978845608 (FastGELU) or
/// 0.79788456 (BLOOM), relative differences of 4e-12 and 1e-9.
constexpr double kTolerance = 1e-6;
/// Bounds that keep a match cheap: ops in one pattern, powers of x.
constexpr unsigned kMaxOps = 24;
constexpr unsigned kMaxDegree = 8;

/// A polynomial in the pattern's input x and its one transcendental atom t
/// (tanh or erf of a polynomial in x): the coefficient of x^i t^j at (i, j).
using Poly = std::map<std::pair<unsigned, unsigned>, double>;

Poly constantPoly(double c) { return Poly{{{0, 0}, c}}; }

Poly add(const Poly &a, const Poly &b, double alpha) {
  Poly r = a;
  for (auto &[key, c] : b)
    r[key] += alpha * c;
  return r;
}

std::optional<Poly> mul(const Poly &a, const Poly &b) {
  Poly r;
  for (auto &[ka, ca] : a)
    for (auto &[kb, cb] : b) {
      std::pair<unsigned, unsigned> key{ka.first + kb.first, ka.second + kb.second};
      if (key.first > kMaxDegree || key.second > 2)
        return std::nullopt;
      r[key] += ca * cb;
    }
  return r;
}

/// Whether a and b have the same coefficients, each within kTolerance
/// (relative); a missing term is a zero coefficient.
bool samePoly(const Poly &a, const Poly &b) {
  auto close = [](double x, double y) {
    return std::fabs(x - y) <= kTolerance * std::max(std::fabs(x), std::fabs(y));
  };
  for (auto &[key, c] : a) {
    auto it = b.find(key);
    if (!close(c, it == b.end() ? 0.0 : it->second))
      return false;
  }
  for (auto &[key, c] : b)
    if (!a.count(key) && !close(0.0, c))
      return false;
  return true;
}

/// The arithmetic ops the evaluation goes through.
enum class Arith { Add, Sub, Rsub, Mul, Div, Neg, Pow, Tanh, Erf, None };

Arith arithOf(bmt::AtenOp op) {
  std::optional<AtenOpId> id = bmt::atenOpId(op);
  if (!id)
    return Arith::None;
  switch (*id) {
  case AtenOpId::add_Tensor:
  case AtenOpId::add_Scalar: return Arith::Add;
  case AtenOpId::sub_Tensor:
  case AtenOpId::sub_Scalar: return Arith::Sub;
  case AtenOpId::rsub_Tensor:
  case AtenOpId::rsub_Scalar: return Arith::Rsub;
  case AtenOpId::mul_Tensor:
  case AtenOpId::mul_Scalar: return Arith::Mul;
  case AtenOpId::div_Tensor:
  case AtenOpId::div_Scalar: return Arith::Div;
  case AtenOpId::neg: return Arith::Neg;
  case AtenOpId::pow_Tensor_Scalar:
  case AtenOpId::pow_Tensor_Tensor: return Arith::Pow;
  case AtenOpId::tanh: return Arith::Tanh;
  case AtenOpId::erf: return Arith::Erf;
  default: return Arith::None;
  }
}

/// One attempt to read the tree under `root` as GELU.
class GeluMatcher {
public:
  explicit GeluMatcher(bmt::AtenOp root) : root(root) {}

  /// "tanh" or "none" (aten::gelu's `approximate`) when the tree under the
  /// root computes 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) or
  /// 0.5 x (1 + erf(x / sqrt(2))).
  std::optional<StringRef> match() {
    std::optional<Poly> p = eval(root.getResult(0), /*insideAtom=*/false);
    if (!p || !x || !atom || !isa<bmt::TensorType>(x.getType()))
      return std::nullopt;
    if (!samePoly(*p, Poly{{{1, 0}, 0.5}, {{1, 1}, 0.5}}))
      return std::nullopt;
    if (atomKind == Arith::Tanh) {
      double k = std::sqrt(2.0 / llvm::numbers::pi);
      if (samePoly(atomArg, Poly{{{1, 0}, k}, {{3, 0}, k * 0.044715}}))
        return StringRef("tanh");
    } else if (samePoly(atomArg, Poly{{{1, 0}, llvm::numbers::inv_sqrt2}})) {
      return StringRef("none");
    }
    return std::nullopt;
  }

  Value input() const { return x; }
  /// The pattern's ops, each after the ops it reads (the root last).
  ArrayRef<Operation *> ops() const { return interior.getArrayRef(); }
  /// The constants the pattern's ops read (erased when they become dead).
  ArrayRef<Operation *> constants() const { return constantOps.getArrayRef(); }

private:
  /// The value as a polynomial, or none when it is not one in a single x.
  std::optional<Poly> eval(Value v, bool insideAtom) {
    if (std::optional<double> c = bmt::getConstantNumber(v)) {
      constantOps.insert(v.getDefiningOp());
      return constantPoly(*c);
    }
    auto op = v.getDefiningOp<bmt::AtenOp>();
    Arith kind = op ? arithOf(op) : Arith::None;
    // An op of the pattern: arithmetic, in the root's block, and read only
    // by the pattern (the root may have any uses). Anything else is a leaf,
    // and every leaf must be the same value x.
    bool inside = kind != Arith::None && op->getNumResults() == 1 &&
                  op->getBlock() == root->getBlock() &&
                  (op == root.getOperation() || v.hasOneUse());
    if (!inside) {
      if (x && x != v)
        return std::nullopt;
      x = v;
      return Poly{{{1, 0}, 1.0}};
    }
    if (++visited > kMaxOps)
      return std::nullopt; // bounds the depth too: the ops are counted on the way down

    auto operand = [&](unsigned index, bool intoAtom = false) -> std::optional<Poly> {
      std::optional<bmt::AtenArg> arg = bmt::getAtenArg(op, index);
      if (!arg || arg->isList())
        return std::nullopt;
      if (arg->isOperand())
        return eval(arg->getOperand(), insideAtom || intoAtom);
      if (std::optional<double> c = arg->getNumber())
        return constantPoly(*c);
      return std::nullopt;
    };
    auto scalar = [&](unsigned index) -> std::optional<double> {
      std::optional<bmt::AtenArg> arg = bmt::getAtenArg(op, index);
      if (!arg)
        return std::nullopt;
      std::optional<double> c = arg->getNumber();
      if (c && arg->isOperand())
        constantOps.insert(arg->getOperand().getDefiningOp());
      return c;
    };

    std::optional<Poly> result;
    switch (kind) {
    case Arith::Add:
    case Arith::Sub:
    case Arith::Rsub: {
      std::optional<Poly> a = operand(0), b = operand(1);
      std::optional<double> alpha = scalar(2);
      if (!a || !b || !alpha)
        return std::nullopt;
      if (kind == Arith::Add)
        result = add(*a, *b, *alpha);
      else if (kind == Arith::Sub)
        result = add(*a, *b, -*alpha);
      else
        result = add(*b, *a, -*alpha);
      break;
    }
    case Arith::Mul: {
      std::optional<Poly> a = operand(0), b = operand(1);
      if (!a || !b)
        return std::nullopt;
      result = mul(*a, *b);
      break;
    }
    case Arith::Div: {
      std::optional<Poly> a = operand(0);
      std::optional<double> d = scalar(1);
      if (!a || !d || *d == 0.0)
        return std::nullopt;
      result = add(Poly{}, *a, 1.0 / *d);
      break;
    }
    case Arith::Neg: {
      std::optional<Poly> a = operand(0);
      if (!a)
        return std::nullopt;
      result = add(Poly{}, *a, -1.0);
      break;
    }
    case Arith::Pow: {
      std::optional<Poly> a = operand(0);
      std::optional<double> e = scalar(1);
      if (!a || !e || *e < 1 || *e > kMaxDegree || *e != std::floor(*e))
        return std::nullopt;
      result = a;
      for (int i = 1; i < static_cast<int>(*e) && result; ++i)
        result = mul(*result, *a);
      break;
    }
    case Arith::Tanh:
    case Arith::Erf: {
      if (insideAtom || atom)
        return std::nullopt; // one atom, not nested
      std::optional<Poly> a = operand(0, /*intoAtom=*/true);
      if (!a || atom)
        return std::nullopt;
      atom = op;
      atomKind = kind;
      atomArg = *a;
      result = Poly{{{0, 1}, 1.0}};
      break;
    }
    case Arith::None:
      return std::nullopt;
    }
    if (!result)
      return std::nullopt;
    interior.insert(op);
    return result;
  }

  bmt::AtenOp root;
  Value x;
  bmt::AtenOp atom;
  Arith atomKind = Arith::None;
  Poly atomArg;
  unsigned visited = 0;
  llvm::SetVector<Operation *> interior;
  llvm::SetVector<Operation *> constantOps;
};

struct FuseGeluPass : bmt::impl::FuseGeluBase<FuseGeluPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    OpBuilder builder(module.getContext());
    int64_t tanhCount = 0, erfCount = 0;
    SmallVector<StringRef> functions;
    for (func::FuncOp f : module.getOps<func::FuncOp>()) {
      int64_t before = tanhCount + erfCount;
      for (Block &block : f.getBody()) {
        // Outermost roots first: walk each block backwards, skipping the ops
        // an earlier match has taken.
        SmallVector<bmt::AtenOp> candidates;
        for (Operation &op : llvm::reverse(block))
          if (auto aten = dyn_cast<bmt::AtenOp>(op);
              aten && arithOf(aten) != Arith::None && aten->getNumResults() == 1 &&
              isa<bmt::TensorType>(aten.getResult(0).getType()))
            candidates.push_back(aten);
        llvm::DenseSet<Operation *> taken;
        for (bmt::AtenOp root : candidates) {
          if (taken.contains(root))
            continue;
          GeluMatcher matcher(root);
          std::optional<StringRef> approximate = matcher.match();
          if (!approximate)
            continue;
          replace(builder, root, matcher, *approximate);
          for (Operation *op : matcher.ops())
            taken.insert(op);
          ++(*approximate == "tanh" ? tanhCount : erfCount);
          for (Operation *op : llvm::reverse(matcher.ops()))
            op->erase();
          for (Operation *c : matcher.constants())
            if (c->use_empty())
              c->erase();
        }
      }
      if (tanhCount + erfCount > before)
        functions.push_back(f.getSymName());
    }

    InFlightDiagnostic remark = emitRemark(module.getLoc());
    int64_t total = tanhCount + erfCount;
    if (total == 0) {
      remark << "bmt-fuse-gelu: no GELU written out as elementwise ops";
      return;
    }
    remark << "bmt-fuse-gelu: " << total << " GELU" << (total == 1 ? "" : "s")
           << " fused into aten::gelu (" << tanhCount << " approximate=\"tanh\", " << erfCount
           << " exact) in " << functions.size() << " function"
           << (functions.size() == 1 ? "" : "s") << " (" << functions.front();
    if (functions.size() > 1)
      remark << " ... " << functions.back();
    remark << ")";
  }

  /// Puts `aten::gelu(x, approximate)` in the root's place, as the importers
  /// write it: every schema argument in `args`, x as the operand.
  void replace(OpBuilder &builder, bmt::AtenOp root, const GeluMatcher &matcher,
               StringRef approximate) {
    MLIRContext *context = root.getContext();
    builder.setInsertionPoint(root);
    auto gelu = bmt::AtenOp::create(
        builder, root.getLoc(), TypeRange{root.getResult(0).getType()},
        builder.getStringAttr(bmt::atenOpName(AtenOpId::gelu)),
        builder.getArrayAttr({bmt::OperandAttr::get(context), builder.getStringAttr(approximate)}),
        ValueRange{matcher.input()});
    root.getResult(0).replaceAllUsesWith(gelu.getResult(0));
  }
};

} // namespace
