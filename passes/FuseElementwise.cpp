//===- FuseElementwise.cpp - the bmt-fuse-elementwise pass ----------------===//
//
// Groups maximal regions of pointwise ATen ops (with broadcasting and dtype
// casts) and at most one reduction over the last dimension (RMSNorm's mean,
// a sum, layer_norm, a softmax that ends the region) into `bmt.fused` ops
// whose body holds the original ops; the runtime
// runs each region as one generated kernel forward and one backward
// (include/bmt/Runtime/fusion/Region.h). The ops a region may hold are
// those of include/bmt/Dialect/FusibleOps.def that the operator
// registry marks neither in-place nor random, and none that reads a value
// overwritten in place after it (InPlaceWrites). See passes/Passes.td for the
// contract.
//
//===----------------------------------------------------------------------===//

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/FusibleOps.h"
#include "bmt/Plan/ScalarTypeCodes.h"
#include "bmt/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/EquivalenceClasses.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringMap.h"

namespace bmt {
#define GEN_PASS_DEF_FUSEELEMENTWISE
#include "bmt/Passes/Passes.h.inc"
} // namespace bmt

using namespace mlir;
using bmt::AtenOpId;

namespace {

enum class Role { Pointwise, Cast, Reduction };

/// The role in a region of an op of FusibleOps.def.
Role roleOfKind(bmt::FusibleKind kind) {
  if (kind == bmt::FusibleKind::Cast)
    return Role::Cast;
  return bmt::isFusibleReduction(kind) ? Role::Reduction : Role::Pointwise;
}

/// Whether a cast may target the dtype of code `code` (a floating one).
bool isFloatingDtypeCode(int64_t code) { return bmt::scalar_type::isFloating(code); }

/// Whether `v` is a tensor operand the generator can read: any tensor value
/// (an input of the region or a value of it).
bool isTensor(Value v) { return isa<bmt::TensorType>(v.getType()); }

/// The role of `op` in a region, or none when it cannot be in one: not in
/// FusibleOps.def, flagged in-place or random by the registry, or with
/// arguments the generator does not take (run-time scalars, a reduction
/// over other dims, a cast with options).
std::optional<Role> roleOf(Operation *op) {
  auto aten = dyn_cast<bmt::AtenOp>(op);
  if (!aten || aten->getNumResults() != 1 || !isTensor(aten.getResult(0)))
    return std::nullopt;
  std::optional<AtenOpId> id = bmt::atenOpId(aten);
  std::optional<bmt::FusibleKind> kind = id ? bmt::fusibleKindOf(*id) : std::nullopt;
  if (!kind || bmt::getAtenOpInfo(*id).isInPlace() || bmt::getAtenOpInfo(*id).isRandom())
    return std::nullopt;
  Role role = roleOfKind(*kind);
  // Every operand is a tensor (an i64/f64 operand is a run-time scalar).
  for (Value v : aten.getOperands())
    if (!isTensor(v))
      return std::nullopt;
  llvm::SmallVector<bmt::AtenArg> args = bmt::getAtenArgs(aten);
  auto constantNumber = [&](unsigned i) {
    return i < args.size() && !args[i].isList() && !args[i].isOperand() &&
           args[i].getNumber().has_value();
  };
  auto tensorOrNumber = [&](unsigned i) {
    return i < args.size() && !args[i].isList() && (args[i].isOperand() || constantNumber(i));
  };
  switch (role) {
  case Role::Cast:
    // to.dtype(self, dtype, non_blocking=false, copy=false, memory_format=None)
    return args[0].isOperand() && args[1].getInt() && isFloatingDtypeCode(*args[1].getInt()) &&
                   args[2].getBool() == false && args[3].getBool() == false && args[4].isNone()
               ? std::optional<Role>(role)
               : std::nullopt;
  case Role::Reduction: {
    if (id == AtenOpId::layer_norm) {
      // layer_norm(input, normalized_shape=[D], weight?, bias?, eps, cudnn_enable):
      // over the last dim only (D is checked against it per call).
      std::optional<SmallVector<int64_t>> shape = args[1].getInts();
      auto tensorOrNone = [&](unsigned i) { return args[i].isOperand() || args[i].isNone(); };
      return args.size() == 6 && args[0].isOperand() && shape && shape->size() == 1 &&
                     tensorOrNone(2) && tensorOrNone(3) && constantNumber(4)
                 ? std::optional<Role>(role)
                 : std::nullopt;
    }
    if (id == AtenOpId::softmax_int) {
      // softmax(self, dim=-1, dtype=None or a floating dtype)
      return args.size() == 3 && args[0].isOperand() && args[1].getInt() == -1 &&
                     (args[2].isNone() || (args[2].getInt() && isFloatingDtypeCode(*args[2].getInt())))
                 ? std::optional<Role>(role)
                 : std::nullopt;
    }
    // mean.dim / sum.dim_IntList(self, dim=[-1], keepdim=true, dtype=None)
    std::optional<SmallVector<int64_t>> dims = args[1].getInts();
    bool lastDim = dims && dims->size() == 1 && (*dims)[0] == -1;
    return args[0].isOperand() && lastDim && args[2].getBool() == true && args[3].isNone()
               ? std::optional<Role>(role)
               : std::nullopt;
  }
  case Role::Pointwise:
    break;
  }
  if (!args[0].isOperand())
    return std::nullopt;
  using bmt::FusibleKind;
  if (kind == FusibleKind::Add || kind == FusibleKind::Sub || kind == FusibleKind::Rsub)
    return tensorOrNumber(1) && constantNumber(2) ? std::optional<Role>(role) : std::nullopt;
  if (kind == FusibleKind::Mul || kind == FusibleKind::Div)
    return tensorOrNumber(1) ? std::optional<Role>(role) : std::nullopt;
  if (id == AtenOpId::pow_Tensor_Scalar)
    return constantNumber(1) ? std::optional<Role>(role) : std::nullopt;
  if (id == AtenOpId::gelu) {
    auto approximate = dyn_cast_or_null<StringAttr>(args[1].getAttr());
    return approximate && (approximate.getValue() == "none" || approximate.getValue() == "tanh")
               ? std::optional<Role>(role)
               : std::nullopt;
  }
  return args.size() == 1 ? std::optional<Role>(role) : std::nullopt; // unary
}

bool isLayerNorm(Operation *op) {
  auto aten = dyn_cast<bmt::AtenOp>(op);
  return aten && bmt::atenOpId(aten) == AtenOpId::layer_norm;
}

/// softmax ends a region, never grows into one as a producer (its input must
/// have the region's shape: the runtime reduces over that last dim) but for
/// a region of one cast of it (softmax in float32, then `.to(q.dtype)`).
bool isSoftmax(Operation *op) {
  auto aten = dyn_cast<bmt::AtenOp>(op);
  return aten && bmt::atenOpId(aten) == AtenOpId::softmax_int;
}

/// A 0-dim numeric bmt.constant: a number inside the region (cloned into it).
bool isScalarConstant(Value v) {
  auto c = v.getDefiningOp<bmt::ConstantOp>();
  return c && bmt::getConstantNumber(v).has_value();
}

/// `op` as a bmt.aten of `id` with one result used once, or null.
bmt::AtenOp usedOnce(Operation *op, AtenOpId id) {
  auto aten = dyn_cast_or_null<bmt::AtenOp>(op);
  return aten && bmt::atenOpId(aten) == id && aten->getNumResults() == 1 &&
                 aten->getResult(0).hasOneUse()
             ? aten
             : bmt::AtenOp();
}

/// HF's rotate_half(x) = cat([-x[..., h:], x[..., :h]], -1) at `cat`
/// (either half negated, or neither): every op of it (slices, negs, the
/// cat, and where h is computed from x's size, the size.int, num_to_tensor,
/// floor_divide by 2 and Int.Tensor of each slice), each used only inside
/// it. Empty when `cat` is not that form. x must come from an op no region
/// takes (the runtime reads halves of a region input only); the sliced dim
/// being x's last and h = size / 2 are checked per call at run time.
SmallVector<Operation *> rotateHalfOps(Operation *cat, Value *source = nullptr) {
  auto c = dyn_cast<bmt::AtenOp>(cat);
  if (!c || bmt::atenOpId(c) != AtenOpId::cat || c->getNumResults() != 1)
    return {};
  SmallVector<bmt::AtenArg> args = bmt::getAtenArgs(c);
  if (args.size() != 2 || !args[0].isList() || args[0].getElements().size() != 2 ||
      !args[1].getInt())
    return {};
  SmallVector<Operation *> ops{cat};
  struct Piece {
    Value x;
    std::optional<int64_t> dim;
    bmt::AtenArg start, end;
  };
  SmallVector<Piece> pieces;
  for (const bmt::AtenArg &e : args[0].getElements()) {
    if (!e.isOperand() || !e.getOperand().hasOneUse())
      return {};
    Operation *op = e.getOperand().getDefiningOp();
    if (auto neg = usedOnce(op, AtenOpId::neg)) {
      ops.push_back(neg);
      op = neg->getOperand(0).getDefiningOp();
    }
    auto slice = usedOnce(op, AtenOpId::slice_Tensor);
    if (!slice)
      return {};
    SmallVector<bmt::AtenArg> sa = bmt::getAtenArgs(slice);
    if (sa.size() != 5 || !sa[0].isOperand() || !sa[1].getInt() || sa[4].getInt() != 1)
      return {};
    ops.push_back(slice);
    pieces.push_back({sa[0].getOperand(), sa[1].getInt(), sa[2], sa[3]});
  }
  const Piece &second = pieces[0], &first = pieces[1];
  if (first.x != second.x || first.dim != second.dim)
    return {};
  // The half h: equal constants, or size.int(x, dim) // 2 on both sides.
  auto half = [&](const bmt::AtenArg &a) -> std::optional<int64_t> {
    if (a.getInt())
      return a.getInt();
    if (!a.isOperand())
      return std::nullopt;
    auto toInt = usedOnce(a.getOperand().getDefiningOp(), AtenOpId::Int_Tensor);
    auto div = toInt ? usedOnce(toInt->getOperand(0).getDefiningOp(), AtenOpId::floor_divide)
                     : bmt::AtenOp();
    if (!div || div->getNumOperands() != 2 || bmt::getConstantInt(div->getOperand(1)) != 2)
      return std::nullopt;
    auto num = dyn_cast_or_null<bmt::NumToTensorOp>(div->getOperand(0).getDefiningOp());
    if (!num || !num->getResult(0).hasOneUse())
      return std::nullopt;
    auto size = usedOnce(num->getOperand(0).getDefiningOp(), AtenOpId::size_int);
    std::optional<bmt::AtenArg> sizeDim = size ? bmt::getAtenArg(size, 1) : std::nullopt;
    if (!size || size->getOperand(0) != first.x || !sizeDim || sizeDim->getInt() != first.dim)
      return std::nullopt;
    ops.append({toInt, div, num, size});
    return -1; // size(dim) // 2
  };
  constexpr int64_t kToEnd = int64_t{1} << 62; // x[..., h:] records INT64_MAX
  std::optional<int64_t> h1 = half(first.end), h2 = half(second.start);
  if (first.start.getInt() != 0 || !second.end.getInt() || *second.end.getInt() < kToEnd || !h1 ||
      !h2 || *h1 != *h2 || *h1 == 0)
    return {};
  Operation *producer = first.x.getDefiningOp();
  if (producer && roleOf(producer))
    return {};
  if (source)
    *source = first.x;
  return ops;
}

/// One region being grown backwards from its root (its last op).
struct Region {
  llvm::SetVector<Operation *> ops; // in no particular order until sorted
  unsigned reductions = 0;
  unsigned rotateHalves = 0;
  /// Ops whose value ops after the root read too: results of the region
  /// besides the root's (a residual sum that a norm in the region reads).
  llvm::SetVector<Operation *> extraResults;
};

/// The most results beside the root's a region may have: each adds a
/// grad_output and an output to the kernels' tensors (at most 16).
constexpr unsigned kMaxExtraResults = 2;

/// Whether `op` of `region` has one value per row: a mean or sum over the
/// last dim, or computed from such values and constants only (the
/// runtime's Graph::rowValued; an input from outside is element-valued).
bool rowValued(Operation *op, const Region &region, llvm::DenseMap<Operation *, bool> &memo) {
  if (auto it = memo.find(op); it != memo.end())
    return it->second;
  auto aten = dyn_cast<bmt::AtenOp>(op);
  bool row = false;
  if (aten && (bmt::atenOpId(aten) == AtenOpId::mean_dim || bmt::atenOpId(aten) == AtenOpId::sum_dim_IntList)) {
    row = true;
  } else if (aten && bmt::atenOpId(aten) != AtenOpId::layer_norm && bmt::atenOpId(aten) != AtenOpId::softmax_int) {
    row = true;
    for (Value v : op->getOperands()) {
      if (isScalarConstant(v))
        continue;
      Operation *producer = v.getDefiningOp();
      row = row && producer && region.ops.contains(producer) && rowValued(producer, region, memo);
    }
  }
  return memo[op] = row;
}

/// Where a block's tensors are overwritten in place: the ops that write
/// each storage (an in-place op's `self`, or a call whose callee writes that
/// argument), storages told apart by alias class (a view, a cast that may
/// return its input, an in-place op's result: the same storage as its
/// `self`). A region runs at its root's place and the runtime saves its
/// inputs for the backward, so a value overwritten after an op that reads
/// it must not be read inside a region: the kernel would read the written
/// data, or its backward the written inputs (DeepSeek-V3's router divides
/// top-k weights in place after summing them).
class InPlaceWrites {
public:
  InPlaceWrites(Block &block, llvm::function_ref<bool(func::CallOp, unsigned)> callWrites) {
    for (Operation &op : block) {
      if (auto call = dyn_cast<func::CallOp>(op)) {
        for (unsigned i = 0; i < call->getNumOperands(); ++i)
          if (isa<bmt::TensorType>(call->getOperand(i).getType()) && callWrites(call, i))
            writes.push_back({call->getOperand(i), &op});
        continue;
      }
      auto aten = dyn_cast<bmt::AtenOp>(op);
      std::optional<AtenOpId> id = aten ? bmt::atenOpId(aten) : std::nullopt;
      if (!id || aten->getNumOperands() == 0)
        continue;
      const bmt::AtenOpInfo &info = bmt::getAtenOpInfo(*id);
      Value self = aten->getOperand(0);
      if (info.mayAlias())
        for (Value result : aten->getResults())
          if (isa<bmt::TensorType>(result.getType()))
            classes.unionSets(self, result);
      if (info.isInPlace())
        writes.push_back({self, &op});
    }
  }

