//===- ErrorText.h - LibTorch error messages as one line --------*- C++ -*-===//
//
// bmt reports every failure as one "error: ..." line. LibTorch's messages
// (c10::Error::what_without_backtrace()) span several lines and may start
// with "[enforce fail at file.cc:123] "; this keeps the useful first line.
// Standard library only, so any target may include it.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_SUPPORT_ERRORTEXT_H
#define BMT_SUPPORT_ERRORTEXT_H

#include <string>

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

} // namespace bmt

#endif // BMT_SUPPORT_ERRORTEXT_H
