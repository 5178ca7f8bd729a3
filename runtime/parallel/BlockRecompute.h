//===- BlockRecompute.h - a checkpointed block, recomputed in backward -*- C++ -*-===//
//
// ZeRO's block call under --checkpoint (torch.utils.checkpoint, reentrant
// variant): the forward runs the block without autograd and keeps only its
// inputs; the backward gathers the block's storage groups again, restores
// the RNG state, runs the block again with autograd (the `recompute` run,
// which skips what only the results' values need, exec/Recompute.h) and
// back-propagates through it, which reduce-scatters its parameters'
// gradients on the way (gatherZeroGroup, comm/Collectives.h).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_PARALLEL_BLOCKRECOMPUTE_H
#define BMT_RUNTIME_PARALLEL_BLOCKRECOMPUTE_H

#include "bmt/Runtime/exec/Executor.h"

#include <ATen/core/ivalue.h>

#include <vector>

namespace bmt::runtime {

class ZeroStorage;

/// Block call `inst` with `args` (its tensors the inputs autograd tracks),
/// run by `run` now and by `recompute` in backward; its results, their
/// tensors the outputs of the recompute's autograd node. `zero` and
/// `device` (whose generator is restored) outlive the backward.
/// `trainable`: the block has parameters that train, so its backward must
/// run even when no input tensor requires grad.
std::vector<c10::IValue> callRecomputed(const plan::Instruction &inst,
                                        const ExecutorHooks::Run &run,
                                        const ExecutorHooks::Run &recompute,
                                        std::vector<c10::IValue> args, ZeroStorage &zero,
                                        at::Device device, bool trainable);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_PARALLEL_BLOCKRECOMPUTE_H
