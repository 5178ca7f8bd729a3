//===- Fused.cpp - a fused region as an autograd node, kernels via NVRTC --===//

#include "bmt/Runtime/fusion/Fused.h"
#include "bmt/Runtime/Env.h"

#include "bmt/Runtime/fusion/Nvrtc.h"
#include "bmt/Runtime/fusion/Prewarm.h"
#include "bmt/Runtime/exec/ColumnSum.h"
#include "exec/SavedPointer.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/csrc/autograd/custom_function.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <sstream>

#ifdef BMT_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace bmt::fusion {

namespace {

bool floating(c10::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

std::string identifier(const std::string &name) {
  std::string out = "bmt_";
  for (char c : name)
    out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

/// The autograd node: saves the inputs, recomputes in backward.
struct FusedFunction : torch::autograd::Function<FusedFunction> {
  // The inputs as a TensorList: autograd tracks each (a std::vector would
  // count as one non-tensor argument).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx,
                                                FusedRegion *self, at::TensorList list) {
    std::vector<at::Tensor> inputs(list.begin(), list.end());
    runtime::savePointer(ctx, "region", self);
    ctx->save_for_backward(inputs);
    return self->forward(inputs);
  }
  // A result without a gradient gets zeros (autograd materializes it): its
  // term of the sum is then zero.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    auto *self = runtime::savedPointer<FusedRegion>(ctx, "region");
    std::vector<at::Tensor> inputs = ctx->get_saved_variables();
    torch::autograd::variable_list out{at::Tensor()}; // the region pointer
    if (std::none_of(grads.begin(), grads.end(), [](const at::Tensor &g) { return g.defined(); })) {
      out.resize(inputs.size() + 1);
      return out;
    }
    // Only the gradients autograd asks for (not those of the rotary
    // cos/sin, say): fewer outputs, a smaller kernel, no sums of them.
    std::vector<bool> needed(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      needed[i] = ctx->needs_input_grad(i);
    for (at::Tensor &g : self->backward(inputs, grads, needed))
      out.push_back(g);
    return out;
  }
};

/// bmt_fused::Args of the generated source (CudaSource.cpp's preamble).
struct Args {
  long long n;
  int ndim;
  int vec;
  long long sizes[kMaxDims];
  void *tensors[kMaxTensors];
  long long strides[kMaxTensors][kMaxDims];
};
std::atomic<int64_t> lazyCount{0};

/// Fills `a` for the element shape `shape` and the tensors' strides over
/// it (`strided[k]`: the tensor broadcast to the element shape; outputs
/// contiguous), merging adjacent dims every tensor walks alike (all but the
/// last for a row kernel, `row`, or a region reading halves of the last
/// dim, `halves`). False when more than kMaxDims dims remain.
bool layout(Args &a, std::vector<int64_t> shape, std::vector<std::vector<int64_t>> strides, bool row,
            bool halves) {
  if (shape.empty()) {
    shape = {1};
    for (auto &s : strides)
      s = {0};
  }
  // Merge dim d into d-1 where every tensor has stride[d-1] == stride[d] * size[d].
  for (int d = static_cast<int>(shape.size()) - 1 - (row || halves ? 1 : 0); d >= 1; --d) {
    bool ok = true;
    for (auto &s : strides)
      ok = ok && s[d - 1] == s[d] * shape[d];
    if (!ok)
      continue;
    shape[d - 1] *= shape[d];
    shape.erase(shape.begin() + d);
    for (auto &s : strides) {
      s[d - 1] = s[d];
      s.erase(s.begin() + d);
    }
  }
  if (shape.size() > static_cast<size_t>(kMaxDims) || strides.size() > static_cast<size_t>(kMaxTensors))
    return false;
  std::memset(&a, 0, sizeof a);
  a.ndim = static_cast<int>(shape.size());
  int64_t numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    a.sizes[d] = shape[d];
    numel *= shape[d];
  }
  a.n = row ? numel / shape.back() : numel;
  for (size_t k = 0; k < strides.size(); ++k)
    for (size_t d = 0; d < shape.size(); ++d)
      a.strides[k][d] = strides[k][d];
  return true;
}

/// The order (outermost first) in which a kernel walks the element shape
/// `shape` and lays out its outputs: the memory order of the first input of
/// that whole shape that is dense, not overlapping and not contiguous (a
/// transposed q: its outputs and gradients then have q's layout, as ATen's
/// TensorIterator gives them, so that views after it stay free), when its
/// last dim is its innermost; otherwise the shape's own order.
std::vector<int64_t> walkOrder(const std::vector<at::Tensor> &inputs, const std::vector<int64_t> &shape) {
  const int64_t n = static_cast<int64_t>(shape.size());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  for (const at::Tensor &t : inputs) {
    if (t.sizes().vec() != shape || !t.is_non_overlapping_and_dense() || t.is_contiguous())
      continue;
    // Dims of size 1 first (their stride means nothing), then by stride.
    std::vector<int64_t> byStride;
    for (int64_t d = 0; d < n; ++d)
      if (t.size(d) == 1)
        byStride.push_back(d);
    std::vector<int64_t> rest;
    for (int64_t d = 0; d < n; ++d)
      if (t.size(d) != 1)
        rest.push_back(d);
    std::stable_sort(rest.begin(), rest.end(),
                     [&](int64_t x, int64_t y) { return t.stride(x) > t.stride(y); });
    byStride.insert(byStride.end(), rest.begin(), rest.end());
    if (byStride.back() == n - 1)
      return byStride;
    break;
  }
  return order;
}

/// `v` in `order` (v[order[0]], v[order[1]], ...).
std::vector<int64_t> permuted(const std::vector<int64_t> &v, const std::vector<int64_t> &order) {
  std::vector<int64_t> out;
  for (int64_t d : order)
    out.push_back(v.at(d));
  return out;
}

/// An uninitialized tensor of `shape` whose memory is laid out in `order`.
at::Tensor emptyInOrder(const std::vector<int64_t> &shape, const std::vector<int64_t> &order,
                        const at::TensorOptions &options) {
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i)
    inverse[order[i]] = static_cast<int64_t>(i);
  return at::empty(permuted(shape, order), options).permute(inverse);
}

