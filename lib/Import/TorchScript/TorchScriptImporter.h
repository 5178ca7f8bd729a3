//===- TorchScriptImporter.h - the TorchScript importer's parts -*- C++ -*-===//
//
// Private to lib/Import/TorchScript: the importer class, the entries that
// TorchScript values map to, and small naming helpers. Its methods live in
// TorchScriptValues.cpp (types, constants, parameters and buffers, entries)
// and TorchScriptImporter.cpp (functions, nodes, the entry points).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_LIB_IMPORT_TORCHSCRIPT_TORCHSCRIPTIMPORTER_H
#define BMT_LIB_IMPORT_TORCHSCRIPT_TORCHSCRIPTIMPORTER_H

#include "../ImportSupport.h"
#include "bmt/Import/TorchScript.h"

#include "../IValueConstants.h"
#include "../InputFile.h"

#include "bmt/Support/ErrorText.h"

#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Process.h"

#include <ATen/core/function_schema.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/serialization/import.h>
#include <caffe2/serialize/inline_container.h>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace bmt::torch_script {

using namespace bmt::import;
using mlir::Block;
using mlir::Operation;
using mlir::ValueRange;
namespace jit = torch::jit;

/// What a TorchScript value stands for while its function is imported.
struct Entry {
  enum class Kind { Value, Constant, List, Tuple, Dict, Module, NumTensor };
  Kind kind = Kind::Value;
  Value value;                   // Value; NumTensor: the scalar
  Attribute constant;            // Constant
  std::vector<Entry> elements;   // List, Tuple, Dict (values)
  std::vector<std::string> keys; // Dict
  std::string modulePath;        // Module: dotted path ("" for the root)
  std::shared_ptr<jit::Module> module;

  static Entry ofValue(Value v) {
    Entry e;
    e.value = v;
    return e;
  }
  static Entry ofConstant(Attribute a) {
    Entry e;
    e.kind = Kind::Constant;
    e.constant = a;
    return e;
  }
};

/// How a function's flat result list folds back into tuples and dicts.
struct ResultShape {
  enum class Kind { Leaf, Tuple, List, Dict } kind = Kind::Leaf;
  std::vector<ResultShape> children;
  std::vector<std::string> keys;
};

struct ImportedFunction {
  func::FuncOp op;
  ResultShape resultShape;
};

std::string join(const std::string &prefix, const std::string &name);

/// "__torch__.transformers.models.gpt2.modeling_gpt2.___torch_mangle_3.GPT2Block"
/// -> "transformers.models.gpt2.modeling_gpt2.GPT2Block".
std::string demangleClassName(std::string name);

/// The name TorchScript gives a value, without its uniquing suffix: "x.1" -> "x".
std::string baseName(const jit::Value *v);

/// One line describing a node: "%y : Tensor = aten::erfinv(%x)".
std::string describeNode(const jit::Node *node);

class TorchScriptImporter {
public:
  TorchScriptImporter(MLIRContext &context, std::string path)
      : context(context), builder(&context), path(std::move(path)) {}

  OwningOpRef<ModuleOp> run(const jit::Module &root);

private:
  // --- module state ---------------------------------------------------------
  void collectGlobals(const jit::Module &root);
  std::string globalForTensorAttribute(const std::string &attrPath,
                                       const at::Tensor &tensor, Location loc);

  // --- functions ------------------------------------------------------------
  ImportedFunction &importMethod(const jit::Module &module,
                                 const std::string &modulePath,
                                 const std::string &method, Location callLoc);
  void importNode(jit::Node *node, const std::string &functionName);
  void importAtenNode(jit::Node *node, const std::string &functionName);
  void importCall(jit::Node *node, const std::string &functionName);

  // --- entries --------------------------------------------------------------
  Entry &lookup(const jit::Value *v);
  void bind(const jit::Value *v, Entry entry) { entries[v] = std::move(entry); }
  Value materialize(Entry &entry, Location loc);
  Attribute toArgument(Entry &entry, SmallVectorImpl<Value> &operands,
                       Location loc);
  void flatten(Entry &entry, SmallVectorImpl<Value> &values,
               std::vector<std::string> &names, const std::string &name,
               ResultShape &shape, Location loc);
  Entry unflatten(const ResultShape &shape, ValueRange values, size_t &next);
  void flattenInputType(const c10::TypePtr &type, SmallVectorImpl<Type> &types,
                        Location loc, const std::string &where);
  Entry bindInput(const c10::TypePtr &type, Block::BlockArgListType args,
                  size_t &next, Location loc);

  // --- conversions ----------------------------------------------------------
  /// `where` is appended to the error message (" (argument 'x' of f)").
  Type convertType(const c10::TypePtr &type, Location loc,
                   const std::string &where = "");
  /// `what` names the tensor in error messages.
  RankedTensorType convertTensorType(const at::Tensor &tensor, Location loc,
                                     const std::string &what = "");
  Attribute convertConstant(const c10::IValue &value, Location loc);
  Location locationOf(const jit::Node *node);

  [[noreturn]] void fail(Location loc, const std::string &message) {
    throw ImportError{loc, message};
  }
  [[noreturn]] void failAt(const jit::Node *node, const std::string &function,
                           const std::string &message) {
    fail(locationOf(node), path + ": " + message + " (node `" +
                               describeNode(node) + "` in function '" +
                               function + "')");
  }

  MLIRContext &context;
  OpBuilder builder;
  std::string path;
  ModuleOp moduleOp;

  /// Attribute path ("lm_head.weight") -> symbol name of its global.
  llvm::StringMap<std::string> globalOfAttribute;
  /// Storage identity of each global, to find ties.
  using TensorKey = std::tuple<const void *, int64_t, std::vector<int64_t>,
                               std::vector<int64_t>, int>;
  std::map<TensorKey, Operation *> globalOfTensor;
  Block *globalsBlock = nullptr;
  Operation *lastGlobal = nullptr;

  std::map<std::string, ImportedFunction> functions; // by symbol name
  std::map<const jit::Value *, Entry> entries;
};

} // namespace bmt::torch_script

#endif // BMT_LIB_IMPORT_TORCHSCRIPT_TORCHSCRIPTIMPORTER_H
