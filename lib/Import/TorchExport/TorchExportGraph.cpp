//===- TorchExportGraph.cpp - reading a .pt2's graph ----------------------===//
//
// Steps 1-3 of the .pt2 import (TorchExportImporter.cpp): the parameters,
// buffers and constants the graph signature lifts, the flattened nodes with
// their module stacks, the regions and their boundaries.
//
//===----------------------------------------------------------------------===//

#include "bmt/Import/TorchExport.h"

#include "../IValueConstants.h"
#include "../InputFile.h"

#include "Pt2Archive.h"
#include "TorchExportImporter.h"

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
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>
using namespace mlir;

namespace bmt::torch_export {

double floatOf(const json &v) {
  if (v.is_string()) {
    const std::string &text = v.get_ref<const std::string &>();
    if (text == "Infinity")
      return std::numeric_limits<double>::infinity();
    if (text == "-Infinity")
      return -std::numeric_limits<double>::infinity();
    if (text == "NaN")
      return std::numeric_limits<double>::quiet_NaN();
  }
  return v.get<double>();
}

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


} // namespace bmt::torch_export
