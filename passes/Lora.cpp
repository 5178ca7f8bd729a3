//===- Lora.cpp - the bmt-lora pass ---------------------------------------===//
//
// Low-rank adapters (LoRA, as peft's LoraConfig): for each target linear
// y = linear(x, W, b) (or GPT-2's Conv1D, addmm(b, x, W) with W [in, out])
// two new trainable parameters <module>.lora_A.weight [r, in] and
// <module>.lora_B.weight [out, r], and
//   y' = y + (alpha / r) * linear(linear(dropout(x), A), B),
// one bmt.lora_adapter op (the runtime's exec/LoraAdapter.h); every other
// parameter is frozen. A is Kaiming-uniform (a = sqrt(5): bound
// 1 / sqrt(in)), B zero, so step 0 is the base model exactly; the exporter
// makes their values (bmt.generated_init). After bmt-tensor-parallel (a
// module with bmt.tensor_parallel = T > 1) the adapters follow their base's
// split: a column-parallel W gives a whole A and a B split on its rows like
// W's outputs; a row-parallel W (its matmul already without bias, before the
// all-reduce) an A split on its columns like W's inputs and a whole B, the
// adapter's partial output added before the all-reduce. The whole adapter
// of a split base sees only its rank's part of the gradient: reduce_grad.
// See passes/Passes.td and docs/passes/lora.md.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/TensorSplit.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>
#include <string>

