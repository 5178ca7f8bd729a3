//===- TorchExportImporter.cpp - torch.export .pt2 -> bmt dialect ---------===//
//
// An ExportedProgram is one flat graph of ATen nodes whose parameters,
// buffers and constants are lifted to graph inputs (named by the graph
// signature). The module tree survives only as each node's nn_module_stack
// metadata; the importer rebuilds it:
//
//  1. flatten: drop bookkeeping nodes (_assert_tensor_metadata, ...), inline
//     the bodies of wrap_with_set_grad_enabled (rotary embeddings), and give
//     every node its module stack;
//  2. regions: consecutive nodes under the same module path form one region
//     (a call of that submodule), nested as the stacks nest;
//  3. boundaries: a value defined outside a region and used inside is an
//     argument of it, a value defined inside and used after it a result;
//     parameters/buffers are not passed (each function reads them by
//     bmt.get_global, as TorchScript imports do);
//  4. emission: one func.func per region, func.call where a region sits in
//     its parent, bmt.aten per node with every schema argument (defaults
//     from LibTorch's registered schema); symbolic scalars (dynamic shapes:
//     sizes, `_operator.*` / `torch.sym_*` arithmetic on them) become i64,
//     f64 and i1 values computed as a trace computes them (see emitSymOp).
//
// All LibTorch and JSON work happens inside importTorchExport's try block;
// errors travel as ImportError and become exactly one diagnostic.
//
//===----------------------------------------------------------------------===//

#include "bmt/Import/TorchExport.h"

#include "../IValueConstants.h"
#include "../InputFile.h"

#include "Pt2Archive.h"

#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Support/ErrorText.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace mlir;
using json = nlohmann::json;
namespace pt2 = bmt::pt2;

namespace {

struct ImportError {
  Location loc;
  std::string message;
};

struct ModuleFrame {
  std::string path; // dotted, "" for the root
  std::string type; // Python class
};

struct FlatNode {
  const json *node;
  std::vector<ModuleFrame> stack; // without the root
};

struct Region {
  std::string path, type, symbol;
  Region *parent = nullptr;
  int depth = 0;
  // Items in order: a node index (>= 0) or a child region (-1 - child index).
  std::vector<int> items;
  std::vector<std::unique_ptr<Region>> children;
  std::vector<std::string> args, results;
  func::FuncOp func;
};

/// The innermost Python frame of a stack_trace: (file, line).
std::pair<std::string, int> innermostFrame(const std::string &trace) {
  size_t pos = trace.rfind("File \"");
  if (pos == std::string::npos)
    return {"", 0};
  size_t start = pos + 6, end = trace.find('"', start);
  if (end == std::string::npos)
    return {"", 0};
  std::string file = trace.substr(start, end - start);
  size_t line = trace.find(", line ", end);
  if (line == std::string::npos)
    return {file, 0};
  return {file, std::atoi(trace.c_str() + line + 7)};
}

/// "L__self__,,T;L__self__transformer,transformer,T2" -> frames (root dropped).
std::vector<ModuleFrame> parseModuleStack(const std::string &text,
                                          std::string &rootType) {
  std::vector<ModuleFrame> frames;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    std::string entry = text.substr(start, end == std::string::npos ? std::string::npos
                                                                    : end - start);
    size_t first = entry.find(','), last = entry.rfind(',');
    // torch.export marks nodes it made outside any module (the sym_size of
    // a dynamic input) with this placeholder: they belong to the root.
    bool placeholder = entry.rfind("_empty_nn_module_stack_from_metadata_hook", 0) == 0;
    if (!placeholder && first != std::string::npos && last != first) {
      ModuleFrame f{entry.substr(first + 1, last - first - 1), entry.substr(last + 1)};
      // Normalise "h[0]" / "L['self'].h.0" forms to dotted paths.
      std::string p;
      for (char c : f.path)
        p += c == '[' ? '.' : c;
      p.erase(std::remove(p.begin(), p.end(), ']'), p.end());
      if (p.rfind("L.'self'.", 0) == 0)
        p = p.substr(9);
      f.path = p;
      if (f.path.empty())
        rootType = f.type;
      else
        frames.push_back(f);
    }
    if (end == std::string::npos)
      break;
    start = end + 1;
  }
  return frames;
}

class TorchExportImporter {
public:
  TorchExportImporter(MLIRContext &context, std::string path, pt2::Archive &archive)
      : context(context), builder(&context), path(std::move(path)),
        archive(archive) {}

  OwningOpRef<ModuleOp> run(const json &program);

private:
  void collectGlobals(const json &graph, const json &signature);
  void flattenGraph(const json &graph, const std::vector<ModuleFrame> *outer);
  void buildRegions();
  void computeBoundaries(const std::vector<std::string> &graphOutputs);
  func::FuncOp emitRegion(Region &region, const std::vector<std::string> *argNames,
                          const std::vector<std::string> *resultNames);
  void emitNode(const FlatNode &flat, std::map<std::string, Value> &values,
                std::map<std::string, Value> &globals, const std::string &fn);
  bool emitSymOp(const json &node, std::map<std::string, Value> &values,
                 std::map<std::string, Value> &globals, const std::string &fn);
  void dropUnusedSymbolicNodes(const std::vector<std::string> &graphOutputs);
  Value valueOf(const std::string &name, std::map<std::string, Value> &values,
                std::map<std::string, Value> &globals, Location loc,
                const std::string &fn);
  Attribute convertArg(const json &arg, SmallVectorImpl<Value> &operands,
                       std::map<std::string, Value> &values,
                       std::map<std::string, Value> &globals, Location loc,
                       const std::string &fn);
  Attribute convertIValue(const c10::IValue &value, Location loc);
  RankedTensorType tensorType(int serdeDtype, const std::vector<int64_t> &sizes,
                              Location loc, const std::string &what);
  Location locationOf(const json &node);
  std::string resolve(std::string name) const {
    for (auto it = rename.find(name); it != rename.end(); it = rename.find(name))
      name = it->second;
    return name;
  }
  static std::vector<std::string> tensorUses(const json &node);
  static std::vector<std::string> tensorDefs(const json &node);

  [[noreturn]] void fail(Location loc, const std::string &message) {
    throw ImportError{loc, path + ": " + message};
  }
  [[noreturn]] void failAt(const json &node, const std::string &fn,
                           const std::string &message) {
    std::string defs;
    for (const std::string &d : tensorDefs(node))
      defs += (defs.empty() ? "%" : ", %") + d;
    std::string uses;
    for (const std::string &u : tensorUses(node))
      uses += (uses.empty() ? "%" : ", %") + u;
    fail(locationOf(node), message + " (node `" + (defs.empty() ? "" : defs + " = ") +
                               node.value("target", std::string("?")) + "(" + uses +
                               ")` in function '" + fn + "')");
  }

  MLIRContext &context;
  OpBuilder builder;
  std::string path;
  pt2::Archive &archive;
  ModuleOp moduleOp;

