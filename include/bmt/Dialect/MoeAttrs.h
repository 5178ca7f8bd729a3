//===- MoeAttrs.h - discardable attributes of a MoE layer's ops -*- C++ -*-===//
//
// `bmt.router_bias = @buffer` on a bmt.moe_dispatch: the router that
// chose its expert ids added that buffer b [E] (float) to its scores before
// its top-k (DeepSeek-V3's e_score_correction_bias), so that training may
// move b toward balanced loads (bmt-run --moe-bias-update-rate). Set by
// --bmt-moe-layers (passes/MoeRouter.cpp); the exporter writes the
// buffer's index as the plan's MoeDispatch target (docs/passes/moe-layers.md).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_DIALECT_MOEATTRS_H
#define BMT_DIALECT_MOEATTRS_H

#include "llvm/ADT/StringRef.h"

namespace bmt {

inline constexpr llvm::StringLiteral kRouterBiasAttr = "bmt.router_bias";

} // namespace bmt

#endif // BMT_DIALECT_MOEATTRS_H
