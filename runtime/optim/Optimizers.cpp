//===- Optimizers.cpp - SGD, Lion, Adafactor and the optimizer choice -----===//
//
// SGD over ATen's fused kernel; Lion and Adafactor with foreach / plain ATen
// ops computed out of place and committed with at::where(found_inf, old,
// new), so that a skipped step changes nothing whatever the gradients hold
// (an inf times zero would be NaN).
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/optim/Optimizers.h"

#include "bmt/Runtime/comm/Comm.h"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sign.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace bmt::runtime {

std::optional<OptimizerKind> parseOptimizerKind(const std::string &name) {
  if (name == "sgd")
    return OptimizerKind::SGD;
  if (name == "adam")
    return OptimizerKind::Adam;
  if (name == "adamw")
    return OptimizerKind::AdamW;
  if (name == "lion")
    return OptimizerKind::Lion;
  if (name == "adafactor")
    return OptimizerKind::Adafactor;
  return std::nullopt;
}

const char *optimizerKindName(OptimizerKind kind) {
  switch (kind) {
  case OptimizerKind::SGD: return "sgd";
  case OptimizerKind::Adam: return "adam";
  case OptimizerKind::AdamW: return "adamw";
  case OptimizerKind::Lion: return "lion";
  case OptimizerKind::Adafactor: return "adafactor";
  }
  return "?";
}

double OptimizerConfig::weightDecayValue() const {
  return weightDecay.value_or(kind == OptimizerKind::AdamW ? 0.01 : 0.0);
}

double OptimizerConfig::beta1Value() const { return beta1.value_or(0.9); }

double OptimizerConfig::beta2Value() const {
  return beta2.value_or(kind == OptimizerKind::Lion ? 0.99 : 0.999);
}

namespace {

std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void require(bool ok, const std::string &message) {
  if (!ok)
    throw std::invalid_argument(message);
}

} // namespace

void checkOptimizerConfig(const OptimizerConfig &c) {
  const std::string who = std::string("--optimizer ") + optimizerKindName(c.kind) + ": ";
  const bool adam = c.kind == OptimizerKind::Adam || c.kind == OptimizerKind::AdamW;
  const bool sgd = c.kind == OptimizerKind::SGD, lion = c.kind == OptimizerKind::Lion;
  const bool adafactor = c.kind == OptimizerKind::Adafactor;
  require(std::isfinite(c.weightDecayValue()) && c.weightDecayValue() >= 0,
          who + "--weight-decay must be finite and >= 0, got " + num(c.weightDecayValue()));
  require(adam || lion || (!c.beta1 && !c.beta2),
          who + "takes no --beta1/--beta2 (Adam, AdamW and Lion do)");
  if (adam || lion)
    for (double b : {c.beta1Value(), c.beta2Value()})
      require(b >= 0 && b < 1, who + "--beta1 and --beta2 must lie in [0, 1), got " + num(b));
  require(adam || c.eps == 1e-8, who + "takes no --eps (Adam and AdamW do; Adafactor has "
                                       "--adafactor-eps1/--adafactor-eps2)");
  require(c.eps >= 0, who + "--eps must be >= 0, got " + num(c.eps));
  require(sgd || (c.momentum == 0 && c.dampening == 0 && !c.nesterov),
          who + "takes no --momentum/--dampening/--nesterov (SGD does)");
  require(c.momentum >= 0, who + "--momentum must be >= 0, got " + num(c.momentum));
  require(c.dampening >= 0 && c.dampening <= 1,
          who + "--dampening must lie in [0, 1], got " + num(c.dampening));
  require(!c.nesterov || (c.momentum > 0 && c.dampening == 0),
          who + "--nesterov needs --momentum > 0 and --dampening 0 (as torch.optim.SGD)");
  require(adafactor || (c.beta2Decay == -0.8 && !c.eps1 && c.eps2 == 1e-3 &&
                        c.clipThreshold == 1.0),
          who + "takes no --adafactor-* settings");
  require(c.beta2Decay <= 0, who + "--adafactor-beta2-decay must be <= 0, got " +
                                 num(c.beta2Decay));
  require(!c.eps1 || *c.eps1 >= 0, who + "--adafactor-eps1 must be >= 0");
  require(c.eps2 >= 0, who + "--adafactor-eps2 must be >= 0, got " + num(c.eps2));
  require(c.clipThreshold >= 1, who + "--adafactor-d (the update clipping threshold) must be "
                                      ">= 1, got " + num(c.clipThreshold));
}

