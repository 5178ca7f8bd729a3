//===- FindBlocks.cpp - the bmt-find-blocks pass --------------------------===//
//
// Structural fingerprints: each function is reduced to a canonical string of
// its ops (names, attributes, types, operand numbering), in which parameter
// symbols are written relative to the function's module path (with their
// type) and callees by the id of their own fingerprint. Equal strings mean
// interchangeable layers. A second, weaker rule groups the calls of one
// module list (same module type, consecutive indices under one path) whose
// structures differ, as T5's first block differs from the others; it applies
// only where it groups more calls than the structural rule. See
// passes/Passes.td for the contract.
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

#include <optional>

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

/// Whether an op reads only its operands' shapes (aten::size, dim, numel).
bool readsOnlyShape(Operation *op) {
  auto aten = dyn_cast<bmt::AtenOp>(op);
  if (!aten)
    return false;
  StringRef name = aten.getName();
  // (torch.export's sym_size is imported as aten::size.)
  return name.starts_with("aten::size") || name == "aten::dim" || name == "aten::numel";
}

/// Whether `later` reads, directly or through ops of the same block, a
/// result of `earlier`'s values; not through a shape (GPT-2's position
/// embedding reads arange(size(token embedding)): the two embeddings are
/// no chain of layers).
bool dependsOn(Operation *later, Operation *earlier) {
  SmallVector<Value> work(later->getOperands().begin(), later->getOperands().end());
  llvm::DenseSet<Operation *> seen;
  while (!work.empty()) {
    Operation *def = work.pop_back_val().getDefiningOp();
    if (!def || def->getBlock() != earlier->getBlock() || !seen.insert(def).second)
      continue;
    if (def == earlier)
      return true;
    if (def->isBeforeInBlock(earlier) || readsOnlyShape(def))
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

/// Which rule made a block list (named in the remark).
enum class Rule { Structure, ModuleList };

/// The end of the run of calls from `calls[i]` under the structural rule:
/// distinct callees with the same fingerprint, which use parameters, each
/// call consuming a result of the previous one. `i + 1` when there is no run.
size_t structuralRun(Fingerprints &prints, MutableArrayRef<func::CallOp> calls, size_t i) {
  size_t j = i + 1;
  func::FuncOp first = prints.lookup(calls[i].getCallee());
  if (!first || !prints.usesParameters(first))
    return j;
  llvm::DenseSet<Operation *> callees{first};
  while (j < calls.size()) {
    func::FuncOp next = prints.lookup(calls[j].getCallee());
    if (!next || !callees.insert(next).second || prints.id(next) != prints.id(first) ||
        !dependsOn(calls[j], calls[j - 1]))
      break;
    ++j;
  }
  return j;
}

/// A module path "P.k" whose last component is a decimal index k (an element
/// of a ModuleList or Sequential P): P and k.
std::optional<std::pair<StringRef, uint64_t>> indexedPath(func::FuncOp f) {
  auto attr = f->getAttrOfType<StringAttr>("bmt.module_path");
  if (!attr)
    return std::nullopt;
  StringRef path = attr.getValue();
  size_t dot = path.rfind('.');
  StringRef parent = dot == StringRef::npos ? StringRef() : path.take_front(dot);
  StringRef last = dot == StringRef::npos ? path : path.drop_front(dot + 1);
  uint64_t index;
  if (last.empty() || !llvm::all_of(last, llvm::isDigit) || last.getAsInteger(10, index))
    return std::nullopt;
  return std::make_pair(parent, index);
}

/// The end of the run of calls from `calls[i]` under the module-list rule:
/// distinct callees that use parameters, carry the same non-empty
/// `bmt.module_type`, and whose module paths are P.k, P.(k+1), ... under the
/// same P, each call consuming a result of the previous one. Their
/// structures may differ. `i + 1` when there is no run.
size_t moduleListRun(Fingerprints &prints, MutableArrayRef<func::CallOp> calls, size_t i) {
  size_t j = i + 1;
  func::FuncOp first = prints.lookup(calls[i].getCallee());
  if (!first || !prints.usesParameters(first))
    return j;
  auto type = first->getAttrOfType<StringAttr>("bmt.module_type");
  auto start = indexedPath(first);
  if (!type || type.getValue().empty() || !start)
    return j;
  llvm::DenseSet<Operation *> callees{first};
  while (j < calls.size()) {
    func::FuncOp next = prints.lookup(calls[j].getCallee());
    if (!next || !callees.insert(next).second ||
        next->getAttrOfType<StringAttr>("bmt.module_type") != type ||
        !prints.usesParameters(next) || !dependsOn(calls[j], calls[j - 1]))
      break;
    auto at = indexedPath(next);
    if (!at || at->first != start->first || at->second != start->second + (j - i))
      break;
    ++j;
  }
  return j;
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
        // The structural rule first; the module-list rule only where it
        // groups more calls from the same start (so that every model whose
        // layers are identical keeps exactly the structural lists).
        size_t j = structuralRun(prints, calls, i);
        Rule rule = Rule::Structure;
        size_t listEnd = moduleListRun(prints, calls, i);
        if (listEnd > j && listEnd - i >= 2) {
          j = listEnd;
          rule = Rule::ModuleList;
        }
        if (j - i >= 2) {
          makeBlockList(module, symbols, builder, prints, f,
                        ArrayRef(calls).slice(i, j - i), rule);
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
                     Fingerprints &prints, func::FuncOp caller,
                     ArrayRef<func::CallOp> constCalls, Rule rule) {
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
    InFlightDiagnostic remark = emitRemark(list.getLoc());
    remark << "bmt-find-blocks: " << calls.size() << " blocks in " << unique << " ("
           << paths.front() << " ... " << paths.back() << ")";
    if (rule == Rule::Structure) {
      remark << ", rule: identical structure";
      return;
    }
    // The blocks whose structure is not the most common one (on a tie, the
    // last block's): T5's block 0, which owns the relative attention bias.
    llvm::DenseMap<unsigned, unsigned> counts;
    SmallVector<unsigned> ids;
    for (func::CallOp call : calls) {
      ids.push_back(prints.id(prints.lookup(call.getCallee())));
      ++counts[ids.back()];
    }
    unsigned common = ids.back();
    for (unsigned id : ids)
      if (counts[id] > counts[common])
        common = id;
    SmallVector<std::string> differ;
    for (auto [index, id] : llvm::enumerate(ids))
      if (id != common)
        differ.push_back(paths[index]);
    func::FuncOp first = prints.lookup(calls.front().getCallee());
    remark << ", rule: module list of "
           << first->getAttrOfType<StringAttr>("bmt.module_type").getValue();
    if (!differ.empty())
      remark << " (structure differs: " << llvm::join(differ, ", ") << ")";
  }
};

} // namespace
