//===- Checkpoint.cpp - loading sharded training checkpoints ---------------===//
//
// loadCheckpoint: the stages of a resume (Restore.h) in their order. Saving
// is Staging.cpp's, checkpoint.json Metadata.cpp's, the folder protocol
// and the reads of the rank files FileStorage.cpp's, the reshard planner
// LoadPlan.cpp's.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/checkpoint/Checkpoint.h"
#include "Restore.h"

namespace bmt::runtime {

ResumeReport loadCheckpoint(const std::string &folder, Model &model, Optimizer &optimizer,
                            LossScaler *scaler, const OptimizerConfig *expected) {
  checkpoint::Restore r(folder, model, optimizer, scaler);
  checkpoint::readMetadata(r, expected);
  checkpoint::planReads(r);
  checkpoint::readFields(r);
  checkpoint::applyParameters(r);
  checkpoint::applyOptimizerState(r);
  model.parametersChanged();
  checkpoint::applyProgress(r);
  checkpoint::applyBuffers(r);
  checkpoint::applyGenerators(r);
  r.report.bytesRead = r.reader->bytesRead();
  return r.report;
}

} // namespace bmt::runtime
