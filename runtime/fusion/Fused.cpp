//===- Fused.cpp - a fused region as an autograd node, kernels via NVRTC --===//

#include "bmt/Runtime/fusion/Fused.h"

#include "bmt/Runtime/fusion/Nvrtc.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/csrc/autograd/custom_function.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>

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
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, FusedRegion *self,
                            at::TensorList list) {
    std::vector<at::Tensor> inputs(list.begin(), list.end());
    ctx->saved_data["region"] = reinterpret_cast<int64_t>(self);
    ctx->save_for_backward(inputs);
    return self->forward(inputs);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    auto *self = reinterpret_cast<FusedRegion *>(ctx->saved_data["region"].toInt());
    std::vector<at::Tensor> inputs = ctx->get_saved_variables();
    torch::autograd::variable_list out{at::Tensor()}; // the region pointer
    if (!grads.at(0).defined()) {
      out.resize(inputs.size() + 1);
      return out;
    }
    // Only the gradients autograd asks for (not those of the rotary
    // cos/sin, say): fewer outputs, a smaller kernel, no sums of them.
    std::vector<bool> needed(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      needed[i] = ctx->needs_input_grad(i);
    for (at::Tensor &g : self->backward(inputs, grads[0], needed))
      out.push_back(g);
    return out;
  }
};

// ---- CUDA: the driver API through dlopen, kernels from NVRTC ----

#ifdef BMT_WITH_CUDA_KERNELS
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

/// bmt_fused::Args of the generated source (CudaSource.cpp's preamble).
struct Args {
  long long n;
  int ndim;
  int vec;
  long long sizes[kMaxDims];
  void *tensors[kMaxTensors];
  long long strides[kMaxTensors][kMaxDims];
};
#endif

} // namespace

struct FusedRegion::Kernels {
  void *function = nullptr; // CUfunction; null: a backward whose result depends on no input
  int maxThreads = 1024;    // the most threads a block of it may have (its registers)
  std::vector<c10::ScalarType> gradDtypes; // per backward output
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
  if (resultDtype(region_, dtypes) == c10::ScalarType::Undefined)
    return false;
  try {
    std::vector<int64_t> shape = elementShape(inputs);
    return !(region_.hasReduction && shape.empty()) && callFits(region_, inputs, shape);
  } catch (const FusionError &) {
    return false;
  }
}

at::Tensor FusedRegion::run(const std::vector<at::Tensor> &inputs) {
  return FusedFunction::apply(this, at::TensorList(inputs));
}

bool FusedRegion::usesKernels(const at::Device &device) {
#ifdef BMT_WITH_CUDA_KERNELS
  static const bool disabled = std::getenv("BMT_FUSED_ATEN") != nullptr;
  return device.is_cuda() && !disabled && driver().handle && nvrtcAvailable();
#else
  (void)device;
  return false;
#endif
}

#ifdef BMT_WITH_CUDA_KERNELS
namespace {

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
/// share it), compiled through the disk cache.
void *loadFunction(const std::string &source, const std::string &name, const at::Device &device) {
  static std::mutex mutex;
  static std::map<std::string, void *> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  std::string key = device.str() + "\n" + source;
  if (auto it = loaded.find(key); it != loaded.end())
    return it->second;
  const cudaDeviceProp *prop = at::cuda::getDeviceProperties(device.index());
  std::string cubin = compileCuda(source, name, prop->major, prop->minor, /*cubin=*/true);
  void *module = nullptr, *function = nullptr;
  int rc = driver().moduleLoadData(&module, cubin.data());
  if (rc != 0)
    throw FusionError("cuModuleLoadData failed for " + name + " (CUresult " + std::to_string(rc) + ")");
  rc = driver().moduleGetFunction(&function, module, name.c_str());
  if (rc != 0)
    throw FusionError("cuModuleGetFunction failed for " + name + " (CUresult " + std::to_string(rc) + ")");
  loaded[key] = function;
  return function;
}

} // namespace
#endif

