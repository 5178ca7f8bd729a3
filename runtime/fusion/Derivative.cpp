//===- Derivative.cpp - the reverse-mode derivative of a fused region -----===//

#include "fusion/Derivative.h"

#include <cmath>

namespace bmt::fusion {

namespace {
constexpr double kPi = 3.14159265358979323846;
} // namespace

/// Reverse-mode differentiation of `g` at `results`: extends `g` by a
/// GradOut per result and the adjoint nodes; returns the adjoint of each
/// input (-1: none).
std::vector<int> differentiate(Graph &g, const std::vector<int> &results, int numInputs) {
  std::vector<bool> row = g.rowValued();
  const size_t forwardSize = g.nodes.size();
  // Contributions to each node's adjoint: from element-valued users (a row
  // node sums them over the row) and from row-valued ones; a result's
  // GradOut seeds its adjoint (a result read inside the region too sums both).
  std::vector<std::vector<int>> fromElement(forwardSize), fromRow(forwardSize);
  for (size_t k = 0; k < results.size(); ++k) {
    const int result = results[k];
    Node gradOut;
    gradOut.op = Op::GradOut;
    gradOut.index = static_cast<int>(k);
    gradOut.value = row[result] ? 1 : 0;
    int seed = g.add(gradOut);
    (row[result] ? fromRow : fromElement)[result].push_back(seed);
  }
  std::vector<int> adjoint(forwardSize, -1);
  auto sum = [&](const std::vector<int> &terms) {
    int s = -1;
    for (int t : terms)
      s = s < 0 ? t : g.binary(Op::Add, s, t);
    return s;
  };
  for (int n = static_cast<int>(forwardSize) - 1; n >= 0; --n) {
    int e = sum(fromElement[n]), r = sum(fromRow[n]);
    if (e < 0 && r < 0)
      continue;
    if (row[n] && e >= 0)
      e = g.unary(Op::RowSum, e); // the chain rule through the reduction
    int A = e < 0 ? r : r < 0 ? e : g.binary(Op::Add, e, r);
    adjoint[n] = A;
    const Node node = g.nodes[n]; // copy: g.nodes grows below
    auto give = [&](int arg, int contribution) {
      Op k = g.nodes[arg].op;
      // RowMax is softmax's shift, which the value does not depend on: a
      // constant for the derivative (its contributions would cancel).
      if (k == Op::Const || k == Op::RowLen || k == Op::RowMax)
        return;
      (row[n] ? fromRow : fromElement)[arg].push_back(contribution);
    };
    auto C = [&](double v) { return g.constant(v); };
    auto mul = [&](int a, int b) { return g.binary(Op::Mul, a, b); };
    auto addn = [&](int a, int b) { return g.binary(Op::Add, a, b); };
    auto subn = [&](int a, int b) { return g.binary(Op::Sub, a, b); };
    int a = node.args.empty() ? -1 : node.args[0];
    int b = node.args.size() > 1 ? node.args[1] : -1;
    switch (node.op) {
    case Op::Input:
    case Op::Const:
    case Op::GradOut:
    case Op::RowLen:
    case Op::Step:
    case Op::HalfSign:
      break;
    case Op::Add:
      give(a, A);
      give(b, A);
      break;
    case Op::Sub:
      give(a, A);
      give(b, g.unary(Op::Neg, A));
      break;
    case Op::Mul:
      give(a, mul(A, b));
      give(b, mul(A, a));
      break;
    case Op::Div:
      give(a, g.binary(Op::Div, A, b));
      give(b, g.unary(Op::Neg, g.binary(Op::Div, mul(A, n), b)));
      break;
    case Op::Neg:
      give(a, g.unary(Op::Neg, A));
      break;
    case Op::Pow: {
      double c = node.value;
      int d;
      if (c == 1)
        d = C(1);
      else if (c == 2)
        d = mul(C(2), a);
      else {
        Node p;
        p.op = Op::Pow;
        p.args = {a};
        p.value = c - 1;
        d = mul(C(c), g.add(p));
      }
      give(a, mul(A, d));
      break;
    }
    case Op::Sqrt:
      give(a, g.binary(Op::Div, mul(A, C(0.5)), n));
      break;
    case Op::Rsqrt: // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 r^3
      give(a, mul(mul(A, C(-0.5)), mul(n, mul(n, n))));
      break;
    case Op::Exp:
      give(a, mul(A, n));
      break;
    case Op::Log:
      give(a, g.binary(Op::Div, A, a));
      break;
    case Op::Tanh:
      give(a, mul(A, subn(C(1), mul(n, n))));
      break;
    case Op::Sigmoid:
      give(a, mul(A, mul(n, subn(C(1), n))));
      break;
    case Op::Relu:
      give(a, mul(A, g.unary(Op::Step, a)));
      break;
    case Op::Silu: { // s (1 + x (1 - s))
      int s = g.unary(Op::Sigmoid, a);
      give(a, mul(A, mul(s, addn(C(1), mul(a, subn(C(1), s))))));
      break;
    }
    case Op::Erf: // 2/sqrt(pi) exp(-x^2)
      give(a, mul(A, mul(C(2.0 / std::sqrt(kPi)), g.unary(Op::Exp, g.unary(Op::Neg, mul(a, a))))));
      break;
    case Op::Cos:
      give(a, g.unary(Op::Neg, mul(A, g.unary(Op::Sin, a))));
      break;
    case Op::Sin:
      give(a, mul(A, g.unary(Op::Cos, a)));
      break;
    case Op::GeluErf: { // Phi(x) + x phi(x)
      int cdf = mul(C(0.5), addn(C(1), g.unary(Op::Erf, mul(a, C(1.0 / std::sqrt(2.0))))));
      int pdf = mul(C(1.0 / std::sqrt(2.0 * kPi)),
                    g.unary(Op::Exp, mul(C(-0.5), mul(a, a))));
      give(a, mul(A, addn(cdf, mul(a, pdf))));
      break;
    }
    case Op::GeluTanh: { // u = k (x + 0.044715 x^3), t = tanh(u)
      double k = std::sqrt(2.0 / kPi), c = 0.044715;
      int x2 = mul(a, a);
      int u = mul(C(k), addn(a, mul(C(c), mul(x2, a))));
      int t = g.unary(Op::Tanh, u);
      int du = mul(C(k), addn(C(1), mul(C(3 * c), x2)));
      int d = addn(mul(C(0.5), addn(C(1), t)),
                   mul(mul(mul(C(0.5), a), subn(C(1), mul(t, t))), du));
      give(a, mul(A, d));
      break;
    }
    case Op::Cast: // the gradient flows through unrounded (fp32 math)
    case Op::Round:
      give(a, A);
      break;
    case Op::RowSum: // broadcast back over the row
      fromElement[a].push_back(A);
      break;
    case Op::RowMax: // never reached: nothing contributes to its adjoint
      break;
    }
  }
  // An input read half-swapped contributes its adjoint swapped back.
  std::vector<int> grads(numInputs, -1);
  for (size_t n = 0; n < forwardSize; ++n) {
    const Node &node = g.nodes[n];
    if (node.op != Op::Input || adjoint[n] < 0)
      continue;
    int contribution = node.swapped ? g.swapped(adjoint[n]) : adjoint[n];
    int &grad = grads[node.index];
    grad = grad < 0 ? contribution : g.binary(Op::Add, grad, contribution);
  }
  return grads;
}

} // namespace bmt::fusion
