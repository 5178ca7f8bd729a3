//===- Files.cpp - bmt-run's files: reading, atomic writes, output checks ===//

#include "Run.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace bmt::tools {

namespace {

/// The (device, inode) of an existing path, for comparing files.
std::optional<std::pair<dev_t, ino_t>> fileId(const std::string &path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0)
    return std::nullopt;
  return std::make_pair(st.st_dev, st.st_ino);
}

/// Whether two paths name the same file, existing or not ("a.out",
/// "./a.out", "/abs/a.out", through symlinked directories).
bool samePath(const std::string &a, const std::string &b) {
  namespace fs = std::filesystem;
  std::error_code ea, eb;
  fs::path pa = fs::weakly_canonical(fs::absolute(a), ea);
  fs::path pb = fs::weakly_canonical(fs::absolute(b), eb);
  return !ea && !eb && pa == pb;
}

} // namespace

std::vector<char> readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Failure(path + ": cannot open");
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

/// Writes `value` (torch.save format) to `path` atomically.
void saveIValue(const std::string &path, const c10::IValue &value) {
  // torch::jit::pickle_save's container, but the pickle without the type
  // tags of dicts and lists (torch.jit._pickle.restore_type_tag), which
  // torch.load's default weights_only=True refuses: a dict of tensors then
  // loads as a plain dict with torch.load(path).
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char *data, size_t size) { pickled.insert(pickled.end(), data, data + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> bytes;
  caffe2::serialize::PyTorchStreamWriter container([&](const void *data, size_t size) {
    const char *begin = static_cast<const char *>(data);
    bytes.insert(bytes.end(), begin, begin + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(),
                                     container);
  container.writeEndOfFile();
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out)
      throw Failure(path + ": cannot write");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out)
      throw Failure(path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Failure(path + ": cannot write");
  }
}

/// Refuses an output that is one of the inputs, and an output that cannot
/// be created, before anything is loaded or trained.
void checkOutputs(const tools::RunOptions &o) {
  std::vector<std::string> inputs = {o.archive, o.data, o.evalData, o.batchesFile, o.dumpInputs};
  for (const std::string &in : {o.data, o.evalData}) {
    // A token file is a pair: PREFIX.bin and PREFIX.json.
    if (in.size() > 4 && (in.rfind(".bin") == in.size() - 4 || in.rfind(".json") == in.size() - 5)) {
      std::string prefix = in.substr(0, in.rfind('.'));
      inputs.push_back(prefix + ".bin");
      inputs.push_back(prefix + ".json");
    }
  }
  std::vector<std::pair<std::string, std::string>> outputs = {
      {"--log-file", o.logFile}, {"--save-params", o.saveParams},
      {"--profile-trace", o.train.profileTrace}, {"--dump", o.dumpOutput}};
  for (const auto &[option, out] : outputs) {
    if (out.empty())
      continue;
    auto outId = fileId(out);
    for (const std::string &in : inputs)
      if (outId && fileId(in) == outId)
        throw Failure(option + " " + out + ": the output would overwrite the input " + in);
    for (const auto &[otherOption, other] : outputs)
      if (otherOption != option && !other.empty() &&
          (other == out || (outId && fileId(other) == outId) ||
           samePath(other, out)))
        throw Failure(option + " and " + otherOption + " name the same file " + out);
    struct stat st {};
    if (::stat(out.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      throw Failure(option + " " + out + ": is a directory");
    // Can the file be created there? (Written at the end, so find out now.)
    std::string probe = out + ".probe." + std::to_string(::getpid());
    int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
      throw Failure(option + " " + out + ": cannot write there (" + std::strerror(errno) + ")");
    ::close(fd);
    ::unlink(probe.c_str());
  }
}

void checkSaveParamsRoom(const std::string &path, int64_t bytes) {
  namespace fs = std::filesystem;
  fs::path folder = fs::path(path).parent_path();
  if (folder.empty())
    folder = ".";
  struct statvfs st {};
  if (::statvfs(folder.c_str(), &st) != 0)
    return; // checkOutputs found it writable; nothing more to learn
  const double freeBytes = static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
  if (freeBytes < static_cast<double>(bytes)) {
    auto mib = [](double b) {
      char text[48];
      if (b < 10 * 1024 * 1024)
        std::snprintf(text, sizeof text, "%.0f bytes", b);
      else
        std::snprintf(text, sizeof text, "%.1f MiB", b / (1024.0 * 1024.0));
      return std::string(text);
    };
    throw Failure("--save-params " + path + ": the parameters need " +
                  mib(static_cast<double>(bytes)) + " and " + folder.string() + " has " +
                  mib(freeBytes) + " free; free some space or save elsewhere (refused before "
                  "training, so that the trained parameters are not lost at the end)");
  }
}

} // namespace bmt::tools
