//===- Region.cpp - fused regions: the graph, read from a plan body -------===//
//
// The expression graph, a region built from a bmt.fused body (its
// derivative is Derivative.cpp's) and its dtypes; the ATen evaluation is
// Evaluate.cpp's.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/fusion/Region.h"
#include "fusion/Derivative.h"

#include "bmt/Dialect/FusibleOps.h"
#include "bmt/Plan/ScalarTypeCodes.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

namespace bmt::fusion {

namespace {

/// The generator's kind of each op of FusibleOps.def, by overload name.
const std::map<std::string, FusibleKind> &fusibleKinds() {
  static const std::map<std::string, FusibleKind> kinds = {
#define BMT_FUSIBLE_OP(ID, KIND)                                                                   \
  {kAtenOpNames[static_cast<unsigned>(AtenOpId::ID)], FusibleKind::KIND},
#include "bmt/Dialect/FusibleOps.def"
  };
  return kinds;
}

// The dtype codes programs carry (the compiler's names for them) are c10's.
static_assert(scalar_type::kHalf == static_cast<int64_t>(c10::ScalarType::Half));
static_assert(scalar_type::kFloat == static_cast<int64_t>(c10::ScalarType::Float));
static_assert(scalar_type::kDouble == static_cast<int64_t>(c10::ScalarType::Double));
static_assert(scalar_type::kBFloat16 == static_cast<int64_t>(c10::ScalarType::BFloat16));
static_assert(scalar_type::kByte == static_cast<int64_t>(c10::ScalarType::Byte));
static_assert(scalar_type::kChar == static_cast<int64_t>(c10::ScalarType::Char));
static_assert(scalar_type::kShort == static_cast<int64_t>(c10::ScalarType::Short));
static_assert(scalar_type::kInt == static_cast<int64_t>(c10::ScalarType::Int));
static_assert(scalar_type::kLong == static_cast<int64_t>(c10::ScalarType::Long));
static_assert(scalar_type::kBool == static_cast<int64_t>(c10::ScalarType::Bool));

bool isConst(const Graph &g, int n, double v) {
  return g.nodes[n].op == Op::Const && g.nodes[n].value == v;
}

} // namespace

int Graph::add(Node node) {
  // Sharing: an equal node (same kind, arguments and attributes) is reused.
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node &m = nodes[i];
    if (m.op == node.op && m.args == node.args && m.value == node.value &&
        m.index == node.index && m.dtype == node.dtype && m.swapped == node.swapped)
      return static_cast<int>(i);
  }
  nodes.push_back(std::move(node));
  return static_cast<int>(nodes.size()) - 1;
}

int Graph::constant(double v) {
  Node n;
  n.op = Op::Const;
  n.value = v;
  return add(n);
}

int Graph::input(int index) {
  Node n;
  n.op = Op::Input;
  n.index = index;
  return add(n);
}

int Graph::unary(Op op, int a) {
  if (op == Op::Neg && nodes[a].op == Op::Const)
    return constant(-nodes[a].value);
  Node n;
  n.op = op;
  n.args = {a};
  return add(n);
}

int Graph::binary(Op op, int a, int b) {
  // Folds that keep derived graphs small: x*1, x*0 (constant 0), x+0, x-0, x/1.
  bool ca = nodes[a].op == Op::Const, cb = nodes[b].op == Op::Const;
  if (ca && cb) {
    double x = nodes[a].value, y = nodes[b].value;
    switch (op) {
    case Op::Add: return constant(x + y);
    case Op::Sub: return constant(x - y);
    case Op::Mul: return constant(x * y);
    case Op::Div: return constant(x / y);
    default: break;
    }
  }
  if (op == Op::Mul) {
    if (isConst(*this, a, 1))
      return b;
    if (isConst(*this, b, 1))
      return a;
    if (isConst(*this, a, 0) || isConst(*this, b, 0))
      return constant(0);
  }
  if ((op == Op::Add || op == Op::Sub) && isConst(*this, b, 0))
    return a;
  if (op == Op::Add && isConst(*this, a, 0))
    return b;
  if (op == Op::Div && isConst(*this, b, 1))
    return a;
  Node n;
  n.op = op;
  n.args = {a, b};
  return add(n);
}

