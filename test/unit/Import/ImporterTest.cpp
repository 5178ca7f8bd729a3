//===- ImporterTest.cpp - TorchScript importer on modules built in C++ ----===//
//
// Builds TorchScript modules with LibTorch's C++ API (an independent way to
// make archives than the Python fixtures), saves them, imports them, and
// checks ties, buffers, the call tree and the diagnostics.
//
//===----------------------------------------------------------------------===//

#include "ImportResult.h"

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Import/TorchScript.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/FileSystem.h"

#include <torch/csrc/jit/api/module.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

using namespace mlir;

namespace {

/// A file name in a fresh temporary directory, removed with the test.
class TempDir {
public:
  TempDir() {
    llvm::SmallString<128> dir;
    EXPECT_FALSE(llvm::sys::fs::createUniqueDirectory("bmt-importer-test", dir));
    path = dir.str().str();
  }
  ~TempDir() { llvm::sys::fs::remove_directories(path); }
  std::string file(const std::string &name) const { return path + "/" + name; }
  std::string path;
};

using bmt::test::Imported;

Imported import(const std::string &file, MLIRContext &context) {
  return bmt::test::importWith(bmt::importTorchScript, file, context);
}

TEST(TorchScriptImporter, TiedParametersBecomeOneSymbolWithAliases) {
  TempDir dir;
  torch::jit::Module inner("Inner");
  torch::jit::Module root("Root");
  at::Tensor shared = torch::randn({4, 3}).set_requires_grad(true);
  inner.register_parameter("weight", shared, /*is_buffer=*/false);
  inner.define("def forward(self, x):\n  return torch.matmul(x, self.weight)\n");
  root.register_module("proj", inner);
  root.register_parameter("head", shared, /*is_buffer=*/false);
  root.register_buffer("scale", torch::ones({3}));
  root.define("def forward(self, x):\n"
              "  y = self.proj.forward(x)\n"
              "  return torch.mul(y, self.scale), torch.matmul(x, self.head)\n");
  root.save(dir.file("tied.pt"));

  MLIRContext context;
  Imported imported = import(dir.file("tied.pt"), context);
  ASSERT_TRUE(imported.module) << (imported.errors.empty() ? "" : imported.errors[0]);
  EXPECT_TRUE(succeeded(verify(*imported.module)));

  std::vector<bmt::ParameterOp> params;
  std::vector<bmt::BufferOp> buffers;
  imported.module->walk([&](bmt::ParameterOp p) { params.push_back(p); });
  imported.module->walk([&](bmt::BufferOp b) { buffers.push_back(b); });
  ASSERT_EQ(params.size(), 1u);
  // One symbol for the two names (the first in TorchScript's slot order is
  // the symbol, the other its alias).
  ASSERT_TRUE(params[0].getAliases());
  ASSERT_EQ(params[0].getAliases()->size(), 1u);
  std::string symbol = params[0].getSymName().str();
  std::string alias =
      cast<StringAttr>((*params[0].getAliases())[0]).getValue().str();
  EXPECT_EQ(std::set<std::string>({symbol, alias}),
            std::set<std::string>({"head", "proj.weight"}));
  EXPECT_EQ(cast<RankedTensorType>(params[0].getType()).getShape(),
            (ArrayRef<int64_t>{4, 3}));
  EXPECT_TRUE(params[0].getRequiresGrad());
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_EQ(buffers[0].getSymName(), "scale");

  // Both uses of the shared tensor refer to the one symbol.
  int uses = 0;
  imported.module->walk([&](bmt::GetGlobalOp g) {
    if (g.getGlobal() == symbol)
      ++uses;
    EXPECT_NE(g.getGlobal(), alias);
  });
  EXPECT_EQ(uses, 2);

  // Module tree: forward calls proj.forward; a tuple result is two results.
  auto forward = imported.module->lookupSymbol<func::FuncOp>("forward");
  auto proj = imported.module->lookupSymbol<func::FuncOp>("proj.forward");
  ASSERT_TRUE(forward && proj);
  EXPECT_EQ(forward.getFunctionType().getNumResults(), 2u);
  EXPECT_TRUE(proj.isPrivate());
  int calls = 0;
  forward.walk([&](func::CallOp call) {
    EXPECT_EQ(call.getCallee(), "proj.forward");
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

TEST(TorchScriptImporter, MissingFileIsOneError) {
  MLIRContext context;
  Imported imported = import("/nonexistent/model.pt", context);
  EXPECT_FALSE(imported.module);
  ASSERT_EQ(imported.errors.size(), 1u);
  EXPECT_NE(imported.errors[0].find("/nonexistent/model.pt: no such file"),
            std::string::npos);
}

TEST(TorchScriptImporter, UnknownOperatorIsOneErrorNamingTheNode) {
  TempDir dir;
  torch::jit::Module root("Root");
  root.define("def forward(self, x):\n  return torch.erfinv(torch.relu(x))\n");
  root.save(dir.file("erfinv.pt"));
  MLIRContext context;
  Imported imported = import(dir.file("erfinv.pt"), context);
  EXPECT_FALSE(imported.module);
  ASSERT_EQ(imported.errors.size(), 1u);
  EXPECT_NE(imported.errors[0].find("unsupported operator 'aten::erfinv'"),
            std::string::npos)
      << imported.errors[0];
  EXPECT_NE(imported.errors[0].find("erfinv.pt"), std::string::npos);
}

TEST(TorchScriptImporter, RecognisesZipArchives) {
  TempDir dir;
  std::ofstream(dir.file("text.pt")) << "hello";
  std::ofstream(dir.file("empty.pt"));
  std::ofstream(dir.file("zip.pt")) << "PK\x03\x04rest";
  EXPECT_FALSE(bmt::looksLikeZipArchive(dir.file("text.pt")));
  EXPECT_FALSE(bmt::looksLikeZipArchive(dir.file("empty.pt")));
  EXPECT_FALSE(bmt::looksLikeZipArchive(dir.file("missing.pt")));
  EXPECT_TRUE(bmt::looksLikeZipArchive(dir.file("zip.pt")));
}

} // namespace
