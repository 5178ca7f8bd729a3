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

class Comm;

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

/// Vocab-parallel cross-entropy (tensor parallelism; Megatron-LM's
/// vocab_parallel_cross_entropy, Shoeybi et al. 2019): `logits` [rows,
/// Vlocal] are the vocab entries [vocabStart, vocabStart + Vlocal) of the
/// (padded) vocabulary on this rank of `tensorComm`; entries at index >=
/// vocabSize (padding) are ignored (taken as -inf). The rows' maximum, sum
/// of exponentials and the label's logit are reduced over `tensorComm`, so
/// no rank holds [rows, vocab] logits. Returns what crossEntropy() returns
/// on the gathered logits (the same on every rank of the group): the mean
/// over rows whose label is not ignoreIndex, float32 (float64 for float64
/// logits), with autograd to this rank's `logits` (gradient softmax minus
/// the label's one-hot, over the count; zero at padding entries).
/// labels: int64 [rows], the same on every rank, in [0, vocabSize) or
/// ignoreIndex (checked on CPU tensors: std::invalid_argument). Collective
/// over `tensorComm` in forward (three all-reduces), none in backward.
/// Throws std::invalid_argument on other shapes or dtypes.
at::Tensor vocabParallelCrossEntropy(const at::Tensor &logits, const at::Tensor &labels,
                                     Comm &tensorComm, int64_t vocabStart, int64_t vocabSize,
                                     int64_t ignoreIndex = -100);

/// Whether crossEntropy() would use the fused CUDA kernels for `logits`.
bool fusedCrossEntropyApplies(const at::Tensor &logits);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OBJECTIVES_CROSSENTROPY_H
