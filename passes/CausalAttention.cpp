//===- CausalAttention.cpp - the bmt-causal-attention pass ----------------===//
//
// Hugging Face's transformers 5 builds the mask of its SDPA attention with
// index arithmetic (masking_utils.sdpa_mask): aranges of the query and key
// positions, `kv_idx <= q_idx`, ANDed with `attention_mask[batch_idx,
// kv_idx]`, expanded to [batch, 1, q, kv]. Under tracing it cannot take its
// own shortcut (attn_mask=None, is_causal=True), so every
// aten::scaled_dot_product_attention of a trace or an export gets an
// explicit boolean mask, and the GPU kernels compute the whole square
// instead of its lower triangle.
//
// The pass evaluates the mask's computation symbolically (the analysis in
// passes/CausalMaskProver.h). Where the mask is exactly kv <= q over query and key lengths that are provably
// equal, the call becomes attn_mask=None, is_causal=True, and the mask's
// computation, now dead, is removed. Lookups of a tensor proven constant
// (transformers' packed-sequence ids of a model traced without
// attention_mask) are then folded in every attention, SDPA or not. See
// passes/Passes.td for the contract.
//
//===----------------------------------------------------------------------===//

#include "CausalMaskProver.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSwitch.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>

namespace bmt {
#define GEN_PASS_DEF_CAUSALATTENTION
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;
using bmt::AtenOpId;
using namespace bmt::causal_mask;

namespace {

/// What assume-unpadded adds to the module attribute `bmt.assumptions` when
/// a rewrite needed it; the exporter puts it in the runtime plan, and
/// bmt-run --dump refuses batches that break it.
constexpr llvm::StringLiteral kAssumption = "attention_mask all ones";

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

/// Ops the clean-up may erase once their results are unused: computations
/// without effects other than their results.
bool erasable(Operation *op) {
  if (isa<bmt::ConstantOp, bmt::NumToTensorOp>(op))
    return true;
  auto aten = dyn_cast<bmt::AtenOp>(op);
  if (!aten || isInPlace(aten))
    return false;
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(aten.getName());
  if (!info)
    return false;
  switch (info->kind) {
  case bmt::AtenOpKind::Elementwise:
  case bmt::AtenOpKind::View:
  case bmt::AtenOpKind::Copy:
  case bmt::AtenOpKind::Factory:
  case bmt::AtenOpKind::Indexing:
  case bmt::AtenOpKind::Metadata:
  case bmt::AtenOpKind::Reduction: // cumsum, diff of the packed-sequence ids
    return true;
  default:
    return false;
  }
}

struct CausalAttentionPass : bmt::impl::CausalAttentionBase<CausalAttentionPass> {
  using CausalAttentionBase::CausalAttentionBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    CallSites callers;
    module.walk([&](func::CallOp call) {
      if (auto callee = module.lookupSymbol<func::FuncOp>(call.getCallee()))
        callers[callee].push_back(call);
    });

