//===- CommInternal.h - helpers shared by the Comm backends -----*- C++ -*-===//
//
// Private to runtime/Comm*.cpp: message prefixes, argument checks that every
// backend applies before a collective, and a Work that is already done.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_COMMINTERNAL_H
#define BMT_RUNTIME_COMMINTERNAL_H

#include "bmt/Runtime/comm/Comm.h"

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace bmt::runtime::detail {

/// "rank 1 of 4 (world)".
std::string who(int64_t rank, int64_t size, const std::string &name);
inline std::string who(const Comm &c) { return who(c.rank(), c.size(), c.name()); }

/// "30 s", "1.5 s", "0.25 s".
std::string seconds(std::chrono::milliseconds d);

/// "ranks 2, 3" / "rank 3".
std::string rankList(const std::vector<int64_t> &ranks);

/// The first line of an exception's text (c10::Error's what() carries a
/// C++ backtrace after it).
std::string firstLine(const std::string &text);

/// Checks `t` before a collective `op` of `comm`: defined, contiguous, on
/// an acceptable device (`deviceOk`, described by `deviceWhat`). Throws
/// CommError "rank r of N (name): op: <what> ...".
void checkTensor(const Comm &comm, const char *op, const char *what, const at::Tensor &t,
                 const std::function<bool(const at::Tensor &)> &deviceOk,
                 const std::string &deviceWhat);

/// out.numel() == in.numel() * size(), same dtype and device (allGather).
void checkGather(const Comm &comm, const char *op, const at::Tensor &out, const at::Tensor &in);
/// in.numel() == out.numel() * size(), same dtype and device, a dtype that
/// can be reduced (reduceScatter).
void checkScatter(const Comm &comm, const char *op, const at::Tensor &out, const at::Tensor &in);
/// allToAll's arguments: one count per rank, none negative; in and out of
/// one dtype and device, at least 1-dimensional, rows (dim 0) of the same
/// number of elements, sum(sendCounts) rows in `in` and sum(recvCounts) in
/// `out`, as many rows sent to this rank as received from it, not
/// overlapping.
void checkAllToAll(const Comm &comm, const char *op, const at::Tensor &out, const at::Tensor &in,
                   const std::vector<int64_t> &sendCounts, const std::vector<int64_t> &recvCounts);
/// One count per rank, none negative (`what`: "sendCounts", "recvCounts").
void checkCounts(const Comm &comm, const char *op, const char *what,
                 const std::vector<int64_t> &counts);
/// Elements per row (dim 0) of a tensor of at least one dimension.
int64_t rowNumel(const at::Tensor &t);
/// A dtype that can be reduced: floating, integral or bool.
void checkReducible(const Comm &comm, const char *op, const at::Tensor &t);
/// 0 <= root < size().
void checkRoot(const Comm &comm, const char *op, int64_t root);

/// CommError unless `peer` is a rank of `comm` other than its own, and `t`
/// contiguous (send, recv).
void checkPeer(const Comm &comm, const char *op, int64_t peer, const at::Tensor &t);

/// A Work that is already done.
class DoneWork : public Work {
public:
  void wait() override {}
};

/// Parses a BMT_COMM_TIMEOUT_S value (seconds > 0, fractions allowed);
/// CommError naming the variable otherwise.
std::chrono::milliseconds parseTimeoutSeconds(const std::string &value);

/// Timeout to use: `t` if positive, else defaultCommTimeout().
std::chrono::milliseconds resolveTimeout(std::chrono::milliseconds t);

} // namespace bmt::runtime::detail

#endif // BMT_RUNTIME_COMMINTERNAL_H
