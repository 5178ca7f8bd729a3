//===- Linear.cpp - a linear layer whose bias gradient comes from the GEMM ===//

#include "bmt/Runtime/ops/Linear.h"

#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#ifdef BMT_WITH_CUBLASLT
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#endif

namespace bmt::runtime::ops {

namespace {

std::atomic<int64_t> epilogueCount{0}, fallbackCount{0};

bool enabled() {
  static const bool on = [] {
    const char *v = std::getenv("BMT_LINEAR_BIAS_GRAD");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

#ifdef BMT_WITH_CUBLASLT

/// The largest power of two up to 16 that divides the address: the
/// alignment cuBLASLt's heuristic must assume for an operand.
uint32_t alignment(const void *p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t n = 1;
  while (n < 16 && a % (2 * n) == 0)
    n *= 2;
  return n;
}

/// Owns one cuBLASLt descriptor (cublasLt*Destroy on scope exit).
template <typename T, cublasStatus_t (*Destroy)(T)> struct Owned {
  T value = nullptr;
  ~Owned() {
    if (value)
      Destroy(value);
  }
};

/// The heuristic's choice per problem (shapes, dtype, epilogue, operand
/// alignments): asked once, then reused (the query costs host time).
using GemmKey = std::tuple<int64_t, int64_t, int64_t, int, int, uint32_t, uint32_t, uint32_t,
                           uint32_t, void *>;
std::mutex algoMutex;
std::map<GemmKey, std::optional<cublasLtMatmulAlgo_t>> algos;

/// D = A op(B) in column-major terms, with A [m, k] (ld lda, not
/// transposed), B stored [n, k] (ld ldb, transposed), D [m, n] (ld m), and
/// the bias gradient written to `biasGrad` by `epilogue` (BGRADA: the sum
/// of A over k, m values; BGRADB: the sum of op(B) over k, n values).
/// float32 accumulation, as ATen's bf16 / fp16 GEMMs. Returns false, having
/// launched nothing, where cuBLASLt offers no algorithm or a call fails.
bool gemmWithBiasGrad(const void *A, int64_t lda, const void *B, int64_t ldb, void *D,
                      void *biasGrad, int64_t m, int64_t n, int64_t k, cudaDataType_t type,
                      cublasLtEpilogue_t epilogue) {
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> desc;
  Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> aLayout, bLayout, dLayout;
  if (cublasLtMatmulDescCreate(&desc.value, CUBLAS_COMPUTE_32F, CUDA_R_32F) !=
      CUBLAS_STATUS_SUCCESS)
    return false;
  const cublasOperation_t opN = CUBLAS_OP_N, opT = CUBLAS_OP_T;
  const int32_t biasType = type;
  bool ok =
      cublasLtMatmulDescSetAttribute(desc.value, CUBLASLT_MATMUL_DESC_TRANSA, &opN, sizeof(opN)) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(desc.value, CUBLASLT_MATMUL_DESC_TRANSB, &opT, sizeof(opT)) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(desc.value, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                     sizeof(epilogue)) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(desc.value, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &biasGrad,
                                     sizeof(biasGrad)) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(desc.value, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType,
                                     sizeof(biasType)) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&aLayout.value, type, m, k, lda) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&bLayout.value, type, n, k, ldb) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&dLayout.value, type, m, n, m) == CUBLAS_STATUS_SUCCESS;
  if (!ok)
    return false;