std::vector<bool> Graph::rowValued() const {
  std::vector<bool> row(nodes.size(), false);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node &n = nodes[i];
    switch (n.op) {
    case Op::RowSum:
    case Op::RowMax:
    case Op::Const:
    case Op::RowLen:
      row[i] = true;
      break;
    case Op::Input:
    case Op::HalfSign:
      row[i] = false;
      break;
    case Op::GradOut:
      row[i] = n.value != 0; // the gradient of a row-valued result
      break;
    default: {
      bool all = true;
      for (int a : n.args)
        all = all && row[a];
      row[i] = all;
    }
    }
  }
  return row;
}

int Graph::swapped(int n) {
  std::vector<bool> row = rowValued();
  std::map<int, int> memo;
  std::function<int(int)> swap = [&](int i) -> int {
    if (auto it = memo.find(i); it != memo.end())
      return it->second;
    Node node = nodes[i]; // copy: nodes grows below
    int out;
    if (node.op == Op::Input || node.op == Op::GradOut) {
      node.swapped = !node.swapped;
      out = add(node);
    } else if (node.op == Op::HalfSign) {
      out = unary(Op::Neg, i);
    } else if (i < static_cast<int>(row.size()) && row[i]) {
      out = i; // one value per row: the same at every column
    } else {
      for (int &a : node.args)
        a = swap(a);
      out = add(node);
    }
    return memo[i] = out;
  };
  return swap(n);
}

bool Graph::usesHalves() const {
  for (const Node &n : nodes)
    if (n.swapped || n.op == Op::HalfSign)
      return true;
  return false;
}

namespace {

bool isNone(const plan::Arg &a) {
  return a.kind == plan::Arg::Kind::Constant && a.constant.isNone();
}

double numberOf(const c10::IValue &v, const std::string &what) {
  if (v.isDouble())
    return v.toDouble();
  if (v.isInt())
    return static_cast<double>(v.toInt());
  if (v.isBool())
    return v.toBool() ? 1.0 : 0.0;
  if (v.isTensor() && v.toTensor().dim() == 0)
    return v.toTensor().item<double>();
  throw FusionError(what + ": a number was expected, got " + v.tagKind());
}

} // namespace

namespace {

/// rotate_half's pieces while a region body is read: a scalar computed from
/// an input's size (size.int, NumToTensor, floor_divide by 2, Int.Tensor),
/// or a slice of an input's dim at a half (negated or not).
struct HalfScalar {
  int input = -1;
  int64_t dim = 0;
  bool halved = false; // size(dim) // 2, else size(dim)
};
struct HalfSlice {
  int input = -1;
  int64_t dim = 0;
  int64_t half = -1; // the constant boundary, or -1: size(dim) // 2
  bool second = false;
  double sign = 1;
};

/// The rotate_half forms of buildRegion: the scalar and slice registers
/// they make, and the cat that ends them.
class HalfReader {
public:
  HalfReader(Graph &g, std::map<int64_t, int> &nodeOf) : g_(g), nodeOf_(nodeOf) {}