  std::map<std::string, std::string> rename;
  std::map<std::string, std::string> globalOfInput;  // graph input -> symbol
  std::map<std::string, Attribute> constantOfInput;  // lifted constants
  std::vector<std::string> userInputs;
  std::string rootType;
  std::vector<FlatNode> nodes;
  std::unique_ptr<Region> root;
  std::set<std::string> usedSymbols;
  // Symbolic scalars by value name: i64 (SymInt), f64 (SymFloat), i1 (SymBool).
  std::map<std::string, Type> symTypes;
};

//===----------------------------------------------------------------------===//

Location TorchExportImporter::locationOf(const json &node) {
  if (node.contains("metadata") && node["metadata"].contains("stack_trace")) {
    auto [file, line] = innermostFrame(node["metadata"]["stack_trace"].get<std::string>());
    if (!file.empty())
      return FileLineColLoc::get(&context, file, line, 1);
  }
  return FileLineColLoc::get(&context, path, 0, 0);
}

RankedTensorType TorchExportImporter::tensorType(int serdeDtype,
                                                 const std::vector<int64_t> &sizes,
                                                 Location loc,
                                                 const std::string &what) {
  Type element;
  switch (serdeDtype) {
  case 7: element = builder.getF32Type(); break;
  case 6: element = builder.getF16Type(); break;
  case 13: element = builder.getBF16Type(); break;
  case 8: element = builder.getF64Type(); break;
  case 5: element = builder.getI64Type(); break;
  case 4: element = builder.getI32Type(); break;
  case 3: element = builder.getIntegerType(16); break;
  case 2: element = builder.getIntegerType(8); break;
  case 1: element = builder.getIntegerType(8, /*isSigned=*/false); break;
  case 12: element = builder.getI1Type(); break;
  default:
    fail(loc, "tensor of unsupported dtype " + std::to_string(serdeDtype) +
                  " (torch.export ScalarType) (" + what + ")");
  }
  return RankedTensorType::get(sizes, element);
}

std::vector<std::string> TorchExportImporter::tensorUses(const json &node) {
  std::vector<std::string> out;
  if (!node.contains("inputs"))
    return out;
  for (const json &input : node["inputs"]) {
    const json &arg = input["arg"];
    if (arg.contains("as_tensor"))
      out.push_back(arg["as_tensor"]["name"]);
    else if (arg.contains("as_tensors"))
      for (const json &t : arg["as_tensors"])
        out.push_back(t["name"]);
    else if (arg.contains("as_optional_tensors")) {
      for (const json &t : arg["as_optional_tensors"])
        if (t.contains("as_tensor"))
          out.push_back(t["as_tensor"]["name"]);
    } else {
      // Symbolic scalars (dynamic shapes) are values too.
      for (const char *kind : {"as_sym_int", "as_sym_float", "as_sym_bool"})
        if (arg.contains(kind) && arg[kind].contains("as_name"))
          out.push_back(arg[kind]["as_name"]);
      for (const char *kind : {"as_sym_ints", "as_sym_floats", "as_sym_bools"})
        if (arg.contains(kind))
          for (const json &e : arg[kind])
            if (e.is_object() && e.contains("as_name"))
              out.push_back(e["as_name"]);
    }
  }
  return out;
}

