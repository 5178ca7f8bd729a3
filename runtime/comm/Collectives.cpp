//===- Collectives.cpp - the collectives autograd records -----------------===//
//
// Each autograd function here is a collective and its transpose (see
// bmt/Runtime/comm/Collectives.h for the table). The tensor-parallel ones
// are one function, TpCollectiveFunction, parametrised by what it does
// forward and backward; ZeRO's two call into ZeroStorage for the buffer
// bookkeeping (parallel/Zero.cpp).
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/comm/Collectives.h"

#include "bmt/Runtime/comm/Comm.h"
#include "bmt/Runtime/exec/Executor.h"
#include "bmt/Runtime/parallel/Zero.h"
#include "exec/Recompute.h"
#include "exec/SavedPointer.h"

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>

namespace bmt::runtime {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// --- tensor parallelism ---------------------------------------------------

/// The sum of `x` over the TP group (a new contiguous tensor).
at::Tensor sumOver(Comm &comm, const at::Tensor &x) {
  at::Tensor out = x.detach().contiguous().clone();
  comm.allReduce(out)->wait();
  return out;
}

/// `x` of every TP rank concatenated along `dim` (rank order).
at::Tensor gatherAlong(Comm &comm, const at::Tensor &x, int64_t dim) {
  at::Tensor moved = x.detach().movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = moved.sizes().vec();
  shape[0] *= comm.size();
  at::Tensor out = at::empty(shape, moved.options());
  comm.allGather(out, moved)->wait();
  return out.movedim(0, dim).contiguous();
}

/// The sum of `x` over the TP group, this rank's 1/T of it along `dim`.
at::Tensor reduceScatterAlong(Comm &comm, const at::Tensor &x, int64_t dim) {
  if (x.size(dim) % comm.size() != 0)
    throw ExecutionError(
        "tp_reduce_scatter (sequence parallelism): dim " + std::to_string(dim) + " of size " +
        std::to_string(x.size(dim)) + " is not a multiple of the " + std::to_string(comm.size()) +
        " TP ranks; the plan was compiled with --sequence-parallel, so the sequence length "
        "(--seq-len) must be a multiple of --tensor-parallel " + std::to_string(comm.size()));
  at::Tensor moved = x.detach().movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = moved.sizes().vec();
  shape[0] /= comm.size();
  at::Tensor out = at::empty(shape, moved.options());
  comm.reduceScatter(out, moved)->wait();
  return out.movedim(0, dim).contiguous();
}

/// What a TP collective does to a tensor in its forward or its backward.
enum class TpOp : int64_t { Identity, Sum, AllGather, ReduceScatter };

at::Tensor applyTp(TpOp op, Comm &comm, const at::Tensor &x, int64_t dim) {
  switch (op) {
  case TpOp::Identity:
    return x;
  case TpOp::Sum:
    return sumOver(comm, x);
  case TpOp::AllGather:
    return gatherAlong(comm, x, dim);
  case TpOp::ReduceScatter:
    return reduceScatterAlong(comm, x, dim);
  }
  return x;
}

/// `forwardOp` on the input, `backwardOp` on its gradient.
struct TpCollectiveFunction : torch::autograd::Function<TpCollectiveFunction> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, Comm *comm,
                            int64_t forwardOp, int64_t backwardOp, int64_t dim,
                            bool computeValue) {
    savePointer(ctx, "comm", comm);
    ctx->saved_data["backward"] = backwardOp;
    ctx->saved_data["dim"] = dim;
    const auto op = static_cast<TpOp>(forwardOp);
    if (op == TpOp::Identity)
      return x.view_as(x); // a function's output must not be its input
    if (!computeValue) {
      // The result's shape, nothing communicated.
      std::vector<int64_t> shape = x.sizes().vec();
      if (op == TpOp::AllGather)
        shape[dim] *= comm->size();
      else if (op == TpOp::ReduceScatter)
        shape[dim] /= comm->size(); // divisible: the same call computed it before
      return placeholder(shape, x.options());
    }
    return applyTp(op, *comm, x, dim);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto *comm = savedPointer<Comm>(ctx, "comm");
    const auto op = static_cast<TpOp>(ctx->saved_data["backward"].toInt());
    at::Tensor grad = grads[0].defined()
                          ? applyTp(op, *comm, grads[0], ctx->saved_data["dim"].toInt())
                          : at::Tensor();
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor applyTpCollective(const at::Tensor &x, Comm &tp, TpOp forward, TpOp backward,
                             int64_t dim, bool computeValue) {
  return TpCollectiveFunction::apply(x, &tp, static_cast<int64_t>(forward),
                                     static_cast<int64_t>(backward), dim, computeValue);
}

} // namespace