AdamWConfig adamWConfig(const OptimizerConfig &c) {
  AdamWConfig a;
  a.beta1 = c.beta1Value();
  a.beta2 = c.beta2Value();
  a.eps = c.eps;
  a.weightDecay = c.weightDecayValue();
  a.decoupled = c.kind != OptimizerKind::Adam;
  a.decayParams = c.decayParams;
  return a;
}

std::unique_ptr<Optimizer> makeDeviceOptimizer(std::vector<at::Tensor> params,
                                               std::vector<ParameterLayout> layouts,
                                               const OptimizerConfig &c, Comm *shardComm,
                                               Comm *tensorComm) {
  checkOptimizerConfig(c);
  switch (c.kind) {
  case OptimizerKind::Adam:
  case OptimizerKind::AdamW:
    return std::make_unique<AdamW>(std::move(params), adamWConfig(c), std::move(layouts));
  case OptimizerKind::SGD:
    return std::make_unique<SGD>(std::move(params),
                                 SGDConfig{c.momentum, c.dampening, c.weightDecayValue(),
                                           c.nesterov, c.decayParams},
                                 std::move(layouts));
  case OptimizerKind::Lion:
    return std::make_unique<Lion>(std::move(params),
                                  LionConfig{c.beta1Value(), c.beta2Value(), c.weightDecayValue(),
                                             c.decayParams},
                                  std::move(layouts));
  case OptimizerKind::Adafactor:
    return std::make_unique<Adafactor>(std::move(params),
                                       AdafactorConfig{c.beta2Decay, c.eps1, c.eps2,
                                                       c.clipThreshold, c.weightDecayValue(),
                                                       c.decayParams},
                                       std::move(layouts), shardComm, tensorComm);
  }
  throw std::invalid_argument("unknown optimizer");
}

namespace {

void checkParams(const std::vector<at::Tensor> &params, const std::string &who) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined())
      throw std::invalid_argument(who + ": parameter " + std::to_string(i) + " is undefined");
    if (!at::isFloatingType(params[i].scalar_type()))
      throw std::invalid_argument(who + ": parameter " + std::to_string(i) +
                                  " is not floating point (" +
                                  std::string(c10::toString(params[i].scalar_type())) + ")");
  }
}

std::vector<at::Tensor> gradsOf(const std::vector<at::Tensor> &params) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor &p : params)
    grads.push_back(p.grad());
  return grads;
}

std::vector<at::Tensor> zerosLike(const std::vector<at::Tensor> &params) {
  std::vector<at::Tensor> out;
  for (const at::Tensor &p : params)
    out.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
  return out;
}

std::vector<at::Tensor> stepCounts(const std::vector<at::Tensor> &params) {
  std::vector<at::Tensor> out;
  for (const at::Tensor &p : params)
    out.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
  return out;
}

/// The step's found-inf flag (bool, 0-dim) on `device`, or none.
std::optional<at::Tensor> foundOn(const StepInputs &in, c10::Device device) {
  if (!in.foundInf)
    return std::nullopt;
  return in.foundInf->to(device).reshape({}).ne(0);
}

/// The factor the gradients are multiplied by (clipping), float32 0-dim on
/// `device`, or none.
std::optional<at::Tensor> clipOn(const StepInputs &in, c10::Device device) {
  if (!in.gradNorm || in.maxNorm <= 0)
    return std::nullopt;
  // As the fused kernels apply it: g / float32(1 / factor).
  return clipFactor(in.gradNorm->reshape({1}).to(at::kDouble), in.maxNorm)
      .reciprocal()
      .to(device, at::kFloat)
      .reshape({});
}

