//===- TensorParallelViewRules.cpp - the split dim through views ----------===//
//
// The chain analysis of bmt-tensor-parallel (TensorParallelChainBuilder.h):
// a chain that starts at matmuls with parameter weights reading one
// replicated activation, runs through pointwise ops, views and per-head
// attention, and ends at a matmul that contracts the split dimension. How
// the split dimension moves through pointwise ops, reductions, transposes,
// per-head matmuls and attention is the upstream shard dialect's
// ShardingInterface (lib/Dialect/ShardingInterfaceImpl.cpp), asked on
// ranked copies of the ops; views that regroup dims are the pass's own
// (TensorParallelViewRules.cpp). Each step returns LogicalResult; fail()
// records the reason.
//
//===----------------------------------------------------------------------===//

#include "TensorParallelChainBuilderImpl.h"

#include "bmt/Dialect/AtenArgs.h"
#include "bmt/Dialect/AtenRegistry.h"
#include "bmt/Dialect/BmtDialect.h"
#include "bmt/Dialect/ShardingInterfaceImpl.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Shard/Interfaces/ShardingInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringExtras.h"

#include <optional>
#include <string>

using namespace mlir;
using bmt::AtenOpId;
using namespace bmt::tp;

LogicalResult ChainBuilder::Impl::edit(Chain &chain, bmt::AtenOp op, unsigned arg, int elem, int64_t global,
                                       StringRef what) {
  if (failed(checkDivides(op, what, global, tensorParallel)))
    return failure();
  chain.edits.push_back({op, arg, elem, global / tensorParallel});
  return success();
}

