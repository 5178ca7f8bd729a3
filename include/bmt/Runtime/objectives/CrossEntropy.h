//===- CrossEntropy.h - the language-model loss ----------------*- C++ -*-===//
//
// Mean softmax cross-entropy of logits against labels, as
// torch.nn.functional.cross_entropy(logits.float(), labels, ignore_index)
// computes it. On CUDA (float32, bfloat16 or float16 logits, in a build
// with the runtime's CUDA kernels) it runs fused kernels
// (runtime/kernels/CrossEntropy.cu) that never write a [rows, vocab]
// float32 tensor in forward and write the logits' gradient in their own
// dtype in backward; elsewhere ATen's log_softmax + nll_loss on float32.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OBJECTIVES_CROSSENTROPY_H
#define BMT_RUNTIME_OBJECTIVES_CROSSENTROPY_H

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace bmt::runtime {

/// Mean cross-entropy over the rows whose label is not ignoreIndex: a
/// float32 scalar (float64 for float64 logits) with autograd to `logits`.
/// logits: [rows, vocab] floating point; labels: int64 [rows] with values
/// in [0, vocab) or ignoreIndex. The fused CUDA path gives NaN for a label
/// out of range (ATen's path raises). NaN when every label is ignored (as
/// torch). Throws std::invalid_argument on other shapes or dtypes.
/// The environment variable BMT_FUSED_CROSS_ENTROPY=0 selects the ATen path
/// on CUDA too (for comparisons).
at::Tensor crossEntropy(const at::Tensor &logits, const at::Tensor &labels,
                        int64_t ignoreIndex = -100);

/// Whether crossEntropy() would use the fused CUDA kernels for `logits`.
bool fusedCrossEntropyApplies(const at::Tensor &logits);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OBJECTIVES_CROSSENTROPY_H
