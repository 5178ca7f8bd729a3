//===- Passes.h - bmt passes ------------------------------------*- C++ -*-===//
//
// Declarations and registration of every bmt pass (passes/Passes.td) and
// of the default pipeline (bmt/Passes/DefaultPipeline.h).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_H
#define BMT_PASSES_H

#include "bmt/Passes/DefaultPipeline.h"

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassOptions.h"

namespace bmt {

#define GEN_PASS_DECL
#include "bmt/Passes/Passes.h.inc"

/// registerBmtPasses(): registers every bmt pass with the global pass registry, so that
/// `bmt-opt --bmt-<name>` and `--pass-pipeline` find them.
#define GEN_PASS_REGISTRATION
#include "bmt/Passes/Passes.h.inc"

} // namespace bmt

#endif // BMT_PASSES_H