  /// Reads `inst` when it belongs to a rotate_half form (returns true), or
  /// leaves it to the caller (false). Throws FusionError for a form it
  /// cannot take.
  bool read(const plan::Instruction &inst, const std::string &where, Region &region) {
    using Kind = plan::Instruction::Kind;
    if (inst.kind == Kind::NumToTensor) {
      scalars_[result(inst, where)] = scalar(inst.args.at(0), where);
      return true;
    }
    if (inst.kind != Kind::Aten)
      return false;
    const std::string &op = inst.op;
    if (op == "aten::size.int") {
      scalars_[result(inst, where)] = HalfScalar{input(inst.args.at(0), where), integer(inst, 1, where)};
    } else if (op == "aten::Int.Tensor") {
      scalars_[result(inst, where)] = scalar(inst.args.at(0), where);
    } else if (op == "aten::floor_divide") {
      HalfScalar s = scalar(inst.args.at(0), where);
      const plan::Arg &d = inst.args.at(1);
      bool two = d.kind == plan::Arg::Kind::Constant ? numberOf(d.constant, where) == 2
                 : d.kind == plan::Arg::Kind::Register && nodeOf_.count(d.reg) &&
                       g_.nodes[nodeOf_[d.reg]].op == Op::Const && g_.nodes[nodeOf_[d.reg]].value == 2;
      if (s.halved || !two)
        throw FusionError(where + ": only size(dim) // 2 is taken");
      s.halved = true;
      scalars_[result(inst, where)] = s;
    } else if (op == "aten::slice.Tensor") {
      // slice(x, dim, start, end, step 1): [0, h) or [h, end of dim).
      HalfSlice piece{input(inst.args.at(0), where), integer(inst, 1, where)};
      if (integer(inst, 4, where) != 1)
        throw FusionError(where + ": a slice with a step");
      std::optional<int64_t> start = boundary(inst.args.at(2), piece, where);
      std::optional<int64_t> end = boundary(inst.args.at(3), piece, where);
      constexpr int64_t kToEnd = int64_t{1} << 62; // x[..., h:] records INT64_MAX
      if (start == 0) {
        piece.half = end.value_or(-1);
      } else if (end && *end >= kToEnd) {
        piece.second = true;
        piece.half = start.value_or(-1);
      } else {
        throw FusionError(where + ": not a half of the dim (rotate_half)");
      }
      if (piece.half == 0)
        throw FusionError(where + ": an empty half");
      slices_[result(inst, where)] = piece;
    } else if (op == "aten::neg" && isSlice(inst.args.at(0))) {
      HalfSlice piece = slices_.at(inst.args[0].reg);
      piece.sign = -piece.sign;
      slices_[result(inst, where)] = piece;
    } else if (op == "aten::cat") {
      const plan::Arg &list = inst.args.at(0);
      if (list.kind != plan::Arg::Kind::List || list.elements.size() != 2 ||
          !isSlice(list.elements[0]) || !isSlice(list.elements[1]))
        throw FusionError(where + ": only cat of an input's two halves (rotate_half) is fusible");
      HalfSlice a = slices_.at(list.elements[0].reg), b = slices_.at(list.elements[1].reg);
      if (a.input != b.input || a.dim != b.dim || a.half != b.half || a.second == b.second)
        throw FusionError(where + ": the halves are not one input's two halves");
      // cat([s_a x[h:], s_b x[:h]]) = S * x half-swapped, S = s_a on the
      // first half, s_b on the second; unswapped for cat([x[:h], x[h:]]).
      Node x;
      x.op = Op::Input;
      x.index = a.input;
      x.swapped = a.second;
      int value = g_.add(x);
      int out;
      if (a.sign == b.sign)
        out = a.sign > 0 ? value : g_.unary(Op::Neg, value);
      else {
        Node sign;
        sign.op = Op::HalfSign;
        int signed_ = g_.binary(Op::Mul, g_.add(sign), value);
        out = a.sign < 0 ? signed_ : g_.unary(Op::Neg, signed_);
      }
      region.halves.push_back(HalfSplit{a.input, a.dim, integer(inst, 1, where), a.half});
      nodeOf_[result(inst, where)] = out;
    } else {
      return false;
    }
    return true;
  }

