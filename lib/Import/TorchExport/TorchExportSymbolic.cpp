//===- TorchExportSymbolic.cpp - symbolic scalars of a .pt2 ---------------===//
//
// The operations on SymInts, SymFloats and SymBools of a dynamic-shape
// export (TorchExportImporter::emitSymOp).
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
            ArrayRef<double>{lit.contains("as_float") ? floatOf(lit["as_float"])
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


} // namespace bmt::torch_export
