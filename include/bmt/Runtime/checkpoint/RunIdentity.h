//===- RunIdentity.h - what a checkpoint records of its run -----*- C++ -*-===//

#ifndef BMT_RUNTIME_CHECKPOINT_RUNIDENTITY_H
#define BMT_RUNTIME_CHECKPOINT_RUNIDENTITY_H

#include "bmt/Runtime/checkpoint/Checkpoint.h"

#include <cstdint>

namespace bmt::plan {
class Archive;
}

namespace bmt::runtime {

/// The identity a run's checkpoints record (Checkpoint.h RunIdentity) for
/// plan `p` (loaded from `archive`) on `worldSize` data-parallel ranks, with the batch
/// (`sequencesPerStep` a step of `seqLen` tokens; 0 for fixed batches,
/// whose shape is not recorded). Throws nothing.
RunIdentity runIdentity(plan::Archive &archive, const plan::Plan &p, int64_t worldSize,
                        int64_t sequencesPerStep,
                        int64_t seqLen);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_CHECKPOINT_RUNIDENTITY_H