  /// Throws when a register of a rotate_half form is read otherwise.
  void checkNotRead(const plan::Arg &a, const std::string &where) const {
    if (a.kind == plan::Arg::Kind::Register && (scalars_.count(a.reg) || slices_.count(a.reg)))
      throw FusionError(where + ": reads a slice or size outside rotate_half's form");
    for (const plan::Arg &e : a.elements)
      checkNotRead(e, where);
  }

private:
  static int64_t result(const plan::Instruction &inst, const std::string &where) {
    if (inst.results.size() != 1)
      throw FusionError(where + ": one result expected");
    return inst.results[0];
  }
  int64_t integer(const plan::Instruction &inst, size_t i, const std::string &where) const {
    const plan::Arg &a = inst.args.at(i);
    if (a.kind != plan::Arg::Kind::Constant || !a.constant.isInt())
      throw FusionError(where + ": argument " + std::to_string(i) + " must be a constant integer");
    return a.constant.toInt();
  }
  int input(const plan::Arg &a, const std::string &where) const {
    auto it = a.kind == plan::Arg::Kind::Register ? nodeOf_.find(a.reg) : nodeOf_.end();
    if (it == nodeOf_.end() || g_.nodes[it->second].op != Op::Input || g_.nodes[it->second].swapped)
      throw FusionError(where + ": rotate_half's halves are taken of a region input only");
    return g_.nodes[it->second].index;
  }
  HalfScalar scalar(const plan::Arg &a, const std::string &where) const {
    auto it = a.kind == plan::Arg::Kind::Register ? scalars_.find(a.reg) : scalars_.end();
    if (it == scalars_.end())
      throw FusionError(where + ": a scalar not computed from an input's size");
    return it->second;
  }
  bool isSlice(const plan::Arg &a) const {
    return a.kind == plan::Arg::Kind::Register && slices_.count(a.reg);
  }
  /// A slice boundary: a constant, or -1 for size(dim) // 2 of the sliced
  /// input and dim, INT64_MAX for size(dim); nullopt for another scalar.
  std::optional<int64_t> boundary(const plan::Arg &a, const HalfSlice &piece,
                                  const std::string &where) const {
    if (a.kind == plan::Arg::Kind::Constant && a.constant.isInt())
      return a.constant.toInt();
    HalfScalar s = scalar(a, where);
    if (s.input != piece.input || s.dim != piece.dim)
      throw FusionError(where + ": a boundary from another tensor's or dim's size");
    return s.halved ? -1 : std::numeric_limits<int64_t>::max();
  }

  Graph &g_;
  std::map<int64_t, int> &nodeOf_;
  std::map<int64_t, HalfScalar> scalars_;
  std::map<int64_t, HalfSlice> slices_;
};

} // namespace