std::vector<std::string> TorchExportImporter::tensorDefs(const json &node) {
  std::vector<std::string> out;
  if (!node.contains("outputs"))
    return out;
  for (const json &o : node["outputs"]) {
    if (o.contains("as_tensor"))
      out.push_back(o["as_tensor"]["name"]);
    else if (o.contains("as_tensors"))
      for (const json &t : o["as_tensors"])
        out.push_back(t["name"]);
    else
      for (const char *kind : {"as_sym_int", "as_sym_float", "as_sym_bool"})
        if (o.contains(kind) && o[kind].contains("as_name"))
          out.push_back(o[kind]["as_name"]);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Parameters, buffers, constants
//===----------------------------------------------------------------------===//

void TorchExportImporter::collectGlobals(const json &graph, const json &signature) {
  Location loc = FileLineColLoc::get(&context, path, 0, 0);
  const json &metas = graph.at("tensor_values");
  using Key = std::tuple<std::string, int64_t, std::vector<int64_t>,
                         std::vector<int64_t>, int>;
  std::map<Key, Operation *> globalOfStorage;
  builder.setInsertionPointToEnd(moduleOp.getBody());

  auto add = [&](const std::string &arg, const std::string &name, bool isParameter,
                 bool persistent) {
    if (!metas.contains(arg))
      fail(loc, "graph input '" + arg + "' (" + name + ") has no tensor metadata");
    const json &meta = metas[arg];
    std::vector<int64_t> sizes;
    for (const json &s : meta.at("sizes")) {
      if (!s.contains("as_int"))
        fail(loc, name + " has a symbolic size; export with static shapes");
      sizes.push_back(s["as_int"].get<int64_t>());
    }
    int dtype = meta.at("dtype").get<int>();
    auto stored = archive.tensors.find(name);
    if (stored != archive.tensors.end()) {
      const pt2::StoredTensor &t = stored->second;
      Key key{t.record, t.storageOffset, t.sizes, t.strides, t.serdeDtype};
      if (auto it = globalOfStorage.find(key); it != globalOfStorage.end()) {
        Operation *global = it->second;
        auto aliases = global->getAttrOfType<ArrayAttr>("aliases");
        SmallVector<Attribute> names(aliases ? aliases.getValue() : ArrayRef<Attribute>());
        names.push_back(builder.getStringAttr(name));
        global->setAttr("aliases", builder.getArrayAttr(names));
        globalOfInput[arg] = SymbolTable::getSymbolName(global).getValue().str();
        return;
      }
    }
    RankedTensorType type = tensorType(dtype, sizes, loc, name);
    Operation *global;
    if (isParameter)
      global = bmt::ParameterOp::create(builder, loc, name, type,
                                        meta.value("requires_grad", true),
                                        /*aliases=*/nullptr);
    else
      global = bmt::BufferOp::create(builder, loc, name, type, persistent,
                                     /*aliases=*/nullptr);
    if (stored != archive.tensors.end()) {
      const pt2::StoredTensor &t = stored->second;
      globalOfStorage[Key{t.record, t.storageOffset, t.sizes, t.strides, t.serdeDtype}] =
          global;
    }
    globalOfInput[arg] = name;
  };

  const json &specs = signature.at("input_specs");
  // Parameters first, then buffers: the order TorchScript imports have.
  for (const json &spec : specs)
    if (spec.contains("parameter"))
      add(spec["parameter"]["arg"]["name"], spec["parameter"]["parameter_name"],
          true, false);
  for (const json &spec : specs)
    if (spec.contains("buffer"))
      add(spec["buffer"]["arg"]["name"], spec["buffer"]["buffer_name"], false,
          spec["buffer"].value("persistent", true));
  for (const json &spec : specs) {
    if (spec.contains("parameter") || spec.contains("buffer"))
      continue;
    if (spec.contains("user_input")) {
      const json &arg = spec["user_input"]["arg"];
      if (!arg.contains("as_tensor"))
        fail(loc, "a user input that is not a tensor (" + arg.dump() +
                      ") is not supported");
      userInputs.push_back(arg["as_tensor"]["name"]);
    } else if (spec.contains("tensor_constant")) {
      // A tensor created in forward (torch.tensor(...)): a constant in place,
      // as TorchScript keeps it.
      std::string arg = spec["tensor_constant"]["arg"]["name"];
      std::string name = spec["tensor_constant"]["tensor_constant_name"];
      auto stored = archive.tensors.find(name);
      if (stored == archive.tensors.end())
        fail(loc, "the tensor constant " + name + " is not stored in the archive");
      at::Tensor t = pt2::loadTensor(archive, stored->second).contiguous();
      RankedTensorType type = tensorType(stored->second.serdeDtype, t.sizes().vec(), loc, name);
      if (t.scalar_type() == at::kBool) {
        const bool *data = t.data_ptr<bool>();
        SmallVector<bool> bits(data, data + t.numel());
        constantOfInput[arg] = DenseElementsAttr::get(type, ArrayRef<bool>(bits));
      } else {
        ArrayRef<char> raw(static_cast<const char *>(t.data_ptr()), t.nbytes());
        constantOfInput[arg] = DenseElementsAttr::getFromRawBuffer(type, raw);
      }
    } else {
      fail(loc, "graph input of kind '" + spec.begin().key() +
                    "' is not supported (input spec " + spec.dump() + ")");
    }
  }
}

//===----------------------------------------------------------------------===//
// Flattening and regions
//===----------------------------------------------------------------------===//

void TorchExportImporter::flattenGraph(const json &graph,
                                       const std::vector<ModuleFrame> *outer) {
  for (const json &node : graph.at("nodes")) {
    std::string target = node.at("target");
    if (target == "torch.ops.aten._assert_tensor_metadata.default" ||
        target == "torch.ops.aten._assert_scalar.default" ||
        target == "torch.ops.aten.sym_constrain_range_for_size.default" ||
        target == "torch.ops.aten.sym_constrain_range.default")
      continue;
    // Symbolic booleans (`s0 >= 2`) that fed only the range checks dropped
    // above go in dropUnusedSymbolicNodes.
    if (node.contains("outputs"))
      for (const json &o : node["outputs"]) {
        if (o.contains("as_sym_int") && o["as_sym_int"].contains("as_name"))
          symTypes[o["as_sym_int"]["as_name"]] = builder.getI64Type();
        if (o.contains("as_sym_float") && o["as_sym_float"].contains("as_name"))
          symTypes[o["as_sym_float"]["as_name"]] = builder.getF64Type();
        if (o.contains("as_sym_bool") && o["as_sym_bool"].contains("as_name"))
          symTypes[o["as_sym_bool"]["as_name"]] = builder.getI1Type();
      }
    std::vector<ModuleFrame> stack;
    bool hasStack = node.contains("metadata") &&
                    node["metadata"].contains("nn_module_stack");
    if (hasStack)
      stack = parseModuleStack(node["metadata"]["nn_module_stack"], rootType);
    else if (outer)
      stack = *outer;
    if (target == "torch.ops.higher_order.wrap_with_set_grad_enabled") {
      // Inline the body: inputs are (enabled, graph, *tensors).
      const json *body = nullptr;
      std::vector<std::string> args;
      for (const json &input : node["inputs"]) {
        if (input["arg"].contains("as_graph"))
          body = &input["arg"]["as_graph"]["graph"];
        else if (input["arg"].contains("as_tensor"))
          args.push_back(resolve(input["arg"]["as_tensor"]["name"]));
      }
      if (!body || body->at("inputs").size() != args.size())
        failAt(node, "forward", "malformed wrap_with_set_grad_enabled");
      for (size_t i = 0; i < args.size(); ++i) {
        std::string inner = (*body)["inputs"][i]["as_tensor"]["name"];
        if (inner != args[i])
          rename[inner] = args[i];
      }
      flattenGraph(*body, &stack);
      std::vector<std::string> outs = tensorDefs(node);
      const json &bodyOuts = (*body)["outputs"];
      if (outs.size() != bodyOuts.size())
        failAt(node, "forward", "wrap_with_set_grad_enabled results do not match its body");
      for (size_t i = 0; i < outs.size(); ++i) {
        std::string inner = bodyOuts[i]["as_tensor"]["name"];
        if (inner != outs[i])
          rename[outs[i]] = inner;
      }
      continue;
    }
    nodes.push_back({&node, stack});
  }
}

/// Symbolic nodes (every result a SymInt / SymFloat / SymBool) whose results
/// nothing uses: the comparisons and size arithmetic that fed the range
/// checks flattenGraph dropped (`s0 >= 2`, `s0 % 8 == 0`).
void TorchExportImporter::dropUnusedSymbolicNodes(
    const std::vector<std::string> &graphOutputs) {
  auto symbolicOnly = [](const json &node) {
    const json &outs = node.at("outputs");
    return !outs.empty() && std::all_of(outs.begin(), outs.end(), [](const json &o) {
      return o.contains("as_sym_int") || o.contains("as_sym_float") ||
             o.contains("as_sym_bool");
    });
  };
  std::vector<bool> keep(nodes.size(), true);
  for (bool changed = true; changed;) {
    changed = false;
    std::set<std::string> used;
    for (const std::string &o : graphOutputs)
      used.insert(resolve(o));
    for (size_t i = 0; i < nodes.size(); ++i)
      if (keep[i])
        for (const std::string &u : tensorUses(*nodes[i].node))
          used.insert(resolve(u));
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (!keep[i] || !symbolicOnly(*nodes[i].node))
        continue;
      std::vector<std::string> defs = tensorDefs(*nodes[i].node);
      if (std::none_of(defs.begin(), defs.end(),
                       [&](const std::string &d) { return used.count(d); })) {
        keep[i] = false;
        changed = true;
      }
    }
  }
  std::vector<FlatNode> kept;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (keep[i])
      kept.push_back(nodes[i]);
  nodes = std::move(kept);
}

void TorchExportImporter::buildRegions() {
  root = std::make_unique<Region>();
  root->symbol = "forward";
  root->type = rootType;
  std::vector<Region *> open{root.get()};
  std::map<std::string, int> calls; // module path -> regions so far
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::vector<ModuleFrame> &stack = nodes[i].stack;
    size_t k = 0;
    while (k + 1 < open.size() && k < stack.size() && open[k + 1]->path == stack[k].path)
      ++k;
    open.resize(k + 1);
    for (size_t j = k; j < stack.size(); ++j) {
      Region *parent = open.back();
      auto child = std::make_unique<Region>();
      child->path = stack[j].path;
      child->type = stack[j].type;
      child->parent = parent;
      child->depth = parent->depth + 1;
      // A second call of the same submodule gets its own function, named
      // as torch.jit.trace names the second traced method: forward1, ...
      int n = calls[child->path]++;
      child->symbol = child->path + ".forward" + (n ? std::to_string(n) : "");
      parent->items.push_back(-1 - static_cast<int>(parent->children.size()));
      parent->children.push_back(std::move(child));
      open.push_back(parent->children.back().get());
    }
    open.back()->items.push_back(static_cast<int>(i));
  }
}

