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
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>
using namespace mlir;

namespace bmt::torch_export {

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
    return builder.getF64FloatAttr(floatOf(v));
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
      return builder.getF64FloatAttr(floatOf(v["as_float"]));
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
        out.push_back(builder.getF64FloatAttr(floatOf(e["as_float"])));
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
      out.push_back(builder.getF64FloatAttr(floatOf(e)));
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

namespace {

/// transformers' grouped matmul, what torch.export records of its
/// mixture-of-experts layers (transformers/integrations/moe.py: a custom op
/// in place of torch._grouped_mm): input [S, in] sorted by expert, weight
/// [E, in, out], offs [E] the cumulative row counts.
constexpr const char *kTransformersGroupedMm = "torch.ops.transformers.grouped_mm_fallback.default";

/// `node`, a call of kTransformersGroupedMm, as the aten::_grouped_mm call
/// computing the same product (its arguments renamed: self, mat2, offs).
json groupedMmAsAten(const json &node) {
  json aten = node;
  aten["target"] = "torch.ops.aten._grouped_mm.default";
  for (json &input : aten["inputs"]) {
    if (input["name"] == "input")
      input["name"] = "self";
    else if (input["name"] == "weight")
      input["name"] = "mat2";
  }
  return aten;
}

/// Appends the names of the leaves of pytree spec `node` (torch.export's
/// out_spec: {"type", "context", "children_spec"}) to `names`, in order: a
/// dict's or ModelOutput's children by key (its context lists the keys), a
/// tuple's or list's by position, joined to `prefix` with ".". A leaf alone
/// is "".
void leafNames(const json &node, const std::string &prefix, std::vector<std::string> &names) {
  if (node.at("type").is_null()) {
    names.push_back(prefix);
    return;
  }
  json keys;
  if (node.contains("context") && node["context"].is_string())
    keys = json::parse(node["context"].get<std::string>());
  const json &children = node.at("children_spec");
  for (size_t i = 0; i < children.size(); ++i) {
    std::string key = keys.is_array() && i < keys.size() && keys[i].is_string()
                          ? keys[i].get<std::string>()
                          : std::to_string(i);
    leafNames(children[i], prefix.empty() ? key : prefix + "." + key, names);
  }
}

} // namespace

void TorchExportImporter::emitNode(const FlatNode &flat,
                                   std::map<std::string, Value> &values,
                                   std::map<std::string, Value> &globals,
                                   const std::string &fn) {
  json asAten;
  const json &node = flat.node->value("target", "") == kTransformersGroupedMm
                         ? (asAten = groupedMmAsAten(*flat.node))
                         : *flat.node;
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
    failAt(node, fn, unsupportedOperatorMessage(name, fn));
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
                                       ArrayRef<double>{floatOf(number["as_float"])});
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
  // the out_spec of the root's module call has them, joined by "." with the
  // positions in a nested tuple (a mixture of experts' router_logits.0), as
  // TorchScript imports name a flattened result.
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
        std::vector<std::string> names;
        leafNames(spec.at(1), "", names);
        if (names.size() == outputs.size())
          for (size_t i = 0; i < outputs.size(); ++i)
            if (!names[i].empty())
              outputNames[i] = names[i];
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


} // namespace bmt::torch_export

using namespace bmt::torch_export;


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
