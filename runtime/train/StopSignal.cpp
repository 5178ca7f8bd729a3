//===- StopSignal.cpp - SIGTERM and SIGINT during a run -------------------===//

#include "bmt/Runtime/train/StopSignal.h"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace bmt::runtime {

namespace {

std::atomic<int> firstSignal{0};
std::atomic<bool> deferMode{false};
bool printing = true; ///< rank 0 (set at installation)

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

} // namespace

void installStopHandlers() {
  const char *rank = std::getenv("RANK");
  printing = rank == nullptr || std::strcmp(rank, "0") == 0;
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
