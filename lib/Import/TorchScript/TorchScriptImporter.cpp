//===- TorchScriptImporter.cpp - TorchScript archive -> bmt dialect -------===//
//
// Walks a loaded torch::jit::Module from `forward` through every
// prim::CallMethod and emits one func.func per (submodule, method). Each
// TorchScript value maps to an `Entry`: an MLIR value, or a compile-time
// structure (constant, list, tuple, dict, submodule) that prim:: nodes build
// and take apart; only ATen nodes, calls and returns turn entries into IR.
//
// All LibTorch calls happen inside `importTorchScript`'s try block; errors
// travel as ImportError (or c10::Error) and become exactly one diagnostic.
//
//===----------------------------------------------------------------------===//

#include "TorchScriptImporter.h"

using namespace mlir;

namespace bmt::torch_script {

std::string join(const std::string &prefix, const std::string &name) {
  return prefix.empty() ? name : prefix + "." + name;
}

/// "__torch__.transformers.models.gpt2.modeling_gpt2.___torch_mangle_3.GPT2Block"
/// -> "transformers.models.gpt2.modeling_gpt2.GPT2Block".
std::string demangleClassName(std::string name) {
  const std::string prefix = "__torch__.";
  if (name.rfind(prefix, 0) == 0)
    name = name.substr(prefix.size());
  size_t pos;
  while ((pos = name.find("___torch_mangle_")) != std::string::npos) {
    size_t end = name.find('.', pos);
    name.erase(pos, end == std::string::npos ? std::string::npos
                                             : end - pos + 1);
  }
  return name;
}

/// The name TorchScript gives a value, without its uniquing suffix: "x.1" -> "x".
std::string baseName(const jit::Value *v) {
  std::string name = v->debugNameBase();
  return name.empty() ? "%" + std::to_string(v->unique()) : name;
}

/// One line describing a node: "%y : Tensor = aten::erfinv(%x)".
std::string describeNode(const jit::Node *node) {
  std::ostringstream os;
  for (size_t i = 0; i < node->outputs().size(); ++i)
    os << (i ? ", " : "") << "%" << node->outputs()[i]->debugName() << " : "
       << node->outputs()[i]->type()->repr_str();
  os << (node->outputs().empty() ? "" : " = ") << node->kind().toQualString()
     << "(";
  for (size_t i = 0; i < node->inputs().size(); ++i)
    os << (i ? ", " : "") << "%" << node->inputs()[i]->debugName();
  os << ")";
  return os.str();
}

//===----------------------------------------------------------------------===//
// Functions and nodes
//===----------------------------------------------------------------------===//

ImportedFunction &TorchScriptImporter::importMethod(
    const jit::Module &module, const std::string &modulePath,
    const std::string &method, Location callLoc) {
  std::string symbol = join(modulePath, method);
  if (auto it = functions.find(symbol); it != functions.end())
    return it->second;

  c10::optional<jit::Method> m = module.find_method(method);
  if (!m)
    fail(callLoc, path + ": module '" + modulePath + "' has no method '" +
                      method + "'");
  std::shared_ptr<jit::Graph> graph = m->graph();

  // Signature: every graph input but `self`, tuples flattened.
  Location loc = FileLineColLoc::get(&context, path, 0, 0);
  SmallVector<Type> argTypes;
  for (size_t i = 1; i < graph->inputs().size(); ++i)
    flattenInputType(graph->inputs()[i]->type(), argTypes, loc,
                     " (argument '" + baseName(graph->inputs()[i]) + "' of " +
                         symbol + ")");

  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToEnd(moduleOp.getBody());
  auto func = func::FuncOp::create(builder, 
      NameLoc::get(builder.getStringAttr(symbol)), symbol,
      builder.getFunctionType(argTypes, {}));
  if (!modulePath.empty() || method != "forward")
    func.setPrivate();
  func->setAttr("bmt.module_path", builder.getStringAttr(modulePath));
  func->setAttr("bmt.module_type",
                builder.getStringAttr(
                    demangleClassName(module.type()->name()->qualifiedName())));
  ImportedFunction &imported = functions[symbol];
  imported.op = func;

  Block *body = func.addEntryBlock();
  builder.setInsertionPointToStart(body);

  // Bind inputs.
  Entry self;
  self.kind = Entry::Kind::Module;
  self.modulePath = modulePath;
  self.module = std::make_shared<jit::Module>(module);
  bind(graph->inputs()[0], self);
  size_t next = 0;
  for (size_t i = 1; i < graph->inputs().size(); ++i) {
    jit::Value *input = graph->inputs()[i];
    size_t first = next;
    bind(input, bindInput(input->type(), body->getArguments(), next, loc));
    for (size_t a = first; a < next; ++a)
      func.setArgAttr(a, "bmt.name",
                      builder.getStringAttr(
                          next - first == 1
                              ? baseName(input)
                              : baseName(input) + "." + std::to_string(a - first)));
  }

  // Control flow is reported before anything else it contains (a scripted
  // `if` first shows up as aten::Bool, which would be a less useful error).
  for (jit::Node *node : graph->nodes())
    if (node->kind() == c10::prim::If || node->kind() == c10::prim::Loop)
      failAt(node, symbol,
             "control flow (" + std::string(node->kind().toQualString()) +
                 ") is not supported; trace the model with torch.jit.trace "
                 "(a traced model keeps the control flow of submodules that "
                 "were scripted: trace those too)");
  for (jit::Node *node : graph->nodes())
    importNode(node, symbol);

  // Results: flatten tuples and dicts, remembering their shape for callers.
  SmallVector<Value> results;
  std::vector<std::string> names;
  ResultShape shape;
  Location retLoc = locationOf(graph->return_node());
  if (graph->outputs().size() == 1) {
    flatten(lookup(graph->outputs()[0]), results, names, "", shape, retLoc);
  } else {
    shape.kind = ResultShape::Kind::Tuple;
    for (size_t i = 0; i < graph->outputs().size(); ++i) {
      shape.children.emplace_back();
      flatten(lookup(graph->outputs()[i]), results, names, std::to_string(i),
              shape.children.back(), retLoc);
    }
  }
  func::ReturnOp::create(builder, retLoc, results);
  func.setType(builder.getFunctionType(argTypes, ValueRange(results).getTypes()));
  for (size_t i = 0; i < names.size(); ++i)
    if (!names[i].empty())
      func.setResultAttr(i, "bmt.name", builder.getStringAttr(names[i]));

  // Entries of this graph are no longer needed.
  for (const jit::Value *v : graph->inputs())
    entries.erase(v);
  for (jit::Node *node : graph->nodes())
    for (const jit::Value *v : node->outputs())
      entries.erase(v);
  imported.resultShape = std::move(shape);
  return imported;
}

void TorchScriptImporter::importCall(jit::Node *node,
                                     const std::string &functionName) {
  Location loc = locationOf(node);
  Entry &object = lookup(node->inputs()[0]);
  if (object.kind != Entry::Kind::Module)
    failAt(node, functionName, "prim::CallMethod on something not a submodule");
  std::string method = node->s(c10::attr::name);
  jit::Module callee = *object.module;
  std::string calleePath = object.modulePath;
  ImportedFunction &target = importMethod(callee, calleePath, method, loc);

  SmallVector<Value> args;
  std::vector<std::string> unusedNames;
  for (size_t i = 1; i < node->inputs().size(); ++i) {
    ResultShape unusedShape;
    flatten(lookup(node->inputs()[i]), args, unusedNames, "", unusedShape, loc);
  }
  FunctionType type = target.op.getFunctionType();
  if (args.size() != type.getNumInputs())
    failAt(node, functionName,
           "call passes " + std::to_string(args.size()) + " values to '" +
               target.op.getSymName().str() + "', which takes " +
               std::to_string(type.getNumInputs()));
  auto call = func::CallOp::create(builder, loc, target.op, args);
  size_t next = 0;
  if (node->outputs().size() == 1) {
    bind(node->output(), unflatten(target.resultShape, call.getResults(), next));
  } else {
    for (size_t i = 0; i < node->outputs().size(); ++i)
      bind(node->outputs()[i],
           unflatten(target.resultShape.children.at(i), call.getResults(), next));
  }
}

void TorchScriptImporter::importAtenNode(jit::Node *node,
                                         const std::string &functionName) {
  Location loc = locationOf(node);
  const c10::FunctionSchema *schema = node->maybeSchema();
  if (!schema)
    failAt(node, functionName, "operator without a registered schema");
  std::string name = schema->name();
  if (!schema->overload_name().empty())
    name += "." + schema->overload_name();
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(name);
  if (!info)
    failAt(node, functionName,
           unsupportedOperatorMessage(name, functionName));
  if (node->inputs().size() != info->numArgs)
    failAt(node, functionName,
           "operator '" + name + "' has " + std::to_string(node->inputs().size()) +
               " inputs, the registry expects " + std::to_string(info->numArgs));

  // Scalar conversions of a NumToTensor fold away: aten::Int(NumToTensor(n)) = n.
  if ((name == "aten::Int.Tensor" || name == "aten::Float.Tensor" ||
       name == "aten::ScalarImplicit") &&
      lookup(node->input(0)).kind == Entry::Kind::NumTensor) {
    bind(node->output(), Entry::ofValue(lookup(node->input(0)).value));
    return;
  }

  SmallVector<Value> operands;
  SmallVector<Attribute> args;
  for (jit::Value *input : node->inputs())
    args.push_back(toArgument(lookup(input), operands, loc));

  // Results. A list result is spread over as many results as its unpacking
  // prim::ListUnpack has outputs.
  SmallVector<Type> resultTypes;
  int listLength = -1;
  for (jit::Value *output : node->outputs()) {
    if (auto list = output->type()->cast<c10::ListType>()) {
      if (node->outputs().size() != 1 ||
          list->getElementType()->kind() != c10::TypeKind::TensorType)
        failAt(node, functionName, "list results other than one Tensor[] are not supported");
      for (const jit::Use &use : output->uses()) {
        if (use.user->kind() != c10::prim::ListUnpack)
          failAt(node, functionName,
                 "the Tensor[] result is used by " +
                     std::string(use.user->kind().toQualString()) +
                     "; only prim::ListUnpack is supported");
        int n = static_cast<int>(use.user->outputs().size());
        if (listLength >= 0 && n != listLength)
          failAt(node, functionName, "the Tensor[] result is unpacked to different lengths");
        listLength = n;
      }
      if (listLength < 0)
        listLength = 0;
      resultTypes.append(listLength, bmt::TensorType::get(&context));
    } else {
      resultTypes.push_back(convertType(output->type(), loc));
    }
  }
  auto op = bmt::AtenOp::create(builder, loc, resultTypes,
                                        builder.getStringAttr(name),
                                        builder.getArrayAttr(args), operands);
  if (listLength >= 0) {
    Entry list;
    list.kind = Entry::Kind::List;
    for (Value v : op.getResults())
      list.elements.push_back(Entry::ofValue(v));
    bind(node->output(), list);
    return;
  }
  for (size_t i = 0; i < node->outputs().size(); ++i)
    bind(node->outputs()[i], Entry::ofValue(op.getResult(i)));
}

void TorchScriptImporter::importNode(jit::Node *node,
                                     const std::string &functionName) {
  Location loc = locationOf(node);
  c10::Symbol kind = node->kind();

  if (kind == c10::prim::Constant) {
    c10::optional<c10::IValue> value = jit::toIValue(node->output());
    if (!value)
      failAt(node, functionName,
             "a constant of type " + node->output()->type()->repr_str() +
                 " (a scripted function or class) is not supported; trace the "
                 "model so that calls are inlined");
    bind(node->output(), Entry::ofConstant(convertConstant(*value, loc)));
    return;
  }
  if (kind == c10::prim::GetAttr) {
    Entry &object = lookup(node->input());
    if (object.kind != Entry::Kind::Module)
      failAt(node, functionName, "prim::GetAttr on something not a module");
    std::string name = node->s(c10::attr::name);
    std::string attrPath = join(object.modulePath, name);
    c10::IValue attr = object.module->attr(name);
    if (attr.isModule()) {
      Entry sub;
      sub.kind = Entry::Kind::Module;
      sub.modulePath = attrPath;
      sub.module = std::make_shared<jit::Module>(attr.toModule());
      bind(node->output(), sub);
    } else if (attr.isTensor()) {
      std::string symbol =
          globalForTensorAttribute(attrPath, attr.toTensor(), loc);
      bind(node->output(),
           Entry::ofValue(bmt::GetGlobalOp::create(builder, 
               loc, bmt::TensorType::get(&context),
               FlatSymbolRefAttr::get(&context, symbol))));
    } else {
      bind(node->output(), Entry::ofConstant(convertConstant(attr, loc)));
    }
    return;
  }
  if (kind == c10::prim::CallMethod) {
    importCall(node, functionName);
    return;
  }
  if (kind == c10::prim::ListConstruct || kind == c10::prim::TupleConstruct) {
    Entry e;
    e.kind = kind == c10::prim::ListConstruct ? Entry::Kind::List
                                              : Entry::Kind::Tuple;
    for (jit::Value *input : node->inputs())
      e.elements.push_back(lookup(input));
    bind(node->output(), e);
    return;
  }
  if (kind == c10::prim::DictConstruct) {
    Entry e;
    e.kind = Entry::Kind::Dict;
    for (size_t i = 0; i + 1 < node->inputs().size(); i += 2) {
      Entry &key = lookup(node->inputs()[i]);
      if (key.kind != Entry::Kind::Constant || !isa<StringAttr>(key.constant))
        failAt(node, functionName, "dict keys must be constant strings");
      e.keys.push_back(cast<StringAttr>(key.constant).getValue().str());
      e.elements.push_back(lookup(node->inputs()[i + 1]));
    }
    bind(node->output(), e);
    return;
  }
  if (kind == c10::prim::ListUnpack || kind == c10::prim::TupleUnpack) {
    Entry container = lookup(node->input());
    if ((container.kind != Entry::Kind::List &&
         container.kind != Entry::Kind::Tuple) ||
        container.elements.size() != node->outputs().size())
      failAt(node, functionName,
             "unpacks a value whose length is not known at compile time");
    for (size_t i = 0; i < node->outputs().size(); ++i)
      bind(node->outputs()[i], container.elements[i]);
    return;
  }
  if (kind == c10::prim::TupleIndex || kind == c10::aten::__getitem__) {
    Entry container = lookup(node->inputs()[0]);
    Entry &index = lookup(node->inputs()[1]);
    if (index.kind != Entry::Kind::Constant)
      failAt(node, functionName, "indexing with a run-time index is not supported");
    if (container.kind == Entry::Kind::Dict) {
      auto key = dyn_cast<StringAttr>(index.constant);
      for (size_t i = 0; key && i < container.keys.size(); ++i)
        if (container.keys[i] == key.getValue()) {
          bind(node->output(), container.elements[i]);
          return;
        }
      failAt(node, functionName, "dict lookup of a key the dict does not hold");
    }
    auto i = dyn_cast<IntegerAttr>(index.constant);
    if ((container.kind != Entry::Kind::List &&
         container.kind != Entry::Kind::Tuple) || !i)
      failAt(node, functionName, "indexing of a value that is not a list or tuple");
    int64_t n = static_cast<int64_t>(container.elements.size());
    int64_t at = i.getInt() < 0 ? i.getInt() + n : i.getInt();
    if (at < 0 || at >= n)
      failAt(node, functionName, "index out of range");
    bind(node->output(), container.elements[at]);
    return;
  }
  if (kind == c10::prim::NumToTensor) {
    Entry &scalar = lookup(node->input());
    Entry e;
    e.kind = Entry::Kind::NumTensor;
    e.value = materialize(scalar, loc);
    bind(node->output(), e);
    return;
  }
  if (kind.is_aten()) {
    importAtenNode(node, functionName);
    return;
  }
  failAt(node, functionName,
         "unsupported TorchScript node '" + std::string(kind.toQualString()) + "'");
}

OwningOpRef<ModuleOp> TorchScriptImporter::run(const jit::Module &root) {
  Location loc = FileLineColLoc::get(&context, path, 0, 0);
  OwningOpRef<ModuleOp> owned = ModuleOp::create(loc);
  moduleOp = *owned;
  // Absolute, so that the exporter finds the weights from anywhere.
  llvm::SmallString<256> absolute(path);
  llvm::sys::fs::make_absolute(absolute);
  moduleOp->setAttr("bmt.source", builder.getStringAttr(absolute));
  moduleOp->setAttr("bmt.source_format", builder.getStringAttr("torchscript"));
  globalsBlock = moduleOp.getBody();
  collectGlobals(root);
  importMethod(root, "", "forward", loc);
  return owned;
}


} // namespace bmt::torch_script

