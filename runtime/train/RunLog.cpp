//===- RunLog.cpp - the run's --log-file ----------------------------------===//

#include "bmt/Runtime/train/RunLog.h"

#include "bmt/Support/ErrorText.h"

#include <cstdint>
#include <filesystem>
#include <iostream>

namespace bmt::runtime {
namespace {

/// Cuts `path` after its last newline (nothing when it is missing, empty or
/// ends with one) and says so.
void dropTornLastLine(const std::string &path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || size == 0)
    return;
  std::ifstream in(path, std::ios::binary);
  // Backwards from the end, 64 KiB at a time, to the last newline.
  uint64_t keep = 0;
  std::string block;
  for (uint64_t end = size; end > 0 && in;) {
    const uint64_t begin = end > 65536 ? end - 65536 : 0;
    block.resize(end - begin);
    in.seekg(static_cast<std::streamoff>(begin));
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    if (end == size && block.back() == '\n')
      return;
    if (const size_t nl = block.rfind('\n'); nl != std::string::npos) {
      keep = begin + nl + 1;
      break;
    }
    end = begin;
  }
  if (!in)
    return;
  std::filesystem::resize_file(path, keep, ec);
  if (!ec)
    std::cout << "bmt-run: note: --log-file " << path << ": dropped its incomplete last line ("
              << size - keep << " bytes) before appending\n";
}

} // namespace

std::unique_ptr<std::ofstream> openRunLog(const std::string &path, bool append,
                                          bool dropTornLine) {
  if (append && dropTornLine)
    dropTornLastLine(path);
  auto log = std::make_unique<std::ofstream>(path, append ? std::ios::app : std::ios::trunc);
  if (!*log)
    throw RunLogError(path + ": cannot write the log");
  return log;
}

int checkRunLog(const std::string &path, std::ofstream *log, int status) {
  if (log == nullptr || *log)
    return status;
  bmt::writeErrorLine("error: --log-file " + path +
                      ": a line could not be written (see the warning above); the log is "
                      "incomplete");
  return status == 0 ? 1 : status;
}

} // namespace bmt::runtime
