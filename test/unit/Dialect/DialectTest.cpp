//===- DialectTest.cpp - bmt dialect C++ API ------------------------------===//

#include "bmt/Dialect/BmtDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

using namespace mlir;

namespace {

class DialectTest : public ::testing::Test {
protected:
  DialectTest() : builder(&context) {
    context.loadDialect<bmt::BmtDialect, func::FuncDialect>();
  }
  MLIRContext context;
  OpBuilder builder;
};

TEST_F(DialectTest, AtenOpSplitsNameAndOverload) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @f(%x: !bmt.tensor) -> (!bmt.tensor, !bmt.tensor) {
      %0 = bmt.aten "aten::softmax.int"(%x, -1, #bmt.none) : (!bmt.tensor) -> !bmt.tensor
      %1 = bmt.aten "aten::linear"(%x, %x, #bmt.none) : (!bmt.tensor, !bmt.tensor) -> !bmt.tensor
      return %0, %1 : !bmt.tensor, !bmt.tensor
    })mlir", &context);
  ASSERT_TRUE(module);
  std::vector<bmt::AtenOp> ops;
  module->walk([&](bmt::AtenOp op) { ops.push_back(op); });
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].getOperatorName(), "aten::softmax");
  EXPECT_EQ(ops[0].getOverloadName(), "int");
  EXPECT_EQ(ops[1].getOperatorName(), "aten::linear");
  EXPECT_EQ(ops[1].getOverloadName(), "");
  EXPECT_EQ(ops[1].getOperands().size(), 2u);
  EXPECT_EQ(ops[1].getArgs().size(), 3u);
}

TEST_F(DialectTest, ConstantInfersItsTypeFromTheAttribute) {
  Location loc = builder.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  builder.setInsertionPointToEnd(module->getBody());
  auto i = bmt::ConstantOp::create(builder, loc, builder.getI64IntegerAttr(3));
  auto f = bmt::ConstantOp::create(builder, loc, builder.getF64FloatAttr(0.5));
  auto b = bmt::ConstantOp::create(builder, loc, builder.getBoolAttr(true));
  auto n = bmt::ConstantOp::create(builder, loc, bmt::NoneAttr::get(&context));
  auto d = bmt::ConstantOp::create(builder, loc,
                                   bmt::DeviceAttr::get(&context, "cuda:1"));
  auto t = bmt::ConstantOp::create(
      builder, loc,
      DenseElementsAttr::get(RankedTensorType::get({2}, builder.getF32Type()),
                             ArrayRef<float>{1.0f, 2.0f}));
  EXPECT_TRUE(i.getType().isInteger(64));
  EXPECT_TRUE(f.getType().isF64());
  EXPECT_TRUE(b.getType().isInteger(1));
  EXPECT_TRUE(isa<bmt::NoneType>(n.getType()));
  EXPECT_TRUE(isa<bmt::DeviceType>(d.getType()));
  EXPECT_TRUE(isa<bmt::TensorType>(t.getType()));
  EXPECT_TRUE(succeeded(verify(*module)));
}

TEST_F(DialectTest, ParameterCountsElements) {
  Location loc = builder.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  builder.setInsertionPointToEnd(module->getBody());
  auto p = bmt::ParameterOp::create(
      builder, loc, "w", RankedTensorType::get({3, 5, 7}, builder.getBF16Type()),
      /*requires_grad=*/true, /*aliases=*/nullptr);
  EXPECT_EQ(p.getNumElements(), 105);
  EXPECT_TRUE(succeeded(verify(*module)));
}

} // namespace
