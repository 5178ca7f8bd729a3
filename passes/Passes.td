//===- Passes.td - bmt passes ------------------------------*- tablegen -*-===//
//
// Every bmt pass, one definition each; the implementation of pass X is
// passes/X.cpp and its lit test test/Passes/X.mlir (or .test).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PASSES_TD
#define BMT_PASSES_TD

include "mlir/Pass/PassBase.td"

def Summary : Pass<"bmt-summary", "::mlir::ModuleOp"> {
  let summary = "Print a summary of the model's parameters, buffers and functions";
  let description = [{
    Prints to stderr, without changing the IR:

    ```
    bmt summary of gpt2.pt
      parameters: 59264 elements in 27 tensors (231.5 KiB)
      tied: 1 (transformer.wte.weight = lm_head.weight)
      buffers: 0 tensors
      functions: 14, calls: 13, aten ops: 120
    ```

    Element counts count tied parameters once, as
    `sum(p.numel() for p in model.parameters())` does.
  }];
}

#endif // BMT_PASSES_TD
