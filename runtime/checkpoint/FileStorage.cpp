//===- FileStorage.cpp - checkpoint folders on a file system --------------===//
//
// Synced writes, the folder protocol of a save and the complete
// checkpoints of a folder (docs/checkpoint-format.md).
//
//===----------------------------------------------------------------------===//

#include "FileStorage.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <fcntl.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace bmt::runtime::checkpoint {

std::string systemError() { return std::strerror(errno); }

/// Writes `text` to `path` and fsyncs it. Throws std::runtime_error.
void writeSynced(const std::string &path, const std::string &text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error(path + ": cannot write (" + systemError() + ")");
  const char *p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      std::string reason = systemError();
      ::close(fd);
      throw std::runtime_error(path + ": write failed (" + reason + ")");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    std::string reason = systemError();
    ::close(fd);
    throw std::runtime_error(path + ": fsync failed (" + reason + ")");
  }
  ::close(fd);
}

void syncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string readText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

CompleteFile readComplete(const fs::path &folder) {
  std::error_code ec;
  if (!fs::is_regular_file(folder / "COMPLETE", ec))
    return CompleteFile();
  return parseComplete(readText((folder / "COMPLETE").string()));
}

/// The step of a checkpoint folder that this bmt-run reads, by its COMPLETE
/// file, or -1.
int64_t completeStepOf(const fs::path &folder) {
  const CompleteFile c = readComplete(folder);
  return c.version == kFormatVersion || c.version == kTensorParallelVersion ? c.step : -1;
}

/// The step of a checkpoint that a save of this run manages in its
/// --checkpoint-dir (`--resume auto`, --keep): a folder named
/// step-<8 digits> whose COMPLETE file this bmt-run reads and says the same
/// step; else -1. (A checkpoint resumed by name may be called anything.)
int64_t completeStep(const fs::path &folder) {
  const std::string name = folder.filename().string();
  if (name.size() != 13 || name.rfind("step-", 0) != 0 ||
      !std::all_of(name.begin() + 5, name.end(), ::isdigit))
    return -1;
  const int64_t step = completeStepOf(folder);
  return step == std::stoll(name.substr(5)) ? step : -1;
}

/// The checkpoints in `dir` that saves of a run starting at `step` would
/// replace or mix with: the folders step-<8 digits> of a later step with a
/// COMPLETE file (of any format version), by step.
std::vector<std::string> checkpointsAfter(const std::string &dir, int64_t step) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto &entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() == 13 && name.rfind("step-", 0) == 0 &&
        std::all_of(name.begin() + 5, name.end(), ::isdigit) &&
        std::stoll(name.substr(5)) > step && readComplete(entry.path()).present)
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

} // namespace bmt::runtime::checkpoint