  /// Whether the storage of `v` is written in place after `reader`.
  bool writtenAfter(Value v, Operation *reader) const {
    for (const auto &[written, writer] : writes)
      if (reader->isBeforeInBlock(writer) && sameStorage(v, written))
        return true;
    return false;
  }

  /// Whether the storage of `v` is written in place anywhere in the block.
  bool written(Value v) const {
    return llvm::any_of(writes, [&](const auto &w) { return sameStorage(v, w.first); });
  }

  /// Whether an operand of `op` is written in place after it.
  bool readsOverwritten(Operation *op) const {
    return llvm::any_of(op->getOperands(), [&](Value v) { return writtenAfter(v, op); });
  }

private:
  bool sameStorage(Value a, Value b) const {
    return a == b || (classes.contains(a) && classes.contains(b) &&
                      classes.getLeaderValue(a) == classes.getLeaderValue(b));
  }

  llvm::EquivalenceClasses<Value> classes;
  SmallVector<std::pair<Value, Operation *>> writes;
};

struct FuseElementwisePass : bmt::impl::FuseElementwiseBase<FuseElementwisePass> {
  using FuseElementwiseBase::FuseElementwiseBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    int64_t inlined = inlineCalls ? inlinePointwiseCalls(module) : 0;
    writtenArguments.clear();
    int64_t regions = 0, rowRegions = 0, fusedOps = 0, rotateHalves = 0, results = 0;
    SmallVector<StringRef> functions;
    for (func::FuncOp f : module.getOps<func::FuncOp>()) {
      int64_t before = regions;
      for (Block &block : f.getBody()) {
        llvm::DenseSet<Operation *> taken;
        SmallVector<Operation *> candidates;
        for (Operation &op : llvm::reverse(block))
          candidates.push_back(&op);
        auto callWrites = [&](func::CallOp call, unsigned i) { return writesArgument(call, i); };
        std::optional<InPlaceWrites> writes(std::in_place, block, callWrites);
        for (Operation *root : candidates) {
          if (taken.contains(root) || (!roleOf(root) && rotateHalfOps(root).empty()))
            continue;
          Region region = grow(root, taken, secondResults, *writes);
          // Results beside the root's must be element-valued (and feed no
          // rotate_half region): else the region without them.
          llvm::DenseMap<Operation *, bool> memo;
          if (!region.extraResults.empty() &&
              (region.rotateHalves > 0 ||
               llvm::any_of(region.extraResults,
                            [&](Operation *op) { return rowValued(op, region, memo); })))
            region = grow(root, taken, /*extraResults=*/false, *writes);
          if (region.ops.empty() || (region.ops.size() < 2 && !isLayerNorm(root)))
            continue; // one op is one kernel already (layer_norm: the row kernel's is faster)
          for (Operation *op : region.ops)
            taken.insert(op);
          fusedOps += static_cast<int64_t>(region.ops.size());
          ++regions;
          rowRegions += region.reductions;
          rotateHalves += region.rotateHalves;
          results += static_cast<int64_t>(region.extraResults.size());
          for (Operation *c : outline(root, region))
            taken.insert(c); // erased: never look at them again
          writes.emplace(block, callWrites); // the region's values are new ones
        }
      }
      if (regions > before)
        functions.push_back(f.getSymName());
    }
    InFlightDiagnostic remark = emitRemark(module.getLoc());
    if (regions == 0) {
      remark << "bmt-fuse-elementwise: no region of two or more fusible ops";
      return;
    }
    remark << "bmt-fuse-elementwise: " << fusedOps << " ops in " << regions << " region"
           << (regions == 1 ? "" : "s") << " (" << rowRegions << " with a last-dim reduction"
           << (rotateHalves ? ", " + std::to_string(rotateHalves) + " rotate_half" : "")
           << (results ? ", " + std::to_string(results) + " with a second result" : "") << ") in "
           << functions.size() << " function" << (functions.size() == 1 ? "" : "s") << " ("
           << functions.front();
    if (functions.size() > 1)
      remark << " ... " << functions.back();
    remark << ")";
    if (inlined)
      remark << "; " << inlined << " call" << (inlined == 1 ? "" : "s")
             << " of fusible submodules inlined";
  }