namespace bmt {
#define GEN_PASS_DEF_LORA
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;
using bmt::AtenOpId;

namespace {

/// The adapter's settings, from "r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj".
struct LoraSpec {
  int64_t rank = 0;
  double alpha = 0;
  double dropout = 0;
  bool allLinear = false;
  SmallVector<std::string> targets;
};

/// Parses `text`; an error message, or "" when it is fine. A comma-separated
/// item without '=' continues the targets list.
std::string parseSpec(StringRef text, LoraSpec &spec) {
  bool alphaGiven = false, inTargets = false;
  llvm::StringSet<> seenKeys;
  SmallVector<StringRef> items;
  text.split(items, ',');
  for (StringRef raw : items) {
    StringRef item = raw.trim();
    if (item.empty())
      return "empty item in '" + text.str() + "'";
    auto [key, value] = item.split('=');
    if (!item.contains('=')) {
      if (!inTargets)
        return "'" + item.str() + "' is not key=value (keys: r, alpha, dropout, targets)";
      spec.targets.push_back(item.str());
      continue;
    }
    inTargets = false;
    key = key.trim();
    value = value.trim();
    if (!seenKeys.insert(key).second)
      return "'" + key.str() + "' is given twice";
    if (key == "r") {
      if (value.getAsInteger(10, spec.rank) || spec.rank <= 0)
        return "r must be a positive integer, got '" + value.str() + "'";
    } else if (key == "alpha") {
      if (value.getAsDouble(spec.alpha) || !(spec.alpha > 0) || !std::isfinite(spec.alpha))
        return "alpha must be a positive number, got '" + value.str() + "'";
      alphaGiven = true;
    } else if (key == "dropout") {
      if (value.getAsDouble(spec.dropout) || !(spec.dropout >= 0 && spec.dropout < 1))
        return "dropout must be in [0, 1), got '" + value.str() + "'";
    } else if (key == "targets") {
      if (value.empty())
        return "targets needs module names (targets=q_proj,v_proj) or all-linear";
      inTargets = true;
      spec.targets.push_back(value.str());
    } else {
      return "unknown key '" + key.str() + "' (keys: r, alpha, dropout, targets)";
    }
  }
  if (spec.rank <= 0)
    return "r=N is required";
  if (spec.targets.empty())
    return "targets=... is required (module names such as q_proj,v_proj, or all-linear)";
  if (!alphaGiven)
    spec.alpha = static_cast<double>(spec.rank);
  if (llvm::is_contained(spec.targets, "all-linear")) {
    if (spec.targets.size() != 1)
      return "all-linear stands alone in targets";
    spec.allLinear = true;
  }
  return "";
}

/// A matmul to adapt: its input, its weight parameter and the sizes.
struct Site {
  bmt::AtenOp op;
  Value input;
  bmt::ParameterOp weight;
  int64_t in = 0, out = 0;
};

/// The site of `op` when it is aten::linear(x, W, b) or aten::addmm(b, x, W,
/// 1, 1) whose weight is a 2-D parameter read by bmt.get_global; with
/// `splitModule` also aten::mm(x, W), a row-parallel Conv1D's matmul that
/// bmt-tensor-parallel took its bias from.
std::optional<Site> siteOf(bmt::AtenOp op, SymbolTable &symbols, bool splitModule) {
  bool linear = bmt::isAten(op, {AtenOpId::linear});
  bool addmm = bmt::isAten(op, {AtenOpId::addmm});
  bool mm = splitModule && bmt::isAten(op, {AtenOpId::mm});
  if (!linear && !addmm && !mm)
    return std::nullopt;
  auto x = bmt::getAtenArg(op, linear ? 0u : mm ? 0u : 1u);
  auto w = bmt::getAtenArg(op, linear ? 1u : mm ? 1u : 2u);
  if (!x || !w || !x->isOperand() || !w->isOperand())
    return std::nullopt;
  if (addmm) {
    auto beta = bmt::getAtenArg(op, 3u), alpha = bmt::getAtenArg(op, 4u);
    if (!beta || !alpha || beta->getNumber() != 1.0 || alpha->getNumber() != 1.0)
      return std::nullopt;
  }
  auto global = w->getOperand().getDefiningOp<bmt::GetGlobalOp>();
  if (!global)
    return std::nullopt;
  auto param = symbols.lookup<bmt::ParameterOp>(global.getGlobal());
  if (!param)
    return std::nullopt;
  auto type = cast<RankedTensorType>(param.getType());
  if (type.getRank() != 2)
    return std::nullopt;
  Site s{op, x->getOperand(), param, 0, 0};
  s.in = linear ? type.getDimSize(1) : type.getDimSize(0);
  s.out = linear ? type.getDimSize(0) : type.getDimSize(1);
  return s;
}

/// The splits of a site's adapters over the TP group (replicated by
/// default), or why the site cannot be adapted.
struct AdapterSplits {
  bmt::ParameterSplit a, b;
  const char *layout = "whole";
  std::string error;
};

/// Follows the base weight's split (bmt-tensor-parallel ran before):
/// - W split on its output dim (column-parallel, y split): A whole, B
///   split on dim 0 as W's outputs (chunks alike). Each rank's dA is the
///   part of its output slice, so A's gradient is summed over the group.
/// - W split on its input dim (row-parallel, y a partial sum before the
///   all-reduce): A split on dim 1 as W's inputs, B whole; x A_t^T is each
///   rank's partial of x A^T, and B of it a partial of the adapter's output,
///   added to the partial base output before the all-reduce (linear, so
///   the sum is right). dB = dy^T (x_t A_t^T) is a partial: summed.
/// - W whole with reduce_grad (replicated k/v): dW's parts summed over the
///   group; the adapters' gradients come from the same dy and x: summed.
/// - W whole otherwise: gradients identical on every rank; nothing to do.
AdapterSplits adapterSplits(const Site &site) {
  AdapterSplits out;
  bmt::ParameterSplit w = bmt::parameterSplitOf(site.weight);
  if (!w.isSplit()) {
    if (w.reduceGrad) {
      out.a = out.b = bmt::reduceGradSplit();
      out.layout = "whole, reduce_grad";
    }
    return out;
  }
  const int64_t outDim = bmt::isAten(site.op, {AtenOpId::linear}) ? 0 : 1;
  if (!w.isTensorSplit() || w.paddedSize != 0 || (w.dim != 0 && w.dim != 1)) {
    out.error = "its weight is split in a way the adapters cannot follow (padded by the "
                "vocab-parallel split, or split over the expert group)";
    return out;
  }
  if (w.dim == outDim) {
    out.b.dim = 0;
    out.b.chunks = w.chunks;
    out.a = bmt::reduceGradSplit();
    out.layout = "column";
    return out;
  }
  Value y = site.op->getResult(0);
  // The row's collective: the all-reduce, or with sequence parallelism the
  // reduce-scatter along the sequence (a sum too).
  if (!y.hasOneUse() ||
      !isa<bmt::TpAllReduceOp, bmt::TpReduceScatterOp>(*y.getUsers().begin())) {
    out.error = "its row-parallel output is not summed over the group right after the matmul";
    return out;
  }
  out.a.dim = 1;
  out.a.chunks = w.chunks;
  out.b = bmt::reduceGradSplit();
  out.layout = "row";
  return out;
}

struct LoraPass : bmt::impl::LoraBase<LoraPass> {
  using LoraBase::LoraBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (StringRef(spec).trim().empty())
      return;
    LoraSpec lora;
    if (std::string problem = parseSpec(spec, lora); !problem.empty()) {
      module.emitError("bmt-lora: ") << problem;
      return signalPassFailure();
    }
    SymbolTable symbols(module);
    const int64_t tensorParallel = bmt::tensorParallelOf(module);
    const bool sequenceParallel = module->hasAttr("bmt.sequence_parallel");
    // Weights an embedding reads (a tied output head): never adapted.
    llvm::StringSet<> embeddings;
    module.walk([&](bmt::AtenOp op) {
      if (bmt::isAten(op, {AtenOpId::embedding}))
        if (auto w = bmt::getAtenArg(op, 0u); w && w->isOperand())
          if (auto g = w->getOperand().getDefiningOp<bmt::GetGlobalOp>())
            embeddings.insert(g.getGlobal());
    });
    auto targeted = [&](bmt::ParameterOp w, std::string &module) {
      StringRef name = w.getSymName();
      if (!name.consume_back(".weight"))
        return false;
      module = name.str();
      StringRef last = name.rsplit('.').second.empty() ? name : name.rsplit('.').second;
      if (lora.allLinear)
        return last != "lm_head" && !w.getAliases() && !embeddings.contains(w.getSymName());
      return llvm::any_of(lora.targets, [&](const std::string &t) {
        return last == t || name.ends_with("." + t) || name == t;
      });
    };