void TorchExportImporter::computeBoundaries(const std::vector<std::string> &graphOutputs) {
  // Region of every node, and where every value is defined.
  std::vector<Region *> regionOf(nodes.size());
  std::function<void(Region &)> walk = [&](Region &r) {
    for (int item : r.items) {
      if (item >= 0)
        regionOf[item] = &r;
      else
        walk(*r.children[-1 - item]);
    }
  };
  walk(*root);
  std::map<std::string, std::pair<Region *, int>> def; // value -> (region, node)
  for (const std::string &u : userInputs)
    def[u] = {root.get(), -1};
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const std::string &d : tensorDefs(*nodes[i].node))
      def[d] = {regionOf[i], static_cast<int>(i)};

  std::map<Region *, std::vector<std::pair<int, std::string>>> args, results;
  auto isAncestor = [](Region *a, Region *r) {
    for (; r; r = r->parent)
      if (r == a)
        return true;
    return false;
  };
  auto use = [&](const std::string &rawName, Region *user, int at) {
    std::string name = resolve(rawName);
    if (globalOfInput.count(name) || constantOfInput.count(name))
      return;
    auto it = def.find(name);
    if (it == def.end())
      return; // reported at emission
    auto [defRegion, defAt] = it->second;
    // Results: regions containing the definition but not the use.
    for (Region *r = defRegion; r && !isAncestor(r, user); r = r->parent)
      results[r].push_back({defAt, name});
    // Arguments: regions containing the use but not the definition.
    for (Region *r = user; r && !isAncestor(r, defRegion); r = r->parent)
      args[r].push_back({at, name});
  };
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const std::string &u : tensorUses(*nodes[i].node))
      use(u, regionOf[i], static_cast<int>(i));
  for (const std::string &o : graphOutputs)
    use(o, root.get(), static_cast<int>(nodes.size()));

  auto finish = [](std::vector<std::pair<int, std::string>> &list) {
    std::stable_sort(list.begin(), list.end(),
                     [](auto &a, auto &b) { return a.first < b.first; });
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (auto &[at, name] : list)
      if (seen.insert(name).second)
        out.push_back(name);
    return out;
  };
  for (auto &[r, list] : args)
    r->args = finish(list);
  for (auto &[r, list] : results)
    r->results = finish(list);
}

//===----------------------------------------------------------------------===//
// Emission
//===----------------------------------------------------------------------===//

Value TorchExportImporter::valueOf(const std::string &rawName,
                                   std::map<std::string, Value> &values,
                                   std::map<std::string, Value> &globals,
                                   Location loc, const std::string &fn) {
  std::string name = resolve(rawName);
  if (auto it = values.find(name); it != values.end())
    return it->second;
  if (auto it = globalOfInput.find(name); it != globalOfInput.end()) {
    Value &v = globals[it->second];
    if (!v) {
      v = bmt::GetGlobalOp::create(builder, loc, bmt::TensorType::get(&context),
                                   FlatSymbolRefAttr::get(&context, it->second));
      usedSymbols.insert(it->second);
    }
    return v;
  }
  if (auto it = constantOfInput.find(name); it != constantOfInput.end())
    return bmt::ConstantOp::create(builder, loc, it->second);
  fail(loc, "internal error: value %" + name + " used before it is defined in '" +
                fn + "'");
}

Attribute TorchExportImporter::convertIValue(const c10::IValue &value, Location loc) {
  if (Attribute a = bmt::constantAttr(value, builder))
    return a;
  fail(loc, "default argument of type '" + value.type()->repr_str() +
                "' is not supported");
}

Attribute TorchExportImporter::convertArg(const json &arg, SmallVectorImpl<Value> &operands,
                                          std::map<std::string, Value> &values,
                                          std::map<std::string, Value> &globals,
                                          Location loc, const std::string &fn) {
  if (arg.size() != 1)
    fail(loc, "malformed argument " + arg.dump());
  const std::string &kind = arg.begin().key();
  const json &v = arg.begin().value();
  auto intList = [&](const json &list) {
    SmallVector<Attribute> out;
    for (const json &e : list) {
      if (e.is_number_integer())
        out.push_back(builder.getI64IntegerAttr(e.get<int64_t>()));
      else if (e.contains("as_int"))
        out.push_back(builder.getI64IntegerAttr(e["as_int"].get<int64_t>()));
      else if (e.contains("as_name")) {
        // A symbolic size (dynamic shapes): the i64 value computed in the
        // program, as a trace keeps aten::size results in a list.
        operands.push_back(valueOf(e["as_name"], values, globals, loc, fn));
        out.push_back(bmt::OperandAttr::get(&context));
      } else
        fail(loc, "symbolic integer " + e.dump() + " is not supported");
    }
    return builder.getArrayAttr(out);
  };
  if (kind == "as_none")
    return bmt::NoneAttr::get(&context);
  if (kind == "as_tensor") {
    operands.push_back(valueOf(v["name"], values, globals, loc, fn));
    return bmt::OperandAttr::get(&context);
  }
  if (kind == "as_tensors" || kind == "as_optional_tensors") {
    SmallVector<Attribute> out;
    for (const json &t : v) {
      if (t.contains("as_none")) {
        out.push_back(bmt::NoneAttr::get(&context));
        continue;
      }
      const json &named = t.contains("as_tensor") ? t["as_tensor"] : t;
      operands.push_back(valueOf(named["name"], values, globals, loc, fn));
      out.push_back(bmt::OperandAttr::get(&context));
    }
    return builder.getArrayAttr(out);
  }
  if (kind == "as_int")
    return builder.getI64IntegerAttr(v.get<int64_t>());
  if (kind == "as_float")
    return builder.getF64FloatAttr(v.get<double>());
  if (kind == "as_bool")
    return builder.getBoolAttr(v.get<bool>());
  if (kind == "as_string")
    return builder.getStringAttr(v.get<std::string>());
  if (kind == "as_ints" || kind == "as_sym_ints")
    return intList(v);
  if (kind == "as_sym_int") {
    if (v.contains("as_int"))
      return builder.getI64IntegerAttr(v["as_int"].get<int64_t>());
    if (v.contains("as_name")) {
      operands.push_back(valueOf(v["as_name"], values, globals, loc, fn));
      return bmt::OperandAttr::get(&context);
    }
    fail(loc, "symbolic integer " + v.dump() + " is not supported");
  }
  if (kind == "as_sym_float" || kind == "as_sym_bool") {
    // A symbolic float or boolean: the f64 / i1 value computed in the
    // program (a literal when torch.export folded it).
    if (v.contains("as_name")) {
      operands.push_back(valueOf(v["as_name"], values, globals, loc, fn));
      return bmt::OperandAttr::get(&context);
    }
    if (v.contains("as_float"))
      return builder.getF64FloatAttr(v["as_float"].get<double>());
    if (v.contains("as_bool"))
      return builder.getBoolAttr(v["as_bool"].get<bool>());
    fail(loc, "symbolic " + kind.substr(7) + " " + v.dump() +
                  " is not supported (only a named value or a literal)");
  }
  if (kind == "as_sym_floats" || kind == "as_sym_bools") {
    SmallVector<Attribute> out;
    for (const json &e : v) {
      if (e.contains("as_name")) {
        operands.push_back(valueOf(e["as_name"], values, globals, loc, fn));
        out.push_back(bmt::OperandAttr::get(&context));
      } else if (e.contains("as_float")) {
        out.push_back(builder.getF64FloatAttr(e["as_float"].get<double>()));
      } else if (e.contains("as_bool")) {
        out.push_back(builder.getBoolAttr(e["as_bool"].get<bool>()));
      } else {
        fail(loc, "symbolic scalar " + e.dump() + " is not supported");
      }
    }
    return builder.getArrayAttr(out);
  }
  if (kind == "as_floats") {
    SmallVector<Attribute> out;
    for (const json &e : v)
      out.push_back(builder.getF64FloatAttr(e.get<double>()));
    return builder.getArrayAttr(out);
  }
  if (kind == "as_bools") {
    SmallVector<Attribute> out;
    for (const json &e : v)
      out.push_back(builder.getBoolAttr(e.get<bool>()));
    return builder.getArrayAttr(out);
  }
  if (kind == "as_strings") {
    SmallVector<Attribute> out;
    for (const json &e : v)
      out.push_back(builder.getStringAttr(e.get<std::string>()));
    return builder.getArrayAttr(out);
  }
  if (kind == "as_scalar_type") {
    int c10Type = pt2::toC10ScalarType(v.get<int>());
    if (c10Type < 0)
      fail(loc, "unsupported dtype " + v.dump() + " (torch.export ScalarType)");
    return builder.getI64IntegerAttr(c10Type);
  }
  if (kind == "as_layout") {
    if (v.get<int>() != 7)
      fail(loc, "only the strided layout is supported (got " + v.dump() + ")");
    return builder.getI64IntegerAttr(static_cast<int64_t>(c10::kStrided));
  }
  if (kind == "as_memory_format") {
    // serde: 1 contiguous, 2 channels_last, 3 channels_last_3d, 4 preserve.
    static const std::map<int, c10::MemoryFormat> formats{
        {1, c10::MemoryFormat::Contiguous},
        {2, c10::MemoryFormat::ChannelsLast},
        {3, c10::MemoryFormat::ChannelsLast3d},
        {4, c10::MemoryFormat::Preserve}};
    auto it = formats.find(v.get<int>());
    if (it == formats.end())
      fail(loc, "unsupported memory format " + v.dump());
    return builder.getI64IntegerAttr(static_cast<int64_t>(it->second));
  }
  if (kind == "as_device") {
    std::string device = v.at("type");
    if (v.contains("index") && !v["index"].is_null())
      device += ":" + std::to_string(v["index"].get<int64_t>());
    return bmt::DeviceAttr::get(&context, device);
  }
  fail(loc, "arguments of kind '" + kind + "' are not supported");
}