std::vector<int64_t> contiguousStrides(const std::vector<int64_t> &shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d)
    s[d] = s[d + 1] * shape[d + 1];
  return s;
}

/// Sets a.vec, the pointwise kernel's 8-wide paths (CudaSource.cpp): each
/// of the `count` tensors walks the last dim with stride 1 or 0, the
/// stride-1 ones start 16-byte aligned and (more than one dim: then the last
/// size is a multiple of 8) have their other strides multiples of 8. With
/// `halves` (a region reading halves of the last dim), half the last dim
/// must be a multiple of 8 too (a run of 8 stays in its half).
void chooseVector(Args &a, size_t count, bool halves) {
  a.vec = 0;
  if (a.ndim < 1 || (a.ndim > 1 && a.sizes[a.ndim - 1] % 8 != 0) ||
      (halves && a.sizes[a.ndim - 1] % 16 != 0))
    return;
  const int last = a.ndim - 1;
  for (size_t k = 0; k < count; ++k) {
    if (a.strides[k][last] == 0)
      continue;
    if (a.strides[k][last] != 1 || reinterpret_cast<uintptr_t>(a.tensors[k]) % 16 != 0)
      return;
    for (int d = 0; d < last; ++d)
      if (a.strides[k][d] % 8 != 0)
        return;
  }
  a.vec = a.ndim == 1 ? 1 : 2;
}

/// Threads of the 8-wide row kernel for rows of D: enough that kRowChunks
/// runs of 8 a thread cover the row; 0 when RowVector's conditions fail for
/// the first `count` tensors of `a`.
unsigned rowVectorThreads(const Args &a, size_t count) {
  const int last = a.ndim - 1;
  const int64_t D = a.sizes[last];
  if (D % 8 != 0 || D > int64_t{8} * kRowChunks * 1024)
    return 0;
  for (size_t k = 0; k < count; ++k) {
    if (a.strides[k][last] == 0)
      continue;
    if (a.strides[k][last] != 1 || reinterpret_cast<uintptr_t>(a.tensors[k]) % 16 != 0)
      return 0;
    for (int d = 0; d < last; ++d)
      if (a.strides[k][d] % 8 != 0)
        return 0;
  }
  int64_t runs = D / 8;
  int64_t threads = (runs + kRowChunks - 1) / kRowChunks;
  return static_cast<unsigned>(std::max<int64_t>(64, (threads + 31) / 32 * 32));
}

