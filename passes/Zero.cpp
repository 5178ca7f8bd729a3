//===- Zero.cpp - the bmt-zero pass ---------------------------------------===//
//
// Decides which storage group owns each parameter (the block whose call
// tree alone reads it, else "outside_blocks"), and lays each group out as a
// flat buffer with aligned offsets. See passes/Passes.td. Frozen parameters
// (requires_grad false) go to groups of their own ("<owner>.frozen.<dtype>",
// marked `frozen`), sharded and gathered like the others but never reduced.
// Parameters split over the expert group go to groups of their own
// ("<owner>.experts.<dtype>", local sizes), which the exporter writes once
// per expert group position (docs/sharded-format.md).
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/TensorSplit.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

#include <map>

namespace bmt {
#define GEN_PASS_DEF_ZERO
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;

namespace {

/// PyTorch's name of an element type ("float32").
std::string dtypeName(Type t) {
  if (t.isF32()) return "float32";
  if (t.isF16()) return "float16";
  if (t.isBF16()) return "bfloat16";
  if (t.isF64()) return "float64";
  std::string s;
  llvm::raw_string_ostream os(s);
  os << t;
  return s;
}

int64_t elementBytes(Type t) { return std::max<int64_t>(1, t.getIntOrFloatBitWidth() / 8); }

struct ZeroPass : bmt::impl::ZeroBase<ZeroPass> {
  using ZeroBase::ZeroBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (stage != 2 && stage != 3) {
      module.emitError("bmt-zero: stage must be 2 or 3, got ") << static_cast<int64_t>(stage);
      return signalPassFailure();
    }
    if (alignment <= 0 || (alignment & (alignment - 1)) != 0 || alignment % 8 != 0) {
      module.emitError("bmt-zero: alignment must be a power of two of at least 8 bytes, got ")
          << static_cast<int64_t>(alignment);
      return signalPassFailure();
    }
    if (shardGroupSize < 0) {
      module.emitError("bmt-zero: shard-group-size must be 0 or positive");
      return signalPassFailure();
    }
    if (!module.getOps<bmt::StorageGroupOp>().empty()) {
      module.emitError("bmt-zero: the module already has storage groups");
      return signalPassFailure();
    }
    SymbolTable symbols(module);

    // Which owners (block list + index, or none) read each parameter.
    using Owner = std::pair<Operation *, int64_t>; // {block list, index}; {nullptr, -1} outside
    llvm::DenseMap<Operation *, llvm::SetVector<Owner>> readers;
    llvm::DenseSet<Operation *> visiting;
    std::function<void(func::FuncOp, Owner)> visit = [&](func::FuncOp f, Owner owner) {
      if (!f || !visiting.insert(f).second)
        return;
      f.walk([&](Operation *op) {
        if (auto g = dyn_cast<bmt::GetGlobalOp>(op)) {
          if (auto p = symbols.lookup<bmt::ParameterOp>(g.getGlobal()))
            readers[p].insert(owner);
        } else if (auto call = dyn_cast<func::CallOp>(op)) {
          Owner calleeOwner = owner;
          if (auto list = call->getAttrOfType<FlatSymbolRefAttr>("bmt.block"))
            calleeOwner = {symbols.lookup(list.getValue()),
                           call->getAttrOfType<IntegerAttr>("bmt.block_index").getInt()};
          visit(symbols.lookup<func::FuncOp>(call.getCallee()), calleeOwner);
        }
      });
      visiting.erase(f);
    };
    func::FuncOp entry = symbols.lookup<func::FuncOp>("forward");
    if (!entry) {
      module.emitError("bmt-zero: the module has no 'forward' function");
      return signalPassFailure();
    }
    visit(entry, {nullptr, -1});