Region buildRegion(const plan::Function &body) {
  Region region;
  region.numInputs = static_cast<int>(body.params.size());
  Graph &g = region.forward;
  std::map<int64_t, int> nodeOf; // register -> node
  for (size_t i = 0; i < body.params.size(); ++i)
    nodeOf[body.params[i]] = g.input(static_cast<int>(i));
  HalfReader halves(g, nodeOf);
  int softmax = -1; // its value's node
  for (const plan::Instruction &inst : body.body) {
    std::string where = (inst.op.empty() ? "instruction" : inst.op) + " in " + body.name;
    if (inst.kind == plan::Instruction::Kind::Constant) {
      nodeOf[inst.results.at(0)] = g.constant(numberOf(inst.args.at(0).constant, where));
      continue;
    }
    if (halves.read(inst, where, region))
      continue;
    if (inst.kind != plan::Instruction::Kind::Aten)
      throw FusionError(where + ": a fused region holds only operator calls and constants");
    for (const plan::Arg &a : inst.args)
      halves.checkNotRead(a, where);
    auto kind = fusibleKinds().find(inst.op);
    if (kind == fusibleKinds().end())
      throw FusionError(where + ": the operator is not fusible (FusibleOps.def)");
    auto node = [&](size_t i) -> int {
      if (i >= inst.args.size())
        throw FusionError(where + ": missing argument " + std::to_string(i));
      const plan::Arg &a = inst.args[i];
      if (a.kind == plan::Arg::Kind::Register) {
        auto it = nodeOf.find(a.reg);
        if (it == nodeOf.end())
          throw FusionError(where + ": reads a register not defined in the region");
        return it->second;
      }
      if (a.kind == plan::Arg::Kind::Constant)
        return g.constant(numberOf(a.constant, where));
      throw FusionError(where + ": a list argument where a tensor or number was expected");
    };
    auto number = [&](size_t i) {
      const plan::Arg &a = inst.args.at(i);
      if (a.kind != plan::Arg::Kind::Constant)
        throw FusionError(where + ": argument " + std::to_string(i) + " must be a constant");
      return numberOf(a.constant, where);
    };
    // A Cast node of `a` to the dtype of c10::ScalarType code `code`.
    auto cast = [&](int a, double code) {
      auto dtype = static_cast<c10::ScalarType>(static_cast<int64_t>(code));
      if (dtype != c10::ScalarType::Float && dtype != c10::ScalarType::BFloat16 &&
          dtype != c10::ScalarType::Half)
        throw FusionError(where + ": casts only to float32, bfloat16 or float16");
      Node c;
      c.op = Op::Cast;
      c.args = {a};
      c.dtype = dtype;
      return g.add(c);
    };
    const FusibleKind k = kind->second;
    int out;
    if (k == FusibleKind::Add || k == FusibleKind::Sub || k == FusibleKind::Rsub) {
      int a = node(0), b = node(1);
      double alpha = number(2);
      if (k == FusibleKind::Rsub)
        std::swap(a, b); // rsub(self, other, alpha) = other - alpha * self
      int scaled = g.binary(Op::Mul, b, g.constant(alpha));
      out = g.binary(k == FusibleKind::Add ? Op::Add : Op::Sub, a, scaled);
    } else if (k == FusibleKind::Mul || k == FusibleKind::Div) {
      out = g.binary(k == FusibleKind::Mul ? Op::Mul : Op::Div, node(0), node(1));
    } else if (k == FusibleKind::Pow) {
      double e = number(1);
      int a = node(0);
      if (e == 1) {
        out = a;
      } else if (e == 2) {
        out = g.binary(Op::Mul, a, a);
      } else {
        Node p;
        p.op = Op::Pow;
        p.args = {a};
        p.value = e;
        out = g.add(p);
      }
    } else if (k == FusibleKind::Gelu) {
      const plan::Arg &a = inst.args.at(1);
      std::string approximate =
          a.kind == plan::Arg::Kind::Constant && a.constant.isString() ? a.constant.toStringRef() : "";
      if (approximate != "none" && approximate != "tanh")
        throw FusionError(where + ": approximate must be \"none\" or \"tanh\"");
      out = g.unary(approximate == "tanh" ? Op::GeluTanh : Op::GeluErf, node(0));
    } else if (k == FusibleKind::Cast) {
      out = cast(node(0), number(1));
    } else if (k == FusibleKind::LayerNorm) {
      // layer_norm(x, [D], w, b, eps) over the last dim, in float:
      // (x - mean) * rsqrt(var + eps) * w + b, var the mean of the squared
      // deviations (ATen's biased variance), two row-sum levels.
      if (region.hasReduction)
        throw FusionError(where + ": a region holds at most one reduction");
      region.hasReduction = true;
      const plan::Arg &shape = inst.args.at(1);
      std::vector<int64_t> lengths;
      if (shape.kind == plan::Arg::Kind::List) {
        for (const plan::Arg &e : shape.elements)
          if (e.kind == plan::Arg::Kind::Constant && e.constant.isInt())
            lengths.push_back(e.constant.toInt());
          else
            lengths.clear();
      } else if (shape.kind == plan::Arg::Kind::Constant && shape.constant.isIntList()) {
        lengths = shape.constant.toIntVector();
      }
      if (lengths.size() != 1 || lengths[0] <= 0)
        throw FusionError(where + ": normalized_shape must be one constant length (the last dim)");
      region.rowLength = lengths[0];
      Node len;
      len.op = Op::RowLen;
      const int D = g.add(len), x = node(0);
      const int mean = g.binary(Op::Div, g.unary(Op::RowSum, x), D);
      const int centred = g.binary(Op::Sub, x, mean);
      const int var = g.binary(Op::Div, g.unary(Op::RowSum, g.binary(Op::Mul, centred, centred)), D);
      const int scale = g.unary(Op::Rsqrt, g.binary(Op::Add, var, g.constant(number(4))));
      out = g.binary(Op::Mul, centred, scale);
      auto optional = [&](size_t i) { return inst.args.at(i).kind == plan::Arg::Kind::Register; };
      if (!optional(2) && !isNone(inst.args.at(2)))
        throw FusionError(where + ": the weight must be a tensor or None");
      if (!optional(3) && !isNone(inst.args.at(3)))
        throw FusionError(where + ": the bias must be a tensor or None");
      if (optional(2))
        out = g.binary(Op::Mul, out, node(2));
      if (optional(3))
        out = g.binary(Op::Add, out, node(3));
    } else if (k == FusibleKind::Softmax) {
      // softmax(x, -1, dtype) = e / rowsum(e), e = exp(x - rowmax(x)), x
      // first cast to dtype when one is given. Only as the region's result
      // or a cast of it (checked below), so that x has the element shape
      // (its last dim is the row).
      if (region.hasReduction)
        throw FusionError(where + ": a region holds at most one reduction");
      region.hasReduction = true;
      if (number(1) != -1)
        throw FusionError(where + ": only a softmax over dim -1 is fusible");
      const int x = isNone(inst.args.at(2)) ? node(0) : cast(node(0), number(2));
      const int e = g.unary(Op::Exp, g.binary(Op::Sub, x, g.unary(Op::RowMax, x)));
      out = g.binary(Op::Div, e, g.unary(Op::RowSum, e));
      softmax = out;
    } else if (k == FusibleKind::Mean || k == FusibleKind::Sum) {
      if (region.hasReduction)
        throw FusionError(where + ": a region holds at most one reduction");
      region.hasReduction = true;
      const plan::Arg &dims = inst.args.at(1);
      bool last = dims.kind == plan::Arg::Kind::List && dims.elements.size() == 1 &&
                  dims.elements[0].kind == plan::Arg::Kind::Constant &&
                  dims.elements[0].constant.isInt() && dims.elements[0].constant.toInt() == -1;
      if (!last && dims.kind == plan::Arg::Kind::Constant && dims.constant.isIntList()) {
        std::vector<int64_t> d = dims.constant.toIntVector();
        last = d.size() == 1 && d[0] == -1;
      }
      if (!last || number(2) != 1.0)
        throw FusionError(where + ": only a reduction over [-1] with keepdim is fusible");
      out = g.unary(Op::RowSum, node(0));
      if (k == FusibleKind::Mean) {
        Node len;
        len.op = Op::RowLen;
        out = g.binary(Op::Div, out, g.add(len));
      }
    } else {
      static const std::map<FusibleKind, Op> unary = {
          {FusibleKind::Neg, Op::Neg},         {FusibleKind::Sqrt, Op::Sqrt},
          {FusibleKind::Rsqrt, Op::Rsqrt},     {FusibleKind::Exp, Op::Exp},
          {FusibleKind::Log, Op::Log},         {FusibleKind::Tanh, Op::Tanh},
          {FusibleKind::Sigmoid, Op::Sigmoid}, {FusibleKind::Relu, Op::Relu},
          {FusibleKind::Silu, Op::Silu},       {FusibleKind::Erf, Op::Erf},
          {FusibleKind::Cos, Op::Cos},         {FusibleKind::Sin, Op::Sin}};
      auto it = unary.find(k);
      if (it == unary.end())
        throw FusionError(where + ": no generator rule for " + inst.op);
      out = g.unary(it->second, node(0));
    }
    if (inst.results.size() != 1)
      throw FusionError(where + ": one result expected");
    // Eager rounds each operator's result to its dtype (bf16 stays bf16
    // between ops); a cast or an earlier op already has (pow(x, 1) is x),
    // an input or number needs not.
    const Op made = g.nodes[out].op;
    if (made != Op::Cast && made != Op::Round && made != Op::Input && made != Op::Const) {
      const bool isSoftmax = out == softmax;
      out = g.unary(Op::Round, out);
      if (isSoftmax)
        softmax = out;
    }
    nodeOf[inst.results[0]] = out;
  }
  if (body.returns.empty())
    throw FusionError(body.name + ": a fused region returns at least one value");
  for (int64_t r : body.returns) {
    if (!nodeOf.count(r))
      throw FusionError(body.name + ": a fused region returns values it computes");
    region.results.push_back(nodeOf[r]);
  }
  if (region.hasReduction && !region.halves.empty())
    throw FusionError(body.name + ": rotate_half in a region with a reduction");
  if (region.results.size() > 1) {
    std::vector<bool> row = g.rowValued();
    for (int r : region.results)
      if (row[r])
        throw FusionError(body.name + ": a row-valued result beside other results");
  }
  const Node &last = g.nodes[region.results[0]];
  if (softmax >= 0 && (region.results.size() != 1 ||
                       (region.results[0] != softmax && !(last.op == Op::Cast && last.args[0] == softmax))))
    throw FusionError(body.name + ": softmax must be the region's one result, or cast to it");
  region.backward = region.forward;
  region.gradients = differentiate(region.backward, region.results, region.numInputs);
  return region;
}