void TorchExportImporter::emitNode(const FlatNode &flat,
                                   std::map<std::string, Value> &values,
                                   std::map<std::string, Value> &globals,
                                   const std::string &fn) {
  const json &node = *flat.node;
  Location loc = locationOf(node);
  std::string target = node.at("target");
  if (emitSymOp(node, values, globals, fn))
    return;
  const std::string prefix = "torch.ops.aten.";
  if (target.rfind(prefix, 0) != 0)
    failAt(node, fn, "unsupported operator '" + target +
                         "' (only ATen operators are imported)");
  std::string rest = target.substr(prefix.size());
  size_t dot = rest.rfind('.');
  std::string opName = "aten::" + rest.substr(0, dot);
  std::string overload = dot == std::string::npos ? "" : rest.substr(dot + 1);
  if (overload == "default")
    overload.clear();
  // The size of a dynamic dimension: aten::size.int (same arguments), the op
  // a trace records, returning an integer.
  if (opName == "aten::sym_size" && overload == "int")
    opName = "aten::size";
  std::string name = opName + (overload.empty() ? "" : "." + overload);

  std::map<std::string, const json *> byName;
  for (const json &input : node.at("inputs"))
    byName[input.at("name")] = &input["arg"];
  auto isNumber = [](const json &arg) {
    return arg.contains("as_int") || arg.contains("as_float") || arg.contains("as_bool");
  };
  // A symbolic scalar (`x * (s / 2)`: aten.mul.Tensor(x, %truediv)) or a
  // literal in its place, where the schema takes a Tensor.
  auto symScalar = [](const json &arg) -> const json * {
    for (const char *kind : {"as_sym_int", "as_sym_float", "as_sym_bool"})
      if (arg.contains(kind))
        return &arg[kind];
    return nullptr;
  };
  auto numberForTensor = [&](const c10::FunctionSchema &schema) {
    for (const c10::Argument &a : schema.arguments())
      if (a.type()->kind() == c10::TypeKind::TensorType)
        if (auto it = byName.find(a.name());
            it != byName.end() && (isNumber(*it->second) || symScalar(*it->second)))
          return true;
    return false;
  };

  auto handle = c10::Dispatcher::singleton().findSchema({opName, overload});
  if (!handle)
    failAt(node, fn, "operator '" + name + "' has no schema registered in LibTorch");
  // torch.export records Python numbers where a schema takes a Tensor
  // (`aten.add.Tensor(x, 1)`); the dispatcher wants a Tensor there. Use the
  // op's Scalar overload where bmt has it (what TorchScript records), else a
  // 0-dim tensor constant (which promotes like the wrapped number). A
  // symbolic scalar there is passed to the Scalar overload as the i64 / f64
  // value, else wrapped by bmt.num_to_tensor.
  if (numberForTensor(handle->schema()) && overload == "Tensor") {
    auto scalar = c10::Dispatcher::singleton().findSchema({opName, "Scalar"});
    if (scalar && bmt::lookupAtenOp(opName + ".Scalar")) {
      bool sameNames = scalar->schema().arguments().size() ==
                       handle->schema().arguments().size();
      for (size_t i = 0; sameNames && i < scalar->schema().arguments().size(); ++i)
        sameNames = scalar->schema().arguments()[i].name() ==
                    handle->schema().arguments()[i].name();
      if (sameNames && !numberForTensor(scalar->schema())) {
        overload = "Scalar";
        name = opName + ".Scalar";
        handle = scalar;
      }
    }
  }
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(name);
  if (!info)
    failAt(node, fn, "unsupported operator '" + name + "' (not in bmt's operator registry)");
  const c10::FunctionSchema &schema = handle->schema();
  if (schema.arguments().size() != info->numArgs)
    failAt(node, fn, "operator '" + name + "' has " +
                         std::to_string(schema.arguments().size()) +
                         " arguments, the registry expects " +
                         std::to_string(info->numArgs));

  SmallVector<Value> operands;
  SmallVector<Attribute> args;
  for (const c10::Argument &a : schema.arguments()) {
    auto it = byName.find(a.name());
    const json *sym = it != byName.end() ? symScalar(*it->second) : nullptr;
    if (sym && a.type()->kind() == c10::TypeKind::TensorType && sym->contains("as_name")) {
      Value v = valueOf((*sym)["as_name"], values, globals, loc, fn);
      operands.push_back(
          bmt::NumToTensorOp::create(builder, loc, bmt::TensorType::get(&context), v));
      args.push_back(bmt::OperandAttr::get(&context));
      byName.erase(it);
    } else if (it != byName.end() && a.type()->kind() == c10::TypeKind::TensorType &&
               (isNumber(*it->second) || sym)) {
      const json &number = sym ? *sym : *it->second;
      auto type0 = [&](Type element) { return RankedTensorType::get({}, element); };
      Attribute value;
      if (number.contains("as_int"))
        value = DenseElementsAttr::get(type0(builder.getI64Type()),
                                       ArrayRef<int64_t>{number["as_int"].get<int64_t>()});
      else if (number.contains("as_float"))
        value = DenseElementsAttr::get(type0(builder.getF64Type()),
                                       ArrayRef<double>{number["as_float"].get<double>()});
      else
        value = DenseElementsAttr::get(type0(builder.getI1Type()),
                                       ArrayRef<bool>{number["as_bool"].get<bool>()});
      operands.push_back(bmt::ConstantOp::create(builder, loc, value));
      args.push_back(bmt::OperandAttr::get(&context));
      byName.erase(it);
    } else if (it != byName.end()) {
      args.push_back(convertArg(*it->second, operands, values, globals, loc, fn));
      byName.erase(it);
    } else if (a.default_value()) {
      args.push_back(convertIValue(*a.default_value(), loc));
    } else {
      failAt(node, fn, "argument '" + a.name() + "' of '" + name + "' is missing");
    }
  }
  if (!byName.empty())
    failAt(node, fn, "argument '" + byName.begin()->first + "' is not in the schema of '" +
                         name + "'");

  std::vector<std::string> defs;
  SmallVector<Type> types;
  for (const json &o : node.at("outputs")) {
    if (o.contains("as_tensor")) {
      defs.push_back(o["as_tensor"]["name"]);
      types.push_back(bmt::TensorType::get(&context));
    } else if (o.contains("as_tensors")) {
      for (const json &t : o["as_tensors"]) {
        defs.push_back(t["name"]);
        types.push_back(bmt::TensorType::get(&context));
      }
    } else if (o.contains("as_sym_int") && o["as_sym_int"].contains("as_name")) {
      defs.push_back(o["as_sym_int"]["as_name"]);
      types.push_back(builder.getI64Type());
    } else if (o.contains("as_sym_float") && o["as_sym_float"].contains("as_name")) {
      defs.push_back(o["as_sym_float"]["as_name"]);
      types.push_back(builder.getF64Type());
    } else if (o.contains("as_sym_bool") && o["as_sym_bool"].contains("as_name")) {
      defs.push_back(o["as_sym_bool"]["as_name"]);
      types.push_back(builder.getI1Type());
    } else if (!o.contains("as_none")) {
      failAt(node, fn, "results of kind '" + o.begin().key() + "' are not supported");
    }
  }
  auto op = bmt::AtenOp::create(builder, loc, types, builder.getStringAttr(name),
                                builder.getArrayAttr(args), operands);
  for (size_t i = 0; i < defs.size(); ++i)
    values[defs[i]] = op.getResult(i);
}

