//===- Overlap.cpp - the bmt-overlap pass ---------------------------------===//
//
// Places bmt.all_gather (bounded prefetch, in block order) and, under
// ZeRO-3, bmt.release around the block calls, and gathers the groups
// outside the blocks at the start of @forward. See passes/Passes.td.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

#include <map>

namespace bmt {
#define GEN_PASS_DEF_OVERLAP
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;

namespace {

struct OverlapPass : bmt::impl::OverlapBase<OverlapPass> {
  using OverlapBase::OverlapBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (depth < 0) {
      module.emitError("bmt-overlap: depth must be 0 or positive, got ")
          << static_cast<int64_t>(depth);
      return signalPassFailure();
    }
    bool scheduled = module->hasAttr("bmt.overlap");
    module.walk([&](Operation *op) {
      if (isa<bmt::AllGatherOp, bmt::ReleaseOp>(op))
        scheduled = true;
      return scheduled ? WalkResult::interrupt() : WalkResult::advance();
    });
    if (scheduled) {
      module.emitError("bmt-overlap: the module is already scheduled (it has bmt.overlap "
                       "or bmt.all_gather/bmt.release ops); run the pass once");
      return signalPassFailure();
    }
    SmallVector<bmt::StorageGroupOp> groups(module.getOps<bmt::StorageGroupOp>());
    SmallVector<bmt::BlockListOp> lists(module.getOps<bmt::BlockListOp>());
    if (groups.empty()) {
      if (!lists.empty()) {
        module.emitError("bmt-overlap: the module has block lists but no storage groups; "
                         "run --bmt-zero before --bmt-overlap");
        return signalPassFailure();
      }
      emitRemark(module.getLoc())
          << "bmt-overlap: no storage groups; nothing to gather (run --bmt-zero first)";
      return;
    }
    int64_t stage = 3;
    if (auto zero = module->getAttrOfType<DictionaryAttr>("bmt.zero"))
      if (auto s = zero.getAs<IntegerAttr>("stage"))
        stage = s.getInt();

    SymbolTable symbols(module);
    auto entry = symbols.lookup<func::FuncOp>("forward");
    if (!entry || entry.getBody().empty()) {
      module.emitError("bmt-overlap: the module has no 'forward' function");
      return signalPassFailure();
    }

    // Groups per block (list name, index), in group order; and outside.
    std::map<std::pair<std::string, int64_t>, SmallVector<FlatSymbolRefAttr>> blockGroups;
    SmallVector<FlatSymbolRefAttr> outside;
    for (bmt::StorageGroupOp g : groups) {
      auto ref = FlatSymbolRefAttr::get(g.getSymNameAttr());
      if (auto block = g.getBlockAttr())
        blockGroups[{block.getValue().str(), *g.getBlockIndex()}].push_back(ref);
      else
        outside.push_back(ref);
    }

    OpBuilder builder(module.getContext());
    int64_t gathers = 0, releases = 0;
    for (bmt::BlockListOp list : lists) {
      auto caller = symbols.lookup<func::FuncOp>(list.getCaller());
      if (!caller) {
        list.emitError("bmt-overlap: the caller ") << list.getCallerAttr() << " is not a function";
        return signalPassFailure();
      }
      size_t n = list.getBlocks().size();
      SmallVector<func::CallOp> calls(n);
      bool bad = false;
      caller.walk([&](func::CallOp call) {
        auto ref = call->getAttrOfType<FlatSymbolRefAttr>("bmt.block");
        auto index = call->getAttrOfType<IntegerAttr>("bmt.block_index");
        if (!ref || ref.getValue() != list.getSymName())
          return;
        if (!index || index.getInt() < 0 || static_cast<size_t>(index.getInt()) >= n ||
            calls[index.getInt()])
          bad = true;
        else
          calls[index.getInt()] = call;
      });
      if (bad || llvm::any_of(calls, [](func::CallOp c) { return !c; })) {
        list.emitError("bmt-overlap: the calls of ")
            << list.getSymName() << " in " << list.getCallerAttr()
            << " do not match the list (one call per block, bmt.block_index 0.."
            << static_cast<int64_t>(n) - 1 << ")";
        return signalPassFailure();
      }
      auto groupsOf = [&](size_t i) -> ArrayRef<FlatSymbolRefAttr> {
        auto it = blockGroups.find({list.getSymName().str(), static_cast<int64_t>(i)});
        return it == blockGroups.end() ? ArrayRef<FlatSymbolRefAttr>() : it->second;
      };
      size_t issued = 0; // blocks [0, issued) have their gathers placed
      for (size_t i = 0; i < n; ++i) {
        builder.setInsertionPoint(calls[i]);
        size_t until = std::min<size_t>(n, i + static_cast<size_t>(depth) + 1);
        for (; issued < until; ++issued)
          for (FlatSymbolRefAttr g : groupsOf(issued)) {
            bmt::AllGatherOp::create(builder, calls[i].getLoc(), g);
            ++gathers;
          }
        if (stage == 3) {
          builder.setInsertionPointAfter(calls[i]);
          for (FlatSymbolRefAttr g : groupsOf(i)) {
            auto release = bmt::ReleaseOp::create(builder, calls[i].getLoc(), g);
            builder.setInsertionPointAfter(release);
            ++releases;
          }
        }
      }
    }
    builder.setInsertionPointToStart(&entry.getBody().front());
    for (FlatSymbolRefAttr g : outside)
      bmt::AllGatherOp::create(builder, entry.getLoc(), g);

    module->setAttr("bmt.overlap",
                    builder.getDictionaryAttr({builder.getNamedAttr(
                        "prefetch_depth", builder.getI64IntegerAttr(depth))}));
    emitRemark(module.getLoc()) << "bmt-overlap: prefetch depth " << static_cast<int64_t>(depth)
                                << ", ZeRO-" << stage << ": " << gathers
                                << " block all-gathers, " << releases << " releases, "
                                << outside.size() << " outside-block groups gathered in @forward";
  }
};

} // namespace
