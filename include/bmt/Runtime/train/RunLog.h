//===- RunLog.h - the run's --log-file --------------------------*- C++ -*-===//
//
// The JSON-lines log a run writes with --log-file (docs/runtime/failures.md,
// "A log that cannot be written", "A resumed run's log"): opened fresh, or appended to by a resumed run; and the error
// a log that could not be written in full is at the end of the run.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_RUNLOG_H
#define BMT_RUNTIME_TRAIN_RUNLOG_H

#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>

namespace bmt::runtime {

/// A log that cannot be opened for writing.
struct RunLogError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Opens `path` for the run's log: truncated, or with `append` (a resumed
/// run continues the log of the run it resumes) after dropping an
/// incomplete last line a killed run or a full disk left, which
/// `dropTornLine` (rank 0) does and says in one note on stdout. Throws
/// RunLogError when the file cannot be written.
std::unique_ptr<std::ofstream> openRunLog(const std::string &path, bool append,
                                          bool dropTornLine);

/// `status`, or 1 after one error line on stderr when `log` (opened on
/// `path`; null: no log) could not be written in full (a full disk: the
/// metrics writer warned at the step). A failed run's status is kept.
int checkRunLog(const std::string &path, std::ofstream *log, int status);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_RUNLOG_H