std::vector<c10::ScalarType> valueDtypes(const Graph &g,
                                         const std::vector<c10::ScalarType> &inputDtypes) {
  constexpr auto none = c10::ScalarType::Undefined; // a number: does not promote
  std::vector<c10::ScalarType> t(g.nodes.size(), none);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node &n = g.nodes[i];
    switch (n.op) {
    case Op::Input: {
      c10::ScalarType d = inputDtypes.at(n.index);
      if (d != c10::ScalarType::Float && d != c10::ScalarType::BFloat16 &&
          d != c10::ScalarType::Half)
        throw FusionError(std::string("fused region: an input of dtype ") + c10::toString(d) +
                          " (float32, bfloat16 or float16 expected)");
      t[i] = d;
      break;
    }
    case Op::Const:
    case Op::RowLen:
    case Op::GradOut:
    case Op::HalfSign:
      break;
    case Op::Cast:
      t[i] = n.dtype;
      break;
    default:
      for (int a : n.args)
        t[i] = t[i] == none ? t[a] : t[a] == none ? t[i] : c10::promoteTypes(t[i], t[a]);
    }
  }
  return t;
}

Graph resolveRounding(const Graph &g, const std::vector<c10::ScalarType> &inputDtypes) {
  Graph out = g;
  std::vector<c10::ScalarType> t;
  for (Node &n : out.nodes) {
    if (n.op != Op::Round)
      continue;
    if (t.empty())
      t = valueDtypes(g, inputDtypes);
    c10::ScalarType d = t[&n - out.nodes.data()];
    n.op = Op::Cast;
    n.dtype = d == c10::ScalarType::Undefined ? c10::ScalarType::Float : d;
  }
  return out;
}

