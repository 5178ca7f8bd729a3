//===- TensorParallelVocab.cpp - the vocab-parallel LM head ---------------===//
//
// bmt-tensor-parallel's vocab-parallel stage, run after the chains are
// rewritten: see vocabParallel in TensorParallelChains.h.
//
//===----------------------------------------------------------------------===//

#include "TensorParallelChains.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/TensorSplit.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using bmt::AtenOpId;
using namespace bmt::tp;

namespace {

void setSplit(bmt::ParameterOp p, int64_t dim, int64_t paddedSize) {
  bmt::ParameterSplit split;
  split.dim = dim;
  split.paddedSize = paddedSize;
  bmt::setParameterSplit(p, split);
}

/// Replaces the embedding `emb` of a vocab-parallel table by this rank's
/// lookup: the ids shifted to its `local` rows, those outside masked to
/// zero, then the sum over the group.
void splitEmbedding(bmt::AtenOp emb, int64_t local, FlatSymbolRefAttr grid) {
  MLIRContext *context = emb.getContext();
  OpBuilder builder(context);
  Type tensor = bmt::TensorType::get(context);
  auto marker = bmt::OperandAttr::get(context);
  auto aten = [&](Location loc, AtenOpId id, ArrayRef<Attribute> args, ValueRange operands, Type result) {
    return bmt::AtenOp::create(builder, loc, TypeRange{result}, builder.getStringAttr(bmt::atenOpName(id)),
                               builder.getArrayAttr(args), operands)
        .getResult(0);
  };
  Location loc = emb.getLoc();
  builder.setInsertionPoint(emb);
  Value ids = bmt::getAtenArg(emb, "indices")->getOperand();
  Value table = bmt::getAtenArg(emb, "weight")->getOperand();
  Value rank = bmt::TpRankOp::create(builder, loc, builder.getI64Type(), grid).getResult();
  Value shifted = aten(loc, AtenOpId::sub_Scalar, {marker, marker, builder.getI64IntegerAttr(local)},
                       {ids, rank}, tensor);
  Value below = aten(loc, AtenOpId::lt_Scalar, {marker, builder.getI64IntegerAttr(0)}, {shifted}, tensor);
  Value above = aten(loc, AtenOpId::ge_Scalar, {marker, builder.getI64IntegerAttr(local)}, {shifted}, tensor);
  Value outside = aten(loc, AtenOpId::or_Tensor, {marker, marker}, {below, above}, tensor);
  Value clamped = aten(loc, AtenOpId::masked_fill_Scalar, {marker, marker, builder.getI64IntegerAttr(0)},
                       {shifted, outside}, tensor);
  Value rows = aten(loc, AtenOpId::embedding,
                    {marker, marker, builder.getI64IntegerAttr(-1), builder.getBoolAttr(false),
                     builder.getBoolAttr(false)},
                    {table, clamped}, tensor);
  // padding_idx p (a global row): its row gets no gradient, as
  // aten::embedding's own padding_idx does, by a detached copy.
  int64_t paddingIdx = *bmt::getAtenArg(emb, "padding_idx")->getInt();
  if (paddingIdx >= 0) {
    Value isPad = aten(loc, AtenOpId::eq_Scalar, {marker, builder.getI64IntegerAttr(paddingIdx)},
                       {ids}, tensor);
    Value padMask = aten(loc, AtenOpId::unsqueeze, {marker, builder.getI64IntegerAttr(-1)},
                         {isPad}, tensor);
    Value frozen = aten(loc, AtenOpId::detach, {marker}, {rows}, tensor);
    rows = aten(loc, AtenOpId::where_self, {marker, marker, marker}, {padMask, frozen, rows}, tensor);
  }
  Value mask = aten(loc, AtenOpId::unsqueeze, {marker, builder.getI64IntegerAttr(-1)}, {outside}, tensor);
  Value zeroed = aten(loc, AtenOpId::masked_fill_Scalar, {marker, marker, builder.getF64FloatAttr(0.0)},
                      {rows, mask}, tensor);
  Value sum = bmt::TpAllReduceOp::create(builder, loc, tensor, zeroed, grid);
  emb.getResult(0).replaceAllUsesWith(sum);
  emb->erase();
}

} // namespace

