//===- AtenRegistryTest.cpp - the registry agrees with LibTorch -----------===//
//
// Every AtenOps.def entry is checked against the schema that LibTorch
// registers under the same name: same argument names (hence count), same
// result count, and -1 exactly for schemas returning one Tensor[]; the
// flags a schema states (InPlace: `self` is `Tensor(a!)`; Alias: a result
// is `Tensor(a)`; Random: tagged nondeterministic_seeded) and the
// reduced-dims argument of reductions.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/FusibleOps.h"

#include "llvm/ADT/Twine.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <gtest/gtest.h>

#include <cstring>
#include <iterator>
#include <set>
#include <string>

namespace {

/// "aten::softmax.int" as LibTorch names it: ("aten::softmax", "int").
c10::OperatorName operatorName(const bmt::AtenOpInfo &info) {
  std::string name = info.name.str();
  size_t ns = name.find("::");
  size_t dot = name.find('.', ns + 2);
  return c10::OperatorName(name.substr(0, dot),
                           dot == std::string::npos ? "" : name.substr(dot + 1));
}

/// The schema LibTorch registers for `info`. The JIT operator table holds
/// the dispatcher's operators and the TorchScript-only ones
/// (aten::Int.Tensor, aten::size.int, ...).
const c10::FunctionSchema *schemaOf(const bmt::AtenOpInfo &info) {
  std::shared_ptr<torch::jit::Operator> handle = torch::jit::findOperatorFor(operatorName(info));
  return handle ? &handle->schema() : nullptr;
}

TEST(AtenRegistry, EveryEntryMatchesTheDispatcherSchema) {
  ASSERT_GT(bmt::getAtenOps().size(), 50u);
  for (const bmt::AtenOpInfo &info : bmt::getAtenOps()) {
    std::string name = info.name.str();
    const c10::FunctionSchema *found = schemaOf(info);
    ASSERT_TRUE(found) << name << " has no schema in LibTorch";
    const c10::FunctionSchema &schema = *found;
    EXPECT_EQ(schema.arguments().size(), info.numArgs) << schema;
    ASSERT_EQ(info.argNames.size(), info.numArgs) << name;
    for (size_t i = 0; i < schema.arguments().size() && i < info.argNames.size(); ++i)
      EXPECT_EQ(info.argNames[i].str(), schema.arguments()[i].name()) << schema;
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

TEST(AtenRegistry, FlagsMatchTheSchemaAnnotationsAndTags) {
  for (const bmt::AtenOpInfo &info : bmt::getAtenOps()) {
    const c10::FunctionSchema *schema = schemaOf(info);
    ASSERT_TRUE(schema) << info.name.str();
    const c10::AliasInfo *self =
        schema->arguments().empty() ? nullptr : schema->arguments()[0].alias_info();
    EXPECT_EQ(info.isInPlace(), self && self->isWrite()) << *schema;
    bool resultAliases = false;
    for (const c10::Argument &ret : schema->returns())
      resultAliases |= ret.alias_info() != nullptr;
    // aten::type_as returns `self` itself when the dtype already matches
    // (it is `self.to(other)`), which its schema does not annotate.
    if (info.name == "aten::type_as")
      EXPECT_TRUE(info.mayAlias() && !resultAliases) << *schema;
    else
      EXPECT_EQ(info.mayAlias(), resultAliases) << *schema;
    // TorchScript-only operators are not in the dispatcher and carry no tags.
    if (std::optional<c10::OperatorHandle> handle =
            c10::Dispatcher::singleton().findSchema(operatorName(info)))
      EXPECT_EQ(info.isRandom(), handle->hasTag(at::Tag::nondeterministic_seeded)) << *schema;
    else
      EXPECT_FALSE(info.isRandom()) << *schema;
  }
}

TEST(AtenRegistry, ReductionsNameTheirReducedDims) {
  for (const bmt::AtenOpInfo &info : bmt::getAtenOps()) {
    const c10::FunctionSchema *schema = schemaOf(info);
    ASSERT_TRUE(schema) << info.name.str();
    if (info.kind != bmt::AtenOpKind::Reduction) {
      EXPECT_EQ(info.reducedDimsArg, -1) << *schema;
      continue;
    }
    if (info.reducedDimsArg < 0) { // every dim: then the schema has no `dim`
      EXPECT_FALSE(schema->argumentIndexWithName("dim").has_value()) << *schema;
      continue;
    }
    ASSERT_LT(static_cast<size_t>(info.reducedDimsArg), schema->arguments().size());
    // An int, an optional int or a list of ints (dims, or trailing sizes).
    c10::TypePtr type = schema->arguments()[info.reducedDimsArg].type();
    if (auto optional = type->cast<c10::OptionalType>())
      type = optional->getElementType();
    if (auto list = type->cast<c10::ListType>())
      type = list->getElementType();
    EXPECT_EQ(type->kind(), c10::TypeKind::IntType) << *schema;
  }
  const bmt::AtenOpInfo *softmax = bmt::lookupAtenOp("aten::softmax.int");
  ASSERT_NE(softmax, nullptr);
  EXPECT_EQ(softmax->reducedDimsArg, softmax->argIndex("dim"));
  EXPECT_EQ(bmt::lookupAtenOp("aten::sum")->reducedDimsArg, -1);
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

// Every op a fused region may hold (FusibleOps.def, shared by
// bmt-fuse-elementwise and the runtime's code generator) is in the registry,
// pointwise or a reduction over named dims (or the to.dtype copy, or
// layer_norm over its normalized_shape), and
// neither in-place nor random.
TEST(AtenRegistry, FusibleOpsAreRegisteredAndPure) {
  std::vector<std::pair<std::string, std::string>> ops = {
#define BMT_FUSIBLE_OP(ID, KIND) {bmt::atenOpName(bmt::AtenOpId::ID).str(), #KIND},
#include "bmt/Dialect/FusibleOps.def"
  };
  EXPECT_GE(ops.size(), 20u);
  for (const auto &[name, kind] : ops) {
    const bmt::AtenOpInfo *info = bmt::lookupAtenOp(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_FALSE(info->isInPlace()) << name;
    EXPECT_FALSE(info->isRandom()) << name;
    if (kind == "Mean" || kind == "Sum" || kind == "Softmax") {
      EXPECT_EQ(info->kind, bmt::AtenOpKind::Reduction) << name;
      EXPECT_EQ(info->reducedDimsArg, info->argIndex("dim")) << name;
    } else if (kind == "LayerNorm") {
      // Reduces over the trailing dims its normalized_shape names.
      EXPECT_EQ(info->kind, bmt::AtenOpKind::Reduction) << name;
      EXPECT_EQ(info->reducedDimsArg, info->argIndex("normalized_shape")) << name;
    } else if (kind == "Cast") {
      EXPECT_EQ(info->kind, bmt::AtenOpKind::Copy) << name;
    } else {
      EXPECT_EQ(info->kind, bmt::AtenOpKind::Elementwise) << name;
    }
  }
}

/// The AtenOpId rule of AtenOps.def: the name without "aten::", "." as "_",
/// an operator's dunder dropped ("aten::__and__.Tensor": and_Tensor).
std::string expectedId(llvm::StringRef name) {
  auto [base, overload] = name.drop_front(strlen("aten::")).split('.');
  if (base.size() > 4 && base.starts_with("__") && base.ends_with("__"))
    base = base.drop_front(2).drop_back(2);
  return overload.empty() ? base.str() : (llvm::Twine(base) + "_" + overload).str();
}

// Every enumerator round-trips through its name (and is the registry entry
// of its position), its identifier follows the rule, and the MLIR-free name
// table the runtime reads agrees with the registry.
TEST(AtenRegistry, OpIdsRoundTripThroughNames) {
  struct Line {
    bmt::AtenOpId id;
    const char *ident;
    const char *name;
  };
  const Line lines[] = {
#define BMT_ATEN_OP(ID, NAME, ARGS, NUM_RESULTS, KIND, FLAGS, REDUCED) {bmt::AtenOpId::ID, #ID, NAME},
#include "bmt/Dialect/AtenOps.def"
  };
  ASSERT_EQ(std::size(lines), bmt::kNumAtenOps);
  ASSERT_EQ(bmt::getAtenOps().size(), bmt::kNumAtenOps);
  std::set<unsigned> seen;
  for (const Line &line : lines) {
    unsigned index = static_cast<unsigned>(line.id);
    EXPECT_TRUE(seen.insert(index).second) << line.name;
    EXPECT_EQ(bmt::atenOpName(line.id), line.name);
    EXPECT_TRUE(bmt::atenOpIdOf(line.name) == line.id) << line.name;
    EXPECT_TRUE(bmt::getAtenOpInfo(line.id).id == line.id) << line.name;
    EXPECT_EQ(&bmt::getAtenOps()[index], &bmt::getAtenOpInfo(line.id)) << line.name;
    EXPECT_EQ(bmt::lookupAtenOp(line.name), &bmt::getAtenOpInfo(line.id)) << line.name;
    EXPECT_STREQ(bmt::kAtenOpNames[index], line.name);
    EXPECT_EQ(expectedId(line.name), line.ident) << line.name;
  }
  EXPECT_FALSE(bmt::atenOpIdOf("aten::no_such_op").has_value());
  EXPECT_FALSE(bmt::atenOpIdOf("aten::add").has_value()); // an overload is named
  EXPECT_EQ(bmt::atenOpBase(bmt::AtenOpId::add_Tensor), "add");
  EXPECT_EQ(bmt::atenOpBase(bmt::AtenOpId::add__Tensor), "add_");
  EXPECT_EQ(bmt::atenOpBase(bmt::AtenOpId::linear), "linear");
  EXPECT_EQ(bmt::atenOpBase(bmt::AtenOpId::to_dtype), "to");
}

// FusibleOps.h maps exactly the ops of FusibleOps.def to their kinds.
TEST(AtenRegistry, FusibleKindsMatchTheList) {
  unsigned fusible = 0;
  for (const bmt::AtenOpInfo &info : bmt::getAtenOps())
    fusible += bmt::fusibleKindOf(info.id).has_value();
  unsigned listed = 0
#define BMT_FUSIBLE_OP(ID, KIND) +1
#include "bmt/Dialect/FusibleOps.def"
      ;
  EXPECT_EQ(fusible, listed);
  EXPECT_TRUE(bmt::fusibleKindOf(bmt::AtenOpId::add_Scalar) == bmt::FusibleKind::Add);
  EXPECT_TRUE(bmt::fusibleKindOf(bmt::AtenOpId::softmax_int) == bmt::FusibleKind::Softmax);
  EXPECT_FALSE(bmt::fusibleKindOf(bmt::AtenOpId::add__Tensor).has_value());
}

} // namespace