#ifdef BMT_WITH_CUDA_KERNELS
// ---- CUDA: the driver API through dlopen, kernels from NVRTC ----

struct Driver {
  void *handle = nullptr;
  int (*moduleLoadData)(void **, const void *) = nullptr;
  int (*moduleGetFunction)(void **, void *, const char *) = nullptr;
  int (*launchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                      void *, void **, void **) = nullptr;
  int (*funcGetAttribute)(int *, int, void *) = nullptr;
};

const Driver &driver() {
  static Driver d = [] {
    Driver d;
    d.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d.handle)
      return d;
    d.moduleLoadData = reinterpret_cast<decltype(d.moduleLoadData)>(dlsym(d.handle, "cuModuleLoadData"));
    d.moduleGetFunction =
        reinterpret_cast<decltype(d.moduleGetFunction)>(dlsym(d.handle, "cuModuleGetFunction"));
    d.launchKernel = reinterpret_cast<decltype(d.launchKernel)>(dlsym(d.handle, "cuLaunchKernel"));
    d.funcGetAttribute = reinterpret_cast<decltype(d.funcGetAttribute)>(dlsym(d.handle, "cuFuncGetAttribute"));
    if (!d.moduleLoadData || !d.moduleGetFunction || !d.launchKernel || !d.funcGetAttribute)
      d.handle = nullptr;
    return d;
  }();
  return d;
}

void launch(void *function, Args &a, unsigned blocks, unsigned threads, const at::Device &device) {
  if (a.n == 0)
    return;
  void *params[] = {&a};
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  int rc = driver().launchKernel(function, blocks, 1, 1, threads, 1, 1, 0, stream, params, nullptr);
  if (rc != 0)
    throw FusionError("cuLaunchKernel failed (CUresult " + std::to_string(rc) + ")");
}

/// Launches a pointwise kernel (256 threads, a few blocks per SM, 8
/// elements a thread on the a.vec paths) or the scalar row kernel (one
/// block per row, a thread per 4 columns).
void launch(void *function, Args &a, bool row, int64_t rowLen, const at::Device &device) {
  if (a.n == 0)
    return;
  int sms = at::cuda::getDeviceProperties(device.index())->multiProcessorCount;
  unsigned threads, blocks;
  if (row) {
    int64_t t = ((rowLen / 4 + 31) / 32) * 32;
    threads = static_cast<unsigned>(std::min<int64_t>(1024, std::max<int64_t>(64, t)));
    blocks = static_cast<unsigned>(std::min<int64_t>(a.n, int64_t{sms} * 32));
  } else {
    threads = 256;
    int64_t perThread = a.vec ? 8 : 1;
    int64_t work = (a.n + perThread - 1) / perThread;
    blocks = static_cast<unsigned>(std::min<int64_t>((work + 255) / 256, int64_t{sms} * 64));
  }
  launch(function, a, blocks, threads, device);
}

/// The most threads a block of `function` may have (its registers allow).
int maxThreadsPerBlock(void *function) {
  constexpr int kAttribute = 0; // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
  int threads = 1024;
  if (driver().funcGetAttribute(&threads, kAttribute, function) != 0)
    throw FusionError("cuFuncGetAttribute failed");
  return threads;
}

/// The kernel `name` of `source` on `device`: one module per distinct
/// source and device in the process (identical regions of identical blocks
/// share it), loaded from `binary` when given, else compiled through the
/// disk cache.
void *loadFunction(const std::string &source, const std::string &name, const at::Device &device,
                   const std::string *binary) {
  static std::mutex mutex;
  static std::map<std::string, void *> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  std::string key = device.str() + "\n" + source;
  if (auto it = loaded.find(key); it != loaded.end())
    return it->second;
  std::string compiled;
  if (!binary) {
    const cudaDeviceProp *prop = at::cuda::getDeviceProperties(device.index());
    compiled = compileCuda(source, name, prop->major, prop->minor, /*cubin=*/true);
    binary = &compiled;
  }
  void *module = nullptr, *function = nullptr;
  int rc = driver().moduleLoadData(&module, binary->data());
  if (rc != 0)
    throw FusionError("cuModuleLoadData failed for " + name + " (CUresult " + std::to_string(rc) + ")");
  rc = driver().moduleGetFunction(&function, module, name.c_str());
  if (rc != 0)
    throw FusionError("cuModuleGetFunction failed for " + name + " (CUresult " + std::to_string(rc) + ")");
  loaded[key] = function;
  return function;
}

