//===- SplitRule.cpp - a tensor's split over a group of ranks -------------===//

#include "bmt/Plan/SplitRule.h"

#include <algorithm>

namespace bmt::split {

std::string check(const TensorSplit &s, int64_t rank, int64_t size, int64_t tp) {
  if (s.dim < -1 || s.dim >= rank)
    return "dim " + std::to_string(s.dim) + " is out of range for a " + std::to_string(rank) +
           "-d tensor";
  if (s.chunks < 1)
    return "chunks must be at least 1 (it is " + std::to_string(s.chunks) + ")";
  if (s.paddedSize < 0)
    return "padded_size must not be negative";
  if (s.dim < 0) {
    if (s.over == SplitGroup::Expert)
      return "an expert split needs split dim 0 (it is -1)";
    return s.chunks != 1 || s.paddedSize != 0 ? "chunks and padded_size need a split dim (it is -1)"
                                               : "";
  }
  if (s.over == SplitGroup::Expert && (s.dim != 0 || s.chunks != 1 || s.paddedSize != 0))
    return "an expert split is of dim 0 (the experts), chunks 1 and no padded_size (it is dim " +
           std::to_string(s.dim) + ", chunks " + std::to_string(s.chunks) + ", padded_size " +
           std::to_string(s.paddedSize) + ")";
  if (s.reduceGrad)
    return "reduce_grad is for replicated tensors (split dim is " + std::to_string(s.dim) + ")";
  if (s.paddedSize != 0 && s.chunks != 1)
    return "padded_size with chunks > 1";
  if (size >= 0 && s.paddedSize != 0 && s.paddedSize < size)
    return "padded_size " + std::to_string(s.paddedSize) + " is smaller than dim " +
           std::to_string(s.dim) + " (" + std::to_string(size) + ")";
  int64_t padded = s.paddedSize ? s.paddedSize : size;
  if (padded >= 0 && tp > 0 && padded % (s.chunks * tp) != 0)
    return "dim " + std::to_string(s.dim) + " of size " + std::to_string(padded) +
           (s.over == SplitGroup::Expert
                ? " is not a multiple of expert_parallel (" + std::to_string(tp) + ")"
                : " is not a multiple of chunks (" + std::to_string(s.chunks) +
                      ") times tensor_parallel (" + std::to_string(tp) + ")");
  return "";
}

int64_t paddedSize(const TensorSplit &s, int64_t size) { return s.paddedSize ? s.paddedSize : size; }

std::vector<int64_t> localShape(const std::vector<int64_t> &shape, const TensorSplit &s, int64_t tp) {
  std::vector<int64_t> local = shape;
  if (s.dim >= 0 && s.dim < static_cast<int64_t>(shape.size()) && tp > 0)
    local[s.dim] = paddedSize(s, shape[s.dim]) / tp;
  return local;
}

int64_t localNumel(const std::vector<int64_t> &shape, const TensorSplit &s, int64_t tp) {
  int64_t n = 1;
  for (int64_t d : localShape(shape, s, tp))
    n *= d;
  return n;
}

std::vector<Range> tpRanges(const TensorSplit &s, int64_t size, int64_t tp, int64_t t) {
  std::vector<Range> ranges;
  if (!s.isSplit())
    return ranges;
  const int64_t chunk = paddedSize(s, size) / s.chunks, piece = chunk / tp;
  for (int64_t c = 0; c < s.chunks; ++c) {
    const int64_t global = c * chunk + t * piece;
    const int64_t length = std::min(piece, size - global);
    if (length > 0)
      ranges.push_back({c * piece, global, length});
  }
  return ranges;
}

Range localToGlobal(const TensorSplit &s, int64_t size, int64_t tp, int64_t t, int64_t local) {
  const int64_t chunk = paddedSize(s, size) / s.chunks, piece = chunk / tp;
  const int64_t c = local / piece, global = c * chunk + t * piece + local % piece;
  int64_t length = piece - local % piece; // to the piece's end
  if (global < size)
    length = std::min(length, size - global); // to the data's end
  return {local, global, length};
}

Location globalToLocal(const TensorSplit &s, int64_t size, int64_t tp, int64_t global) {
  const int64_t chunk = paddedSize(s, size) / s.chunks, piece = chunk / tp;
  const int64_t c = global / chunk, w = global % chunk, t = w / piece;
  const int64_t end = std::min(size, c * chunk + (t + 1) * piece);
  return {t, {c * piece + w % piece, global, end - global}};
}

} // namespace bmt::split