  const size_t workspaceSize = at::cuda::getCUDABlasLtWorkspaceSize();
  void *workspace = at::cuda::getCUDABlasLtWorkspace();
  const uint32_t alignA = alignment(A), alignB = alignment(B), alignD = alignment(D);
  // The bias pointer's alignment enters the heuristic through its value.
  GemmKey key{m,      n,      k,      static_cast<int>(type), static_cast<int>(epilogue),
              alignA, alignB, alignD, alignment(biasGrad),    handle};
  std::optional<cublasLtMatmulAlgo_t> algo;
  {
    std::lock_guard<std::mutex> lock(algoMutex);
    auto it = algos.find(key);
    if (it != algos.end()) {
      algo = it->second;
    } else {
      Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> pref;
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const uint64_t maxWorkspace = workspaceSize;
      if (cublasLtMatmulPreferenceCreate(&pref.value) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulPreferenceSetAttribute(pref.value,
                                               CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &maxWorkspace, sizeof(maxWorkspace)) ==
              CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulPreferenceSetAttribute(pref.value,
                                               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                               &alignA, sizeof(alignA)) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulPreferenceSetAttribute(pref.value,
                                               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                               &alignB, sizeof(alignB)) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulPreferenceSetAttribute(pref.value,
                                               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                               &alignD, sizeof(alignD)) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulPreferenceSetAttribute(pref.value,
                                               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                               &alignD, sizeof(alignD)) == CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulAlgoGetHeuristic(handle, desc.value, aLayout.value, bLayout.value,
                                         dLayout.value, dLayout.value, pref.value, 1, &result,
                                         &found) == CUBLAS_STATUS_SUCCESS &&
          found > 0)
        algo = result.algo;
      algos.emplace(key, algo);
    }
  }
  if (!algo)
    return false;
  const float one = 1.f, zero = 0.f;
  return cublasLtMatmul(handle, desc.value, &one, A, aLayout.value, B, bLayout.value, &zero, D,
                        dLayout.value, D, dLayout.value, &*algo, workspace, workspaceSize,
                        at::cuda::getCurrentCUDAStream().stream()) == CUBLAS_STATUS_SUCCESS;
}

#endif // BMT_WITH_CUBLASLT

/// The weight and bias gradients: one GEMM with the bias-gradient epilogue
/// where cuBLASLt takes it, else aten::mm and aten::sum. x2: [T, in],
/// g2: [T, out], both contiguous.
std::pair<at::Tensor, at::Tensor> weightAndBiasGrad(const at::Tensor &x2, const at::Tensor &g2,
                                                    WeightLayout layout) {
  const int64_t tokens = x2.size(0), in = x2.size(1), out = g2.size(1);
#ifdef BMT_WITH_CUBLASLT
  c10::cuda::CUDAGuard guard(x2.device());
  at::Tensor dW = at::empty(layout == WeightLayout::InOut ? std::vector<int64_t>{in, out}
                                                          : std::vector<int64_t>{out, in},
                            x2.options());
  at::Tensor db = at::empty({out}, x2.options());
  const cudaDataType_t type = x2.scalar_type() == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  // Column-major terms (a row-major [r, c] buffer is a column-major [c, r]):
  //   InOut: dW [in, out] row-major = D [out, in] = g2^T (out x T) . x2 (T x in),
  //          the bias the sum of A = g2^T over k = T (BGRADA);
  //   OutIn: dW [out, in] row-major = D [in, out] = x2^T (in x T) . g2 (T x out),
  //          the bias the sum of op(B) = g2 over k = T (BGRADB).
  const bool done =
      layout == WeightLayout::InOut
          ? gemmWithBiasGrad(g2.const_data_ptr(), out, x2.const_data_ptr(), in,
                             dW.mutable_data_ptr(), db.mutable_data_ptr(), out, in, tokens, type,
                             CUBLASLT_EPILOGUE_BGRADA)
          : gemmWithBiasGrad(x2.const_data_ptr(), in, g2.const_data_ptr(), out,
                             dW.mutable_data_ptr(), db.mutable_data_ptr(), in, out, tokens, type,
                             CUBLASLT_EPILOGUE_BGRADB);
  if (done) {
    ++epilogueCount;
    return {dW, db};
  }
#else
  (void)tokens, (void)in, (void)out;
#endif
  ++fallbackCount;
  return {layout == WeightLayout::InOut ? at::mm(x2.t(), g2) : at::mm(g2.t(), x2),
          at::sum(g2, {0})};
}

struct LinearBiasFunction : torch::autograd::Function<LinearBiasFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x,
                            const at::Tensor &weight, const at::Tensor &bias, int64_t layout) {
    const at::Tensor x2 = x.view({-1, x.size(-1)});
    const bool inOut = layout == static_cast<int64_t>(WeightLayout::InOut);
    at::Tensor y = at::addmm(bias, x2, inOut ? weight : weight.t());
    ctx->save_for_backward({x, weight});
    ctx->saved_data["layout"] = layout;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = bias.size(0);
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    std::vector<at::Tensor> saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const auto layout = static_cast<WeightLayout>(ctx->saved_data["layout"].toInt());
    torch::autograd::variable_list out(4);
    if (!grads[0].defined())
      return out;
    const int64_t outFeatures = grads[0].size(-1);
    const at::Tensor g2 = grads[0].reshape({-1, outFeatures}).contiguous();
    const at::Tensor x2 = x.view({-1, x.size(-1)});
    if (ctx->needs_input_grad(0))
      out[0] = (layout == WeightLayout::InOut ? at::mm(g2, weight.t()) : at::mm(g2, weight))
                   .view(x.sizes());
    if (ctx->needs_input_grad(1)) {
      auto [dW, db] = weightAndBiasGrad(x2, g2, layout);
      out[1] = dW;
      if (ctx->needs_input_grad(2))
        out[2] = db;
    } else if (ctx->needs_input_grad(2)) {
      out[2] = at::sum(g2, {0});
    }
    return out;
  }
};

} // namespace

std::optional<at::Tensor> linearWithBias(const at::Tensor &x, const at::Tensor &weight,
                                         const at::Tensor &bias, WeightLayout layout) {
if (!enabled())
    return std::nullopt;
#ifndef BMT_WITH_CUBLASLT
  (void)x, (void)weight, (void)bias, (void)layout;
  return std::nullopt;
#else
  if (!c10::GradMode::is_enabled() || !x.defined() || !weight.defined() ||
      !bias.defined() || !bias.requires_grad() || !x.is_cuda())
    return std::nullopt;
  const c10::ScalarType t = x.scalar_type();
  if ((t != at::kBFloat16 && t != at::kHalf) || weight.scalar_type() != t ||
      bias.scalar_type() != t || weight.device() != x.device() || bias.device() != x.device())
    return std::nullopt;
  if (x.dim() < 2 || weight.dim() != 2 || bias.dim() != 1 || !x.is_contiguous() ||
      !weight.is_contiguous() || !bias.is_contiguous() || x.numel() == 0)
    return std::nullopt;
  const int64_t in = layout == WeightLayout::InOut ? weight.size(0) : weight.size(1);
  const int64_t out = layout == WeightLayout::InOut ? weight.size(1) : weight.size(0);
  // Leading dimensions of multiples of 8 elements keep 16-byte rows.
  if (x.size(-1) != in || bias.size(0) != out || in % 8 != 0 || out % 8 != 0)
    return std::nullopt;
  return LinearBiasFunction::apply(x, weight, bias, static_cast<int64_t>(layout));
#endif
}

LinearStats linearStats() { return {epilogueCount.load(), fallbackCount.load()}; }

} // namespace bmt::runtime::ops