int multiProcessors(const at::Device &device) {
  return device.is_cuda() ? at::cuda::getDeviceProperties(device.index())->multiProcessorCount : 1;
}
#else
int multiProcessors(const at::Device &) { return 1; }
#endif

/// RowVector::prefetch for a forward or backward row kernel, from
/// BMT_ROW_PREFETCH (0, the default: none; backward; 1: both), a setting
/// for measuring the two (bench/gpu_row_prefetch.sh); another value is a
/// FusionError (a measurement must not run another mode than it says).
bool rowPrefetch(bool backward) {
  static const std::string mode = [] {
    try {
      return runtime::env::rowPrefetch();
    } catch (const runtime::EnvError &e) {
      throw FusionError(e.what());
    }
  }();
  return mode == "1" || (backward && mode == "backward");
}

/// Blocks of the 8-wide row kernel, at most one per row: 16 per SM (more
/// than its registers let run at once: measured on an H200 with LLaMA's
/// RMSNorm, 8 -> 16 took its forward from 41 to 34 us; 32 and 64 gained
/// nothing more), or 4 with `columnSums` (each block strides over rows and
/// writes one row of column sums: [blocks, D] floats for the caller to sum;
/// 8 or 16 were no faster).
unsigned rowVectorBlocks(const Args &a, const at::Device &device, bool columnSums) {
  int sms = multiProcessors(device);
  // BMT_ROW_BLOCKS_PER_SM: the forward's blocks an SM (default 16), for
  // measuring; an integer from 1 to 64, else a FusionError.
  static const int64_t forwardPerSm = [] {
    try {
      return runtime::env::rowBlocksPerSm();
    } catch (const runtime::EnvError &e) {
      throw FusionError(e.what());
    }
  }();
  int64_t perSm = columnSums ? 4 : forwardPerSm;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(a.n, int64_t{sms} * perSm)));
}

} // namespace

std::string KernelSpec::key() const {
  std::ostringstream os;
  os << (backward ? "bwd" : "fwd");
  for (size_t i = 0; i < inputDtypes.size(); ++i)
    os << (i ? "," : " ") << c10::toString(inputDtypes[i]);
  if (backward)
    for (size_t k = 0; k < gradDtypes.size(); ++k)
      os << (k ? "," : " grad=") << c10::toString(gradDtypes[k]);
  os << " out=";
  for (size_t o = 0; o < outDtypes.size(); ++o)
    os << (o ? "," : "") << (backward ? std::to_string(gradients.at(o)) + ":" : std::string())
       << c10::toString(outDtypes[o]);
  if (rowVector) {
    os << (rowVector->prefetch ? " rvp=" : " rv=");
    for (bool c : rowVector->columnSums)
      os << (c ? 'C' : 'e');
  }
  return os.str();
}

struct FusedRegion::Kernels {
  void *function = nullptr; // CUfunction; null: not loaded (no GPU, or no output)
  int maxThreads = 1024;    // the most threads a block of it may have (its registers)
};

FusedRegion::FusedRegion(Region region, std::string name)
    : region_(std::move(region)), name_(identifier(name)) {}

FusedRegion::~FusedRegion() = default;

bool FusedRegion::accepts(const std::vector<at::Tensor> &inputs) const {
  if (inputs.size() != static_cast<size_t>(region_.numInputs) || inputs.empty())
    return false;
  std::vector<c10::ScalarType> dtypes;
  for (const at::Tensor &t : inputs) {
    if (!t.defined() || !floating(t.scalar_type()) || t.device() != inputs[0].device())
      return false;
    dtypes.push_back(t.scalar_type());
  }
  if (resultDtypes(region_, dtypes).empty())
    return false;
  try {
    std::vector<int64_t> shape = elementShape(inputs);
    return !(region_.hasReduction && shape.empty()) && callFits(region_, inputs, shape);
  } catch (const FusionError &) {
    return false;
  }
}

std::vector<at::Tensor> FusedRegion::run(const std::vector<at::Tensor> &inputs) {
  return FusedFunction::apply(this, at::TensorList(inputs));
}

bool FusedRegion::usesKernels(const at::Device &device) {
#ifdef BMT_WITH_CUDA_KERNELS
  static const bool disabled = runtime::env::fusedRegionsOnAten();
  return device.is_cuda() && !disabled && driver().handle && nvrtcAvailable();
#else
  (void)device;
  return false;
#endif
}