  /// Inlines every call of a private function whose body is fusible
  /// non-reduction ops and scalar constants only (an activation module such
  /// as LLaMA's `act_fn`, SiLU): its op can then join a region of the caller
  /// (SwiGLU's `silu(gate) * up`); the callee stays (the module tree is
  /// kept). With second-results, also one whose body reads parameters and
  /// holds one reduction (a norm module, RMSNorm or LayerNorm, its weight
  /// then read where the call was), so that the residual add before the
  /// norm can join its region; such a callee left without calls is erased
  /// (else its parameters would have a second reader). Returns the number
  /// of calls inlined.
  int64_t inlinePointwiseCalls(ModuleOp module) {
    SymbolTable symbols(module);
    llvm::DenseMap<Operation *, bool> pointwise;
    auto isPointwise = [&](func::FuncOp f) {
      auto [it, fresh] = pointwise.try_emplace(f, false);
      if (!fresh)
        return it->second;
      if (!f.isPrivate() || f.getBody().getBlocks().size() != 1 || f.getNumResults() == 0 ||
          (!secondResults && f.getNumResults() != 1))
        return false;
      unsigned reductions = 0;
      for (Operation &op : f.getBody().front()) {
        if (isa<func::ReturnOp>(op) || (secondResults && isa<bmt::GetGlobalOp>(op)))
          continue;
        if (isa<bmt::ConstantOp>(op) && isScalarConstant(op.getResult(0)))
          continue;
        std::optional<Role> role = roleOf(&op);
        if (!role || (*role == Role::Reduction && (!secondResults || ++reductions > 1)))
          return false;
      }
      return it->second = true;
    };
    SmallVector<func::CallOp> calls;
    module.walk([&](func::CallOp call) {
      auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
      if (callee && !call->hasAttr("bmt.block") && isPointwise(callee))
        calls.push_back(call);
    });
    for (func::CallOp call : calls) {
      auto callee = symbols.lookup<func::FuncOp>(call.getCallee());
      Block &body = callee.getBody().front();
      IRMapping mapping;
      for (auto [arg, operand] : llvm::zip(body.getArguments(), call.getOperands()))
        mapping.map(arg, operand);
      OpBuilder builder(call);
      for (Operation &op : body) {
        if (auto ret = dyn_cast<func::ReturnOp>(op)) {
          for (auto [result, value] : llvm::zip_equal(call.getResults(), ret.getOperands()))
            result.replaceAllUsesWith(mapping.lookupOrDefault(value));
          continue;
        }
        builder.clone(op, mapping);
      }
      call->erase();
    }
    // A callee that reads parameters and is left without calls goes: its
    // parameter reads are the callers' now.
    llvm::SetVector<Operation *> callees;
    for (auto [f, fusible] : pointwise) {
      bool readsParameters = false;
      f->walk([&](bmt::GetGlobalOp) { readsParameters = true; });
      if (fusible && readsParameters && SymbolTable::symbolKnownUseEmpty(f, module))
        callees.insert(f);
    }
    for (Operation *f : callees)
      f->erase();
    return static_cast<int64_t>(calls.size());
  }