/// dst = found ? dst : value (found: 0-dim bool), or dst = value.
void commit(const at::Tensor &dst, const at::Tensor &value, const std::optional<at::Tensor> &found) {
  if (found)
    dst.copy_(at::where(*found, dst, value));
  else
    dst.copy_(value);
}

/// Steps taken: += 1, or += (1 - found).
void advance(const std::vector<at::Tensor> &steps, const std::vector<at::Tensor> &grads,
             const std::optional<at::Tensor> &found) {
  for (size_t i = 0; i < steps.size(); ++i)
    if (grads[i].defined()) {
      if (found)
        steps[i].add_(found->logical_not().to(at::kFloat));
      else
        steps[i].add_(1);
    }
}

} // namespace

// --- SGD ----------------------------------------------------------------------

SGD::SGD(std::vector<at::Tensor> params, SGDConfig config, std::vector<ParameterLayout> layouts)
    : params_(std::move(params)), config_(config) {
  checkParams(params_, "SGD");
  layouts_ = layoutsFor(params_, std::move(layouts), "SGD");
  c10::NoGradGuard noGrad;
  if (config_.momentum > 0)
    momentum_ = zerosLike(params_);
  steps_ = stepCounts(params_);
}

void SGD::step(const StepInputs &in) {
  checkStepInputs(in, "SGD");
  c10::NoGradGuard noGrad;
  std::vector<at::Tensor> grads = gradsOf(params_);
  std::vector<const std::vector<at::Tensor> *> states;
  if (config_.momentum > 0)
    states.push_back(&momentum_);
  bool any = false;
  for (bool decay : {true, false}) {
    PieceViews views =
        pieceViews(params_, grads, states, layouts_, config_.decayParams, decay);
    if (views.params.empty())
      continue;
    any = true;
    const c10::Device device = views.params.front().device();
    std::optional<at::Tensor> inf, scale = clipOn(in, device);
    if (in.foundInf)
      inf = in.foundInf->to(device, at::kFloat).reshape({});
    // is_first_step: the kernel sets buf = g (torch.optim.SGD's first
    // step); the zero buffers give the same when a first step is skipped
    // and dampening is 0 (docs/runtime/optimizers.md).
    at::_fused_sgd_(views.params, views.grads,
                    config_.momentum > 0 ? views.states[0] : std::vector<at::Tensor>{},
                    decay ? config_.weightDecay : 0.0, config_.momentum, in.lr,
                    config_.dampening, config_.nesterov, /*maximize=*/false,
                    /*is_first_step=*/!started_ && config_.momentum > 0, scale, inf);
  }
  if (any) {
    started_ = true;
    advance(steps_, grads, foundOn(in, params_.front().device()));
  }
}

void SGD::zeroGrad() {
  for (at::Tensor &p : params_)
    p.mutable_grad() = at::Tensor();
}

OptimizerState SGD::state() const {
  if (config_.momentum > 0)
    return stateOf({{"momentum_buffer", &momentum_}, {"step", &steps_}});
  return stateOf({{"step", &steps_}});
}

void SGD::loadState(const OptimizerState &state) {
  if (config_.momentum > 0)
    loadStateInto(state, {{"momentum_buffer", &momentum_}, {"step", &steps_}}, params_, "SGD");
  else
    loadStateInto(state, {{"step", &steps_}}, params_, "SGD");
  started_ = false;
  for (const at::Tensor &s : steps_)
    started_ = started_ || s.item<double>() > 0;
}

// --- Lion ---------------------------------------------------------------------

Lion::Lion(std::vector<at::Tensor> params, LionConfig config, std::vector<ParameterLayout> layouts)
    : params_(std::move(params)), config_(config) {
  checkParams(params_, "Lion");
  layouts_ = layoutsFor(params_, std::move(layouts), "Lion");
  c10::NoGradGuard noGrad;
  expAvg_ = zerosLike(params_);
  steps_ = stepCounts(params_);
}