    SmallVector<std::pair<Site, std::string>> sites;
    llvm::StringSet<> seen;
    std::string error;
    module.walk([&](bmt::AtenOp op) {
      std::optional<Site> site = siteOf(op, symbols, tensorParallel > 1);
      std::string path;
      if (!site || !targeted(site->weight, path))
        return;
      if (!seen.insert(path).second) {
        error = "the weight of " + path + " is used by more than one matmul (a shared weight), "
                "which bmt-lora does not adapt";
        return;
      }
      sites.push_back({*site, path});
    });
    if (!error.empty()) {
      module.emitError("bmt-lora: ") << error;
      return signalPassFailure();
    }
    if (sites.empty()) {
      module.emitError("bmt-lora: no linear layer matches targets '")
          << llvm::join(lora.targets, ",") << "' (module names such as q_proj, or all-linear)";
      return signalPassFailure();
    }
    // A target that adapts nothing (a misspelt name) is an error, as a
    // --freeze pattern that matches nothing is.
    if (!lora.allLinear)
      for (const std::string &t : lora.targets)
        if (llvm::none_of(sites, [&](const auto &s) {
              StringRef path = s.second;
              return path == t || path.ends_with("." + t);
            })) {
          module.emitError("bmt-lora: target '")
              << t << "' matches no linear layer (module names such as q_proj, or all-linear)";
          return signalPassFailure();
        }

    // With tensor parallelism, the adapters follow their base's split.
    SmallVector<AdapterSplits> splits;
    int64_t columns = 0, rows = 0;
    for (auto &[site, path] : sites) {
      splits.push_back(tensorParallel > 1 ? adapterSplits(site) : AdapterSplits());
      if (!splits.back().error.empty()) {
        module.emitError("bmt-lora: cannot adapt ") << path << " at --tensor-parallel "
                                                     << tensorParallel << ": "
                                                     << splits.back().error;
        return signalPassFailure();
      }
      columns += StringRef(splits.back().layout) == "column";
      rows += StringRef(splits.back().layout) == "row";
      // A column or row layer reads the whole sequence; a replicated one
      // may read this rank's part of it, whose mask no rank of T = 1 draws.
      if (sequenceParallel && lora.dropout > 0 && StringRef(splits.back().layout).starts_with("whole")) {
        module.emitError("bmt-lora: cannot adapt ")
            << path << " with dropout > 0 and --sequence-parallel: it is not split over the "
            << "tensor-parallel group, and its input may be this rank's part of the sequence "
            << "(give dropout=0, or targets without it)";
        return signalPassFailure();
      }
    }

    // Freeze the base first: only the adapters train.
    for (bmt::ParameterOp p : module.getOps<bmt::ParameterOp>())
      p.setRequiresGrad(false);

