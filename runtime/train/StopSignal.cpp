//===- StopSignal.cpp - SIGTERM and SIGINT during a run -------------------===//

#include "bmt/Runtime/train/StopSignal.h"

#include "bmt/Runtime/Env.h"
#include "bmt/Runtime/comm/Comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

namespace bmt::runtime {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> firstSignal{0};
std::atomic<Clock::rep> firstSignalAt{0}; ///< its steady_clock time
std::atomic<bool> deferMode{false};
bool printing = true; ///< rank 0 (set at installation)
int64_t stopWaitSeconds = 10; ///< BMT_STOP_WAIT_S (read at installation)

/// Async-signal-safe: write(2) and _exit(2) only.
void say(const char *text) {
  if (printing) {
    ssize_t ignored = ::write(2, text, std::strlen(text));
    (void)ignored;
  }
}

void onSignal(int sig) {
  const bool term = sig == SIGTERM;
  if (deferMode.load() && firstSignal.load() == 0) {
    firstSignalAt.store(Clock::now().time_since_epoch().count()); // (clock_gettime)
    firstSignal.store(sig);
    return;
  }
  if (deferMode.load())
    say(term ? "bmt-run: a second signal (SIGTERM): stopping at once; a checkpoint in "
               "progress is left incomplete (--resume auto takes the newest complete one)\n"
             : "bmt-run: a second signal (SIGINT): stopping at once; a checkpoint in "
               "progress is left incomplete (--resume auto takes the newest complete one)\n");
  else
    say(term ? "bmt-run: stopped by SIGTERM outside the training steps: exiting at once\n"
             : "bmt-run: stopped by SIGINT outside the training steps: exiting at once\n");
  ::_exit(128 + sig);
}

/// The CPU backend's wait check (Comm.h setWaitCheck): a signal recorded
/// during the steps stops the run after a step, which needs every rank's
/// collectives; a collective still not done BMT_STOP_WAIT_S after both the
/// signal and the start of its wait waits for a rank that may have died
/// (torchrun sends the survivors SIGTERM, then SIGKILL 30 s later): this
/// rank says so, on every rank, and exits 128 + the signal at once.
void stopWhileWaiting(const std::string &what, Clock::time_point waitStart) {
  const int sig = firstSignal.load();
  if (!deferMode.load() || sig == 0)
    return;
  const Clock::time_point signalAt{Clock::duration(firstSignalAt.load())};
  if (Clock::now() - std::max(waitStart, signalAt) < std::chrono::seconds(stopWaitSeconds))
    return;
  const std::string line = "bmt-run: " + what + ": stopped by " + stopSignalName(sig) +
                           " while waiting for this collective (a peer may have died); no "
                           "checkpoint written (--resume auto takes the newest complete one)\n";
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
  ::_exit(128 + sig);
}

} // namespace

void installStopHandlers() {
  const char *rank = std::getenv("RANK");
  printing = rank == nullptr || std::strcmp(rank, "0") == 0;
  try {
    stopWaitSeconds = env::stopWaitSeconds();
  } catch (const EnvError &) {
    // (checkEnvironment reports it, before anything loads)
  }
  setWaitCheck(&stopWhileWaiting);
  struct sigaction action {};
  action.sa_handler = onSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

void deferStopSignals(bool deferred) { deferMode.store(deferred); }

int stopSignal() { return firstSignal.load(); }

const char *stopSignalName(int signal) {
  return signal == SIGTERM ? "SIGTERM" : signal == SIGINT ? "SIGINT" : "a signal";
}

} // namespace bmt::runtime