LogicalResult ChainBuilder::Impl::view(bmt::AtenOp op, OpOperand &use, const Split &s, llvm::SmallVector<Value> &work,
                                       Chain &chain) {
  std::optional<AtenOpId> id = bmt::atenOpId(op);
  int64_t rank = s.rankKnown() ? s.rank() : -1;
  auto intArg = [&](StringRef arg) { return bmt::getAtenArg(op, arg)->getInt(); };
  if (use.getOperandNumber() != 0 && id != AtenOpId::cat)
    return fail(op, "a split value used as a shape or index");
  if (id == AtenOpId::transpose_int) {
    auto d0 = intArg("dim0"), d1 = intArg("dim1");
    if (!d0 || !d1 || rank < 0)
      return fail(op, "a transpose of a value of unknown rank");
    int64_t a = *d0 < 0 ? *d0 + rank : *d0, b = *d1 < 0 ? *d1 + rank : *d1;
    Split out = s;
    FailureOr<int64_t> dim = dimByInterface(op, s);
    if (failed(dim))
      return failure();
    out.dim = *dim;
    std::swap(out.sizes[a], out.sizes[b]);
    if (failed(assign(op.getResult(0), out, work)))
      return failure();
    return success();
  }
  if (id == AtenOpId::permute) {
    auto dims = bmt::getAtenArg(op, "dims")->getInts();
    if (!dims || rank < 0 || static_cast<int64_t>(dims->size()) != rank)
      return fail(op, "a permute of a value of unknown rank");
    Split out = s;
    for (int64_t i = 0; i < rank; ++i) {
      int64_t src = (*dims)[i] < 0 ? (*dims)[i] + rank : (*dims)[i];
      out.sizes[i] = s.sizes[src];
    }
    FailureOr<int64_t> dim = dimByInterface(op, s);
    if (failed(dim))
      return failure();
    out.dim = *dim;
    if (failed(assign(op.getResult(0), out, work)))
      return failure();
    return success();
  }
  if (id == AtenOpId::unsqueeze) {
    auto d = intArg("dim");
    if (!d || (*d >= 0 && rank < 0))
      return fail(op, "an unsqueeze of a value of unknown rank");
    Split out = s;
    FailureOr<int64_t> dim = dimByInterface(op, s);
    if (failed(dim))
      return failure();
    out.dim = *dim;
    if (rank >= 0)
      out.sizes.insert(out.sizes.begin() + (*d < 0 ? *d + rank + 1 : *d), 1);
    if (failed(assign(op.getResult(0), out, work)))
      return failure();
    return success();
  }
  if (id == AtenOpId::slice_Tensor || id == AtenOpId::narrow || id == AtenOpId::select_int) {
    auto d = intArg("dim");
    auto nd = d ? negDim(*d, rank) : std::nullopt;
    if (id == AtenOpId::slice_Tensor && intArg("start") == 0 && intArg("step") == 1 &&
        intArg("end") >= std::numeric_limits<int64_t>::max() / 2) {
      if (failed(assign(op.getResult(0), s, work))) // the whole tensor
        return failure();
      return success();
    }
    if (nd && *nd == s.dim && id == AtenOpId::slice_Tensor && s.chunks > 1) {
      // One of the equal parts of a fused projection (Phi-3's q, k, v):
      // its bounds become the rank's part of each chunk.
      if (failed(fusedSlice(op, s, work, chain)))
        return failure();
      return success();
    }
    if (!nd || *nd == s.dim)
      return fail(op, "indexing along the split dim");
    Split out = s;
    if (id == AtenOpId::select_int) {
      if (rank < 0)
        return fail(op, "a select of a value of unknown rank");
      int64_t k = *nd + rank;
      if (k > s.pos())
        out.dim = s.dim + 1;
      out.sizes.erase(out.sizes.begin() + k);
    } else if (rank >= 0) {
      out.sizes[*nd + rank] = -1;
    }
    if (failed(assign(op.getResult(0), out, work)))
      return failure();
    return success();
  }
  if (id == AtenOpId::split_Tensor || id == AtenOpId::chunk) {
    auto d = intArg("dim");
    auto nd = d ? negDim(*d, rank) : std::nullopt;
    if (!nd)
      return fail(op, "a split along an unknown dim");
    int64_t n = op->getNumResults();
    Split out = s;
    if (*nd == s.dim) {
      // The chunks of a fused projection (q, k, v) taken apart.
      if (s.chunks != n || s.global < 0 || s.global % n != 0)
        return fail(op, "a split along the split dim that does not follow its chunks");
      out.chunks = 1;
      out.global = s.global / n;
      if (rank >= 0)
        out.sizes[s.pos()] = out.global;
      if (id == AtenOpId::split_Tensor) {
        auto size = intArg("split_size");
        if (!size || *size != out.global)
          return fail(op, "a split along the split dim that does not follow its chunks");
        if (failed(edit(chain, op, bmt::getAtenOpInfo(*id).argIndex("split_size"), -1, *size,
                        "the split size")))
          return failure();
      }
    } else if (rank >= 0) {
      out.sizes[*nd + rank] = -1;
    }
    for (Value r : op->getResults())
      if (failed(assign(r, out, work)))
        return failure();
    return success();
  }
  if (id == AtenOpId::cat) {
    auto d = intArg("dim");
    auto nd = d ? negDim(*d, rank) : std::nullopt;
    if (!nd || *nd == s.dim)
      return fail(op, "a concatenation along the split dim");
    auto list = bmt::getAtenArg(op, "tensors");
    for (const bmt::AtenArg &e : list->getElements())
      if (!e.isOperand() || !splits.count(e.getOperand()))
        if (e.getOperand() != use.get())
          return success(); // the others arrive later
    Split out = s;
    if (rank >= 0)
      out.sizes[*nd + rank] = -1;
    if (failed(assign(op.getResult(0), out, work)))
      return failure();
    return success();
  }
  if (id == AtenOpId::expand) {
    auto list = bmt::getAtenArg(op, "size");
    auto elems = list->getElements();
    int64_t n = elems.size();
    if (n < -s.dim)
      return fail(op, "an expand of fewer dims than the split dim");
    const bmt::AtenArg &at = elems[n + s.dim];
    Split out = s;
    if (auto c = at.getInt(); c && *c != -1) {
      if (*c != s.global)
        return fail(op, "an expand of the split dim");
      if (failed(edit(chain, op, bmt::getAtenOpInfo(*id).argIndex("size"), n + s.dim, *c,
                      "the expanded size")))
        return failure();
    }
    llvm::SmallVector<int64_t> sizes;
    for (int64_t i = 0; i < n; ++i) {
      auto c = elems[i].getInt();
      int64_t from = i - (n - rank);
      sizes.push_back(c && *c != -1 ? *c : rank >= 0 && from >= 0 ? s.sizes[from] : -1);
    }
    out.setSizes(sizes);
    if (failed(assign(op.getResult(0), out, work)))
      return failure();
    return success();
  }
  if (id == AtenOpId::view || id == AtenOpId::reshape) {
    if (failed(reshape(op, s, work, chain)))
      return failure();
    return success();
  }
  return fail(op, "an op the pass does not know how to split");
}