void Lion::step(const StepInputs &in) {
  checkStepInputs(in, "Lion");
  c10::NoGradGuard noGrad;
  std::vector<at::Tensor> grads = gradsOf(params_);
  bool any = false;
  for (bool decay : {true, false}) {
    PieceViews v = pieceViews(params_, grads, {&expAvg_}, layouts_, config_.decayParams, decay);
    if (v.params.empty())
      continue;
    any = true;
    const c10::Device device = v.params.front().device();
    std::optional<at::Tensor> found = foundOn(in, device), scale = clipOn(in, device);
    std::vector<at::Tensor> g = v.grads;
    if (scale)
      g = at::_foreach_div(g, *scale);
    const std::vector<at::Tensor> &m = v.states[0];
    // c = beta1 * m + (1 - beta1) * g; the update sign(c).
    std::vector<at::Tensor> c = at::_foreach_mul(m, config_.beta1);
    at::_foreach_add_(c, at::_foreach_mul(g, 1.0 - config_.beta1));
    std::vector<at::Tensor> update = at::_foreach_sign(c);
    // p = p * (1 - lr * wd) - lr * sign(c).
    const double wd = decay ? config_.weightDecay : 0.0;
    std::vector<at::Tensor> p = at::_foreach_mul(v.params, 1.0 - in.lr * wd);
    at::_foreach_add_(p, update, -in.lr);
    // m = beta2 * m + (1 - beta2) * g.
    std::vector<at::Tensor> mNew = at::_foreach_mul(m, config_.beta2);
    at::_foreach_add_(mNew, at::_foreach_mul(g, 1.0 - config_.beta2));
    for (size_t k = 0; k < p.size(); ++k) {
      commit(v.params[k], p[k], found);
      commit(m[k], mNew[k], found);
    }
  }
  if (any)
    advance(steps_, grads, foundOn(in, params_.front().device()));
}

void Lion::zeroGrad() {
  for (at::Tensor &p : params_)
    p.mutable_grad() = at::Tensor();
}

OptimizerState Lion::state() const {
  return stateOf({{"exp_avg", &expAvg_}, {"step", &steps_}});
}

void Lion::loadState(const OptimizerState &state) {
  loadStateInto(state, {{"exp_avg", &expAvg_}, {"step", &steps_}}, params_, "Lion");
}

// --- Adafactor ----------------------------------------------------------------

namespace {

int64_t product(const std::vector<int64_t> &shape, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t d = from; d < to; ++d)
    n *= shape[d];
  return n;
}

bool factored(const std::vector<int64_t> &shape) { return shape.size() >= 2; }

/// A member's sizes for the factored statistics: rows = prod(shape[:-1]),
/// R = shape[-2], C = shape[-1], batches = prod(shape[:-2]).
struct Factors {
  int64_t rows = 0, R = 0, C = 0, batches = 0;
};

Factors factorsOf(const std::vector<int64_t> &shape) {
  Factors f;
  f.C = shape.back();
  f.R = shape[shape.size() - 2];
  f.batches = product(shape, 0, shape.size() - 2);
  f.rows = f.batches * f.R;
  return f;
}

/// A piece [memberOffset, memberOffset + n) of a factored member as whole
/// rows: the rows [r0, r1) it touches, padded with zeros before and after.
struct RowView {
  int64_t r0 = 0, r1 = 0, front = 0, back = 0;
};

RowView rowViewOf(const ParameterPiece &piece, int64_t C) {
  RowView v;
  v.r0 = piece.memberOffset / C;
  v.r1 = (piece.memberOffset + piece.numel + C - 1) / C;
  v.front = piece.memberOffset - v.r0 * C;
  v.back = v.r1 * C - (piece.memberOffset + piece.numel);
  return v;
}

at::Tensor padRows(const at::Tensor &flat, const RowView &v, int64_t C) {
  at::Tensor t = flat;
  if (v.front || v.back)
    t = at::constant_pad_nd(flat, {v.front, v.back}, 0);
  return t.view({v.r1 - v.r0, C});
}

at::Tensor unpadRows(const at::Tensor &rows, const RowView &v, int64_t n) {
  return rows.reshape({-1}).narrow(0, v.front, n);
}

} // namespace