using namespace bmt::torch_script;


/// For a zip that is not a TorchScript archive, what it is instead (empty
/// for a TorchScript archive or when the records cannot be listed; jit::load
/// reports those).
static std::string describeOtherArchive(const std::string &path) {
  std::vector<std::string> records;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    records = reader.getAllRecords();
  } catch (const c10::Error &e) {
    std::string reason = bmt::firstErrorLine(e.what_without_backtrace());
    if (reason.find("central directory") != std::string::npos)
      return "a truncated or corrupt zip archive (its central directory is missing)";
    return "a zip archive, but not a PyTorch archive (" + reason + ")";
  } catch (const std::exception &e) {
    return "a zip archive, but not a PyTorch archive (" + bmt::firstErrorLine(e.what()) + ")";
  }
  bool hasCode = false, hasData = false, isExport = false, isBmt = false;
  for (const std::string &r : records) {
    hasCode |= r.rfind("code/", 0) == 0;
    hasData |= r == "data.pkl";
    isExport |= r == "archive_format" || r.rfind("models/", 0) == 0;
    isBmt |= r == "bmt/version";
  }
  if (hasCode)
    return "";
  if (isBmt)
    return "a bmt sharded.pt (already compiled; run it with bmt-run, or pass the "
           "model it was compiled from)";
  if (isExport)
    return "a torch.export archive (.pt2), not a TorchScript archive: import it with "
           "importTorchExport (bmt-opt does so for .pt2 files)";
  if (hasData)
    return "a torch.save file (a state dict or a pickled module), not a TorchScript "
           "archive: trace the model with torch.jit.trace and torch.jit.save it";
  return "a zip archive, but not a TorchScript archive (no code/ records)";
}