/// Operations on symbolic scalars (dynamic shapes): `_operator.*`,
/// `torch.sym_*` and `math.trunc` nodes whose operands and result are
/// SymInts, SymFloats or SymBools. Each becomes what a trace records for
/// the same Python arithmetic on sizes: every operand wrapped as a 0-dim
/// tensor (`bmt.num_to_tensor`, a 0-dim `bmt.constant` for a literal), the
/// tensor op, then `aten::Int.Tensor` / `aten::Float.Tensor` /
/// `aten::Bool.Tensor` back to an i64 / f64 / i1 value. The runtime
/// evaluates these per batch, so the sizes follow the input's shape.
/// Returns false for any other node.
bool TorchExportImporter::emitSymOp(const json &node, std::map<std::string, Value> &values,
                                    std::map<std::string, Value> &globals,
                                    const std::string &fn) {
  struct SymOp {
    const char *aten;   // the tensor op ("" for a conversion)
    unsigned arity;
    bool alpha = false; // add/sub take alpha = 1
  };
  // Python semantics on ints and floats hold for 0-dim int64 / double
  // tensors: floor_divide and remainder floor (Python's // and %), pow of
  // ints stays int, comparisons give bool; truediv, sqrt and any op with a
  // float result compute in double (int operands converted first).
  static const std::map<std::string, SymOp> symOps{
      {"_operator.add", {"aten::add.Tensor", 2, true}},
      {"_operator.sub", {"aten::sub.Tensor", 2, true}},
      {"_operator.mul", {"aten::mul.Tensor", 2}},
      {"_operator.floordiv", {"aten::floor_divide", 2}},
      {"_operator.truediv", {"aten::div.Tensor", 2}},
      {"_operator.mod", {"aten::remainder.Tensor", 2}},
      {"_operator.pow", {"aten::pow.Tensor_Tensor", 2}},
      {"_operator.neg", {"aten::neg", 1}},
      {"_operator.pos", {"", 1}},
      {"_operator.eq", {"aten::eq.Tensor", 2}},
      {"_operator.ne", {"aten::ne.Tensor", 2}},
      {"_operator.lt", {"aten::lt.Tensor", 2}},
      {"_operator.le", {"aten::le.Tensor", 2}},
      {"_operator.gt", {"aten::gt.Tensor", 2}},
      {"_operator.ge", {"aten::ge.Tensor", 2}},
      {"_operator.and_", {"aten::__and__.Tensor", 2}},
      {"_operator.or_", {"aten::__or__.Tensor", 2}},
      {"_operator.lshift", {"aten::__lshift__.Tensor", 2}},
      {"_operator.rshift", {"aten::__rshift__.Tensor", 2}},
      {"torch.sym_not", {"aten::logical_not", 1}},
      {"torch.sym_max", {"aten::maximum", 2}},
      {"torch.sym_min", {"aten::minimum", 2}},
      {"torch.sym_sqrt", {"aten::sqrt", 1}},
      {"torch._sym_sqrt", {"aten::sqrt", 1}},
      {"torch.sym_ite", {"aten::where.self", 3}},
      // Conversions: the operand's 0-dim tensor read back as the result's
      // type (aten::Int.Tensor truncates towards zero, as int() does).
      {"torch.sym_float", {"", 1}},
      {"torch.sym_int", {"", 1}},
      {"math.trunc", {"", 1}},
  };
  std::string target = node.at("target");
  auto it = symOps.find(target);
  if (it == symOps.end())
    return false;
  const SymOp &op = it->second;
  Location loc = locationOf(node);
  const json &inputs = node.at("inputs");
  const json &outputs = node.at("outputs");
  auto failHere = [&](const std::string &what) { failAt(node, fn, what); };
  if (outputs.size() != 1)
    failHere("a symbolic operation with " + std::to_string(outputs.size()) + " results");
  const json &out = outputs[0];
  std::string outKind = out.begin().key();
  Type outType;
  if (outKind == "as_sym_int")
    outType = builder.getI64Type();
  else if (outKind == "as_sym_float")
    outType = builder.getF64Type();
  else if (outKind == "as_sym_bool")
    outType = builder.getI1Type();
  else
    failHere("a symbolic operation whose result is of kind '" + outKind + "'");
  if (!out[outKind].contains("as_name"))
    failHere("a symbolic operation whose result is not named: " + out.dump());
  std::string outName = out[outKind]["as_name"];
  if (inputs.size() != op.arity)
    failHere("'" + target + "' with " + std::to_string(inputs.size()) +
             " operands (expected " + std::to_string(op.arity) + ")");
  bool inDouble = outType.isF64();
  auto tensorType = bmt::TensorType::get(&context);
  auto type0 = [&](Type element) { return RankedTensorType::get({}, element); };

  // The operands: SSA values (a named symbolic scalar) or literals.
  struct Operand {
    Value value;        // i64 / f64 / i1, or null for a literal
    const json *literal = nullptr; // {"as_int": ..} / {"as_float": ..} / {"as_bool": ..}
  };
  std::vector<Operand> operands;
  for (const json &input : inputs) {
    const json &arg = input.at("arg");
    const json *v = &arg;
    for (const char *kind : {"as_sym_int", "as_sym_float", "as_sym_bool"})
      if (arg.contains(kind))
        v = &arg[kind];
    if (v->contains("as_name"))
      operands.push_back({valueOf((*v)["as_name"], values, globals, loc, fn), nullptr});
    else if (v->contains("as_int") || v->contains("as_float") || v->contains("as_bool"))
      operands.push_back({Value(), v});
    else
      failHere("symbolic operand " + arg.dump() + " is not supported");
  }

  const char *back = outType.isF64()        ? "aten::Float.Tensor"
                     : outType.isInteger(1) ? "aten::Bool.Tensor"
                                            : "aten::Int.Tensor";
  auto readBack = [&](Value tensor) {
    return bmt::AtenOp::create(builder, loc, TypeRange{outType}, builder.getStringAttr(back),
                               builder.getArrayAttr({bmt::OperandAttr::get(&context)}),
                               ValueRange{tensor})
        .getResult(0);
  };

  // A conversion or the identity: no tensor op.
  if (*op.aten == 0) {
    const Operand &x = operands[0];
    if (!x.value)
      failHere("'" + target + "' of a literal (torch.export folds these)");
    values[outName] = x.value.getType() == outType
                          ? x.value
                          : readBack(bmt::NumToTensorOp::create(builder, loc, tensorType,
                                                                x.value));
    return true;
  }

  // Each operand as a 0-dim tensor, in double where the result is a float.
  SmallVector<Value> tensors;
  for (const Operand &x : operands) {
    // sym_ite's condition stays a bool.
    bool condition = target == "torch.sym_ite" && tensors.empty();
    if (x.literal) {
      const json &lit = *x.literal;
      Attribute value;
      if (lit.contains("as_float") || (inDouble && !condition && lit.contains("as_int")))
        value = DenseElementsAttr::get(
            type0(builder.getF64Type()),
            ArrayRef<double>{lit.contains("as_float") ? lit["as_float"].get<double>()
                                                      : double(lit["as_int"].get<int64_t>())});
      else if (lit.contains("as_int"))
        value = DenseElementsAttr::get(type0(builder.getI64Type()),
                                       ArrayRef<int64_t>{lit["as_int"].get<int64_t>()});
      else
        value = DenseElementsAttr::get(type0(builder.getI1Type()),
                                       ArrayRef<bool>{lit["as_bool"].get<bool>()});
      tensors.push_back(bmt::ConstantOp::create(builder, loc, value));
      continue;
    }
    Value t = bmt::NumToTensorOp::create(builder, loc, tensorType, x.value);
    if (inDouble && !condition && !x.value.getType().isF64()) {
      // to.dtype(self, Double, non_blocking=False, copy=False, memory_format=None)
      t = bmt::AtenOp::create(
              builder, loc, TypeRange{tensorType}, builder.getStringAttr("aten::to.dtype"),
              builder.getArrayAttr({bmt::OperandAttr::get(&context),
                                    builder.getI64IntegerAttr(
                                        static_cast<int64_t>(c10::ScalarType::Double)),
                                    builder.getBoolAttr(false), builder.getBoolAttr(false),
                                    bmt::NoneAttr::get(&context)}),
              ValueRange{t})
              .getResult(0);
    }
    tensors.push_back(t);
  }
  SmallVector<Attribute> args(tensors.size(), bmt::OperandAttr::get(&context));
  if (op.alpha)
    args.push_back(builder.getI64IntegerAttr(1));
  auto tensorOp = bmt::AtenOp::create(builder, loc, TypeRange{tensorType},
                                      builder.getStringAttr(op.aten),
                                      builder.getArrayAttr(args), tensors);
  values[outName] = readBack(tensorOp.getResult(0));
  return true;
}

