//===- Freeze.cpp - the bmt-freeze pass -----------------------------------===//
//
// Clears requires_grad on the parameters whose state-dict names match the
// user's globs (bmt-opt --freeze). Everything downstream reads the flag:
// bmt-zero leaves frozen parameters out of the storage groups, the memory
// estimate counts them as working-dtype copies without optimizer state, the
// runtime gives them no gradient. See passes/Passes.td for the contract and
// docs/passes/freeze.md.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Passes.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/GlobPattern.h"

#include <string>
#include <vector>

namespace bmt {
#define GEN_PASS_DEF_FREEZE
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;

namespace {

/// `text` split at the commas outside `[...]` and `{...}` (a character
/// class or a brace alternative may hold commas).
std::vector<std::string> splitPatterns(StringRef text) {
  std::vector<std::string> parts(1);
  int brackets = 0, braces = 0;
  for (char c : text) {
    if (c == '[')
      ++brackets;
    else if (c == ']' && brackets > 0)
      --brackets;
    else if (c == '{' && brackets == 0)
      ++braces;
    else if (c == '}' && brackets == 0 && braces > 0)
      --braces;
    if (c == ',' && brackets == 0 && braces == 0) {
      parts.emplace_back();
      continue;
    }
    parts.back() += c;
  }
  return parts;
}

struct FreezePass : bmt::impl::FreezeBase<FreezePass> {
  using FreezeBase::FreezeBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (StringRef(patterns).trim().empty())
      return; // nothing asked
    // GlobPattern keeps references into its text: the texts stay put here.
    std::vector<std::string> texts;
    for (const std::string &raw : splitPatterns(patterns))
      texts.push_back(StringRef(raw).trim().str());
    struct Glob {
      StringRef text;
      llvm::GlobPattern pattern;
      int64_t hits = 0;
    };
    std::vector<Glob> globs;
    for (const std::string &text : texts) {
      if (text.empty()) {
        module.emitError("bmt-freeze: empty pattern in '") << patterns.getValue() << "'";
        return signalPassFailure();
      }
      auto glob = llvm::GlobPattern::create(text, /*MaxSubPatterns=*/1024);
      if (!glob) {
        module.emitError("bmt-freeze: pattern '")
            << text << "' is not a glob: " << llvm::toString(glob.takeError());
        return signalPassFailure();
      }
      globs.push_back({text, std::move(*glob), 0});
    }
    int64_t total = 0, frozen = 0, frozenElements = 0;
    for (bmt::ParameterOp p : module.getOps<bmt::ParameterOp>()) {
      ++total;
      SmallVector<StringRef> names{p.getSymName()};
      if (auto aliases = p.getAliases())
        for (Attribute alias : *aliases)
          names.push_back(cast<StringAttr>(alias).getValue());
      bool match = false;
      for (Glob &g : globs)
        if (llvm::any_of(names, [&](StringRef n) { return g.pattern.match(n); })) {
          ++g.hits;
          match = true;
        }
      if (!match)
        continue;
      if (p.getRequiresGrad()) {
        p.setRequiresGrad(false);
        ++frozen;
        frozenElements += cast<RankedTensorType>(p.getType()).getNumElements();
      }
    }
    for (const Glob &g : globs)
      if (g.hits == 0) {
        module.emitError("bmt-freeze: pattern '")
            << g.text << "' matches no parameter (patterns are globs over state-dict names, "
            << "e.g. 'model.layers.[0-3].*')";
        return signalPassFailure();
      }
    bool anyTrainable = llvm::any_of(module.getOps<bmt::ParameterOp>(),
                                     [](bmt::ParameterOp p) { return p.getRequiresGrad(); });
    if (total > 0 && !anyTrainable) {
      module.emitError("bmt-freeze: every parameter is frozen, so nothing would train ('")
          << patterns.getValue() << "' matches all " << total << ")";
      return signalPassFailure();
    }
    emitRemark(module.getLoc()) << "bmt-freeze: froze " << frozen << " parameters ("
                                << frozenElements << " elements)";
  }
};

} // namespace
