//===- TorchExportImporterTest.cpp - torch.export importer through C++ ----===//
//
// Imports the GPT-2 fixture archive (test/fixtures/make_fixtures.py writes
// gpt2.pt2 with torch.export and, from the eager model, gpt2.params.json)
// through bmt::importTorchExport and checks it against values obtained
// independently of the importer: the eager model's parameter list, the
// module paths of the archive's own nn_module_stack metadata, and a schema
// version this test writes itself.
//
// The fixtures are made by ctest's make-fixtures test (BMT_FIXTURES_DIR);
// without them the tests skip.
//
//===----------------------------------------------------------------------===//

#include "ImportResult.h"

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Import/TorchExport.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/FileSystem.h"

#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace mlir;
using json = nlohmann::json;

namespace {

std::string fixture(const std::string &name) {
  return std::string(BMT_FIXTURES_DIR) + "/" + name;
}

#define REQUIRE_FIXTURE(name)                                                  \
  if (!llvm::sys::fs::exists(fixture(name)))                                   \
  GTEST_SKIP() << fixture(name) << " is missing (made by ctest's make-fixtures)"

using bmt::test::Imported;

Imported import(const std::string &file, MLIRContext &context) {
  return bmt::test::importWith(bmt::importTorchExport, file, context);
}

json readJsonFile(const std::string &path) {
  std::ifstream in(path);
  return json::parse(in);
}

/// The program record of a .pt2, read with LibTorch's zip reader.
json readProgram(const std::string &path) {
  caffe2::serialize::PyTorchStreamReader reader(path);
  auto [data, size] = reader.getRecord("models/model.json");
  return json::parse(std::string(static_cast<const char *>(data.get()), size));
}

std::vector<int64_t> shapeOf(Type type) {
  auto ranked = cast<RankedTensorType>(type);
  return std::vector<int64_t>(ranked.getShape().begin(), ranked.getShape().end());
}

TEST(TorchExportImporter, Gpt2ParametersMatchTheEagerModel) {
  REQUIRE_FIXTURE("gpt2.pt2");
  MLIRContext context;
  Imported imported = import(fixture("gpt2.pt2"), context);
  ASSERT_TRUE(imported.module) << (imported.errors.empty() ? "" : imported.errors[0]);
  EXPECT_TRUE(imported.errors.empty());
  EXPECT_TRUE(succeeded(verify(*imported.module)));

  std::map<std::string, bmt::ParameterOp> params;
  std::map<std::string, std::string> symbolOfName; // every name -> its symbol
  imported.module->walk([&](bmt::ParameterOp p) {
    std::string symbol = p.getSymName().str();
    params[symbol] = p;
    symbolOfName[symbol] = symbol;
    if (std::optional<ArrayAttr> aliases = p.getAliases()) {
      ArrayAttr list = *aliases; // not `: *p.getAliases()` (a dangling temporary)
      for (Attribute a : list)
        symbolOfName[cast<StringAttr>(a).getValue().str()] = symbol;
    }
  });

  // The eager model's named_parameters(remove_duplicate=False).
  json reference = readJsonFile(fixture("gpt2.params.json"));
  size_t distinct = 0, names = 0;
  for (const json &r : reference) {
    if (r["kind"] != "parameter")
      continue;
    ++names;
    std::string name = r["name"];
    SCOPED_TRACE(name);
    ASSERT_TRUE(symbolOfName.count(name)) << name << " is neither a symbol nor an alias";
    bmt::ParameterOp p = params[symbolOfName[name]];
    EXPECT_EQ(shapeOf(p.getType()), r["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(p.getRequiresGrad(), r["requires_grad"].get<bool>());
    if (r["tied_to"].is_null()) {
      ++distinct;
      EXPECT_EQ(symbolOfName[name], name); // the first name is the symbol
    } else {
      // Tie unification: the alias resolves to the symbol of its first name.
      EXPECT_EQ(symbolOfName[name], r["tied_to"].get<std::string>());
    }
  }
  EXPECT_EQ(params.size(), distinct);
  EXPECT_EQ(symbolOfName.size(), names);
  // GPT-2's one tie, as the eager model has it.
  ASSERT_TRUE(params.count("transformer.wte.weight"));
  auto aliases = params["transformer.wte.weight"].getAliases();
  ASSERT_TRUE(aliases);
  ASSERT_EQ(aliases->size(), 1u);
  EXPECT_EQ(cast<StringAttr>((*aliases)[0]).getValue(), "lm_head.weight");
  // No bmt.get_global reads the alias; lm_head reads the one symbol.
  auto lmHead = imported.module->lookupSymbol<func::FuncOp>("lm_head.forward");
  ASSERT_TRUE(lmHead);
  int reads = 0;
  imported.module->walk([&](bmt::GetGlobalOp g) {
    EXPECT_NE(g.getGlobal(), "lm_head.weight");
    if (g->getParentOfType<func::FuncOp>() == lmHead && g.getGlobal() == "transformer.wte.weight")
      ++reads;
  });
  EXPECT_EQ(reads, 1);
}

TEST(TorchExportImporter, Gpt2FunctionsAreTheModulesOfNnModuleStack) {
  REQUIRE_FIXTURE("gpt2.pt2");
  // Module paths as the archive's nodes record them ("key,path,type;...").
  std::set<std::string> expected{"forward"};
  std::map<std::string, std::string> typeOfPath;
  json program = readProgram(fixture("gpt2.pt2"));
  for (const json &node : program["graph_module"]["graph"]["nodes"]) {
    if (!node.contains("metadata") || !node["metadata"].contains("nn_module_stack"))
      continue;
    std::stringstream entries(node["metadata"]["nn_module_stack"].get<std::string>());
    std::string entry;
    while (std::getline(entries, entry, ';')) {
      size_t first = entry.find(','), last = entry.rfind(',');
      std::string path = entry.substr(first + 1, last - first - 1);
      if (!path.empty()) {
        expected.insert(path + ".forward");
        typeOfPath[path] = entry.substr(last + 1);
      }
    }
  }
  ASSERT_GT(expected.size(), 10u);

  MLIRContext context;
  Imported imported = import(fixture("gpt2.pt2"), context);
  ASSERT_TRUE(imported.module);
  std::set<std::string> functions;
  imported.module->walk([&](func::FuncOp f) {
    functions.insert(f.getSymName().str());
    auto path = f->getAttrOfType<StringAttr>("bmt.module_path");
    ASSERT_TRUE(path);
    if (!path.getValue().empty()) {
      EXPECT_EQ(f->getAttrOfType<StringAttr>("bmt.module_type").getValue(),
                typeOfPath[path.getValue().str()]);
    }
  });
  EXPECT_EQ(functions, expected);
  EXPECT_TRUE(functions.count("transformer.h.0.attn.c_attn.forward"));

  // The two blocks are called, in order, from transformer.forward.
  auto transformer = imported.module->lookupSymbol<func::FuncOp>("transformer.forward");
  ASSERT_TRUE(transformer);
  std::vector<std::string> blockCalls;
  transformer.walk([&](func::CallOp call) {
    if (call.getCallee().starts_with("transformer.h."))
      blockCalls.push_back(call.getCallee().str());
  });
  EXPECT_EQ(blockCalls, (std::vector<std::string>{"transformer.h.0.forward",
                                                  "transformer.h.1.forward"}));
}

TEST(TorchExportImporter, UnsupportedSchemaVersionNamesBothVersions) {
  REQUIRE_FIXTURE("gpt2.pt2");
  // gpt2.pt2 with its program's schema_version set to 7.3, written here.
  llvm::SmallString<128> dir;
  ASSERT_FALSE(llvm::sys::fs::createUniqueDirectory("bmt-pt2-test", dir));
  std::string path = (dir + "/old.pt2").str();
  {
    caffe2::serialize::PyTorchStreamReader reader(fixture("gpt2.pt2"));
    caffe2::serialize::PyTorchStreamWriter writer(path);
    for (const std::string &record : reader.getAllRecords()) {
      if (record == ".data/version" || record == "version" || record == ".data/serialization_id" ||
          record == "byteorder")
        continue; // the writer writes its own
      auto [data, size] = reader.getRecord(record);
      std::string bytes(static_cast<const char *>(data.get()), size);
      if (record == "models/model.json") {
        json program = json::parse(bytes);
        program["schema_version"] = {{"major", 7}, {"minor", 3}};
        bytes = program.dump();
      }
      writer.writeRecord(record, bytes.data(), bytes.size());
    }
    writer.writeEndOfFile();
  }
  MLIRContext context;
  Imported imported = import(path, context);
  llvm::sys::fs::remove_directories(dir);
  EXPECT_FALSE(imported.module);
  ASSERT_EQ(imported.errors.size(), 1u);
  const std::string &error = imported.errors[0];
  EXPECT_NE(error.find("unsupported torch.export schema version 7.3"), std::string::npos)
      << error;
  EXPECT_NE(error.find("bmt reads schema version " + std::to_string(bmt::kTorchExportSchemaMajor) +
                       ".x"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("old.pt2"), std::string::npos) << error;
}

TEST(TorchExportImporter, DynamicShapesBecomeIntegerValues) {
  REQUIRE_FIXTURE("gpt2-dyn.pt2");
  MLIRContext context;
  Imported imported = import(fixture("gpt2-dyn.pt2"), context);
  ASSERT_TRUE(imported.module) << (imported.errors.empty() ? "" : imported.errors[0]);
  EXPECT_TRUE(succeeded(verify(*imported.module)));
  // The archive's symbolic sizes: one aten::size.int each, returning i64.
  json program = readProgram(fixture("gpt2-dyn.pt2"));
  size_t symSizes = 0;
  for (const json &node : program["graph_module"]["graph"]["nodes"])
    symSizes += node["target"] == "torch.ops.aten.sym_size.int";
  ASSERT_GT(symSizes, 0u);
  size_t sizes = 0;
  imported.module->walk([&](bmt::AtenOp op) {
    if (op.getName() == "aten::size.int") {
      ++sizes;
      EXPECT_TRUE(op.getResult(0).getType().isInteger(64));
      // Made at the root, not in a pseudo-module function.
      EXPECT_EQ(op->getParentOfType<func::FuncOp>().getSymName(), "forward");
    }
  });
  EXPECT_EQ(sizes, symSizes);
  // Block functions take the sizes as i64 arguments.
  auto block = imported.module->lookupSymbol<func::FuncOp>("transformer.h.0.forward");
  ASSERT_TRUE(block);
  size_t intArgs = 0;
  for (Type t : block.getFunctionType().getInputs())
    intArgs += t.isInteger(64);
  EXPECT_GT(intArgs, 0u);
}

} // namespace
