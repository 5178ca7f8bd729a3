//===- BmtDialect.h - the bmt dialect ---------------------------*- C++ -*-===//
//
// Declares the `bmt` dialect, its types (!bmt.tensor, ...), attributes
// (#bmt.none, #bmt.operand, #bmt.device) and operations (bmt.parameter,
// bmt.buffer, bmt.get_global, bmt.aten, bmt.constant, bmt.num_to_tensor).
// The ODS sources next to this header document each one.
//
// This header includes only MLIR headers; no LibTorch.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_DIALECT_BMTDIALECT_H
#define BMT_DIALECT_BMTDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "bmt/Dialect/BmtDialect.h.inc"

#define GET_TYPEDEF_CLASSES
#include "bmt/Dialect/BmtTypes.h.inc"

#define GET_ATTRDEF_CLASSES
#include "bmt/Dialect/BmtAttrs.h.inc"

#define GET_OP_CLASSES
#include "bmt/Dialect/BmtOps.h.inc"

#endif // BMT_DIALECT_BMTDIALECT_H