    MLIRContext *ctx = module.getContext();
    OpBuilder builder(ctx);
    Type tensor = bmt::TensorType::get(ctx);
    double scale = lora.alpha / static_cast<double>(lora.rank);
    int64_t added = 0;
    for (auto [i, entry] : llvm::enumerate(sites)) {
      auto &[site, path] = entry;
      Type element = cast<RankedTensorType>(site.weight.getType()).getElementType();
      auto makeParam = [&](StringRef suffix, ArrayRef<int64_t> shape, StringRef rule) {
        builder.setInsertionPointAfter(site.weight);
        auto p = bmt::ParameterOp::create(builder, site.weight.getLoc(),
                                          builder.getStringAttr(path + suffix),
                                          RankedTensorType::get(shape, element),
                                          /*requires_grad=*/true, /*aliases=*/nullptr);
        p->setAttr("bmt.generated_init", builder.getStringAttr(rule));
        added += 1;
        return p;
      };
      // B after A in the module (each inserted right after the base weight).
      bmt::ParameterOp b = makeParam(".lora_B.weight", {site.out, lora.rank}, "zeros");
      char text[64];
      std::snprintf(text, sizeof text, "uniform:%.17g", 1.0 / std::sqrt(double(site.in)));
      std::string bound = text;
      bmt::ParameterOp a = makeParam(".lora_A.weight", {lora.rank, site.in}, bound);
      if (!splits[i].a.isDefault())
        bmt::setParameterSplit(a, splits[i].a);
      if (!splits[i].b.isDefault())
        bmt::setParameterSplit(b, splits[i].b);

      Operation *op = site.op;
      builder.setInsertionPointAfter(op);
      Location loc = op->getLoc();
      Value aw = bmt::GetGlobalOp::create(builder, loc, tensor,
                                          FlatSymbolRefAttr::get(ctx, a.getSymName()));
      Value bw = bmt::GetGlobalOp::create(builder, loc, tensor,
                                          FlatSymbolRefAttr::get(ctx, b.getSymName()));
      Value y = op->getResult(0);
      // A row-parallel layer's input is this rank's part of its features.
      const int64_t inputParts = StringRef(splits[i].layout) == "row" ? tensorParallel : 1;
      Value sum = bmt::LoraAdapterOp::create(builder, loc, tensor, y, site.input, aw, bw,
                                             builder.getF64FloatAttr(scale),
                                             builder.getF64FloatAttr(lora.dropout),
                                             builder.getI64IntegerAttr(inputParts));
      y.replaceAllUsesExcept(sum, sum.getDefiningOp());
    }
    // What an adapter export needs (bmt-to-hf --adapter reads it from the
    // program text of sharded.pt): peft's LoraConfig fields.
    bool conv1d = llvm::any_of(sites, [](const auto &s) {
      return bmt::isAten(s.first.op, {AtenOpId::addmm, AtenOpId::mm});
    });
    SmallVector<std::string> modules;
    for (auto &[site, path] : sites) {
      std::string last = StringRef(path).rsplit('.').second.str();
      if (last.empty())
        last = path;
      if (!llvm::is_contained(modules, last))
        modules.push_back(last);
    }
    module->setAttr("bmt.lora",
                    builder.getDictionaryAttr(
                        {builder.getNamedAttr("r", builder.getI64IntegerAttr(lora.rank)),
                         builder.getNamedAttr("alpha", builder.getF64FloatAttr(lora.alpha)),
                         builder.getNamedAttr("dropout", builder.getF64FloatAttr(lora.dropout)),
                         builder.getNamedAttr("fan_in_fan_out", builder.getBoolAttr(conv1d)),
                         builder.getNamedAttr("target_modules",
                                              builder.getStringAttr(llvm::join(modules, ",")))}));
    emitRemark(module.getLoc()) << "bmt-lora: adapted " << sites.size()
                                << " linear layers (r=" << lora.rank << ", alpha=" << lora.alpha
                                << ", dropout=" << lora.dropout << "), " << added
                                << " trainable tensors; the base is frozen";
    if (tensorParallel > 1)
      emitRemark(module.getLoc()) << "bmt-lora: over --tensor-parallel " << tensorParallel << ": "
                                  << columns << " adapters of column-parallel layers (B split), "
                                  << rows << " of row-parallel ones (A split), "
                                  << sites.size() - columns - rows << " whole";
  }
};

} // namespace
