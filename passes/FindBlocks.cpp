//===- FindBlocks.cpp - the bmt-find-blocks pass --------------------------===//
//
// Structural fingerprints: each function is reduced to a canonical string of
// its ops (names, attributes, types, operand numbering), in which parameter
// symbols are written relative to the function's module path (with their
// type) and callees by the id of their own fingerprint. Equal strings mean
// interchangeable layers. See passes/Passes.td for the contract.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/raw_ostream.h"

namespace bmt {
#define GEN_PASS_DEF_FINDBLOCKS
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;

namespace {

class Fingerprints {
public:
  Fingerprints(ModuleOp module) : module(module), symbols(module) {}

  /// A small integer naming the function's structure: equal ids, equal structure.
  unsigned id(func::FuncOp f) {
    auto it = ids.find(f);
    if (it != ids.end())
      return it->second;
    std::string text = fingerprint(f);
    auto [entry, inserted] = interned.try_emplace(text, interned.size());
    ids[f] = entry->second;
    return entry->second;
  }

  /// Whether `f` or anything it calls reads a parameter.
  bool usesParameters(func::FuncOp f) {
    auto it = usesParams.find(f);
    if (it != usesParams.end())
      return it->second;
    usesParams[f] = false; // cuts recursion
    bool uses = false;
    f.walk([&](Operation *op) {
      if (auto g = dyn_cast<bmt::GetGlobalOp>(op))
        uses |= isa_and_nonnull<bmt::ParameterOp>(symbols.lookup(g.getGlobal()));
      else if (auto call = dyn_cast<func::CallOp>(op))
        if (auto callee = symbols.lookup<func::FuncOp>(call.getCallee()))
          uses |= usesParameters(callee);
    });
    usesParams[f] = uses;
    return uses;
  }

  func::FuncOp lookup(StringRef name) { return symbols.lookup<func::FuncOp>(name); }

private:
  std::string fingerprint(func::FuncOp f) {
    std::string out;
    llvm::raw_string_ostream os(out);
    std::string prefix;
    if (auto path = f->getAttrOfType<StringAttr>("bmt.module_path"))
      prefix = path.getValue().empty() ? "" : path.getValue().str() + ".";
    llvm::DenseMap<Value, unsigned> numbers;
    auto number = [&](Value v) {
      auto [it, inserted] = numbers.try_emplace(v, numbers.size());
      return it->second;
    };
    os << f.getFunctionType() << "\n";
    if (f.getBody().empty())
      return out;
    for (BlockArgument arg : f.getBody().front().getArguments())
      number(arg);
    for (Operation &op : f.getBody().front()) {
      os << op.getName() << "(";
      for (Value operand : op.getOperands())
        os << number(operand) << ",";
      os << ")";
      if (auto call = dyn_cast<func::CallOp>(op)) {
        func::FuncOp callee = lookup(call.getCallee());
        os << " calls #" << (callee ? id(callee) : ~0u);
      } else if (auto g = dyn_cast<bmt::GetGlobalOp>(op)) {
        StringRef name = g.getGlobal();
        if (!prefix.empty() && name.starts_with(prefix))
          os << " ~" << name.drop_front(prefix.size()).str();
        else
          os << " @" << name.str(); // shared with something outside this module
        if (Operation *decl = symbols.lookup(name)) {
          if (auto p = dyn_cast<bmt::ParameterOp>(decl))
            os << " " << p.getType();
          else if (auto b = dyn_cast<bmt::BufferOp>(decl))
            os << " " << b.getType();
        }
      } else {
        for (NamedAttribute attr : op.getAttrs())
          if (!attr.getName().strref().starts_with("bmt."))
            os << " " << attr.getName().strref() << "=" << attr.getValue();
      }
      os << " ->";
      for (Value result : op.getResults()) {
        number(result);
        os << " " << result.getType();
      }
      os << "\n";
    }
    return out;
  }

