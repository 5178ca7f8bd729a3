//===- BmtDialect.td - the bmt dialect ---------------------*- tablegen -*-===//
//
// The `bmt` dialect holds a PyTorch model as imported from TorchScript or
// torch.export: module-level parameter and buffer symbols, one function per
// submodule, and ATen operator calls. Later passes add the distribution
// (blocks, storage groups, collectives) to the same dialect.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_DIALECT_TD
#define BMT_DIALECT_TD

include "mlir/IR/OpBase.td"

def Bmt_Dialect : Dialect {
  let name = "bmt";
  let cppNamespace = "::bmt";
  let summary = "PyTorch models as data for a distributed-training compiler";
  let description = [{
    Values are PyTorch runtime values: `!bmt.tensor` for tensors, the builtin
    `i64`, `f64` and `i1` for TorchScript's `int`, `float` and `bool`, and a
    few opaque types for the rest. Parameters and buffers are module-level
    symbols whose type is a ranked builtin tensor type giving shape and dtype.
  }];
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
  let hasConstantMaterializer = 1;
  let hasOperationAttrVerify = 1;
  let extraClassDeclaration = [{
    void registerTypes();
    void registerAttributes();
  }];
}

class Bmt_Op<string mnemonic, list<Trait> traits = []>
    : Op<Bmt_Dialect, mnemonic, traits>;

#endif // BMT_DIALECT_TD