  /// Whether `call`'s callee (or a function it calls) writes its argument
  /// `i` in place, or a view of it.
  bool writesArgument(func::CallOp call, unsigned i) {
    auto callee = SymbolTable::lookupNearestSymbolFrom<func::FuncOp>(call, call.getCalleeAttr());
    if (!callee || callee.getBody().empty())
      return true; // unknown: assume it does
    auto key = std::make_pair(callee.getOperation(), i);
    if (auto it = writtenArguments.find(key); it != writtenArguments.end())
      return it->second;
    writtenArguments[key] = false; // a recursive call adds nothing
    Block &body = callee.getBody().front();
    InPlaceWrites inner(body, [&](func::CallOp c, unsigned j) { return writesArgument(c, j); });
    bool written = i < body.getNumArguments() && inner.written(body.getArgument(i));
    return writtenArguments[key] = written;
  }

  llvm::DenseMap<std::pair<Operation *, unsigned>, bool> writtenArguments;

  /// The maximal region ending at `root`: producers in the root's block
  /// that are fusible, not in another region, and whose every use is in the
  /// region, with at most one reduction. With `extraResults`, a pointwise
  /// producer whose other users all come after the root joins too, as a
  /// result of the region (at most kMaxExtraResults).
  Region grow(Operation *root, const llvm::DenseSet<Operation *> &taken, bool extraResults,
              const InPlaceWrites &writes) {
    Region region;
    auto overwritten = [&](ArrayRef<Operation *> ops) {
      return llvm::any_of(ops, [&](Operation *op) { return writes.readsOverwritten(op); });
    };
    if (std::optional<Role> role = roleOf(root)) {
      if (writes.readsOverwritten(root))
        return region; // empty: no region
      region.ops.insert(root);
      region.reductions = *role == Role::Reduction ? 1 : 0;
    } else {
      SmallVector<Operation *> rotate = rotateHalfOps(root);
      if (overwritten(rotate))
        return region;
      region.ops.insert_range(rotate);
      region.rotateHalves = 1;
    }
    bool changed = true;
    while (changed) {
      changed = false;
      for (size_t i = 0; i < region.ops.size(); ++i) {
        Operation *op = region.ops[i];
        for (Value v : op->getOperands()) {
          Operation *producer = v.getDefiningOp();
          if (!producer || producer->getBlock() != root->getBlock() ||
              region.ops.contains(producer) || taken.contains(producer) ||
              isScalarConstant(v))
            continue;
          bool outsideUsers =
              !llvm::all_of(v.getUsers(), [&](Operation *user) { return region.ops.contains(user); });
          if (outsideUsers) {
            std::optional<Role> role = roleOf(producer);
            bool later = llvm::all_of(v.getUsers(), [&](Operation *user) {
              return region.ops.contains(user) ||
                     (user->getBlock() == root->getBlock() && root->isBeforeInBlock(user));
            });
            if (!extraResults || !later || !role || *role == Role::Reduction ||
                region.extraResults.size() >= kMaxExtraResults)
              continue;
          }
          // rotate_half joins as a whole, and never a region with a
          // reduction (the runtime's row kernels read no halves).
          std::optional<Role> role = roleOf(producer);
          if (!role) {
            SmallVector<Operation *> rotate = rotateHalfOps(producer);
            if (rotate.empty() || region.reductions > 0 || overwritten(rotate) ||
                llvm::any_of(rotate, [&](Operation *op) { return taken.contains(op); }))
              continue;
            region.ops.insert_range(rotate);
            ++region.rotateHalves;
            changed = true;
            continue;
          }
          if (*role == Role::Reduction && (region.reductions > 0 || region.rotateHalves > 0))
            continue;
          if (writes.readsOverwritten(producer))
            continue;
          if (isSoftmax(producer) && !(region.ops.size() == 1 && roleOf(root) == Role::Cast))
            continue;
          region.ops.insert(producer);
          if (outsideUsers)
            region.extraResults.insert(producer);
          region.reductions += *role == Role::Reduction ? 1 : 0;
          changed = true;
        }
      }
    }
    return region;
  }

