//===- TensorParallelProgram.cpp - the program's calls and reads ----------===//
//
// ProgramIndex (TensorParallelChains.h): the calls, parameter reads and block
// functions every stage of bmt-tensor-parallel asks about.
//
//===----------------------------------------------------------------------===//

#include "TensorParallelChains.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"

#include <functional>

using namespace mlir;
using bmt::AtenOpId;

namespace bmt::tp {

ProgramIndex ProgramIndex::build(ModuleOp module) {
  ProgramIndex p;
  p.module = module;
  p.symbols = std::make_shared<SymbolTable>(module);
  module.walk([&](func::CallOp call) {
    if (auto f = p.symbols->lookup<func::FuncOp>(call.getCallee()))
      p.callSites[f].push_back(call);
  });
  module.walk([&](bmt::GetGlobalOp g) {
    if (auto param = p.symbols->lookup<bmt::ParameterOp>(g.getGlobal()))
      p.paramReads[param].push_back(g);
  });
  std::function<void(func::FuncOp)> visit = [&](func::FuncOp f) {
    if (!f || !p.blockFuncs.insert(f).second)
      return;
    f.walk([&](func::CallOp call) { visit(p.symbols->lookup<func::FuncOp>(call.getCallee())); });
  };
  for (auto list : module.getOps<bmt::BlockListOp>())
    for (Attribute b : list.getBlocks())
      visit(p.symbols->lookup<func::FuncOp>(cast<FlatSymbolRefAttr>(b).getValue()));
  return p;
}

bmt::ParameterOp ProgramIndex::paramOf(Value v) {
  auto g = v.getDefiningOp<bmt::GetGlobalOp>();
  return g ? symbols->lookup<bmt::ParameterOp>(g.getGlobal()) : nullptr;
}

bmt::ParameterOp ProgramIndex::traceParam(Value v) {
  while (auto arg = dyn_cast<BlockArgument>(v)) {
    auto f = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
    if (!f || callSites[f].size() != 1)
      return nullptr;
    v = callSites[f][0].getOperand(arg.getArgNumber());
  }
  return paramOf(v);
}

void ProgramIndex::readersOf(bmt::ParameterOp p, llvm::SmallVector<OpOperand *> &out) {
  std::function<void(Value)> visit = [&](Value v) {
    for (OpOperand &use : v.getUses()) {
      if (auto call = dyn_cast<func::CallOp>(use.getOwner())) {
        auto callee = symbols->lookup<func::FuncOp>(call.getCallee());
        if (callee && callSites[callee].size() == 1) {
          visit(callee.getArgument(use.getOperandNumber()));
          continue;
        }
      }
      out.push_back(&use);
    }
  };
  for (bmt::GetGlobalOp g : paramReads[p])
    visit(g.getResult());
}

bool ProgramIndex::isBlockRoot(func::FuncOp f) {
  for (auto list : module.getOps<bmt::BlockListOp>())
    for (Attribute b : list.getBlocks())
      if (cast<FlatSymbolRefAttr>(b).getValue() == f.getSymName())
        return true;
  return false;
}

llvm::ArrayRef<int64_t> shapeOf(bmt::ParameterOp p) { return cast<RankedTensorType>(p.getType()).getShape(); }

bool isMetadata(Operation *op) {
  auto aten = dyn_cast<bmt::AtenOp>(op);
  return aten && bmt::lookupAtenOp(aten.getName())->kind == bmt::AtenOpKind::Metadata;
}

std::optional<MatmulShape> matmulShape(ProgramIndex &program, bmt::AtenOp op) {
  std::optional<AtenOpId> id = bmt::atenOpId(op);
  MatmulShape m;
  if (id == AtenOpId::linear) {
    auto input = bmt::getAtenArg(op, "input"), weight = bmt::getAtenArg(op, "weight"),
         bias = bmt::getAtenArg(op, "bias");
    if (!input || !input->isOperand() || !weight || !weight->isOperand())
      return std::nullopt;
    m.input = input->getOperand();
    m.weightValue = weight->getOperand();
    m.outDim = 0;
    if (bias && bias->isOperand())
      m.biasValue = bias->getOperand();
  } else if (id == AtenOpId::addmm) {
    auto self = bmt::getAtenArg(op, "self"), mat1 = bmt::getAtenArg(op, "mat1"),
         mat2 = bmt::getAtenArg(op, "mat2");
    auto beta = bmt::getAtenArg(op, "beta"), alpha = bmt::getAtenArg(op, "alpha");
    if (!self || !self->isOperand() || !mat1 || !mat1->isOperand() || !mat2 ||
        !mat2->isOperand() || beta->getNumber() != 1.0 || alpha->getNumber() != 1.0)
      return std::nullopt;
    m.input = mat1->getOperand();
    m.weightValue = mat2->getOperand();
    m.biasValue = self->getOperand();
    m.outDim = 1;
  } else {
    return std::nullopt;
  }
  m.weight = program.paramOf(m.weightValue);
  if (!m.weight || !m.weight.getRequiresGrad() || shapeOf(m.weight).size() != 2)
    return std::nullopt;
  if (m.biasValue) {
    m.bias = program.paramOf(m.biasValue);
    if (!m.bias || shapeOf(m.bias).size() != 1)
      return std::nullopt;
  }
  m.out = shapeOf(m.weight)[m.outDim];
  m.in = shapeOf(m.weight)[1 - m.outDim];
  return m;
}

} // namespace bmt::tp