func::FuncOp TorchExportImporter::emitRegion(Region &region,
                                             const std::vector<std::string> *argNames,
                                             const std::vector<std::string> *resultNames) {
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToEnd(moduleOp.getBody());
  SmallVector<Type> argTypes;
  for (const std::string &a : region.args)
    argTypes.push_back(symTypes.count(a) ? symTypes[a]
                                         : Type(bmt::TensorType::get(&context)));
  auto func = func::FuncOp::create(builder, NameLoc::get(builder.getStringAttr(region.symbol)),
                                   region.symbol, builder.getFunctionType(argTypes, {}));
  if (region.parent)
    func.setPrivate();
  func->setAttr("bmt.module_path", builder.getStringAttr(region.path));
  func->setAttr("bmt.module_type", builder.getStringAttr(region.type));
  region.func = func;
  Block *body = func.addEntryBlock();
  builder.setInsertionPointToStart(body);
  std::map<std::string, Value> values, globals;
  for (size_t i = 0; i < region.args.size(); ++i) {
    values[region.args[i]] = body->getArgument(i);
    func.setArgAttr(i, "bmt.name",
                    builder.getStringAttr(argNames ? (*argNames)[i] : region.args[i]));
  }
  for (int item : region.items) {
    if (item >= 0) {
      emitNode(nodes[item], values, globals, region.symbol);
      continue;
    }
    Region &child = *region.children[-1 - item];
    func::FuncOp callee = emitRegion(child, nullptr, nullptr);
    SmallVector<Value> operands;
    Location loc = NameLoc::get(builder.getStringAttr(child.symbol));
    for (const std::string &a : child.args)
      operands.push_back(valueOf(a, values, globals, loc, region.symbol));
    auto call = func::CallOp::create(builder, loc, callee, operands);
    for (size_t i = 0; i < child.results.size(); ++i)
      values[child.results[i]] = call.getResult(i);
  }
  SmallVector<Value> results;
  Location retLoc = NameLoc::get(builder.getStringAttr(region.symbol));
  for (const std::string &r : region.results)
    results.push_back(valueOf(r, values, globals, retLoc, region.symbol));
  func::ReturnOp::create(builder, retLoc, results);
  func.setType(builder.getFunctionType(argTypes, ValueRange(results).getTypes()));
  for (size_t i = 0; i < region.results.size(); ++i)
    func.setResultAttr(i, "bmt.name",
                       builder.getStringAttr(resultNames ? (*resultNames)[i]
                                                         : region.results[i]));
  return func;
}

