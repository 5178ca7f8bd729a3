//===- MoeLayers.h - the parts of bmt-moe-layers --------------*- C++ -*-===//
//
// Internal to passes/: MoeLayers.cpp matches and rewrites the token
// permutation; MoeRouter.cpp follows the expert ids back to the router's
// top-k: it drops the experts' masks of expert ids >= E, which that top-k
// makes always false, and finds the router's score-correction bias.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_MOELAYERS_H
#define BMT_PASSES_MOELAYERS_H

#include "bmt/Dialect/BmtDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"

namespace bmt {

/// Whether every call of `experts` passes, as its argument `idsArg`, the
/// indices of an `aten::topk` over the last dim of a tensor whose last dim
/// is `numExperts` (found through calls, conversions, softmax/sigmoid,
/// broadcasting arithmetic, masked_fill, view/reshape to a constant last
/// size and linear layers of a [E, H] weight): then every id is in
/// [0, numExperts).
bool routerIdsBelow(mlir::func::FuncOp experts, unsigned idsArg, int64_t numExperts,
                    mlir::SymbolTable &symbols);

/// The buffer b [numExperts] (float) that every router feeding `experts`
/// its ids (as routerIdsBelow proves them) adds to its scores before its
/// top-k, `topk(masked_fill?(scores + b))`: DeepSeek-V3's
/// e_score_correction_bias. Null when there is none, or the routers differ.
mlir::FlatSymbolRefAttr routerScoreBias(mlir::func::FuncOp experts, unsigned idsArg,
                                        int64_t numExperts, mlir::SymbolTable &symbols);

/// Drops the experts' sentinel masks of `dispatch`: each
/// `ge.Scalar(sorted_ids, E)` (and its unsqueezes) read only as the mask
/// of `masked_fill(_)`; those fills become their input (a mask that is
/// all false changes nothing, forward or backward). Fails, changing
/// nothing, when a mask has another reader. Call only where
/// routerIdsBelow holds.
mlir::LogicalResult dropSentinelMasks(MoeDispatchOp dispatch);

} // namespace bmt

#endif // BMT_PASSES_MOELAYERS_H
