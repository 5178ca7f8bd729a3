//===- TorchExportImporter.h - the .pt2 importer's parts --------*- C++ -*-===//
//
// Private to lib/Import/TorchExport: the importer class and the structures
// its steps share (see TorchExportImporter.cpp for the steps). The class's
// methods live in three files: TorchExportGraph.cpp (reading the graph:
// globals, flattening, regions, boundaries), TorchExportSymbolic.cpp
// (symbolic scalars of dynamic shapes) and TorchExportImporter.cpp
// (emission and the entry points).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_LIB_IMPORT_TORCHEXPORT_TORCHEXPORTIMPORTER_H
#define BMT_LIB_IMPORT_TORCHEXPORT_TORCHEXPORTIMPORTER_H

#include "../ImportSupport.h"
#include "Pt2Archive.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <ATen/core/ivalue.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace bmt::torch_export {

using namespace bmt::import;
using json = nlohmann::json;
namespace pt2 = bmt::pt2;

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

/// A float of the program's JSON: a number, or one of the strings torch.export
/// writes for what JSON cannot ("Infinity", "-Infinity", "NaN": a mask's
/// -inf fill, for one). Anything else throws json's type_error, reported as a
/// malformed program.
double floatOf(const json &v);

/// The innermost Python frame of a stack_trace: (file, line).
std::pair<std::string, int> innermostFrame(const std::string &trace);

/// "L__self__,,T;L__self__transformer,transformer,T2" -> frames (root dropped).
std::vector<ModuleFrame> parseModuleStack(const std::string &text,
                                          std::string &rootType);

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

} // namespace bmt::torch_export

#endif // BMT_LIB_IMPORT_TORCHEXPORT_TORCHEXPORTIMPORTER_H