/// The vocab-parallel LM head and token embedding (Megatron-LM's
/// VocabParallelEmbedding and parallel logits): the matmul that makes the
/// entry's logits and the embeddings that read its (tied) weight get
/// the vocab rows of their TP rank. Returns what it did for the remark,
/// or why the head stays replicated.
std::string bmt::tp::vocabParallel(ProgramIndex &program, int64_t tensorParallel) {
  ModuleOp module = program.module;
  auto entry = program.symbols->lookup<func::FuncOp>("forward");
  if (!entry || entry.getNumResults() == 0)
    return "LM head replicated (no entry result)";
  unsigned index = 0;
  for (unsigned i = 0; i < entry.getNumResults(); ++i)
    if (auto n = entry.getResultAttrOfType<StringAttr>(i, "bmt.name"); n && n.getValue() == "logits")
      index = i;
  Value v = entry.getBody().front().getTerminator()->getOperand(index);
  // Back through call results to the op that makes the logits.
  while (auto call = v.getDefiningOp<func::CallOp>()) {
    auto callee = program.symbols->lookup<func::FuncOp>(call.getCallee());
    if (!callee || program.callSites[callee].size() != 1)
      return "LM head replicated (the logits come from a shared function)";
    v = callee.getBody().front().getTerminator()->getOperand(cast<OpResult>(v).getResultNumber());
  }
  auto head = v.getDefiningOp<bmt::AtenOp>();
  if (!head || bmt::atenOpId(head) != AtenOpId::linear)
    return "LM head replicated (the logits are not made by an aten::linear)";
  auto input = bmt::getAtenArg(head, "input"), weight = bmt::getAtenArg(head, "weight"),
       bias = bmt::getAtenArg(head, "bias");
  bmt::ParameterOp w = weight->isOperand() ? program.traceParam(weight->getOperand()) : nullptr;
  if (!w || !w.getRequiresGrad() || shapeOf(w).size() != 2)
    return "LM head replicated (its weight is no trainable 2-d parameter)";
  bmt::ParameterOp b = bias->isOperand() ? program.traceParam(bias->getOperand()) : nullptr;
  if (bias->isOperand() && !b)
    return "LM head replicated (its bias is no parameter)";
  if (!v.hasOneUse())
    return "LM head replicated (the logits are read inside the program)";
  int64_t vocab = shapeOf(w)[0], T = tensorParallel;
  int64_t padded = (vocab + T - 1) / T * T, local = padded / T;
  // The weight's readers: the head, and embeddings of the tied weight.
  llvm::SmallVector<OpOperand *> readers;
  program.readersOf(w, readers);
  llvm::SmallVector<bmt::AtenOp> embeddings;
  for (OpOperand *use : readers) {
    auto op = dyn_cast<bmt::AtenOp>(use->getOwner());
    if (op == head && use->get() == weight->getOperand())
      continue;
    if (op && bmt::atenOpId(op) == AtenOpId::embedding && use->getOperandNumber() == 0 &&
        bmt::getAtenArg(op, "padding_idx")->getInt().has_value())
      embeddings.push_back(op);
    else
      return "LM head replicated (its weight is also read by " + describe(use->getOwner()) + ")";
  }
  if (b) {
    llvm::SmallVector<OpOperand *> biasReaders;
    program.readersOf(b, biasReaders);
    if (biasReaders.size() != 1 || shapeOf(b).size() != 1)
      return "LM head replicated (its bias is read elsewhere too)";
  }
  // The embedding of a model whose head has its own weight.
  if (embeddings.empty())
    for (auto p : module.getOps<bmt::ParameterOp>()) {
      if (p == w || !p.getRequiresGrad() || shapeOf(p).size() != 2 || shapeOf(p)[0] != vocab)
        continue;
      llvm::SmallVector<OpOperand *> uses;
      program.readersOf(p, uses);
      bool onlyEmbedding = !uses.empty();
      for (OpOperand *use : uses) {
        auto op = dyn_cast<bmt::AtenOp>(use->getOwner());
        onlyEmbedding &= op && bmt::atenOpId(op) == AtenOpId::embedding &&
                         use->getOperandNumber() == 0 &&
                         bmt::getAtenArg(op, "padding_idx")->getInt().has_value();
      }
      if (!onlyEmbedding)
        continue;
      for (OpOperand *use : uses)
        embeddings.push_back(cast<bmt::AtenOp>(use->getOwner()));
      setSplit(p, 0, padded != vocab ? padded : 0);
    }

  MLIRContext *context = module.getContext();
  OpBuilder builder(context);
  Type tensor = bmt::TensorType::get(context);
  FlatSymbolRefAttr grid = FlatSymbolRefAttr::get(context, "tp");
  // The head: f on its input; the logits stay split (Plan::vocabParallel).
  builder.setInsertionPoint(head);
  Value x = input->getOperand();
  auto copy = bmt::TpCopyOp::create(builder, head.getLoc(), tensor, x, grid);
  head->setOperand(input->getOperandNumber(), copy.getResult());
  setSplit(w, 0, padded != vocab ? padded : 0);
  if (b)
    setSplit(b, 0, padded != vocab ? padded : 0);
  // Each embedding: look up the ids in this rank's rows (the others
  // masked to zero), then the sum over the group.
  for (bmt::AtenOp emb : embeddings)
    splitEmbedding(emb, local, grid);
  module->setAttr("bmt.vocab_size", builder.getI64IntegerAttr(vocab));
  std::string out = "vocab-parallel ";
  out += embeddings.empty() ? "LM head" : "embedding and LM head";
  out += " (" + std::to_string(vocab) + " -> " + std::to_string(local) + " per rank";
  if (padded != vocab)
    out += ", padded to " + std::to_string(padded);
  out += ")";
  return out;
}