Adafactor::Adafactor(std::vector<at::Tensor> params, AdafactorConfig config,
                     std::vector<ParameterLayout> layouts, Comm *shardComm, Comm *tensorComm)
    : params_(std::move(params)), config_(config), shardComm_(shardComm),
      tensorComm_(tensorComm) {
  checkParams(params_, "Adafactor");
  for (size_t i = 0; i < params_.size(); ++i)
    if (!params_[i].is_contiguous())
      throw std::invalid_argument("Adafactor: parameter " + std::to_string(i) +
                                  " is not contiguous");
  layouts_ = layoutsFor(params_, std::move(layouts), "Adafactor");
  c10::NoGradGuard noGrad;
  variance_ = zerosLike(params_);
  steps_ = stepCounts(params_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParameterLayout &layout = layouts_[i];
    if (layout.split && !shardComm_)
      throw std::invalid_argument("Adafactor: parameter " + std::to_string(i) +
                                  " is a shard of a split buffer, and no shard communicator "
                                  "was given");
    for (const ParameterLayout::Member &m : layout.members)
      if (m.tpDim >= 0 && !tensorComm_)
        throw std::invalid_argument("Adafactor: member " + m.name +
                                    " is split over a tensor-parallel group, and no "
                                    "communicator of the group was given");
    int64_t rows = 0, cols = 0;
    for (const ParameterLayout::Member &m : layout.members)
      if (factored(m.shape)) {
        Factors f = factorsOf(m.shape);
        rows += f.rows;
        cols += f.batches * f.C;
      }
    const bool whole = !layout.split;
    if (whole) {
      int64_t covered = 0;
      for (const ParameterPiece &piece : piecesOf(layout, params_[i].numel()))
        covered += piece.numel;
      int64_t members = 0;
      for (const ParameterLayout::Member &m : layout.members)
        members += product(m.shape, 0, m.shape.size());
      if (covered != members)
        throw std::invalid_argument("Adafactor: the members of parameter " + std::to_string(i) +
                                    " do not fit in it");
    }
    at::TensorOptions floats = params_[i].options().dtype(params_[i].scalar_type());
    rowVar_.push_back(at::zeros({rows}, floats));
    colVar_.push_back(at::zeros({cols}, floats));
  }
}