OwningOpRef<ModuleOp> TorchExportImporter::run(const json &program) {
  Location loc = FileLineColLoc::get(&context, path, 0, 0);
  const json &gm = program.at("graph_module");
  const json &graph = gm.at("graph");
  const json &signature = gm.at("signature");

  OwningOpRef<ModuleOp> owned = ModuleOp::create(loc);
  moduleOp = *owned;
  llvm::SmallString<256> absolute(path);
  llvm::sys::fs::make_absolute(absolute);
  moduleOp->setAttr("bmt.source", builder.getStringAttr(absolute));
  moduleOp->setAttr("bmt.source_format", builder.getStringAttr("torch.export"));
  collectGlobals(graph, signature);

  // Results: user outputs only; a buffer mutation is not supported.
  std::vector<std::string> outputs;
  for (const json &spec : signature.at("output_specs")) {
    if (!spec.contains("user_output"))
      fail(loc, "graph output of kind '" + spec.begin().key() +
                    "' (a mutated buffer or input, or a loss) is not supported");
    const json &arg = spec["user_output"]["arg"];
    if (!arg.contains("as_tensor"))
      fail(loc, "a model output that is not a tensor (" + arg.dump() +
                    ") is not supported");
    outputs.push_back(arg["as_tensor"]["name"]);
  }
  // Names of the results: the keys of the output dict / ModelOutput, where
  // the out_spec of the root's module call has them (as TorchScript imports
  // name a flattened dict result by its key).
  std::vector<std::string> outputNames;
  for (size_t i = 0; i < outputs.size(); ++i)
    outputNames.push_back(outputs.size() == 1 ? "" : std::to_string(i));
  if (gm.contains("module_call_graph")) {
    for (const json &entry : gm["module_call_graph"]) {
      if (entry.value("fqn", "x") != "" || !entry.contains("signature") ||
          entry["signature"].is_null())
        continue;
      try {
        json spec = json::parse(entry["signature"].at("out_spec").get<std::string>());
        const json &top = spec.at(1);
        if (top.contains("context") && top["context"].is_string()) {
          json keys = json::parse(top["context"].get<std::string>());
          if (keys.is_array() && keys.size() == outputs.size() &&
              top["children_spec"].size() == outputs.size())
            for (size_t i = 0; i < outputs.size(); ++i)
              if (keys[i].is_string())
                outputNames[i] = keys[i];
        }
      } catch (const json::exception &) {
        // Unnamed results then.
      }
    }
  }

  flattenGraph(graph, nullptr);
  dropUnusedSymbolicNodes(outputs);
  buildRegions();
  // The root takes the user inputs, in the signature's order.
  computeBoundaries(outputs);
  root->args = userInputs;
  root->results.clear();
  for (const std::string &o : outputs)
    root->results.push_back(resolve(o));
  emitRegion(*root, &userInputs, &outputNames);
  return owned;
}

} // namespace

bool bmt::looksLikeTorchExportArchive(llvm::StringRef path) {
  auto buffer = llvm::MemoryBuffer::getFileSlice(path, 4, 0);
  if (!buffer || (*buffer)->getBuffer() != llvm::StringRef("PK\x03\x04", 4))
    return false;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path.str());
    for (const std::string &r : reader.getAllRecords())
      if (r == "archive_format" || r.rfind("models/", 0) == 0)
        return true;
  } catch (...) {
  }
  return false;
}

OwningOpRef<ModuleOp> bmt::importTorchExport(llvm::StringRef pathRef,
                                             MLIRContext &context) {
  context.loadDialect<bmt::BmtDialect, func::FuncDialect>();
  std::string path = pathRef.str();
  Location fileLoc = FileLineColLoc::get(&context, path, 0, 0);
  if (!bmt::import::checkInputFile(path, "torch.export archive", fileLoc))
    return nullptr;
  auto head = llvm::MemoryBuffer::getFileSlice(path, 4, 0);
  if (!head) {
    emitError(fileLoc) << path << ": cannot read: " << head.getError().message();
    return nullptr;
  }
  if ((*head)->getBuffer() != llvm::StringRef("PK\x03\x04", 4)) {
    emitError(fileLoc) << path
                       << ": not a zip archive (torch.export archives are written "
                          "by torch.export.save)";
    return nullptr;
  }
  pt2::Archive archive;
  try {
    archive = pt2::openArchive(path);
  } catch (const c10::Error &e) {
    std::string reason = bmt::firstErrorLine(e.what_without_backtrace());
    if (reason.find("central directory") != std::string::npos)
      emitError(fileLoc) << path
                         << ": a truncated or corrupt zip archive (its central "
                            "directory is missing)";
    else
      emitError(fileLoc) << path << ": cannot read the torch.export archive: " << reason;
    return nullptr;
  } catch (const std::exception &e) {
    emitError(fileLoc) << path << ": " << bmt::firstErrorLine(e.what());
    return nullptr;
  }
  try {
    json program = json::parse(pt2::readRecord(archive, archive.programRecord));
    if (!program.contains("schema_version") ||
        !program["schema_version"].contains("major")) {
      emitError(fileLoc) << path << ": " << archive.programRecord
                         << " has no schema_version; not a torch.export program";
      return nullptr;
    }
    int major = program["schema_version"]["major"].get<int>();
    int minor = program["schema_version"].value("minor", 0);
    if (major != kTorchExportSchemaMajor) {
      emitError(fileLoc) << path << ": unsupported torch.export schema version "
                         << major << "." << minor << "; bmt reads schema version "
                         << kTorchExportSchemaMajor
                         << ".x (torch 2.11 writes 8.17): export the model with a "
                            "torch release of that schema";
      return nullptr;
    }
    TorchExportImporter importer(context, path, archive);
    return importer.run(program);
  } catch (const ImportError &error) {
    emitError(error.loc) << error.message;
  } catch (const json::exception &error) {
    emitError(fileLoc) << path << ": malformed torch.export program ("
                       << archive.programRecord << "): " << error.what();
  } catch (const c10::Error &error) {
    emitError(fileLoc) << path << ": cannot load the torch.export archive: "
                       << bmt::firstErrorLine(error.what_without_backtrace());
  } catch (const std::exception &error) {
    emitError(fileLoc) << path << ": cannot load the torch.export archive: "
                       << bmt::firstErrorLine(error.what());
  }
  return nullptr;
}