at::Tensor copyToTensorParallel(const at::Tensor &x, Comm &tp, bool computeValue) {
  return applyTpCollective(x, tp, TpOp::Identity, TpOp::Sum, 0, computeValue);
}

at::Tensor reduceFromTensorParallel(const at::Tensor &x, Comm &tp, bool computeValue) {
  return applyTpCollective(x, tp, TpOp::Sum, TpOp::Identity, 0, computeValue);
}

at::Tensor gatherFromSequenceParallel(const at::Tensor &x, Comm &tp, int64_t dim,
                                      bool computeValue) {
  return applyTpCollective(x, tp, TpOp::AllGather, TpOp::ReduceScatter, dim, computeValue);
}

at::Tensor reduceScatterToSequenceParallel(const at::Tensor &x, Comm &tp, int64_t dim,
                                           bool computeValue) {
  return applyTpCollective(x, tp, TpOp::ReduceScatter, TpOp::AllGather, dim, computeValue);
}

// --- expert parallelism -------------------------------------------------------

namespace {

/// `x`'s rows exchanged by Comm::allToAll (a new contiguous tensor).
at::Tensor exchangeRows(Comm &comm, const at::Tensor &x, const std::vector<int64_t> &sendCounts,
                        const std::vector<int64_t> &recvCounts) {
  at::Tensor in = x.detach().contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  if (!shape.empty()) {
    shape[0] = 0;
    for (int64_t n : recvCounts)
      shape[0] += n;
  }
  at::Tensor out = at::empty(shape, in.options());
  comm.allToAll(out, in, sendCounts, recvCounts)->wait();
  return out;
}

/// allToAllTokens's function.
struct AllToAllFunction : torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, Comm *comm,
                            std::vector<int64_t> sendCounts, std::vector<int64_t> recvCounts) {
    savePointer(ctx, "comm", comm);
    at::Tensor out = exchangeRows(*comm, x, sendCounts, recvCounts);
    ctx->saved_data["send"] = std::move(sendCounts);
    ctx->saved_data["recv"] = std::move(recvCounts);
    return out;
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto *comm = savedPointer<Comm>(ctx, "comm");
    std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    at::Tensor grad = exchangeRows(*comm, grads[0], recv, send);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

} // namespace

at::Tensor allToAllTokens(const at::Tensor &x, Comm &comm, const std::vector<int64_t> &sendCounts,
                          const std::vector<int64_t> &recvCounts) {
  return AllToAllFunction::apply(x, &comm, sendCounts, recvCounts);
}

// --- ZeRO -------------------------------------------------------------------

/// gatherZeroGroup's function.
struct GatherFunction : torch::autograd::Function<GatherFunction> {
  static variable_list forward(AutogradContext *ctx, const at::Tensor &shard,
                               ZeroStorage *zero, int64_t group) {
    savePointer(ctx, "zero", zero);
    ctx->saved_data["group"] = group;
    return zero->gatheredMembers(group);
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    savedPointer<ZeroStorage>(ctx, "zero")
        ->reduceMemberGradients(ctx->saved_data["group"].toInt(), grads);
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

/// regatherInBackward's function.
struct RegatherFunction : torch::autograd::Function<RegatherFunction> {
  // (Tensor lists are passed as at::TensorList: autograd counts only those,
  // not a std::vector, as tensor inputs.)
  static variable_list forward(AutogradContext *ctx, at::TensorList outputs, ZeroStorage *zero,
                               std::string list, int64_t index) {
    savePointer(ctx, "zero", zero);
    ctx->saved_data["list"] = list;
    ctx->saved_data["index"] = index;
    return outputs.vec();
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    savedPointer<ZeroStorage>(ctx, "zero")
        ->prepareBackward(ctx->saved_data["list"].toStringRef(), ctx->saved_data["index"].toInt());
    grads.push_back(at::Tensor());
    grads.push_back(at::Tensor());
    grads.push_back(at::Tensor());
    return grads;
  }
};

std::vector<at::Tensor> gatherZeroGroup(const at::Tensor &shard, ZeroStorage &zero,
                                        int64_t group) {
  return GatherFunction::apply(shard, &zero, group);
}

std::vector<at::Tensor> regatherInBackward(at::TensorList outputs, ZeroStorage &zero,
                                           const std::string &list, int64_t index) {
  return RegatherFunction::apply(outputs, &zero, list, index);
}

} // namespace bmt::runtime