void Adafactor::step(const StepInputs &in) {
  checkStepInputs(in, "Adafactor");
  c10::NoGradGuard noGrad;
  if (params_.empty())
    return;
  std::vector<at::Tensor> grads = gradsOf(params_);
  const c10::Device device = params_.front().device();
  std::optional<at::Tensor> found = foundOn(in, device), scale = clipOn(in, device);

  // Per member (of every parameter with a gradient): its pieces, and the
  // sums over the whole member (local parts; split ones summed over the
  // shard group).
  struct MemberWork {
    size_t param = 0, member = 0;
    std::vector<ParameterPiece> pieces;
    std::vector<at::Tensor> p, g; ///< the pieces' flat views (g clipped)
    int64_t rowBase = 0, colBase = 0; ///< offsets in rowVar_/colVar_ of the param
    /// Tensor parallelism: the member's dim split over the TP group (-1:
    /// none), and the whole tensor's shape (the divisors of its means).
    int64_t tpDim = -1;
    std::vector<int64_t> global;
    at::Tensor paramSq, rowSum, colSum; ///< float32: [1], [rows], [batches * C]
    at::Tensor rowNew, colNew;          ///< the new factors
    at::Tensor rowNewSum;               ///< [batches]: rowNew summed over R
  };
  std::vector<MemberWork> work;
  std::vector<at::Tensor> stepNew(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined())
      continue;
    stepNew[i] = steps_[i].add(1);
    const ParameterLayout &layout = layouts_[i];
    std::vector<ParameterPiece> pieces = piecesOf(layout, params_[i].numel());
    at::Tensor pFlat = params_[i].detach().reshape({-1});
    at::Tensor gFlat = grads[i].reshape({-1});
    if (scale)
      gFlat = gFlat.div(*scale);
    int64_t rowBase = 0, colBase = 0;
    for (size_t m = 0; m < layout.members.size(); ++m) {
      const ParameterLayout::Member &member = layout.members[m];
      const std::vector<int64_t> &shape = member.shape;
      MemberWork w;
      w.param = i;
      w.member = m;
      w.rowBase = rowBase;
      w.colBase = colBase;
      const bool tpSplit = tensorComm_ && tensorComm_->size() > 1 && member.tpDim >= 0;
      w.tpDim = tpSplit ? member.tpDim : -1;
      w.global = member.globalShape.empty() ? shape : member.globalShape;
      for (const ParameterPiece &piece : pieces)
        if (piece.member == m) {
          w.pieces.push_back(piece);
          w.p.push_back(pFlat.narrow(0, piece.offset, piece.numel));
          w.g.push_back(gFlat.narrow(0, piece.offset, piece.numel));
        }
      at::TensorOptions floats = pFlat.options();
      w.paramSq = at::zeros({1}, floats);
      for (const at::Tensor &p : w.p)
        w.paramSq.add_(p.square().sum());
      if (factored(shape)) {
        Factors f = factorsOf(shape);
        w.rowSum = at::zeros({f.rows}, floats);
        w.colSum = at::zeros({f.batches, f.C}, floats);
        for (size_t k = 0; k < w.pieces.size(); ++k) {
          RowView v = rowViewOf(w.pieces[k], f.C);
          at::Tensor sq = padRows(w.g[k].square(), v, f.C);
          w.rowSum.narrow(0, v.r0, v.r1 - v.r0).add_(sq.sum(1));
          // Column sums per batch matrix (one for a 2-D member).
          for (int64_t b = v.r0 / f.R; b * f.R < v.r1; ++b) {
            const int64_t from = std::max(v.r0, b * f.R), to = std::min(v.r1, (b + 1) * f.R);
            w.colSum[b].add_(sq.narrow(0, from - v.r0, to - from).sum(0));
          }
        }
        w.colSum = w.colSum.view({-1});
        rowBase += f.rows;
        colBase += f.batches * f.C;
      }
      work.push_back(std::move(w));
    }
  }
  // The first all-reduce: ||p||^2, row and column sums of the split members
  // (over the shard group, then over the TP group for the members split
  // over it: along the last dim their row sums, along the one before
  // their column sums).
  auto reduce = [&](std::vector<at::Tensor *> parts, Comm *comm = nullptr) {
    comm = comm ? comm : shardComm_;
    if (parts.empty() || !comm)
      return;
    std::vector<at::Tensor> flat;
    for (at::Tensor *t : parts)
      flat.push_back(t->reshape({-1}));
    at::Tensor buffer = at::cat(flat);
    comm->allReduce(buffer)->wait();
    int64_t at = 0;
    for (at::Tensor *t : parts) {
      *t = buffer.narrow(0, at, t->numel()).view(t->sizes());
      at += t->numel();
    }
  };
  {
    std::vector<at::Tensor *> parts;
    for (MemberWork &w : work)
      if (layouts_[w.param].split) {
        parts.push_back(&w.paramSq);
        if (w.rowSum.defined()) {
          parts.push_back(&w.rowSum);
          parts.push_back(&w.colSum);
        }
      }
    reduce(parts);
    std::vector<at::Tensor *> tpParts;
    for (MemberWork &w : work) {
      if (w.tpDim < 0)
        continue;
      tpParts.push_back(&w.paramSq);
      const int64_t ndim = static_cast<int64_t>(w.global.size());
      if (w.rowSum.defined() && w.tpDim == ndim - 1)
        tpParts.push_back(&w.rowSum);
      if (w.rowSum.defined() && w.tpDim == ndim - 2)
        tpParts.push_back(&w.colSum);
    }
    reduce(tpParts, tensorComm_);
  }
  // Per member: the update of its pieces, and ||update||^2.
  std::vector<std::vector<at::Tensor>> updates(work.size());
  std::vector<at::Tensor> updateSq(work.size());
  std::vector<at::Tensor> oneMinusBeta2(params_.size()), rho(params_.size());
  for (size_t i = 0; i < params_.size(); ++i)
    if (stepNew[i].defined()) {
      at::Tensor t = stepNew[i].to(at::kDouble);
      oneMinusBeta2[i] = t.pow(config_.beta2Decay).to(params_[i].scalar_type());
      rho[i] = at::minimum(at::scalar_tensor(in.lr, t.options()), t.sqrt().reciprocal());
    }
  // The new factors (means over the whole tensor's C and R); members
  // split over the TP group along R sum their rows' factors over it.
  {
    std::vector<at::Tensor *> tpParts;
    for (MemberWork &mw : work) {
      const size_t i = mw.param;
      const std::vector<int64_t> &shape = layouts_[i].members[mw.member].shape;
      if (!factored(shape))
        continue;
      Factors f = factorsOf(shape), whole = factorsOf(mw.global);
      at::Tensor rows = rowVar_[i].narrow(0, mw.rowBase, f.rows);
      at::Tensor cols = colVar_[i].narrow(0, mw.colBase, f.batches * f.C);
      mw.rowNew = rows.lerp(mw.rowSum.div(static_cast<double>(whole.C)), oneMinusBeta2[i]);
      mw.colNew = cols.lerp(mw.colSum.div(static_cast<double>(whole.R)), oneMinusBeta2[i]);
      if (mw.tpDim == static_cast<int64_t>(mw.global.size()) - 2) {
        mw.rowNewSum = mw.rowNew.view({f.batches, f.R}).sum(1);
        tpParts.push_back(&mw.rowNewSum);
      }
    }
    reduce(tpParts, tensorComm_);
  }
  for (size_t w = 0; w < work.size(); ++w) {
    MemberWork &mw = work[w];
    const size_t i = mw.param;
    const std::vector<int64_t> &shape = layouts_[i].members[mw.member].shape;
    const double eps1 =
        config_.eps1.value_or(params_[i].scalar_type() == at::kDouble
                                  ? std::numeric_limits<double>::epsilon()
                                  : std::numeric_limits<float>::epsilon());
    updateSq[w] = at::zeros({1}, params_[i].detach().options());
    if (factored(shape)) {
      Factors f = factorsOf(shape);
      // var_estimate = row_var @ col_var / clamp(mean(row_var over R), eps1)
      // (R split over the TP group: the group's sum over the whole R's
      // rows; the padding's rows are zero).
      at::Tensor rowMean =
          (mw.rowNewSum.defined()
               ? mw.rowNewSum.div(static_cast<double>(factorsOf(mw.global).R))
               : mw.rowNew.view({f.batches, f.R}).mean(1))
              .clamp_min(eps1);
      at::Tensor colRows = mw.colNew.view({f.batches, f.C});
      for (size_t k = 0; k < mw.pieces.size(); ++k) {
        RowView v = rowViewOf(mw.pieces[k], f.C);
        at::Tensor batch = at::arange(v.r0, v.r1, rowMean.options().dtype(at::kLong))
                               .div(f.R, "floor");
        at::Tensor var = mw.rowNew.narrow(0, v.r0, v.r1 - v.r0).unsqueeze(1)
                             .mul(colRows.index_select(0, batch))
                             .div(rowMean.index_select(0, batch).unsqueeze(1));
        at::Tensor u = unpadRows(var, v, mw.pieces[k].numel)
                           .clamp_min(eps1 * eps1)
                           .rsqrt()
                           .mul(mw.g[k]);
        updateSq[w].add_(u.square().sum());
        updates[w].push_back(u);
      }
    } else {
      at::Tensor vFlat = variance_[i].reshape({-1});
      for (size_t k = 0; k < mw.pieces.size(); ++k) {
        at::Tensor var = vFlat.narrow(0, mw.pieces[k].offset, mw.pieces[k].numel);
        at::Tensor vNew = var.lerp(mw.g[k].square(), oneMinusBeta2[i]);
        at::Tensor u = vNew.clamp_min(eps1 * eps1).rsqrt().mul(mw.g[k]);
        commit(var, vNew, found);
        updateSq[w].add_(u.square().sum());
        updates[w].push_back(u);
      }
    }
  }
  // The second all-reduce: ||update||^2 of the split members (shard group,
  // then TP group).
  {
    std::vector<at::Tensor *> parts, tpParts;
    for (size_t w = 0; w < work.size(); ++w) {
      if (layouts_[work[w].param].split)
        parts.push_back(&updateSq[w]);
      if (work[w].tpDim >= 0)
        tpParts.push_back(&updateSq[w]);
    }
    reduce(parts);
    reduce(tpParts, tensorComm_);
  }
  for (size_t w = 0; w < work.size(); ++w) {
    MemberWork &mw = work[w];
    const size_t i = mw.param;
    const std::vector<int64_t> &shape = layouts_[i].members[mw.member].shape;
    // RMS over the whole tensor (its TP padding is zero).
    const double numel = static_cast<double>(product(mw.global, 0, mw.global.size()));
    at::Tensor paramRms = mw.paramSq.to(at::kDouble).sqrt().div(std::sqrt(numel));
    at::Tensor alpha = paramRms.clamp_min(config_.eps2).mul(rho[i]);
    at::Tensor denom = updateSq[w]
                           .to(at::kDouble)
                           .sqrt()
                           .div(std::sqrt(numel) * config_.clipThreshold)
                           .clamp_min(1.0);
    at::Tensor stepSize = alpha.div(denom).neg().to(params_[i].scalar_type()).reshape({});
    const double keep =
        decays(shape, config_.decayParams) ? 1.0 - in.lr * config_.weightDecay : 1.0;
    for (size_t k = 0; k < mw.pieces.size(); ++k) {
      at::Tensor p = keep != 1.0 ? mw.p[k].mul(keep) : mw.p[k];
      commit(mw.p[k], p.add(updates[w][k].mul(stepSize)), found);
    }
    if (mw.rowNew.defined()) {
      Factors f = factorsOf(shape);
      commit(rowVar_[i].narrow(0, mw.rowBase, f.rows), mw.rowNew, found);
      commit(colVar_[i].narrow(0, mw.colBase, f.batches * f.C), mw.colNew, found);
    }
  }
  advance(steps_, grads, found);
}

