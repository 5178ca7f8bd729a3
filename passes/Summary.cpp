//===- Summary.cpp - the bmt-summary pass ---------------------------------===//
//
// Prints counts of parameters, ties, buffers, functions and ops; changes
// nothing. See passes/Passes.td for the output format.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

namespace bmt {
#define GEN_PASS_DEF_SUMMARY
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;

namespace {

/// Bytes of one element of a parameter's element type (i1 is one byte, as in PyTorch).
int64_t elementBytes(Type type) {
  unsigned bits = type.getIntOrFloatBitWidth();
  return bits < 8 ? 1 : bits / 8;
}

std::string formatBytes(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  std::string out;
  llvm::raw_string_ostream os(out);
  os << llvm::format(unit ? "%.1f %s" : "%.0f %s", value, units[unit]);
  return out;
}

struct SummaryPass : bmt::impl::SummaryBase<SummaryPass> {
  using SummaryBase::SummaryBase;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    int64_t elements = 0, bytes = 0, tensors = 0, buffers = 0;
    int64_t functions = 0, calls = 0, atenOps = 0;
    SmallVector<std::string> ties;
    for (Operation &op : module.getBody()->getOperations()) {
      if (auto p = dyn_cast<bmt::ParameterOp>(op)) {
        auto type = cast<RankedTensorType>(p.getType());
        ++tensors;
        elements += type.getNumElements();
        bytes += type.getNumElements() * elementBytes(type.getElementType());
        if (auto aliases = p.getAliases()) {
          std::string tie = p.getSymName().str();
          for (Attribute alias : *aliases)
            tie += " = " + cast<StringAttr>(alias).getValue().str();
          ties.push_back(tie);
        }
      } else if (isa<bmt::BufferOp>(op)) {
        ++buffers;
      } else if (auto f = dyn_cast<func::FuncOp>(op)) {
        ++functions;
        f.walk([&](Operation *inner) {
          calls += isa<func::CallOp>(inner);
          atenOps += isa<bmt::AtenOp>(inner);
        });
      }
    }
    llvm::raw_ostream &os = llvm::errs();
    os << "bmt summary";
    if (auto source = module->getAttrOfType<StringAttr>("bmt.source"))
      os << " of " << source.getValue();
    os << "\n  parameters: " << elements << " elements in " << tensors
       << " tensors (" << formatBytes(bytes) << ")\n";
    os << "  tied: " << ties.size();
    if (!ties.empty()) {
      os << " (";
      llvm::interleave(ties, os, "; ");
      os << ")";
    }
    os << "\n  buffers: " << buffers << " tensors\n";
    for (auto list : module.getOps<bmt::BlockListOp>())
      os << "  blocks: " << list.getBlocks().size() << " in " << list.getSymName() << "\n";
    int64_t groupBytes = 0, groups = 0, largestBlockBytes = 0, fp32StateBytes = 0;
    llvm::DenseMap<std::pair<Attribute, int64_t>, int64_t> blockBytes;
    for (auto group : module.getOps<bmt::StorageGroupOp>()) {
      int64_t bytes = group.getSize() * elementBytes(group.getElementType());
      groupBytes += bytes;
      ++groups;
      // fp32 AdamW state (exp_avg, exp_avg_sq), and fp32 master weights
      // for groups of another dtype.
      fp32StateBytes += group.getSize() * 4 * (group.getElementType().isF32() ? 2 : 3);
      if (auto block = group.getBlockAttr()) {
        int64_t &b = blockBytes[{block, *group.getBlockIndex()}];
        b += bytes;
        largestBlockBytes = std::max(largestBlockBytes, b);
      }
    }
    if (groups) {
      os << "  storage groups: " << groups << " (" << formatBytes(groupBytes) << ", "
         << groupBytes << " bytes)";
      if (worldSize > 0) {
        // Each rank keeps 1/N of the parameters, their gradients and the
        // optimizer state, plus one gathered block at a time.
        int64_t n = worldSize;
        int64_t perRank = (2 * groupBytes + fp32StateBytes + n - 1) / n + largestBlockBytes;
        os << "; per rank at world size " << n << ": about " << formatBytes(perRank) << " ("
           << perRank << " bytes: parameter, gradient and optimizer shards, one gathered block)";
      }
      os << "\n";
    }
    os << "  functions: " << functions << ", calls: " << calls
       << ", aten ops: " << atenOps << "\n";
    markAllAnalysesPreserved();
  }
};

} // namespace