    // Prove every masked call first, then rewrite: the proofs read the IR
    // as the program wrote it.
    struct Candidate {
      bmt::AtenOp op;
      bool assumed;
    };
    SmallVector<Candidate> rewrites;
    SmallVector<std::pair<std::string, int64_t>> leftAlone; // reason, count (first seen first)
    auto leaveAlone = [&](const std::string &reason) {
      for (auto &[r, count] : leftAlone)
        if (r == reason) {
          ++count;
          return;
        }
      leftAlone.push_back({reason, 1});
    };
    llvm::SetVector<Operation *> maskOps;
    llvm::SetVector<Value> maskValues;
    int64_t masked = 0;
    module.walk([&](bmt::AtenOp op) {
      if (bmt::atenOpId(op) != AtenOpId::scaled_dot_product_attention)
        return;
      std::optional<AtenArg> mask = argument(op, "attn_mask");
      if (!mask || isNone(mask))
        return; // no mask (or already is_causal)
      ++masked;
      std::optional<AtenArg> isCausal = argument(op, "is_causal");
      if (!mask->getOperand() || !isCausal || isCausal->getOperand() || !isa<BoolAttr>(isCausal->getAttr()) ||
          cast<BoolAttr>(isCausal->getAttr()).getValue()) {
        leaveAlone("is_causal is not a constant false");
        return;
      }
      // Without the assumption first: it is recorded only where needed.
      Prover sound(module, callers, /*assumeUnpadded=*/false);
      if (succeeded(sound.prove(mask->getOperand()))) {
        rewrites.push_back({op, false});
        maskOps.insert(sound.visitedOps().begin(), sound.visitedOps().end());
        maskValues.insert(sound.visitedValues().begin(), sound.visitedValues().end());
        return;
      }
      if (assumeUnpadded) {
        Prover assuming(module, callers, /*assumeUnpadded=*/true);
        if (succeeded(assuming.prove(mask->getOperand()))) {
          rewrites.push_back({op, true});
          maskOps.insert(assuming.visitedOps().begin(), assuming.visitedOps().end());
          maskValues.insert(assuming.visitedValues().begin(), assuming.visitedValues().end());
          return;
        }
        leaveAlone(assuming.reason());
        return;
      }
      leaveAlone(sound.reason());
    });

    OpBuilder builder(module.getContext());
    SmallVector<Value> dropped;
    SmallVector<StringRef> functions;
    bool assumed = false;
    for (Candidate &c : rewrites) {
      dropped.push_back(argument(c.op, "attn_mask")->getOperand());
      StringRef f = c.op->getParentOfType<func::FuncOp>().getSymName();
      if (functions.empty() || functions.back() != f)
        functions.push_back(f);
      assumed |= c.assumed;
      makeCausal(builder, c.op);
    }
    auto [erasedOps, erasedArgs] = removeDeadMask(module, callers, dropped, maskOps, maskValues);
    if (assumed)
      recordAssumption(module);
    emitSummary(module, masked, rewrites.size(), functions, assumed, erasedOps, erasedArgs,
                leftAlone);
    foldConstantLookups(module, callers);
  }

  static void emitSummary(ModuleOp module, int64_t masked, int64_t n,
                          ArrayRef<StringRef> functions, bool assumed, int64_t erasedOps,
                          int64_t erasedArgs,
                          ArrayRef<std::pair<std::string, int64_t>> leftAlone) {

    InFlightDiagnostic remark = emitRemark(module.getLoc());
    if (masked == 0) {
      remark << "bmt-causal-attention: no aten::scaled_dot_product_attention with an attn_mask";
      return;
    }
    remark << "bmt-causal-attention: " << n << " of " << masked
           << " aten::scaled_dot_product_attention with an attn_mask made causal "
              "(attn_mask=None, is_causal=True)";
    if (n > 0) {
      remark << " in " << functions.size() << " function" << (functions.size() == 1 ? "" : "s")
             << " (" << functions.front();
      if (functions.size() > 1)
        remark << " ... " << functions.back();
      remark << ")";
      if (assumed)
        remark << ", assuming " << kAssumption;
      remark << "; mask computation removed: " << erasedOps << " op" << (erasedOps == 1 ? "" : "s")
             << ", " << erasedArgs << " function argument" << (erasedArgs == 1 ? "" : "s");
    }
    if (!leftAlone.empty()) {
      remark << "; left alone:";
      bool first = true;
      for (auto &[reason, count] : leftAlone) {
        remark << (first ? " " : "; ") << count << " (" << reason << ")";
        first = false;
      }
    }
  }

