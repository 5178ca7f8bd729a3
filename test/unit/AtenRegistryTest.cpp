//===- AtenRegistryTest.cpp - the registry agrees with LibTorch -----------===//
//
// Every AtenOps.def entry is checked against the schema that LibTorch
// registers under the same name: same argument count, same result
// count, and -1 exactly for schemas returning one Tensor[].
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/AtenRegistry.h"

#include <torch/csrc/jit/runtime/operator.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

namespace {

TEST(AtenRegistry, EveryEntryMatchesTheDispatcherSchema) {
  ASSERT_GT(bmt::getAtenOps().size(), 50u);
  for (const bmt::AtenOpInfo &info : bmt::getAtenOps()) {
    std::string name = info.name.str();
    size_t ns = name.find("::");
    size_t dot = name.find('.', ns + 2);
    std::string op = name.substr(0, dot);
    std::string overload = dot == std::string::npos ? "" : name.substr(dot + 1);
    // The JIT operator table holds the dispatcher's operators and the
    // TorchScript-only ones (aten::Int.Tensor, aten::size.int, ...).
    std::shared_ptr<torch::jit::Operator> handle =
        torch::jit::findOperatorFor(c10::OperatorName(op, overload));
    ASSERT_TRUE(handle) << name << " has no schema in LibTorch";
    const c10::FunctionSchema &schema = handle->schema();
    EXPECT_EQ(schema.arguments().size(), info.numArgs) << schema;
    if (info.numResults < 0) {
      ASSERT_EQ(schema.returns().size(), 1u) << schema;
      auto list = schema.returns()[0].type()->cast<c10::ListType>();
      ASSERT_TRUE(list) << name << " is marked as returning a list: " << schema;
      EXPECT_EQ(list->getElementType()->kind(), c10::TypeKind::TensorType);
    } else {
      EXPECT_EQ(schema.returns().size(), static_cast<size_t>(info.numResults))
          << schema;
      for (const c10::Argument &ret : schema.returns())
        EXPECT_FALSE(ret.type()->cast<c10::ListType>())
            << name << " returns a list but is not marked -1: " << schema;
    }
  }
}

TEST(AtenRegistry, NamesAreUniqueAndLookupFindsThem) {
  std::set<std::string> seen;
  for (const bmt::AtenOpInfo &info : bmt::getAtenOps()) {
    EXPECT_TRUE(seen.insert(info.name.str()).second) << "duplicate " << info.name.str();
    EXPECT_EQ(bmt::lookupAtenOp(info.name), &info);
  }
}

TEST(AtenRegistry, UnknownOperatorsAreNotFound) {
  EXPECT_EQ(bmt::lookupAtenOp("aten::erfinv"), nullptr);
  EXPECT_EQ(bmt::lookupAtenOp("aten::softmax"), nullptr); // overload missing
  EXPECT_EQ(bmt::lookupAtenOp(""), nullptr);
}

TEST(AtenRegistry, KindsHaveNames) {
  const bmt::AtenOpInfo *linear = bmt::lookupAtenOp("aten::linear");
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear->kind, bmt::AtenOpKind::Matmul);
  EXPECT_EQ(bmt::stringifyAtenOpKind(linear->kind), "matmul");
  EXPECT_EQ(bmt::stringifyAtenOpKind(bmt::lookupAtenOp("aten::view")->kind), "view");
}

} // namespace
