//===- Nvrtc.cpp - NVRTC through dlopen, with an on-disk cache ------------===//

#include "bmt/Runtime/fusion/Nvrtc.h"
#include "bmt/Runtime/Env.h"

#include "bmt/Runtime/fusion/Region.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace bmt::fusion {

namespace {

// The few NVRTC entry points used (nvrtc.h; nvrtcResult is an int enum,
// nvrtcProgram an opaque pointer).
using Program = void *;
struct Api {
  void *handle = nullptr;
  std::string library;
  int (*version)(int *, int *) = nullptr;
  int (*create)(Program *, const char *, const char *, int, const char *const *,
                const char *const *) = nullptr;
  int (*compile)(Program, int, const char *const *) = nullptr;
  int (*logSize)(Program, size_t *) = nullptr;
  int (*log)(Program, char *) = nullptr;
  int (*ptxSize)(Program, size_t *) = nullptr;
  int (*ptx)(Program, char *) = nullptr;
  int (*cubinSize)(Program, size_t *) = nullptr;
  int (*cubin)(Program, char *) = nullptr;
  int (*destroy)(Program *) = nullptr;
};

const Api &api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> names;
    if (std::optional<std::string> e = runtime::env::nvrtcLibrary())
      names.push_back(*e);
    for (const char *n : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                          "/usr/local/cuda/lib64/libnvrtc.so"})
      names.push_back(n);
    for (const std::string &n : names) {
      a.handle = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (a.handle) {
        a.library = n;
        break;
      }
    }
    if (!a.handle)
      return;
    auto sym = [&](auto &f, const char *name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(a.handle, name));
    };
    sym(a.version, "nvrtcVersion");
    sym(a.create, "nvrtcCreateProgram");
    sym(a.compile, "nvrtcCompileProgram");
    sym(a.logSize, "nvrtcGetProgramLogSize");
    sym(a.log, "nvrtcGetProgramLog");
    sym(a.ptxSize, "nvrtcGetPTXSize");
    sym(a.ptx, "nvrtcGetPTX");
    sym(a.cubinSize, "nvrtcGetCUBINSize");
    sym(a.cubin, "nvrtcGetCUBIN");
    sym(a.destroy, "nvrtcDestroyProgram");
    if (!a.version || !a.create || !a.compile || !a.logSize || !a.log || !a.ptxSize || !a.ptx ||
        !a.cubinSize || !a.cubin || !a.destroy) {
      dlclose(a.handle);
      a.handle = nullptr;
    }
  });
  return a;
}

/// FNV-1a, 64 bits: the cache key (collisions only cost a wrong kernel if
/// two sources of the same length and arch collide; the file also stores
/// the source's length and is checked).
uint64_t fnv1a(const std::string &s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::filesystem::path cacheDir() {
  if (std::optional<std::string> e = runtime::env::kernelCache())
    return *e;
  if (const char *x = std::getenv("XDG_CACHE_HOME"))
    return std::filesystem::path(x) / "bmt" / "kernels";
  if (const char *h = std::getenv("HOME"))
    return std::filesystem::path(h) / ".cache" / "bmt" / "kernels";
  return {};
}

} // namespace

bool nvrtcAvailable() { return api().handle != nullptr; }

std::string compileCuda(const std::string &source, const std::string &name, int major, int minor,
                        bool cubin, bool *cached) {
  if (cached)
    *cached = false;
  const Api &a = api();
  if (!a.handle)
    throw FusionError("NVRTC is not available (no libnvrtc.so.13/.12 could be loaded; set "
                      "BMT_NVRTC_LIBRARY to its path)");
  int vmajor = 0, vminor = 0;
  a.version(&vmajor, &vminor);
  std::string arch = std::to_string(major) + std::to_string(minor);
  std::string key = source + "\n//" + arch + (cubin ? "sm" : "compute") + std::to_string(vmajor) +
                    "." + std::to_string(vminor);
  std::ostringstream file;
  file << std::hex << fnv1a(key) << "-" << std::dec << key.size() << (cubin ? ".cubin" : ".ptx");
  std::filesystem::path dir = cacheDir();
  std::error_code ec;
  if (!dir.empty()) {
    std::ifstream in(dir / file.str(), std::ios::binary);
    if (in) {
      std::ostringstream buf;
      buf << in.rdbuf();
      if (!buf.str().empty()) {
        if (cached)
          *cached = true;
        return buf.str();
      }
    }
  }

  Program prog = nullptr;
  if (a.create(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr) != 0)
    throw FusionError("NVRTC could not create a program for " + name);
  std::string archOption = std::string("--gpu-architecture=") + (cubin ? "sm_" : "compute_") + arch;
  const char *options[] = {archOption.c_str(), "--std=c++17", "-default-device"};
  int rc = a.compile(prog, 3, options);
  size_t logSize = 0;
  a.logSize(prog, &logSize);
  std::string log(logSize, '\0');
  if (logSize)
    a.log(prog, log.data());
  if (rc != 0) {
    a.destroy(&prog);
    throw FusionError("NVRTC failed to compile " + name + " for " + archOption + ":\n" + log);
  }
  size_t size = 0;
  std::string out;
  if (cubin) {
    a.cubinSize(prog, &size);
    out.resize(size);
    a.cubin(prog, out.data());
  } else {
    a.ptxSize(prog, &size);
    out.resize(size);
    a.ptx(prog, out.data());
  }
  a.destroy(&prog);
  if (!dir.empty()) {
    // Written to a temporary name and renamed: concurrent ranks (and
    // threads) never read half a file.
    std::filesystem::create_directories(dir, ec);
    std::filesystem::path tmp =
        dir / (file.str() + ".tmp" + std::to_string(::getpid()) + "-" +
               std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id())));
    {
      std::ofstream o(tmp, std::ios::binary);
      o.write(out.data(), static_cast<std::streamsize>(out.size()));
    }
    std::filesystem::rename(tmp, dir / file.str(), ec);
    if (ec)
      std::filesystem::remove(tmp, ec);
  }
  return out;
}

} // namespace bmt::fusion
