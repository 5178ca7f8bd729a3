//===- PlanKinds.h - instruction kinds by name (internal) -----------------===//
//
// The names instructions carry in a plan (docs/sharded-format.md) and the
// kinds' families, shared by Plan.cpp (encoding) and PlanDecode.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_LIB_PLAN_PLANKINDS_H
#define BMT_LIB_PLAN_PLANKINDS_H

#include "bmt/Plan/Plan.h"

#include <string>

namespace bmt::plan {

/// The kind's name in a plan ("aten", "tp_all_reduce", ...); "?" for none.
const char *kindName(Instruction::Kind kind);
/// The kind named `name`; PlanError for an unknown name.
Instruction::Kind kindFromName(const std::string &name);
/// moe_dispatch / moe_combine (format version 8 on).
bool isMoeKind(Instruction::Kind kind);
/// The tensor-parallel collectives and tp_rank (format version 6 on).
bool isTpKind(Instruction::Kind kind);

} // namespace bmt::plan

#endif // BMT_LIB_PLAN_PLANKINDS_H