bool bmt::looksLikeZipArchive(llvm::StringRef path) {
  auto buffer = llvm::MemoryBuffer::getFileSlice(path, 4, 0);
  if (!buffer)
    return false;
  return (*buffer)->getBuffer() == llvm::StringRef("PK\x03\x04", 4);
}

OwningOpRef<ModuleOp> bmt::importTorchScript(llvm::StringRef pathRef,
                                             MLIRContext &context) {
  context.loadDialect<bmt::BmtDialect, func::FuncDialect>();
  std::string path = pathRef.str();
  Location fileLoc = FileLineColLoc::get(&context, path, 0, 0);
  if (!bmt::import::checkInputFile(path, "TorchScript archive", fileLoc))
    return nullptr;
  if (std::error_code ec = llvm::sys::fs::access(path, llvm::sys::fs::AccessMode::Exist);
      !ec) {
    int fd;
    if (std::error_code openError = llvm::sys::fs::openFileForRead(path, fd)) {
      emitError(fileLoc) << path << ": cannot read: " << openError.message();
      return nullptr;
    }
    llvm::sys::Process::SafelyCloseFileDescriptor(fd);
  }
  if (!looksLikeZipArchive(path)) {
    emitError(fileLoc) << path
                       << ": not a zip archive (TorchScript archives are "
                          "written by torch.jit.save)";
    return nullptr;
  }
  if (std::string kind = describeOtherArchive(path); !kind.empty()) {
    emitError(fileLoc) << path << ": " << kind;
    return nullptr;
  }
  try {
    jit::Module root = jit::load(path);
    TorchScriptImporter importer(context, path);
    return importer.run(root);
  } catch (const ImportError &error) {
    emitError(error.loc) << error.message;
  } catch (const c10::Error &error) {
    emitError(fileLoc) << path << ": cannot load the TorchScript archive: "
                       << bmt::firstErrorLine(error.what_without_backtrace());
  } catch (const std::exception &error) {
    emitError(fileLoc) << path << ": cannot load the TorchScript archive: "
                       << bmt::firstErrorLine(error.what());
  }
  return nullptr;
}
