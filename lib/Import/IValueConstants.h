//===- IValueConstants.h - IValue constants as bmt attributes ---*- C++ -*-===//
//
// Internal to the importers (lib/Import/*), which both turn LibTorch
// constants into the attributes bmt.aten takes. Includes LibTorch and MLIR
// headers: never include it from a public header.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_LIB_IMPORT_IVALUECONSTANTS_H
#define BMT_LIB_IMPORT_IVALUECONSTANTS_H

#include "bmt/Dialect/BmtDialect.h"

#include "mlir/IR/Builders.h"

#include <ATen/core/ivalue.h>

namespace bmt {

/// The attribute of a constant IValue: None -> #bmt.none, bool, int (i64),
/// float (f64), string, Device -> #bmt.device, and lists and tuples of
/// those -> arrays. Null for anything else (tensors, objects), which the
/// caller handles or reports.
inline mlir::Attribute constantAttr(const c10::IValue &value, mlir::Builder &b) {
  if (value.isNone())
    return NoneAttr::get(b.getContext());
  if (value.isBool())
    return b.getBoolAttr(value.toBool());
  if (value.isInt())
    return b.getI64IntegerAttr(value.toInt());
  if (value.isDouble())
    return b.getF64FloatAttr(value.toDouble());
  if (value.isString())
    return b.getStringAttr(value.toStringRef());
  if (value.isDevice())
    return DeviceAttr::get(b.getContext(), value.toDevice().str());
  if (value.isList() || value.isTuple()) {
    llvm::SmallVector<mlir::Attribute> elements;
    auto add = [&](const c10::IValue &element) {
      mlir::Attribute a = constantAttr(element, b);
      elements.push_back(a);
      return static_cast<bool>(a);
    };
    if (value.isList()) {
      for (const c10::IValue &element : value.toListRef())
        if (!add(element))
          return {};
    } else {
      for (const c10::IValue &element : value.toTupleRef().elements())
        if (!add(element))
          return {};
    }
    return b.getArrayAttr(elements);
  }
  return {};
}

} // namespace bmt

#endif // BMT_LIB_IMPORT_IVALUECONSTANTS_H