  /// Replaces the region by a bmt.fused op at the root's place whose body
  /// holds clones of the region's ops in their block order; its results
  /// are the root's value, then the extra results' in block order.
  /// Returns the outer constants it erased (dead once the region held them).
  SmallVector<Operation *> outline(Operation *root, Region &region) {
    SmallVector<Operation *> ordered(region.ops.begin(), region.ops.end());
    llvm::sort(ordered, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    // Inputs: operands defined outside the region (not scalar constants),
    // in the order of first use.
    llvm::SetVector<Value> inputs;
    for (Operation *op : ordered)
      for (Value v : op->getOperands())
        if ((!v.getDefiningOp() || !region.ops.contains(v.getDefiningOp())) &&
            !isScalarConstant(v))
          inputs.insert(v);

    OpBuilder builder(root);
    MLIRContext *context = root->getContext();
    SmallVector<Value> inputValues(inputs.begin(), inputs.end());
    SmallVector<Operation *> results{root};
    for (Operation *op : ordered)
      if (region.extraResults.contains(op))
        results.push_back(op);
    SmallVector<Type> resultTypes(results.size(), bmt::TensorType::get(context));
    auto fused = bmt::FusedOp::create(
        builder, root->getLoc(), resultTypes,
        builder.getStringAttr(region.reductions ? "row" : "pointwise"), inputValues);
    Block *body = new Block();
    fused.getBody().push_back(body);
    IRMapping mapping;
    for (Value v : inputValues)
      mapping.map(v, body->addArgument(v.getType(), v.getLoc()));
    OpBuilder inner = OpBuilder::atBlockBegin(body);
    SmallVector<Operation *> constants;
    for (Operation *op : ordered) {
      for (Value v : op->getOperands())
        if (isScalarConstant(v) && !mapping.contains(v)) {
          constants.push_back(v.getDefiningOp());
          mapping.map(v, inner.clone(*v.getDefiningOp())->getResult(0));
        }
      inner.clone(*op, mapping);
    }
    SmallVector<Value> yielded;
    for (Operation *op : results)
      yielded.push_back(mapping.lookup(op->getResult(0)));
    bmt::YieldOp::create(inner, root->getLoc(), yielded);
    for (auto [op, value] : llvm::zip_equal(results, fused.getResults()))
      op->getResult(0).replaceAllUsesWith(value);
    for (Operation *op : llvm::reverse(ordered))
      op->erase();
    SmallVector<Operation *> erased;
    for (Operation *c : constants)
      if (c->use_empty()) {
        erased.push_back(c);
        c->erase();
      }
    return erased;
  }
};

} // namespace