int64_t FusedRegion::lazyKernels() { return lazyCount.load(); }

std::pair<std::string, std::string> FusedRegion::kernelSource(const KernelSpec &spec) const {
  // Names from the region's shape only (one kernel per module), so equal
  // regions still give equal sources and share one module, and a profile
  // tells the kinds apart: bmt_fused_{row,pw}_<inputs>in_<nodes>n_{fwd,bwd}.
  std::string tag = std::string("bmt_fused_") + (region_.hasReduction ? "row_" : "pw_") +
                    std::to_string(region_.numInputs) + "in_" +
                    std::to_string(region_.forward.nodes.size()) + "n_";
  const RowVector *rv = spec.rowVector ? &*spec.rowVector : nullptr;
  if (!spec.backward) {
    std::string name = tag + "fwd";
    return {name, cudaSource(region_.forward, region_.results, name, spec.inputDtypes, {},
                             spec.outDtypes, rv)};
  }
  std::vector<int> outs;
  for (size_t i : spec.gradients)
    outs.push_back(region_.gradients.at(i));
  std::string name = tag + "bwd";
  return {name, cudaSource(region_.backward, outs, name, spec.inputDtypes, spec.gradDtypes,
                           spec.outDtypes, rv)};
}

FusedRegion::Kernels &FusedRegion::kernelsFor(const KernelSpec &spec, const at::Device &device) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::unique_ptr<Kernels> &k = kernels_[device.str() + " " + spec.key()];
  if (k)
    return *k;
  ++lazyCount; // not installed before its first call (Prewarm.h)
  k = std::make_unique<Kernels>();
#ifdef BMT_WITH_CUDA_KERNELS
  if (usesKernels(device)) {
    auto [name, source] = kernelSource(spec);
    k->function = loadFunction(source, name, device, nullptr);
    k->maxThreads = maxThreadsPerBlock(k->function);
  }
#endif
  return *k;
}

FusedRegion::Kernels &FusedRegion::kernelsFitting(KernelSpec &spec, const at::Device &device,
                                                  unsigned &threads) {
  Kernels *k = &kernelsFor(spec, device);
  if (threads && static_cast<int>(threads) > k->maxThreads) { // too many registers
    threads = 0;
    spec.rowVector.reset();
    if (recorder_)
      recorder_->add(this, spec, device, 0);
    k = &kernelsFor(spec, device);
  }
  return *k;
}

int FusedRegion::install(const KernelSpec &spec, const at::Device &device, const std::string &binary) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::unique_ptr<Kernels> &k = kernels_[device.str() + " " + spec.key()];
  if (k)
    return k->maxThreads;
  auto made = std::make_unique<Kernels>();
#ifdef BMT_WITH_CUDA_KERNELS
  if (usesKernels(device)) {
    auto [name, source] = kernelSource(spec);
    made->function = loadFunction(source, name, device, &binary);
    made->maxThreads = maxThreadsPerBlock(made->function);
  }
#else
  (void)binary;
#endif
  k = std::move(made);
  return k->maxThreads;
}

KernelSpec FusedRegion::forwardSpec(const std::vector<at::Tensor> &inputs) const {
  KernelSpec spec;
  for (const at::Tensor &t : inputs)
    spec.inputDtypes.push_back(t.scalar_type());
  spec.outDtypes = resultDtypes(region_, spec.inputDtypes);
  return spec;
}