void Adafactor::zeroGrad() {
  for (at::Tensor &p : params_)
    p.mutable_grad() = at::Tensor();
}

OptimizerState Adafactor::state() const {
  OptimizerState s = stateOf({{"variance", &variance_},
                              {"row_var", &rowVar_},
                              {"col_var", &colVar_},
                              {"step", &steps_}});
  s.replicatedSlots = {"row_var", "col_var"};
  return s;
}

void Adafactor::loadState(const OptimizerState &state) {
  // The factors' shapes are their own, not the parameters': check them
  // here, then load the param-shaped slots with the common check.
  OptimizerState rest = state;
  for (const char *slot : {"row_var", "col_var"})
    for (size_t i = 0; i < params_.size(); ++i) {
      const std::string key = std::string(slot) + "." + std::to_string(i);
      const at::Tensor &mine = (slot[0] == 'r' ? rowVar_ : colVar_)[i];
      auto it = rest.tensors.find(key);
      if (it == rest.tensors.end() || !it->second.defined())
        throw std::invalid_argument("Adafactor: the state has no tensor \"" + key + "\"");
      if (it->second.numel() != mine.numel())
        throw std::invalid_argument("Adafactor: state tensor \"" + key + "\" has " +
                                    std::to_string(it->second.numel()) + " elements, expected " +
                                    std::to_string(mine.numel()));
      rest.tensors.erase(it);
    }
  loadStateInto(rest, {{"variance", &variance_}, {"step", &steps_}}, params_, "Adafactor");
  c10::NoGradGuard noGrad;
  for (size_t i = 0; i < params_.size(); ++i) {
    rowVar_[i].copy_(state.tensors.at("row_var." + std::to_string(i)).reshape({-1}));
    colVar_[i].copy_(state.tensors.at("col_var." + std::to_string(i)).reshape({-1}));
  }
}

} // namespace bmt::runtime
