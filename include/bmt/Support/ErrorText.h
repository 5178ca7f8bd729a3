//===- ErrorText.h - LibTorch error messages as one line --------*- C++ -*-===//
//
// bmt reports every failure as one "error: ..." line. LibTorch's messages
// (c10::Error::what_without_backtrace()) span several lines and may start
// with "[enforce fail at file.cc:123] "; this keeps the useful first line.
// Standard library and POSIX only, so any target may include it.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_SUPPORT_ERRORTEXT_H
#define BMT_SUPPORT_ERRORTEXT_H

#include <cerrno>
#include <string>
#include <unistd.h>

namespace bmt {

/// The first non-blank line of `text`, without an "[enforce fail at ...] "
/// prefix and a leading ". "; "(no reason given)" if there is none.
inline std::string firstErrorLine(const std::string &text) {
  std::string line;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t eol = text.find('\n', begin);
    line = text.substr(begin, eol == std::string::npos ? std::string::npos : eol - begin);
    if (line.find_first_not_of(" \t") != std::string::npos)
      break;
    line.clear();
    if (eol == std::string::npos)
      break;
    begin = eol + 1;
  }
  if (line.rfind("[enforce fail at ", 0) == 0)
    if (size_t close = line.find("] "); close != std::string::npos)
      line = line.substr(close + 2);
  if (line.rfind(". ", 0) == 0)
    line = line.substr(2);
  return line.empty() ? "(no reason given)" : line;
}

/// Writes `line` and a newline to stderr with one write(2) call (more only if
/// the kernel takes part of it). Ranks started by one launcher share a stderr
/// pipe, and POSIX makes pipe writes of at most PIPE_BUF (4096) bytes atomic,
/// so their lines do not interleave as `std::cerr << a << b` lines can.
inline void writeErrorLine(std::string line) {
  line += '\n';
  const char *data = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, data, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return;
    data += n;
    left -= static_cast<size_t>(n);
  }
}

} // namespace bmt

#endif // BMT_SUPPORT_ERRORTEXT_H