std::vector<at::Tensor> FusedRegion::forward(const std::vector<at::Tensor> &inputs) {
  const at::Device device = inputs[0].device();
  if (!kernelPath(device))
    return forwardATen(region_, inputs);
  const bool kernels = usesKernels(device);
#ifdef BMT_WITH_CUDA_KERNELS
  std::optional<c10::cuda::CUDAGuard> guard;
  if (kernels)
    guard.emplace(device);
#endif
  std::vector<int64_t> shape = elementShape(inputs);
  KernelSpec spec = forwardSpec(inputs);
  // One result may be row-valued (buildRegion: only a region's one result).
  const size_t numResults = region_.results.size();
  bool rowResult = region_.forward.rowValued()[region_.results[0]];
  std::vector<int64_t> outShape = shape;
  if (rowResult)
    outShape.back() = 1;
  // The kernel walks the element shape in `order` (the last dim stays last).
  const std::vector<int64_t> order = walkOrder(inputs, shape);
  std::vector<at::Tensor> outs;
  for (size_t k = 0; k < numResults; ++k)
    outs.push_back(emptyInOrder(outShape, order, inputs[0].options().dtype(spec.outDtypes[k])));
  std::vector<std::vector<int64_t>> strides;
  for (const at::Tensor &t : inputs)
    strides.push_back(permuted(t.expand(shape).strides().vec(), order));
  std::vector<int64_t> outStrides = contiguousStrides(permuted(shape, order));
  if (rowResult)
    outStrides.back() = 0; // written once per row at index r
  for (size_t k = 0; k < numResults; ++k)
    strides.push_back(outStrides);
  Args a;
  if (!layout(a, permuted(shape, order), strides, region_.hasReduction, !region_.halves.empty()))
    return forwardATen(region_, inputs);
  for (size_t i = 0; i < inputs.size(); ++i)
    a.tensors[i] = const_cast<void *>(inputs[i].data_ptr());
  for (size_t k = 0; k < numResults; ++k)
    a.tensors[inputs.size() + k] = outs[k].data_ptr();
  // The 8-wide row kernel where the row allows it, else the scalar one.
  unsigned threads = 0;
  if (region_.hasReduction) {
    threads = rowVectorThreads(a, inputs.size());
    if (threads)
      spec.rowVector = RowVector{std::vector<bool>(numResults, false), rowPrefetch(false)};
  } else {
    chooseVector(a, inputs.size() + numResults, !region_.halves.empty());
  }
  if (recorder_)
    recorder_->add(this, spec, device, static_cast<int>(threads));
  if (recorder_ && recorder_->dryRun())
    return outs; // allocated as the kernel's, not computed
  Kernels *k = &kernelsFitting(spec, device, threads);
  if (!kernels) { // emulation: the ATen values in the kernel's layout
    std::vector<at::Tensor> values = forwardATen(region_, inputs);
    for (size_t r = 0; r < numResults; ++r)
      outs[r].copy_(values[r]);
    return outs;
  }
#ifdef BMT_WITH_CUDA_KERNELS
  if (threads)
    launch(k->function, a, rowVectorBlocks(a, device, false), threads, device);
  else
    launch(k->function, a, region_.hasReduction, shape.empty() ? 1 : shape.back(), device);
#endif
  return outs;
}

bool FusedRegion::gradientWanted(size_t i, const std::vector<bool> &needed) const {
  return region_.gradients[i] >= 0 && (needed.empty() || needed[i]);
}

