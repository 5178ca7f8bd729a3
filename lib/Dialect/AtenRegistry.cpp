//===- AtenRegistry.cpp - the operators bmt knows -------------------------===//

#include "bmt/Dialect/AtenRegistry.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"

#include <deque>
#include <vector>

using namespace bmt;

namespace {

/// One AtenOps.def line as written.
struct Entry {
  AtenOpId id;
  const char *name;
  const char *args;
  int numResults;
  AtenOpKind kind;
  unsigned flags;
  const char *reduced;
};

using namespace AtenOpFlag;
const Entry kEntries[] = {
#define BMT_ATEN_OP(ID, NAME, ARGS, NUM_RESULTS, KIND, FLAGS, REDUCED)         \
  {AtenOpId::ID, NAME, ARGS, NUM_RESULTS, AtenOpKind::KIND, FLAGS, REDUCED},
#include "bmt/Dialect/AtenOps.def"
};

/// The registry, built once from kEntries: the argument names split.
struct Registry {
  std::deque<llvm::SmallVector<llvm::StringRef, 8>> names; // stable addresses
  std::vector<AtenOpInfo> ops;
  llvm::StringMap<const AtenOpInfo *> index;

  Registry() {
    for (const Entry &e : kEntries) {
      llvm::SmallVector<llvm::StringRef, 8> &list = names.emplace_back();
      llvm::SmallVector<llvm::StringRef, 8> parts;
      llvm::StringRef(e.args).split(parts, ',', -1, /*KeepEmpty=*/false);
      for (llvm::StringRef part : parts)
        list.push_back(part.trim());
      AtenOpInfo info{e.id, e.name, static_cast<unsigned>(list.size()), list, e.numResults,
                      e.kind, e.flags, -1};
      if (*e.reduced)
        info.reducedDimsArg = info.argIndex(e.reduced);
      ops.push_back(info);
    }
    for (const AtenOpInfo &info : ops)
      index[info.name] = &info;
  }
};

const Registry &registry() {
  static const Registry r;
  return r;
}

} // namespace

int AtenOpInfo::argIndex(llvm::StringRef argName) const {
  for (unsigned i = 0; i < argNames.size(); ++i)
    if (argNames[i] == argName)
      return static_cast<int>(i);
  return -1;
}

llvm::ArrayRef<AtenOpInfo> bmt::getAtenOps() { return registry().ops; }

const AtenOpInfo *bmt::lookupAtenOp(llvm::StringRef name) {
  const llvm::StringMap<const AtenOpInfo *> &index = registry().index;
  auto it = index.find(name);
  return it == index.end() ? nullptr : it->second;
}

std::optional<AtenOpId> bmt::atenOpIdOf(llvm::StringRef name) {
  if (const AtenOpInfo *info = lookupAtenOp(name))
    return info->id;
  return std::nullopt;
}

const AtenOpInfo &bmt::getAtenOpInfo(AtenOpId id) {
  return registry().ops[static_cast<unsigned>(id)];
}

llvm::StringRef bmt::atenOpName(AtenOpId id) { return getAtenOpInfo(id).name; }

llvm::StringRef bmt::atenOpBase(AtenOpId id) {
  llvm::StringRef name = atenOpName(id);
  return name.substr(name.find("::") + 2).split('.').first;
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