  ModuleOp module;
  SymbolTable symbols;
  llvm::StringMap<unsigned> interned;
  llvm::DenseMap<Operation *, unsigned> ids;
  llvm::DenseMap<Operation *, bool> usesParams;
};

/// Whether `later` reads, directly or through ops of the same block, a
/// result of `earlier`.
bool dependsOn(Operation *later, Operation *earlier) {
  SmallVector<Value> work(later->getOperands().begin(), later->getOperands().end());
  llvm::DenseSet<Operation *> seen;
  while (!work.empty()) {
    Operation *def = work.pop_back_val().getDefiningOp();
    if (!def || def->getBlock() != earlier->getBlock() || !seen.insert(def).second)
      continue;
    if (def == earlier)
      return true;
    if (def->isBeforeInBlock(earlier))
      continue;
    work.append(def->getOperands().begin(), def->getOperands().end());
  }
  return false;
}

/// The longest common dotted prefix of module paths ("transformer.h.0",
/// "transformer.h.1" -> "transformer.h").
std::string commonModulePath(ArrayRef<std::string> paths) {
  if (paths.empty())
    return "";
  SmallVector<StringRef> common;
  StringRef(paths[0]).split(common, '.');
  for (const std::string &p : paths.drop_front()) {
    SmallVector<StringRef> parts;
    StringRef(p).split(parts, '.');
    size_t n = 0;
    while (n < common.size() && n < parts.size() && common[n] == parts[n])
      ++n;
    common.resize(n);
  }
  return llvm::join(common, ".");
}

struct FindBlocksPass : bmt::impl::FindBlocksBase<FindBlocksPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    Fingerprints prints(module);
    SymbolTable symbols(module);
    func::FuncOp entry = prints.lookup("forward");
    if (!entry) {
      module.emitError("bmt-find-blocks: the module has no 'forward' function");
      return signalPassFailure();
    }
    OpBuilder builder(module.getContext());
    int lists = 0;
    llvm::SetVector<Operation *> visited;
    SmallVector<func::FuncOp> work{entry};
    while (!work.empty()) {
      func::FuncOp f = work.pop_back_val();
      if (!visited.insert(f) || f.getBody().empty())
        continue;
      SmallVector<func::CallOp> calls;
      f.walk([&](func::CallOp call) { calls.push_back(call); });
      llvm::DenseSet<Operation *> inBlocks;
      for (size_t i = 0; i < calls.size();) {
        size_t j = i + 1;
        func::FuncOp first = prints.lookup(calls[i].getCallee());
        if (first && prints.usesParameters(first)) {
          llvm::DenseSet<Operation *> callees{first};
          while (j < calls.size()) {
            func::FuncOp next = prints.lookup(calls[j].getCallee());
            if (!next || !callees.insert(next).second ||
                prints.id(next) != prints.id(first) ||
                !dependsOn(calls[j], calls[j - 1]))
              break;
            ++j;
          }
        }
        if (j - i >= 2) {
          makeBlockList(module, symbols, builder, f, ArrayRef(calls).slice(i, j - i));
          ++lists;
          for (size_t k = i; k < j; ++k)
            inBlocks.insert(calls[k]);
        }
        i = j;
      }
      // Search the callees that are not blocks, in call order.
      for (func::CallOp call : llvm::reverse(calls))
        if (!inBlocks.contains(call))
          if (func::FuncOp callee = prints.lookup(call.getCallee()))
            work.push_back(callee);
    }
    if (lists == 0)
      emitRemark(module.getLoc())
          << "bmt-find-blocks: no repeated layers found; the model is one unit";
  }

  void makeBlockList(ModuleOp module, SymbolTable &symbols, OpBuilder &builder,
                     func::FuncOp caller, ArrayRef<func::CallOp> constCalls) {
    SmallVector<func::CallOp> calls(constCalls.begin(), constCalls.end());
    std::vector<std::string> paths;
    SmallVector<Attribute> blocks;
    for (func::CallOp call : calls) {
      func::FuncOp callee = symbols.lookup<func::FuncOp>(call.getCallee());
      auto path = callee->getAttrOfType<StringAttr>("bmt.module_path");
      paths.push_back(path ? path.str() : callee.getSymName().str());
      blocks.push_back(FlatSymbolRefAttr::get(callee.getSymNameAttr()));
    }
    std::string name = commonModulePath(paths);
    if (name.empty()) {
      auto path = caller->getAttrOfType<StringAttr>("bmt.module_path");
      name = (path && !path.getValue().empty() ? path.str() + "." : "") + "blocks";
    }
    std::string unique = name;
    for (int n = 1; symbols.lookup(unique); ++n)
      unique = name + "#" + std::to_string(n);

    // After the last global declaration, before the functions.
    Operation *anchor = nullptr;
    for (Operation &op : module.getBody()->getOperations())
      if (isa<bmt::ParameterOp, bmt::BufferOp, bmt::BlockListOp>(op))
        anchor = &op;
    if (anchor)
      builder.setInsertionPointAfter(anchor);
    else
      builder.setInsertionPointToStart(module.getBody());
    auto list = bmt::BlockListOp::create(builder, calls.front().getLoc(),
                                         builder.getStringAttr(unique),
                                         FlatSymbolRefAttr::get(caller.getSymNameAttr()),
                                         builder.getArrayAttr(blocks));
    symbols.insert(list);
    for (auto [index, call] : llvm::enumerate(calls)) {
      call->setAttr("bmt.block", FlatSymbolRefAttr::get(list.getSymNameAttr()));
      call->setAttr("bmt.block_index", builder.getI64IntegerAttr(index));
    }
    emitRemark(list.getLoc()) << "bmt-find-blocks: " << calls.size() << " blocks in "
                              << unique << " (" << paths.front() << " ... "
                              << paths.back() << ")";
  }
};

} // namespace