  /// A model traced or exported without attention_mask computes
  /// transformers' packed-sequence ids from its position_ids
  /// (find_packed_sequence_indices: cumsum(diff(position_ids) != 1), under
  /// tracing always) and ANDs `ids[b, q] == ids[b, kv]` into the mask.
  /// With position_ids an arange the ids are zeros, but a trace at batch 1
  /// keeps them [1, seq] (transformers expands position_ids to the batch
  /// only when the sizes differ) and the lookup fails at any other batch.
  /// Each lookup `source[i0, i1, ...]` of a source proven to be the
  /// constant c everywhere becomes `i0 * 0 + i1 * 0 + ... (+ c)`: c at
  /// every index, of the indices' broadcast shape, for every batch; the
  /// source's computation, now unread, is removed. (A call the mask proof
  /// already made causal has lost its lookups with its mask.)
  void foldConstantLookups(ModuleOp module, CallSites &callers) {
    int64_t folded = 0, erasedOps = 0, erasedArgs = 0;
    SmallVector<StringRef> functions;
    OpBuilder builder(module.getContext());
    // One fold at a time: its clean-up may erase other lookups.
    DenseSet<Operation *> rejected; // live lookups that are not constant
    while (true) {
      bmt::AtenOp op;
      std::optional<int64_t> c;
      std::unique_ptr<Prover> prover;
      module.walk([&](bmt::AtenOp candidate) {
        if (bmt::atenOpId(candidate) != AtenOpId::index_Tensor || rejected.contains(candidate))
          return WalkResult::advance();
        auto p = std::make_unique<Prover>(module, callers, /*assumeUnpadded=*/false);
        c = p->constantLookup(candidate);
        if (!c) {
          rejected.insert(candidate);
          return WalkResult::advance();
        }
        op = candidate;
        prover = std::move(p);
        return WalkResult::interrupt();
      });
      if (!op)
        break;
      builder.setInsertionPoint(op);
      MLIRContext *ctx = builder.getContext();
      Attribute operand = bmt::OperandAttr::get(ctx);
      Type tensor = op->getResult(0).getType();
      auto aten = [&](AtenOpId id, ArrayRef<Attribute> args, ValueRange operands) -> Value {
        return bmt::AtenOp::create(builder, op.getLoc(), TypeRange{tensor},
                                   builder.getStringAttr(bmt::atenOpName(id)), builder.getArrayAttr(args),
                                   operands)
            ->getResult(0);
      };
      Value sum;
      SmallVector<AtenArg> indices = listArgument(op, 1).value_or(SmallVector<AtenArg>{});
      for (const AtenArg &i : indices) {
        Value zero = aten(AtenOpId::mul_Scalar, {operand, builder.getI64IntegerAttr(0)}, {i.getOperand()});
        sum = sum ? aten(AtenOpId::add_Tensor, {operand, operand, builder.getI64IntegerAttr(1)},
                         {sum, zero})
                  : zero;
      }
      if (*c != 0)
        sum = aten(AtenOpId::add_Scalar,
                   {operand, builder.getI64IntegerAttr(*c), builder.getI64IntegerAttr(1)}, {sum});
      Value source = argument(op, 0)->getOperand();
      StringRef f = op->getParentOfType<func::FuncOp>().getSymName();
      if (functions.empty() || functions.back() != f)
        functions.push_back(f);
      op->getResult(0).replaceAllUsesWith(sum);
      op->erase();
      ++folded;
      ++erasedOps;
      auto [ops, args] = removeDeadMask(module, callers, {source}, prover->visitedOps(),
                                        prover->visitedValues());
      erasedOps += ops;
      erasedArgs += args;
    }
    if (folded == 0)
      return;
    InFlightDiagnostic remark = emitRemark(module.getLoc());
    remark << "bmt-causal-attention: " << folded << " lookup" << (folded == 1 ? "" : "s")
           << " of a constant tensor (packed-sequence ids of position_ids that are an arange: "
              "one sequence per row) folded in "
           << functions.size() << " function" << (functions.size() == 1 ? "" : "s") << " ("
           << functions.front();
    if (functions.size() > 1)
      remark << " ... " << functions.back();
    remark << "); removed: " << erasedOps << " op" << (erasedOps == 1 ? "" : "s") << ", "
           << erasedArgs << " function argument" << (erasedArgs == 1 ? "" : "s");
  }

