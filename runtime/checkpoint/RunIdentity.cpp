//===- RunIdentity.cpp - what a checkpoint records of its run --------------===//

#include "bmt/Runtime/checkpoint/RunIdentity.h"

#include "bmt/Plan/Archive.h"

namespace bmt::runtime {

RunIdentity runIdentity(plan::Archive &archive, const plan::Plan &p, int64_t worldSize,
                        int64_t sequencesPerStep,
                        int64_t seqLen) {
  RunIdentity identity;
  identity.planIdentity = planIdentity(p, archive.programText(), worldSize);
  identity.modelIdentity = modelIdentity(p);
  identity.frozenIdentity = frozenIdentity(p);
  identity.adapterSettings = plan::adapterSettings(archive.programText());
  identity.source = p.source;
  identity.modelType = p.modelType;
  identity.worldSize = worldSize;
  identity.zeroStage = p.zeroStage;
  identity.shardGroupSize = p.shardGroupSize > 0 ? p.shardGroupSize : worldSize;
  identity.hfFiles = archive.hfFiles();
  if (sequencesPerStep > 0) {
    identity.sequencesPerStep = sequencesPerStep;
    identity.seqLen = seqLen;
  }
  return identity;
}

} // namespace bmt::runtime
