//===- TensorParallelReport.cpp - bmt-tensor-parallel's remarks -----------===//
//
// The text of bmt-tensor-parallel's remarks: what was split, and how each
// whole parameter's gradient is completed. See TensorParallelChains.h.
//
//===----------------------------------------------------------------------===//

#include "TensorParallelChains.h"

#include "bmt/Dialect/TensorSplit.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringExtras.h"

#include <functional>

using namespace mlir;

namespace bmt::tp {

std::string describe(Operation *op) {
  std::string s;
  llvm::raw_string_ostream os(s);
  if (auto aten = dyn_cast<bmt::AtenOp>(op))
    os << aten.getName();
  else
    os << op->getName();
  if (auto f = op->getParentOfType<func::FuncOp>())
    os << " in " << f.getSymName();
  return s;
}

/// "model.layers.0.mlp.down_proj.weight" -> "mlp.down_proj" (the module
/// path of the matmul's weight relative to its block).
std::string shortName(ModuleOp module, SymbolTable &symbols, bmt::ParameterOp p) {
  StringRef name = p.getSymName();
  name.consume_back(".weight");
  for (auto list : module.getOps<bmt::BlockListOp>())
    for (Attribute b : list.getBlocks()) {
      auto f = symbols.lookup<func::FuncOp>(cast<FlatSymbolRefAttr>(b).getValue());
      auto path = f ? f->getAttrOfType<StringAttr>("bmt.module_path") : nullptr;
      if (path && name.starts_with((path.getValue() + ".").str()))
        return name.drop_front(path.size() + 1).str();
    }
  return name.str();
}

std::string chainReport(ModuleOp module, SymbolTable &symbols, int64_t tensorParallel,
                        llvm::ArrayRef<Chain> chains, llvm::ArrayRef<ChainError> skipped,
                        const std::string &vocab, const std::string &sequence) {
  // The chains of the first block describe every block (find-blocks
  // made them identical).
  auto firstList = *module.getOps<bmt::BlockListOp>().begin();
  auto first = symbols.lookup<func::FuncOp>(
      cast<FlatSymbolRefAttr>(firstList.getBlocks()[0]).getValue());
  llvm::DenseSet<Operation *> firstFuncs;
  std::function<void(func::FuncOp)> visit = [&](func::FuncOp f) {
    if (!f || !firstFuncs.insert(f).second)
      return;
    f.walk([&](func::CallOp call) { visit(symbols.lookup<func::FuncOp>(call.getCallee())); });
  };
  visit(first);
  int64_t blocks = 0;
  for (auto list : module.getOps<bmt::BlockListOp>())
    blocks += list.getBlocks().size();
  std::string text;
  llvm::raw_string_ostream os(text);
  os << blocks
     << " blocks, " << chains.size() << " chains: ";
  bool firstChain = true;
  int64_t ops = 0;
  for (const Chain &chain : chains) {
    ops += chain.ops;
    if (!firstFuncs.count(chain.columns.front().op->getParentOfType<func::FuncOp>()))
      continue;
    if (!firstChain)
      os << "; ";
    firstChain = false;
    llvm::SmallVector<std::string> cols;
    for (const MatmulSite &c : chain.columns)
      cols.push_back(shortName(module, symbols, c.weight));
    os << llvm::join(cols, ", ") << " column-parallel";
    int64_t T = tensorParallel;
    if (chain.headsGlobal)
      os << " by heads (" << chain.headsGlobal << " -> " << chain.headsGlobal / T
         << " per rank" << (chain.fused ? ", fused q/k/v" : "");
    if (chain.headsGlobal && chain.kvHeads < chain.headsGlobal)
      os << ", kv heads " << chain.kvHeads << " -> " << chain.kvHeads / T;
    if (chain.headsGlobal)
      os << ")";
    else
      os << " (" << chain.columnWidth << " -> " << chain.columnWidth / T << " per rank)";
    if (!chain.replicated.empty()) {
      llvm::SmallVector<std::string> kv;
      for (const MatmulSite &c : chain.replicated)
        kv.push_back(shortName(module, symbols, c.weight));
      int64_t heads = chain.replicatedKvHeads;
      os << ", " << llvm::join(kv, ", ") << " k/v replicated on " << T << " ranks (" << heads
         << (heads == 1 ? " kv head" : " kv heads")
         << (heads < T ? " < T = " : " not divisible by T = ") << T << "), reduce_grad";
    }
    llvm::SmallVector<std::string> rows;
    for (const MatmulSite &r : chain.rows)
      rows.push_back(shortName(module, symbols, r.weight));
    os << ", " << llvm::join(rows, ", ") << " row-parallel";
  }
  os << "; " << vocab;
  if (!sequence.empty())
    os << "; " << sequence;
  os << "; " << ops << " ops split; " << skipped.size() << " chains replicated";
  if (!skipped.empty())
    os << " (first: " << describe(skipped.front().op) << ": " << skipped.front().message << ")";
  return text;
}

/// The decision for each whole parameter, after sequence parallelism
/// (which sums the gradients of the parameters it reads between the
/// chains), for the remark.
std::string gradientReport(ModuleOp module, SymbolTable &symbols,
                           llvm::ArrayRef<ParameterGradient> gradients) {
  llvm::SmallVector<std::string> summed;
  int64_t identical = 0, count = 0, sequence = 0;
  for (const ParameterGradient &g : gradients) {
    bmt::ParameterOp param = g.param;
    if (g.completion == Completion::Identical) {
      ++(bmt::parameterSplitOf(param).reduceGrad ? sequence : identical);
      continue;
    }
    ++count;
    std::string name = shortName(module, symbols, param);
    if (param.getSymName().ends_with(".weight") && !StringRef(name).ends_with(".weight"))
      name += ".weight";
    if (!llvm::is_contained(summed, name))
      summed.push_back(name);
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "bmt-tensor-parallel: gradient completion: " << count
     << " whole parameters read beside split values, each rank's gradient a partial sum, reduce_grad";
  if (count)
    os << " (" << llvm::join(summed, ", ") << ")";
  if (sequence)
    os << "; " << sequence << " read between the chains, split along the sequence, reduce_grad";
  os << "; " << identical << " whole parameters identical on every rank";
  return text;
}

} // namespace bmt::tp