std::vector<at::Tensor> FusedRegion::backward(const std::vector<at::Tensor> &inputs,
                                              const std::vector<at::Tensor> &gradOuts,
                                              const std::vector<bool> &needed) {
  const at::Device device = inputs[0].device();
  if (gradOuts.size() != region_.results.size())
    throw FusionError("fused region: " + std::to_string(gradOuts.size()) + " grad_outputs for " +
                      std::to_string(region_.results.size()) + " results");
  auto aten = [&] {
    std::vector<at::Tensor> grads = backwardATen(region_, inputs, gradOuts);
    for (size_t i = 0; i < grads.size(); ++i)
      if (!gradientWanted(i, needed))
        grads[i] = at::Tensor();
    return grads;
  };
  if (!kernelPath(device))
    return aten();
  const bool kernels = usesKernels(device);
  const bool dry = recorder_ && recorder_->dryRun();
#ifdef BMT_WITH_CUDA_KERNELS
  std::optional<c10::cuda::CUDAGuard> guard;
  if (kernels)
    guard.emplace(device);
#endif
  std::vector<at::Tensor> grads(inputs.size());
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), gradOuts.begin(), gradOuts.end());
  std::vector<int64_t> shape = elementShape(all);
  const std::vector<int64_t> inputShape = elementShape(inputs);
  // Gradients laid out as the forward's result (walkOrder of the inputs).
  const std::vector<int64_t> order = walkOrder(inputs, shape);
  std::vector<std::vector<int64_t>> strides;
  for (const at::Tensor &t : all)
    strides.push_back(permuted(t.expand(shape).strides().vec(), order));
  // Per gradient output: the input it belongs to, its dtype (the input's
  // where the input has the element shape; a broadcast one's is float32,
  // summed after), and whether the 8-wide row kernel writes it as column
  // sums (an input that is one row broadcast over all rows: a norm's weight).
  // An input whose gradient is the same node as an earlier one's, both of
  // the element shape and dtype, shares that output (`sameAs`).
  KernelSpec spec;
  spec.backward = true;
  for (const at::Tensor &g : gradOuts)
    spec.gradDtypes.push_back(g.scalar_type());
  for (const at::Tensor &t : inputs)
    spec.inputDtypes.push_back(t.scalar_type());
  std::vector<bool> columnSums;
  std::vector<int> sameAs(inputs.size(), -1);
  auto elementShaped = [&](size_t i) { return inputs[i].sizes().vec() == inputShape; };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!gradientWanted(i, needed))
      continue;
    for (size_t j : spec.gradients)
      if (region_.gradients[j] == region_.gradients[i] && elementShaped(i) && elementShaped(j) &&
          inputs[i].scalar_type() == inputs[j].scalar_type()) {
        sameAs[i] = static_cast<int>(j);
        break;
      }
    if (sameAs[i] >= 0)
      continue;
    spec.gradients.push_back(i);
    spec.outDtypes.push_back(elementShaped(i) ? inputs[i].scalar_type() : at::kFloat);
    bool oneRow = region_.hasReduction && !shape.empty() && inputs[i].numel() == shape.back() &&
                  inputs[i].sizes().vec() != shape;
    columnSums.push_back(oneRow);
  }
  const std::vector<size_t> &of = spec.gradients;
  if (of.empty())
    return grads;
  for (size_t o = 0; o < of.size(); ++o)
    strides.push_back(contiguousStrides(permuted(shape, order)));
  Args a;
  if (!layout(a, permuted(shape, order), strides, region_.hasReduction, !region_.halves.empty()))
    return aten();
  for (size_t i = 0; i < all.size(); ++i)
    a.tensors[i] = const_cast<void *>(all[i].data_ptr());
  unsigned threads = region_.hasReduction ? rowVectorThreads(a, all.size()) : 0;
  if (threads)
    spec.rowVector = RowVector{columnSums, rowPrefetch(true)};
  if (recorder_)
    recorder_->add(this, spec, device, static_cast<int>(threads));
  Kernels *k = nullptr;
  if (!dry)
    k = &kernelsFitting(spec, device, threads);
  unsigned blocks = threads ? rowVectorBlocks(a, device, true) : 0;
  std::vector<at::Tensor> outs;
  for (size_t o = 0; o < of.size(); ++o) {
    const at::Tensor &input = inputs[of[o]];
    if (threads && columnSums[o])
      outs.push_back(at::empty({static_cast<int64_t>(blocks), shape.back()}, input.options().dtype(at::kFloat)));
    else
      outs.push_back(emptyInOrder(shape, order, input.options().dtype(spec.outDtypes[o])));
    a.tensors[all.size() + o] = outs.back().data_ptr();
  }
#ifdef BMT_WITH_CUDA_KERNELS
  if (kernels && !dry) {
    if (threads) {
      launch(k->function, a, blocks, threads, device);
    } else {
      chooseVector(a, all.size() + outs.size(), !region_.halves.empty());
      launch(k->function, a, region_.hasReduction, shape.empty() ? 1 : shape.back(), device);
    }
  }
#endif
  for (size_t o = 0; o < of.size(); ++o) {
    const at::Tensor &input = inputs[of[o]];
    at::Tensor g = outs[o];
    if (threads && columnSums[o]) {
      grads[of[o]] = runtime::columnSum(g, input.scalar_type()).view(input.sizes());
      continue;
    }
    if (g.sizes() != input.sizes())
      g = at::sum_to(g, input.sizes());
    grads[of[o]] = g.to(input.scalar_type());
  }
  if (!kernels && !dry) { // emulation: the ATen values in the kernel's layouts
    std::vector<at::Tensor> values = backwardATen(region_, inputs, gradOuts);
    for (size_t i : of)
      grads[i].copy_(values[i]);
  }
  // Shared after the copies above: one tensor for the equal gradients.
  for (size_t i = 0; i < inputs.size(); ++i)
    if (sameAs[i] >= 0)
      grads[i] = grads[sameAs[i]];
  return grads;
}

} // namespace bmt::fusion