FusedRegion::Kernels &FusedRegion::kernelsFor(const std::vector<at::Tensor> &inputs,
                                              const at::Tensor &gradOut, const RowVector *rowVector,
                                              const std::vector<bool> &needed) {
  std::string key = inputs[0].device().str();
  std::vector<c10::ScalarType> dtypes;
  for (const at::Tensor &t : inputs) {
    dtypes.push_back(t.scalar_type());
    key += std::string(",") + c10::toString(t.scalar_type());
  }
  std::vector<int64_t> shape = elementShape(inputs);
  // Broadcast inputs get fp32 gradients (summed over the broadcast dims after).
  std::vector<c10::ScalarType> gradDtypes;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (gradientWanted(i, needed)) {
      bool full = inputs[i].sizes().vec() == shape;
      gradDtypes.push_back(full ? inputs[i].scalar_type() : at::kFloat);
      key += full ? ",g" : ",G";
    }
  c10::ScalarType gradDtype = gradOut.defined() ? gradOut.scalar_type() : resultDtype(region_, dtypes);
  key += std::string(",") + c10::toString(gradDtype);
  // Forward and backward kernels of one variant (the 8-wide row kernel and
  // its column sums, or not) are compiled on their first use.
  const bool backward = gradOut.defined();
  key += backward ? ",bwd" : ",fwd";
  for (size_t i = 0; backward && i < inputs.size(); ++i)
    key += gradientWanted(i, needed) ? "1" : "0";
  if (rowVector) {
    key += ",v";
    for (bool c : rowVector->columnSums)
      key += c ? "C" : "e";
  }
  std::lock_guard<std::mutex> lock(mutex_);
  std::unique_ptr<Kernels> &k = kernels_[key];
  if (k)
    return *k;
  k = std::make_unique<Kernels>();
  k->gradDtypes = gradDtypes;
#ifdef BMT_WITH_CUDA_KERNELS
  // Names from the region's shape only (one kernel per module), so equal
  // regions still give equal sources and share one module, and a profile
  // tells the kinds apart: bmt_fused_{row,pw}_<inputs>in_<nodes>n_{fwd,bwd}.
  std::string tag = std::string("bmt_fused_") + (region_.hasReduction ? "row_" : "pw_") +
                    std::to_string(region_.numInputs) + "in_" +
                    std::to_string(region_.forward.nodes.size()) + "n_";
  if (!backward) {
    std::string fname = tag + "fwd";
    k->function = loadFunction(cudaSource(region_.forward, {region_.result}, fname, dtypes,
                                          c10::ScalarType::Undefined, {resultDtype(region_, dtypes)},
                                          rowVector),
                               fname, inputs[0].device());
    k->maxThreads = maxThreadsPerBlock(k->function);
    return *k;
  }
  std::vector<int> outs;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (gradientWanted(i, needed))
      outs.push_back(region_.gradients[i]);
  std::string bname = tag + "bwd";
  if (!outs.empty())
    k->function = loadFunction(
        cudaSource(region_.backward, outs, bname, dtypes, gradDtype, gradDtypes, rowVector), bname,
        inputs[0].device());
  if (k->function)
    k->maxThreads = maxThreadsPerBlock(k->function);
#endif
  return *k;
}

#ifdef BMT_WITH_CUDA_KERNELS
namespace {

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

/// Blocks of the 8-wide row kernel, at most one per row: 16 per SM (more
/// than its registers let run at once: measured on an H200 with LLaMA's
/// RMSNorm, 8 -> 16 took its forward from 41 to 34 us; 32 and 64 gained
/// nothing more), or 4 with `columnSums` (each block strides over rows and
/// writes one row of column sums: [blocks, D] floats for the caller to sum;
/// 8 or 16 were no faster).
unsigned rowVectorBlocks(const Args &a, const at::Device &device, bool columnSums) {
  int sms = at::cuda::getDeviceProperties(device.index())->multiProcessorCount;
  int64_t perSm = columnSums ? 4 : 16;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(a.n, int64_t{sms} * perSm)));
}

} // namespace
#endif

at::Tensor FusedRegion::forward(const std::vector<at::Tensor> &inputs) {
  if (!usesKernels(inputs[0].device()))
    return forwardATen(region_, inputs);
#ifdef BMT_WITH_CUDA_KERNELS
  c10::cuda::CUDAGuard guard(inputs[0].device());
  std::vector<int64_t> shape = elementShape(inputs);
  std::vector<c10::ScalarType> dtypes;
  for (const at::Tensor &t : inputs)
    dtypes.push_back(t.scalar_type());
  bool rowResult = region_.forward.rowValued()[region_.result];
  std::vector<int64_t> outShape = shape;
  if (rowResult)
    outShape.back() = 1;
  // The kernel walks the element shape in `order` (the last dim stays last).
  const std::vector<int64_t> order = walkOrder(inputs, shape);
  at::Tensor out = emptyInOrder(outShape, order, inputs[0].options().dtype(resultDtype(region_, dtypes)));
  std::vector<std::vector<int64_t>> strides;
  for (const at::Tensor &t : inputs)
    strides.push_back(permuted(t.expand(shape).strides().vec(), order));
  std::vector<int64_t> outStrides = contiguousStrides(permuted(shape, order));
  if (rowResult)
    outStrides.back() = 0; // written once per row at index r
  strides.push_back(outStrides);
  Args a;
  if (!layout(a, permuted(shape, order), strides, region_.hasReduction, !region_.halves.empty()))
    return forwardATen(region_, inputs);
  for (size_t i = 0; i < inputs.size(); ++i)
    a.tensors[i] = const_cast<void *>(inputs[i].data_ptr());
  a.tensors[inputs.size()] = out.data_ptr();
  const at::Device device = inputs[0].device();
  if (region_.hasReduction) {
    if (unsigned threads = rowVectorThreads(a, inputs.size())) {
      RowVector rv{{false}};
      Kernels &k = kernelsFor(inputs, at::Tensor(), &rv, {});
      if (static_cast<int>(threads) <= k.maxThreads) { // else too many registers: the scalar kernel
        launch(k.function, a, rowVectorBlocks(a, device, false), threads, device);
        return out;
      }
    }
  } else {
    chooseVector(a, inputs.size() + 1, !region_.halves.empty());
  }
  Kernels &k = kernelsFor(inputs, at::Tensor(), nullptr, {});
  launch(k.function, a, region_.hasReduction, shape.empty() ? 1 : shape.back(), device);
  return out;
#else
  return forwardATen(region_, inputs);
#endif
}

