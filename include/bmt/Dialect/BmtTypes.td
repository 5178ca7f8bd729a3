//===- BmtTypes.td - bmt dialect types ---------------------*- tablegen -*-===//

#ifndef BMT_TYPES_TD
#define BMT_TYPES_TD

include "bmt/Dialect/BmtDialect.td"
include "mlir/IR/AttrTypeBase.td"

class Bmt_Type<string name, string typeMnemonic> : TypeDef<Bmt_Dialect, name> {
  let mnemonic = typeMnemonic;
}

def Bmt_TensorType : Bmt_Type<"Tensor", "tensor"> {
  let summary = "a PyTorch tensor whose shape and dtype are not tracked";
  let description = [{
    A runtime `at::Tensor`. Shapes and dtypes of intermediate values are not
    known after a TorchScript import (the archive does not keep them); passes
    that need them infer them from the parameters and the op registry.
  }];
}

def Bmt_NoneType : Bmt_Type<"None", "none"> {
  let summary = "TorchScript's NoneType";
}

def Bmt_NumberType : Bmt_Type<"Number", "number"> {
  let summary = "a TorchScript `Scalar` (int, float or bool, known at run time)";
}

def Bmt_StringType : Bmt_Type<"String", "str"> {
  let summary = "a TorchScript string";
}

def Bmt_DeviceType : Bmt_Type<"Device", "device"> {
  let summary = "a TorchScript `Device`";
}

def Bmt_AnyValue : AnyTypeOf<[Bmt_TensorType, Bmt_NoneType, Bmt_NumberType,
                              Bmt_StringType, Bmt_DeviceType, I64, F64, I1]>;

#endif // BMT_TYPES_TD