    // Groups in a fixed order: per block list, per block, per dtype; then outside.
    using GroupKey = std::tuple<Operation *, int64_t, std::string>;
    llvm::MapVector<GroupKey, SmallVector<bmt::ParameterOp>, std::map<GroupKey, unsigned>>
        groups;
    SmallVector<bmt::ParameterOp> params(module.getOps<bmt::ParameterOp>());
    if (!params.empty() &&
        llvm::none_of(params, [](bmt::ParameterOp p) { return p.getRequiresGrad(); })) {
      module.emitError("bmt-zero: every parameter is frozen (requires_grad false in the trace "
                       "or --freeze), so there is nothing to train");
      return signalPassFailure();
    }
    int64_t shared = 0;
    for (bmt::ParameterOp p : params) {
      Type element = cast<RankedTensorType>(p.getType()).getElementType();
      auto it = readers.find(p);
      Owner owner{nullptr, -1};
      if (it != readers.end() && it->second.size() == 1)
        owner = it->second.front();
      else if (it != readers.end() && it->second.size() > 1 && it->second.front().first)
        ++shared;
      const bool experts = bmt::parameterSplitOf(p).isExpertSplit();
      groups[{owner.first, owner.second,
              std::string(experts ? "experts." : "") + (p.getRequiresGrad() ? "" : "frozen.") +
                  dtypeName(element)}]
          .push_back(p);
    }
    // Blocks first (list order, index order), outside last.
    SmallVector<GroupKey> order;
    for (auto &entry : groups)
      order.push_back(entry.first);
    llvm::stable_sort(order, [](const GroupKey &a, const GroupKey &b) {
      bool aOutside = !std::get<0>(a), bOutside = !std::get<0>(b);
      if (aOutside != bOutside)
        return bOutside;
      return std::get<1>(a) < std::get<1>(b);
    });

    OpBuilder builder(module.getContext());
    Operation *anchor = nullptr;
    for (Operation &op : module.getBody()->getOperations())
      if (isa<bmt::ParameterOp, bmt::BufferOp, bmt::BlockListOp>(op))
        anchor = &op;
    int64_t blockGroups = 0, outsideBytes = 0, blockBytes = 0, frozenGroups = 0, frozenBytes = 0;
    for (const GroupKey &key : order) {
      auto [list, index, dtype] = key;
      SmallVector<bmt::ParameterOp> &members = groups[key];
      const bool frozen = !members.front().getRequiresGrad();
      Type element = cast<RankedTensorType>(members.front().getType()).getElementType();
      SmallVector<Attribute> refs;
      for (bmt::ParameterOp p : members)
        refs.push_back(FlatSymbolRefAttr::get(p.getSymNameAttr()));
      // (A TP rank's slices with T > 1.)
      const bmt::StorageLayout layout = bmt::storageLayout(members, alignment);
      const SmallVector<int64_t> &offsets = layout.offsets;
      const int64_t size = layout.size;
      std::string name;
      if (list) {
        auto blockList = cast<bmt::BlockListOp>(list);
        auto fn = symbols.lookup<func::FuncOp>(
            cast<FlatSymbolRefAttr>(blockList.getBlocks()[index]).getValue());
        auto path = fn->getAttrOfType<StringAttr>("bmt.module_path");
        name = (path ? path.str() : blockList.getSymName().str() + "." + std::to_string(index)) +
               "." + dtype;
      } else {
        name = "outside_blocks." + dtype;
      }
      const int64_t bytes = size * elementBytes(element);
      if (frozen) {
        ++frozenGroups;
        frozenBytes += bytes;
      } else if (list) {
        ++blockGroups;
        blockBytes += bytes;
      } else {
        outsideBytes += bytes;
      }
      if (anchor)
        builder.setInsertionPointAfter(anchor);
      else
        builder.setInsertionPointToStart(module.getBody());
      auto group = bmt::StorageGroupOp::create(
          builder, module.getLoc(), builder.getStringAttr(name), TypeAttr::get(element),
          builder.getArrayAttr(refs), builder.getDenseI64ArrayAttr(offsets),
          builder.getI64IntegerAttr(size), builder.getI64IntegerAttr(alignment),
          list ? FlatSymbolRefAttr::get(cast<bmt::BlockListOp>(list).getSymNameAttr())
               : FlatSymbolRefAttr(),
          list ? builder.getI64IntegerAttr(index) : IntegerAttr(),
          frozen ? builder.getUnitAttr() : UnitAttr());
      symbols.insert(group);
      anchor = group;
    }
    module->setAttr("bmt.zero",
                    builder.getDictionaryAttr(
                        {builder.getNamedAttr("stage", builder.getI64IntegerAttr(stage)),
                         builder.getNamedAttr("shard_group_size",
                                              builder.getI64IntegerAttr(shardGroupSize))}));
    InFlightDiagnostic remark = emitRemark(module.getLoc());
    remark << "bmt-zero: ZeRO-" << static_cast<int64_t>(stage) << ", " << blockGroups << " block storage groups ("
           << blockBytes << " bytes), " << (groups.size() - blockGroups - frozenGroups)
           << " outside blocks (" << outsideBytes << " bytes)";
    if (frozenGroups)
      remark << ", " << frozenGroups << " of frozen parameters (" << frozenBytes << " bytes)";
    if (shared)
      remark << "; " << shared << " parameters shared by several blocks kept outside";
  }
};

} // namespace
