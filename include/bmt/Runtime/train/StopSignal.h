//===- StopSignal.h - SIGTERM and SIGINT during a run -----------*- C++ -*-===//
//
// What a training run does when SLURM, Kubernetes, torchrun or a user sends
// SIGTERM or SIGINT (docs/runtime/failures.md). Outside the
// training steps a signal ends the process at once; during them the first
// one is recorded for the training loop, which stops every rank after the
// same step, saves a checkpoint and exits 128 + the signal; a second one
// ends the process at once.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_STOPSIGNAL_H
#define BMT_RUNTIME_TRAIN_STOPSIGNAL_H

namespace bmt::runtime {

/// Installs the process's SIGTERM and SIGINT handlers, in the immediate
/// mode: a signal prints "bmt-run: stopped by SIGTERM (...)" on stderr
/// (rank 0: RANK unset or 0) and exits 128 + the signal at once.
void installStopHandlers();

/// Deferred mode (the training steps): the first signal is only recorded
/// (stopSignal); a second one prints a line and exits at once.
/// `deferred` false: back to the immediate mode.
void deferStopSignals(bool deferred);

/// The first SIGTERM or SIGINT received in deferred mode, 0 when none.
int stopSignal();

/// "SIGTERM", "SIGINT".
const char *stopSignalName(int signal);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_STOPSIGNAL_H