LogicalResult ChainBuilder::Impl::fusedSlice(bmt::AtenOp op, const Split &s, llvm::SmallVector<Value> &work, Chain &chain) {
  auto intArg = [&](StringRef arg) { return bmt::getAtenArg(op, arg)->getInt(); };
  auto start = intArg("start"), end = intArg("end"), step = intArg("step");
  int64_t part = s.global > 0 ? s.global / s.chunks : -1;
  bool open = end && *end >= std::numeric_limits<int64_t>::max() / 2;
  if (!start || !end || !step || *step != 1 || part <= 0 || *start % part != 0 ||
      (open ? *start != s.global - part : *end != *start + part))
    return fail(op, "a slice along the split dim that does not take one part of a fused projection");
  const bmt::AtenOpInfo *info = bmt::lookupAtenOp(op.getName());
  if (*start != 0)
    if (failed(edit(chain, op, info->argIndex("start"), -1, *start, "the slice's start")))
      return failure();
  if (!open)
    if (failed(edit(chain, op, info->argIndex("end"), -1, *end, "the slice's end")))
      return failure();
  Split out = s;
  out.chunks = 1;
  out.global = part;
  if (out.rankKnown())
    out.sizes[out.pos()] = part;
  if (failed(assign(op.getResult(0), out, work)))
    return failure();
  return success();
}

