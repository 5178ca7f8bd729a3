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

def Bmt_TensorSplitAttr : Bmt_Attr<"TensorSplit", "tensor_split"> {
  let summary = "a parameter's split over the tensor-parallel or the expert group";
  let description = [{
    `--bmt-tensor-parallel` puts it on each parameter it splits, as the
    discardable attribute `bmt.tensor_split`; the parameter's type stays the
    global shape. Along `dim`, the tensor padded with zeros to `padded_size`
    (default: its size) forms `chunks` equal chunks, each split T ways
    (`bmt.tensor_parallel` of the module); TP rank t holds piece t of every
    chunk (bmt/Plan/SplitRule.h). `dim = -1` is a replicated parameter;
    with `reduce_grad = true` its gradient is summed over the TP group.
    `over = "expert"` splits an expert parameter [X, ...] over the E ranks of
    an expert group instead (`bmt.expert_parallel` of the module): dim 0,
    chunks 1, no padding; position p holds experts [p*X/E, (p+1)*X/E).

    ```mlir
    #bmt.tensor_split<dim = 1, chunks = 3>
    #bmt.tensor_split<dim = 0, chunks = 1, padded_size = 50304>
    #bmt.tensor_split<dim = -1, chunks = 1, reduce_grad = true>
    #bmt.tensor_split<dim = 0, chunks = 1, over = "expert">
    ```

    The attribute checks chunks >= 1, padded_size >= 0, and that chunks
    and padded_size need a split dim; on a parameter the dialect checks the
    dim against its shape, padded_size >= the dim's size and, where the
    module has `bmt.tensor_parallel = T`, that the padded size divides by
    chunks * T (an expert split: that E divides the experts, where the
    module has `bmt.expert_parallel = E`).
  }];
  let parameters = (ins "int64_t":$dim, "int64_t":$chunks,
                        DefaultValuedParameter<"int64_t", "0">:$padded_size,
                        DefaultValuedParameter<"bool", "false">:$reduce_grad,
                        StringRefParameter<"the group the split runs over: tensor or expert",
                                           "\"tensor\"">:$over);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

#endif // BMT_ATTRS_TD
