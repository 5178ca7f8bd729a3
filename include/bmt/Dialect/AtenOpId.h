//===- AtenOpId.h - the operators bmt knows, as an enum ---------*- C++ -*-===//
//
// One enumerator per line of AtenOps.def, in that order, so that passes and
// the runtime compare operators as values instead of name strings. The
// enumerator is the overload name without "aten::", "." written "_" and the
// dunder of an operator like __and__ dropped: "aten::add.Tensor" is
// AtenOpId::add_Tensor, "aten::add_.Tensor" add__Tensor, "aten::linear"
// linear, "aten::__and__.Tensor" and_Tensor (AtenRegistryTest checks the
// rule and that every enumerator round-trips through its name). Free of
// MLIR and LLVM, so that the runtime (built without them) can include it;
// the names and lookups are in AtenRegistry.h.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_DIALECT_ATENOPID_H
#define BMT_DIALECT_ATENOPID_H

namespace bmt {

enum class AtenOpId : unsigned {
#define BMT_ATEN_OP(ID, NAME, ARGS, NUM_RESULTS, KIND, FLAGS, REDUCED) ID,
#include "bmt/Dialect/AtenOps.def"
};

/// The number of AtenOpId enumerators (the lines of AtenOps.def).
inline constexpr unsigned kNumAtenOps = 0
#define BMT_ATEN_OP(ID, NAME, ARGS, NUM_RESULTS, KIND, FLAGS, REDUCED) +1
#include "bmt/Dialect/AtenOps.def"
    ;

/// The overload name of each operator, indexed by AtenOpId
/// ("aten::softmax.int"); AtenRegistry.h has the full entries.
inline constexpr const char *kAtenOpNames[] = {
#define BMT_ATEN_OP(ID, NAME, ARGS, NUM_RESULTS, KIND, FLAGS, REDUCED) NAME,
#include "bmt/Dialect/AtenOps.def"
};

} // namespace bmt

#endif // BMT_DIALECT_ATENOPID_H
