//===- TorchScriptValues.cpp - TorchScript values as bmt values -----------===//
//
// Types, constants, parameters and buffers of a TorchScript module, and the
// entries (an MLIR value, a constant, a list, ...) its values map to.
//
//===----------------------------------------------------------------------===//

#include "TorchScriptImporter.h"

using namespace mlir;

namespace bmt::torch_script {

//===----------------------------------------------------------------------===//
// Conversions
//===----------------------------------------------------------------------===//

Location TorchScriptImporter::locationOf(const jit::Node *node) {
  c10::optional<jit::SourceRange> range = node->sourceRange();
  if (auto generated = node->sourceRange().findSourceRangeThatGenerated())
    range = generated;
  if (range && range->source()) {
    if (auto flc = range->file_line_col()) {
      auto [file, line, col] = *flc;
      if (!file.empty() && line > 0) // synthesized nodes have ("", 0, 0)
        return FileLineColLoc::get(&context, file, line, col + 1);
    }
  }
  return FileLineColLoc::get(&context, path, 0, 0);
}

RankedTensorType TorchScriptImporter::convertTensorType(const at::Tensor &t,
                                                        Location loc,
                                                        const std::string &what) {
  Type element;
  switch (t.scalar_type()) {
  case at::kFloat: element = builder.getF32Type(); break;
  case at::kHalf: element = builder.getF16Type(); break;
  case at::kBFloat16: element = builder.getBF16Type(); break;
  case at::kDouble: element = builder.getF64Type(); break;
  case at::kLong: element = builder.getI64Type(); break;
  case at::kInt: element = builder.getI32Type(); break;
  case at::kShort: element = builder.getIntegerType(16); break;
  case at::kChar: element = builder.getIntegerType(8); break;
  case at::kByte: element = builder.getIntegerType(8, /*isSigned=*/false); break;
  case at::kBool: element = builder.getI1Type(); break;
  default:
    fail(loc, path + ": tensor of unsupported dtype " +
                  std::string(c10::toString(t.scalar_type())) +
                  (what.empty() ? "" : " (" + what + ")"));
  }
  return RankedTensorType::get(t.sizes().vec(), element);
}

Type TorchScriptImporter::convertType(const c10::TypePtr &type, Location loc,
                                      const std::string &where) {
  switch (type->kind()) {
  case c10::TypeKind::TensorType: return bmt::TensorType::get(&context);
  case c10::TypeKind::IntType: return builder.getI64Type();
  case c10::TypeKind::FloatType: return builder.getF64Type();
  case c10::TypeKind::BoolType: return builder.getI1Type();
  case c10::TypeKind::NumberType: return bmt::NumberType::get(&context);
  case c10::TypeKind::NoneType: return bmt::NoneType::get(&context);
  case c10::TypeKind::StringType: return bmt::StringType::get(&context);
  case c10::TypeKind::DeviceObjType: return bmt::DeviceType::get(&context);
  default:
    fail(loc, path + ": values of TorchScript type '" + type->repr_str() +
                  "' are not supported" + where);
  }
}

Attribute TorchScriptImporter::convertConstant(const c10::IValue &value,
                                               Location loc) {
  if (Attribute a = bmt::constantAttr(value, builder))
    return a;
  if (value.isTensor()) {
    at::Tensor t = value.toTensor().contiguous().cpu();
    RankedTensorType type = convertTensorType(t, loc);
    if (t.scalar_type() == at::kBool) {
      const bool *data = t.data_ptr<bool>();
      SmallVector<bool> bits(data, data + t.numel());
      return DenseElementsAttr::get(type, ArrayRef<bool>(bits));
    }
    ArrayRef<char> raw(static_cast<const char *>(t.data_ptr()), t.nbytes());
    return DenseElementsAttr::getFromRawBuffer(type, raw);
  }
  fail(loc, path + ": constant of TorchScript type '" +
                value.type()->repr_str() + "' is not supported");
}

//===----------------------------------------------------------------------===//
// Parameters and buffers
//===----------------------------------------------------------------------===//

void TorchScriptImporter::collectGlobals(const jit::Module &root) {
  Location loc = FileLineColLoc::get(&context, path, 0, 0);
  auto add = [&](const std::string &name, const at::Tensor &tensor,
                 bool isParameter) {
    TensorKey key{tensor.storage().unsafeGetStorageImpl(),
                  tensor.storage_offset(), tensor.sizes().vec(),
                  tensor.strides().vec(), static_cast<int>(tensor.scalar_type())};
    auto it = globalOfTensor.find(key);
    if (it != globalOfTensor.end()) {
      // A tie: the same storage under a second name.
      Operation *global = it->second;
      auto aliases = global->getAttrOfType<ArrayAttr>("aliases");
      SmallVector<Attribute> names(aliases ? aliases.getValue()
                                           : ArrayRef<Attribute>());
      names.push_back(builder.getStringAttr(name));
      global->setAttr("aliases", builder.getArrayAttr(names));
      globalOfAttribute[name] =
          SymbolTable::getSymbolName(global).getValue().str();
      return;
    }
    builder.setInsertionPointToEnd(globalsBlock);
    RankedTensorType type = convertTensorType(tensor, loc, name);
    Operation *global;
    if (isParameter)
      global = bmt::ParameterOp::create(builder, 
          loc, name, type, tensor.requires_grad(), /*aliases=*/nullptr);
    else
      // TorchScript keeps every buffer, persistent or not, and does not
      // record which; so none is marked persistent.
      global = bmt::BufferOp::create(builder, loc, name, type,
                                     /*persistent=*/false,
                                     /*aliases=*/nullptr);
    globalOfTensor[key] = global;
    globalOfAttribute[name] = name;
    lastGlobal = global;
  };
  for (const auto &p : root.named_parameters(/*recurse=*/true))
    add(p.name, p.value, /*isParameter=*/true);
  for (const auto &b : root.named_buffers(/*recurse=*/true))
    add(b.name, b.value, /*isParameter=*/false);
}

std::string
TorchScriptImporter::globalForTensorAttribute(const std::string &attrPath,
                                              const at::Tensor &tensor,
                                              Location loc) {
  auto it = globalOfAttribute.find(attrPath);
  if (it != globalOfAttribute.end())
    return it->second;
  // A plain tensor attribute (neither parameter nor buffer): a non-persistent
  // buffer, unless it shares storage with a global already.
  TensorKey key{tensor.storage().unsafeGetStorageImpl(),
                tensor.storage_offset(), tensor.sizes().vec(),
                tensor.strides().vec(), static_cast<int>(tensor.scalar_type())};
  if (auto tied = globalOfTensor.find(key); tied != globalOfTensor.end()) {
    std::string symbol =
        SymbolTable::getSymbolName(tied->second).getValue().str();
    globalOfAttribute[attrPath] = symbol;
    return symbol;
  }
  OpBuilder::InsertionGuard guard(builder);
  if (lastGlobal)
    builder.setInsertionPointAfter(lastGlobal);
  else
    builder.setInsertionPointToStart(globalsBlock);
  auto buffer = bmt::BufferOp::create(builder, 
      loc, attrPath, convertTensorType(tensor, loc, attrPath), /*persistent=*/false,
      /*aliases=*/nullptr);
  lastGlobal = buffer;
  globalOfTensor[key] = buffer;
  globalOfAttribute[attrPath] = attrPath;
  return attrPath;
}

//===----------------------------------------------------------------------===//
// Entries
//===----------------------------------------------------------------------===//

Entry &TorchScriptImporter::lookup(const jit::Value *v) {
  auto it = entries.find(v);
  if (it == entries.end())
    fail(FileLineColLoc::get(&context, path, 0, 0),
         path + ": internal error: value %" + v->debugName() +
             " used before it is defined");
  return it->second;
}

/// Turns an entry into one SSA value, creating a bmt.constant or
/// bmt.num_to_tensor where needed.
Value TorchScriptImporter::materialize(Entry &entry, Location loc) {
  switch (entry.kind) {
  case Entry::Kind::Value:
    return entry.value;
  case Entry::Kind::Constant:
    if (isa<ArrayAttr>(entry.constant))
      fail(loc, path + ": a constant list cannot be used as a single value");
    return bmt::ConstantOp::create(builder, loc, entry.constant);
  case Entry::Kind::NumTensor: {
    Value tensor = bmt::NumToTensorOp::create(builder, 
        loc, bmt::TensorType::get(&context), entry.value);
    entry = Entry::ofValue(tensor);
    return tensor;
  }
  default:
    fail(loc, path + ": a list, tuple, dict or module cannot be used as a "
                     "single value here");
  }
}

/// Turns an entry into a bmt.aten argument: a constant attribute, a
/// #bmt.operand marker (appending the operand), or a nested list of those.
Attribute TorchScriptImporter::toArgument(Entry &entry,
                                          SmallVectorImpl<Value> &operands,
                                          Location loc) {
  switch (entry.kind) {
  case Entry::Kind::Constant:
    if (!isa<ElementsAttr>(entry.constant))
      return entry.constant;
    break;
  case Entry::Kind::List: {
    SmallVector<Attribute> elements;
    for (Entry &element : entry.elements)
      elements.push_back(toArgument(element, operands, loc));
    return builder.getArrayAttr(elements);
  }
  default:
    break;
  }
  operands.push_back(materialize(entry, loc));
  return bmt::OperandAttr::get(&context);
}

void TorchScriptImporter::flatten(Entry &entry, SmallVectorImpl<Value> &values,
                                  std::vector<std::string> &names,
                                  const std::string &name, ResultShape &shape,
                                  Location loc) {
  auto flattenChildren = [&](ResultShape::Kind kind) {
    shape.kind = kind;
    for (size_t i = 0; i < entry.elements.size(); ++i) {
      shape.children.emplace_back();
      std::string childName =
          kind == ResultShape::Kind::Dict ? entry.keys[i] : std::to_string(i);
      flatten(entry.elements[i], values, names, join(name, childName),
              shape.children.back(), loc);
    }
    shape.keys = entry.keys;
  };
  switch (entry.kind) {
  case Entry::Kind::Tuple: flattenChildren(ResultShape::Kind::Tuple); return;
  case Entry::Kind::List: flattenChildren(ResultShape::Kind::List); return;
  case Entry::Kind::Dict: flattenChildren(ResultShape::Kind::Dict); return;
  default:
    shape.kind = ResultShape::Kind::Leaf;
    values.push_back(materialize(entry, loc));
    names.push_back(name);
  }
}

Entry TorchScriptImporter::unflatten(const ResultShape &shape,
                                     ValueRange values, size_t &next) {
  if (shape.kind == ResultShape::Kind::Leaf)
    return Entry::ofValue(values[next++]);
  Entry e;
  e.kind = shape.kind == ResultShape::Kind::Tuple ? Entry::Kind::Tuple
           : shape.kind == ResultShape::Kind::List ? Entry::Kind::List
                                                   : Entry::Kind::Dict;
  e.keys = shape.keys;
  for (const ResultShape &child : shape.children)
    e.elements.push_back(unflatten(child, values, next));
  return e;
}

void TorchScriptImporter::flattenInputType(const c10::TypePtr &type,
                                           SmallVectorImpl<Type> &types,
                                           Location loc, const std::string &where) {
  if (auto tuple = type->cast<c10::TupleType>()) {
    for (const c10::TypePtr &element : tuple->elements())
      flattenInputType(element, types, loc, where);
    return;
  }
  types.push_back(convertType(type, loc, where));
}

Entry TorchScriptImporter::bindInput(const c10::TypePtr &type,
                                     Block::BlockArgListType args, size_t &next,
                                     Location loc) {
  if (auto tuple = type->cast<c10::TupleType>()) {
    Entry e;
    e.kind = Entry::Kind::Tuple;
    for (const c10::TypePtr &element : tuple->elements())
      e.elements.push_back(bindInput(element, args, next, loc));
    return e;
  }
  return Entry::ofValue(args[next++]);
}


} // namespace bmt::torch_script