std::vector<c10::ScalarType> resultDtypes(const Region &region,
                                          const std::vector<c10::ScalarType> &inputDtypes) {
  for (c10::ScalarType d : inputDtypes)
    if (d != c10::ScalarType::Float && d != c10::ScalarType::BFloat16 && d != c10::ScalarType::Half)
      return {};
  std::vector<c10::ScalarType> values = valueDtypes(region.forward, inputDtypes), out;
  for (int r : region.results) {
    c10::ScalarType d = values.at(r);
    out.push_back(d == c10::ScalarType::Undefined ? c10::ScalarType::Float : d);
  }
  return out;
}

bool callFits(const Region &region, const std::vector<at::Tensor> &inputs,
              const std::vector<int64_t> &shape) {
  if (region.rowLength >= 0 && (shape.empty() || shape.back() != region.rowLength))
    return false;
  for (const HalfSplit &h : region.halves) {
    if (h.input < 0 || h.input >= static_cast<int>(inputs.size()) || shape.empty())
      return false;
    const at::Tensor &x = inputs[h.input];
    const int64_t last = x.dim() - 1, D = shape.back();
    auto isLast = [&](int64_t d) { return d == -1 || d == last; };
    if (last < 0 || !isLast(h.dim) || !isLast(h.catDim) || x.size(last) != D || D % 2 != 0 ||
        (h.half >= 0 && 2 * h.half != D))
      return false;
  }
  return true;
}

std::vector<int64_t> elementShape(const std::vector<at::Tensor> &inputs) {
  std::vector<int64_t> shape;
  try {
    for (const at::Tensor &t : inputs)
      if (t.defined())
        shape = at::infer_size(shape, t.sizes());
  } catch (const c10::Error &e) {
    throw FusionError(std::string("fused region: inputs do not broadcast: ") +
                      e.what_without_backtrace());
  }
  return shape;
}

} // namespace bmt::fusion
