//===- AtenRegistry.cpp - the operators bmt knows -------------------------===//

#include "bmt/Dialect/AtenRegistry.h"

#include "llvm/ADT/StringMap.h"

using namespace bmt;

static const AtenOpInfo kAtenOps[] = {
#define BMT_ATEN_OP(NAME, NUM_ARGS, NUM_RESULTS, KIND)                         \
  {NAME, NUM_ARGS, NUM_RESULTS, AtenOpKind::KIND},
#include "bmt/Dialect/AtenOps.def"
};

llvm::ArrayRef<AtenOpInfo> bmt::getAtenOps() { return kAtenOps; }

const AtenOpInfo *bmt::lookupAtenOp(llvm::StringRef name) {
  static const llvm::StringMap<const AtenOpInfo *> index = [] {
    llvm::StringMap<const AtenOpInfo *> map;
    for (const AtenOpInfo &info : kAtenOps)
      map[info.name] = &info;
    return map;
  }();
  auto it = index.find(name);
  return it == index.end() ? nullptr : it->second;
}

llvm::StringRef bmt::stringifyAtenOpKind(AtenOpKind kind) {
  switch (kind) {
  case AtenOpKind::Elementwise: return "elementwise";
  case AtenOpKind::Reduction: return "reduction";
  case AtenOpKind::Matmul: return "matmul";
  case AtenOpKind::View: return "view";
  case AtenOpKind::Copy: return "copy";
  case AtenOpKind::Factory: return "factory";
  case AtenOpKind::Indexing: return "indexing";
  case AtenOpKind::Attention: return "attention";
  case AtenOpKind::Random: return "random";
  case AtenOpKind::Metadata: return "metadata";
  }
  return "unknown";
}