LogicalResult ChainBuilder::Impl::reshape(bmt::AtenOp op, const Split &s, llvm::SmallVector<Value> &work, Chain &chain) {
  unsigned argIdx = 1;
  auto list = bmt::getAtenArg(op, argIdx);
  if (!list || !list->isList())
    return fail(op, "a reshape to a computed shape");
  auto elems = list->getElements();
  int64_t n = elems.size();
  int64_t rank = s.rankKnown() ? s.rank() : -1;
  llvm::SmallVector<std::optional<int64_t>> c;
  for (const bmt::AtenArg &e : elems)
    c.push_back(e.getInt());
  auto sizesOut = [&](int64_t dim, int64_t global) {
    llvm::SmallVector<int64_t> sizes;
    for (auto &x : c)
      sizes.push_back(x && *x != -1 ? *x : -1);
    sizes[n + dim] = global;
    return sizes;
  };
  Split out = s;
  int64_t trailing = 1; // global product of the dims after the split dim
  if (s.dim < -1) {
    if (rank < 0)
      return fail(op, "a reshape of a value of unknown rank");
    for (int64_t i = s.pos() + 1; i < rank; ++i)
      trailing = s.sizes[i] < 0 || trailing < 0 ? -1 : trailing * s.sizes[i];
  }
  if (s.dim == -1) {
    if (c.back() && *c.back() != -1) {
      int64_t last = *c.back();
      if (last == s.global) {
        if (failed(edit(chain, op, argIdx, n - 1, last, "the reshaped size")))
          return failure();
        out.setSizes(sizesOut(-1, s.global));
      } else if (s.global > 0 && last < s.global && s.global % last == 0 && n >= 2 &&
                 s.chunks == 1) {
        // hidden -> heads x head dim
        int64_t heads = s.global / last;
        if (heads % tensorParallel != 0) {
          std::string what = "a width of " + std::to_string(s.global) + " is " +
                             std::to_string(heads) + " heads of " + std::to_string(last) +
                             ", and " + std::to_string(heads) +
                             " heads are not divisible by --tensor-parallel " +
                             std::to_string(static_cast<int64_t>(tensorParallel));
          return fail(op, what, /*fatal=*/true);
        }
        if (c[n - 2] && *c[n - 2] != -1) {
          if (*c[n - 2] != heads)
            return fail(op, "a reshape that does not split the hidden dim into heads");
          if (failed(edit(chain, op, argIdx, n - 2, heads, "the number of heads")))
            return failure();
        } else if (!c[n - 2] && !isLocalSize(elems[n - 2].getOperand())) {
          return fail(op, "a reshape into heads with a computed head count");
        }
        out.dim = -2;
        out.global = heads;
        out.heads = true;
        out.setSizes(sizesOut(-2, heads));
        chain.headsGlobal = std::max(chain.headsGlobal, heads);
        chain.kvHeads = chain.kvHeads ? std::min(chain.kvHeads, heads) : heads;
      } else {
        return fail(op, "a reshape of the split dim");
      }
    } else {
      // [..., -1] or [..., size(x, -1)]: the last dim is kept.
      out.setSizes(sizesOut(-1, s.global));
    }
  } else if (s.dim == -2 && trailing > 0) {
    if (c.back() && *c.back() == trailing && n >= 2) {
      if (c[n - 2] && *c[n - 2] != -1) {
        if (*c[n - 2] != s.global)
          return fail(op, "a reshape of the split dim");
        if (failed(edit(chain, op, argIdx, n - 2, s.global, "the number of heads")))
          return failure();
      }
      out.setSizes(sizesOut(-2, s.global));
    } else if ((!c.back() || *c.back() == -1) && n == rank - 1) {
      // heads x head dim -> hidden
      out.dim = -1;
      out.global = s.global * trailing;
      out.heads = false;
      out.setSizes(sizesOut(-1, out.global));
    } else if (c.back() && *c.back() == s.global * trailing && n == rank - 1) {
      if (failed(edit(chain, op, argIdx, n - 1, s.global * trailing, "the reshaped size")))
        return failure();
      out.dim = -1;
      out.global = s.global * trailing;
      out.heads = false;
      out.setSizes(sizesOut(-1, out.global));
    } else {
      return fail(op, "a reshape the pass cannot follow");
    }
  } else if (s.dim <= -3 && rank >= 0 && (n == rank || n == rank - 1)) {
    // Leading dims kept (n == rank) or the split dim merged with the one
    // after it (GQA's repeat of the kv heads).
    out.dim = n == rank ? s.dim : s.dim + 1;
    int64_t next = n == rank ? 1 : s.sizes[s.pos() + 1];
    out.global = s.global < 0 || next < 0 ? -1 : s.global * next;
    // A constant at the split dim is its global size (a .pt2's static shapes).
    if (auto at = c[n + out.dim]; at && *at != -1) {
      if (*at != out.global)
        return fail(op, "a reshape with a constant size at the split dim");
      if (failed(edit(chain, op, argIdx, n + out.dim, *at, "the reshaped size")))
        return failure();
    }
    out.setSizes(sizesOut(out.dim, out.global));
    for (int64_t i = 0; i < n; ++i)
      if (n + out.dim != i) {
        int64_t from = i < n + out.dim ? i : i + (rank - n);
        out.sizes[i] = s.sizes[from];
      }
  } else {
    return fail(op, "a reshape the pass cannot follow");
  }
  if (failed(assign(op.getResult(0), out, work)))
    return failure();
  return success();
}

bool ChainBuilder::Impl::isLocalSize(Value v) {
  auto size = v.getDefiningOp<bmt::AtenOp>();
  return size && bmt::atenOpId(size) == AtenOpId::size_int;
}
