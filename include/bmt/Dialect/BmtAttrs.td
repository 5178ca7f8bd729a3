//===- BmtAttrs.td - bmt dialect attributes ----------------*- tablegen -*-===//

#ifndef BMT_ATTRS_TD
#define BMT_ATTRS_TD

include "bmt/Dialect/BmtDialect.td"
include "mlir/IR/AttrTypeBase.td"

class Bmt_Attr<string name, string attrMnemonic> : AttrDef<Bmt_Dialect, name> {
  let mnemonic = attrMnemonic;
}

def Bmt_NoneAttr : Bmt_Attr<"None", "none"> {
  let summary = "the constant `None`";
}

def Bmt_OperandAttr : Bmt_Attr<"Operand", "operand"> {
  let summary = "marks the place of the next SSA operand in a `bmt.aten` argument list";
  let description = [{
    `bmt.aten` keeps its schema arguments in one `args` array: constants as
    attributes and, where an argument is computed at run time, this marker.
    Markers are matched with the op's operands in order, depth first through
    nested lists. The custom assembly prints the operand in its place.
  }];
}

def Bmt_DeviceAttr : Bmt_Attr<"Device", "device"> {
  let summary = "a constant `Device`, such as \"cpu\" or \"cuda:0\"";
  let parameters = (ins StringRefParameter<"device string">:$name);
  let assemblyFormat = "`<` $name `>`";
}

#endif // BMT_ATTRS_TD