bool FusedRegion::gradientWanted(size_t i, const std::vector<bool> &needed) const {
  return region_.gradients[i] >= 0 && (needed.empty() || needed[i]);
}

std::vector<at::Tensor> FusedRegion::backward(const std::vector<at::Tensor> &inputs,
                                              const at::Tensor &gradOut,
                                              const std::vector<bool> &needed) {
  if (!usesKernels(inputs[0].device())) {
    std::vector<at::Tensor> grads = backwardATen(region_, inputs, gradOut);
    for (size_t i = 0; i < grads.size(); ++i)
      if (!gradientWanted(i, needed))
        grads[i] = at::Tensor();
    return grads;
  }
#ifdef BMT_WITH_CUDA_KERNELS
  c10::cuda::CUDAGuard guard(inputs[0].device());
  std::vector<at::Tensor> grads(inputs.size());
  std::vector<at::Tensor> all = inputs;
  all.push_back(gradOut);
  std::vector<int64_t> shape = elementShape(all);
  // Gradients laid out as the forward's result (walkOrder of the inputs).
  const std::vector<int64_t> order = walkOrder(inputs, shape);
  std::vector<std::vector<int64_t>> strides;
  for (const at::Tensor &t : all)
    strides.push_back(permuted(t.expand(shape).strides().vec(), order));
  // Per gradient output: the input it belongs to, and whether the 8-wide row
  // kernel writes it as column sums (an input that is one row broadcast
  // over all rows: a norm's weight).
  std::vector<size_t> of;
  std::vector<bool> columnSums;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (gradientWanted(i, needed)) {
      of.push_back(i);
      bool oneRow = region_.hasReduction && !shape.empty() && inputs[i].numel() == shape.back() &&
                    inputs[i].sizes().vec() != shape;
      columnSums.push_back(oneRow);
    }
  if (of.empty())
    return grads;
  for (size_t o = 0; o < of.size(); ++o)
    strides.push_back(contiguousStrides(permuted(shape, order)));
  Args a;
  if (!layout(a, permuted(shape, order), strides, region_.hasReduction, !region_.halves.empty()))
    return backwardATen(region_, inputs, gradOut);
  for (size_t i = 0; i < all.size(); ++i)
    a.tensors[i] = const_cast<void *>(all[i].data_ptr());
  const at::Device device = inputs[0].device();
  unsigned threads = region_.hasReduction ? rowVectorThreads(a, all.size()) : 0;
  RowVector rv{columnSums};
  Kernels *k = &kernelsFor(inputs, gradOut, threads ? &rv : nullptr, needed);
  if (threads && static_cast<int>(threads) > k->maxThreads) { // too many registers: the scalar kernel
    threads = 0;
    k = &kernelsFor(inputs, gradOut, nullptr, needed);
  }
  unsigned blocks = threads ? rowVectorBlocks(a, device, true) : 0;
  std::vector<at::Tensor> outs;
  for (size_t o = 0; o < of.size(); ++o) {
    const at::Tensor &input = inputs[of[o]];
    if (threads && columnSums[o])
      outs.push_back(at::empty({static_cast<int64_t>(blocks), shape.back()}, input.options().dtype(at::kFloat)));
    else
      outs.push_back(emptyInOrder(shape, order, input.options().dtype(k->gradDtypes[o])));
    a.tensors[all.size() + o] = outs.back().data_ptr();
  }
  if (threads) {
    launch(k->function, a, blocks, threads, device);
  } else {
    chooseVector(a, all.size() + outs.size(), !region_.halves.empty());
    launch(k->function, a, region_.hasReduction, shape.empty() ? 1 : shape.back(), device);
  }
  for (size_t o = 0; o < of.size(); ++o) {
    const at::Tensor &input = inputs[of[o]];
    at::Tensor g = outs[o];
    if (threads && columnSums[o])
      g = g.sum(0).view(input.sizes());
    else if (g.sizes() != input.sizes())
      g = at::sum_to(g, input.sizes());
    grads[of[o]] = g.to(input.scalar_type());
  }
  return grads;
#else
  return backwardATen(region_, inputs, gradOut);
#endif
}

} // namespace bmt::fusion