  /// The call with attn_mask=None and is_causal=True, every other argument
  /// (dropout_p, scale, enable_gqa) as it was.
  static void makeCausal(OpBuilder &builder, bmt::AtenOp sdpa) {
    builder.setInsertionPoint(sdpa);
    SmallVector<Attribute> args(sdpa.getArgs().begin(), sdpa.getArgs().end());
    unsigned maskOperand = argument(sdpa, "attn_mask")->getOperandNumber();
    const bmt::AtenOpInfo *info = bmt::lookupAtenOp(sdpa.getName());
    args[info->argIndex("attn_mask")] = bmt::NoneAttr::get(builder.getContext());
    args[info->argIndex("is_causal")] = builder.getBoolAttr(true);
    SmallVector<Value> operands(sdpa->getOperands());
    operands.erase(operands.begin() + maskOperand);
    auto causal = bmt::AtenOp::create(builder, sdpa.getLoc(), sdpa->getResultTypes(),
                                      sdpa.getNameAttr(), builder.getArrayAttr(args), operands);
    causal->setDiscardableAttrs(sdpa->getDiscardableAttrDictionary());
    sdpa->replaceAllUsesWith(causal);
    sdpa->erase();
  }

  /// Erases what computed the dropped masks once nothing reads it: the ops
  /// the proofs went through, and the arguments of private functions that
  /// carried a mask (with the calls' operands). Returns the counts.
  static std::pair<int64_t, int64_t> removeDeadMask(ModuleOp module, CallSites &callers,
                                                    ArrayRef<Value> dropped,
                                                    const llvm::SetVector<Operation *> &maskOps,
                                                    const llvm::SetVector<Value> &maskValues) {
    int64_t ops = 0, args = 0;
    SmallVector<Value> work(dropped.begin(), dropped.end());
    DenseSet<Value> gone; // erased: never look at them again
    while (!work.empty()) {
      Value v = work.pop_back_val();
      if (gone.contains(v) || !v.use_empty())
        continue;
      if (auto arg = dyn_cast<BlockArgument>(v)) {
        auto f = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
        if (!f || !f.isPrivate() || !maskValues.contains(v) ||
            arg.getOwner() != &f.getBody().front())
          continue;
        // Every use of the function must be one of its calls.
        auto &calls = callers[f];
        std::optional<SymbolTable::UseRange> uses = SymbolTable::getSymbolUses(f, module);
        if (!uses || std::distance(uses->begin(), uses->end()) !=
                         static_cast<std::ptrdiff_t>(calls.size()))
          continue;
        unsigned index = arg.getArgNumber();
        for (func::CallOp call : calls) {
          Value operand = call.getOperand(index);
          call->eraseOperand(index);
          work.push_back(operand);
        }
        gone.insert(v);
        if (failed(f.eraseArgument(index)))
          return {ops, args};
        ++args;
        continue;
      }
      Operation *op = v.getDefiningOp();
      if (!op || !maskOps.contains(op) || !erasable(op) || !op->use_empty())
        continue;
      work.append(op->operand_begin(), op->operand_end());
      gone.insert(op->result_begin(), op->result_end());
      op->erase();
      ++ops;
    }
    return {ops, args};
  }

  static void recordAssumption(ModuleOp module) {
    Builder b(module.getContext());
    SmallVector<Attribute> assumptions;
    if (auto existing = module->getAttrOfType<ArrayAttr>("bmt.assumptions"))
      assumptions.assign(existing.begin(), existing.end());
    if (!llvm::is_contained(assumptions, b.getStringAttr(kAssumption)))
      assumptions.push_back(b.getStringAttr(kAssumption));
    module->setAttr("bmt.assumptions", b.getArrayAttr(assumptions));
  }
};

} // namespace
