//===- Collectives.h - the collectives autograd records -----------*- C++ -*-===//
//
// Every collective that is part of the autograd graph, each one autograd
// function whose backward is the collective's transpose (as Megatron's
// tensor_parallel/mappings.py keeps them):
//
//   function                       forward                 backward
//   copyToTensorParallel           identity                all-reduce (TP)
//   reduceFromTensorParallel       all-reduce (TP)         identity
//   gatherFromSequenceParallel     all-gather (TP), dim d  reduce-scatter (TP), dim d
//   reduceScatterToSequenceParallel reduce-scatter (TP), d all-gather (TP), dim d
//   gatherZeroGroup                all-gather (shard grp)  reduce-scatter (shard grp)
//   regatherInBackward             identity                all-gather of the block
//   allToAllTokens                 all-to-all (counts)     all-to-all (counts swapped)
//
// TP: the tensor-parallel group (T ranks, `tp`); shard group: the ranks
// that hold the other shards of a ZeRO storage group; allToAllTokens runs
// over whatever group it is given (expert parallelism's). Every rank of the
// group calls the same functions in the same order, forward and backward
// (Comm.h's conventions); errors are Comm.h's CommError, or ExecutionError
// for a shape the collective cannot split.
//
// computeValue false (a recomputed block's value that nothing reads,
// exec/Recompute.h): the forward returns an uninitialised tensor of the
// result's shape and communicates nothing; the backward is recorded as
// usual.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_COMM_COLLECTIVES_H
#define BMT_RUNTIME_COMM_COLLECTIVES_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace bmt::runtime {

class Comm;
class ZeroStorage;

/// Megatron's f, before a column-parallel matmul: x (any shape, the same on
/// every TP rank) unchanged; backward: the gradient's sum over `tp`.
at::Tensor copyToTensorParallel(const at::Tensor &x, Comm &tp, bool computeValue = true);

/// Megatron's g, after a row-parallel matmul: the sum of x over `tp` (same
/// shape); backward: the gradient unchanged.
at::Tensor reduceFromTensorParallel(const at::Tensor &x, Comm &tp, bool computeValue = true);

/// Sequence parallelism, leaving a sequence-parallel region: x of shape
/// [..., s, ...] (s at `dim`) -> [..., s * T, ...], the TP ranks' x
/// concatenated along `dim` in rank order; backward: the gradient's sum over
/// `tp`, this rank's 1/T of it along `dim` (reduce-scatter).
at::Tensor gatherFromSequenceParallel(const at::Tensor &x, Comm &tp, int64_t dim,
                                      bool computeValue = true);

/// Sequence parallelism, entering a sequence-parallel region: x of shape
/// [..., s, ...] -> [..., s / T, ...], this rank's 1/T of the sum over `tp`
/// along `dim`; backward: the all-gather along `dim`. Throws ExecutionError
/// when s is not a multiple of T.
at::Tensor reduceScatterToSequenceParallel(const at::Tensor &x, Comm &tp, int64_t dim,
                                           bool computeValue = true);

/// Expert parallelism's token dispatch (and, with the counts swapped, its
/// combine): x of shape [sum(sendCounts), ...] -> [sum(recvCounts), ...],
/// Comm::allToAll over `comm` (rows sendCounts[r] of x go to rank r; the
/// result holds recvCounts[q] rows from rank q, in rank order), waited.
/// Backward: the gradient goes back the same way, the all-to-all with
/// recvCounts and sendCounts swapped. The counts are those of
/// allToAllCounts (rank q's sendCounts[r] == rank r's recvCounts[q]).
at::Tensor allToAllTokens(const at::Tensor &x, Comm &comm, const std::vector<int64_t> &sendCounts,
                          const std::vector<int64_t> &recvCounts);

/// ZeRO: `shard` (group `group`'s [shardSize] shard of this rank, requires
/// grad) -> the group's members, views of its gathered buffer (all-gather
/// over the shard group, waited). Backward: the members' gradients laid out
/// flat ([shardSize x shard ranks]), reduce_grad ranges all-reduced over the
/// TP group, then reduce-scattered over the shard group (asynchronously:
/// ZeroStorage::finishGradients adds the result to the shard's gradient),
/// and the gathered buffer freed. The shard's own gradient stays undefined.
std::vector<at::Tensor> gatherZeroGroup(const at::Tensor &shard, ZeroStorage &zero,
                                        int64_t group);

/// ZeRO-3: a block's outputs unchanged; backward: gathers the groups of
/// block `index` of `list` again (ZeRO-3 freed them after the forward),
/// starts the all-gathers of the prefetch-depth blocks before it, and
/// passes the gradients through.
std::vector<at::Tensor> regatherInBackward(at::TensorList outputs, ZeroStorage &zero,
                                           const std::string &list, int64_t index);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_COMM_COLLECTIVES_H
