//===- Comm.h - collective communication (CPU reference and NCCL) -*- C++ -*-===//
//
// The runtime's communication seam: one interface (Comm, Work) and three
// implementations, chosen by connect() in Rendezvous.h or built directly:
//
//   - the CPU reference backend (createCpuComm): CPU tensors, over a
//     c10d::Store (TCPStore for real jobs, HashStore in tests). Correct and
//     deterministic, not fast: every byte goes through the store.
//   - the NCCL backend (createNcclComm): CUDA tensors, a wrapped
//     c10d::ProcessGroupNCCL (its own high-priority streams and events).
//   - the local backend (createLocalComm): one rank, any device; every
//     collective is a local copy (or nothing), no store.
//
// Conventions of every collective (all backends):
//   - Every rank of the communicator calls the same collectives, with the
//     same arguments' shapes and dtype, in the same order (like MPI and NCCL).
//   - Tensors are contiguous, on the communicator's device kind (CPU for the
//     CPU backend, the communicator's CUDA device for NCCL), of one dtype.
//     Only numel() matters, not the shape (a [2, 3] output is 6 elements),
//     except for allToAll, whose counts are rows along dim 0.
//   - Argument errors found locally (non-contiguous, wrong device, numel that
//     does not fit size(), dtype mismatch between out and in, allToAll's
//     counts that do not fit the tensors or the ranks) throw CommError
//     from the call itself. Errors that need the peers (timeouts, a peer that
//     passed another numel/dtype or called another collective, a broken
//     connection) surface as CommError from Work::wait() (CPU backend) or
//     from the NCCL watchdog (see createNcclComm).
//   - CommError messages name this rank, the communicator and the
//     collective with its sequence number on that communicator, e.g.
//     "rank 1 of 4 (world): all_gather #17 timed out after 30 s waiting for rank 3".
//   - Results are bit-identical on every rank (the CPU backend reduces in
//     rank order 0..N-1; NCCL's reductions are identical on all ranks too).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_COMM_COMM_H
#define BMT_RUNTIME_COMM_COMM_H

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace c10d {
class Store;
} // namespace c10d

namespace bmt::runtime {

/// A failed collective or rendezvous. The message names the rank, the
/// communicator and the collective (or, for the rendezvous, the environment
/// variable) and what happened: a timeout after N s and the ranks waited
/// for, a peer's mismatched arguments, or the store/NCCL error text.
class CommError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Reduction of allReduce and reduceScatter. Sum adds the ranks'
/// contributions; Max takes the elementwise maximum (NaN wins, so a
/// found-inf/NaN flag survives: the CPU backend follows at::maximum, NCCL
/// follows its own max). Bool tensors: Sum is logical or, Max too.
enum class ReduceOp { Sum, Max };

/// "sum" or "max" (for messages).
const char *reduceOpName(ReduceOp op);

/// Handle of an asynchronous collective. The tensors passed to the
/// collective must stay alive and must not be touched (read or written) by
/// the caller until wait() returned; the Work keeps references to them.
class Work {
public:
  virtual ~Work();
  /// CPU and local backends: blocks until the collective is done (the
  /// output holds the result). NCCL: makes the current CUDA stream wait for
  /// the collective (no host blocking, unless TORCH_NCCL_BLOCKING_WAIT=1);
  /// outputs are valid for work queued on the current stream afterwards.
  /// Throws CommError on timeout or failure. Calling it again returns at
  /// once (or throws the same error again).
  virtual void wait() = 0;
};

class Comm {
public:
  virtual ~Comm();

  /// This process's rank within the communicator, in [0, size()).
  virtual int64_t rank() const = 0;
  /// Number of ranks (>= 1).
  virtual int64_t size() const = 0;
  /// Name for messages: "world", "shard", "replica", ...
  virtual std::string name() const = 0;
  /// "cpu", "nccl" or "local".
  virtual std::string backend() const = 0;
  /// The device of the tensors the collectives take: CPU for the CPU
  /// backend, cuda:i for NCCL; the local backend takes any device
  /// (reported as CPU).
  virtual at::Device device() const = 0;
  /// The limit of every blocking wait of this communicator (its
  /// sub-communicators inherit it).
  virtual std::chrono::milliseconds timeout() const = 0;

  /// Gathers every rank's `in` (n = in.numel() elements) into `out`
  /// (out.numel() == n * size()): rank r's input lands at elements
  /// [r*n, (r+1)*n) of `out`, as ncclAllGather / torch's
  /// all_gather_into_tensor. `in` may be a view of its own slot in `out`
  /// (in-place gather, as ZeRO keeps the local shard inside the gathered
  /// buffer). Any dtype.
  virtual std::shared_ptr<Work> allGather(at::Tensor out, at::Tensor in) = 0;

  /// Reduces `in` (in.numel() == n * size(), n = out.numel()) over the
  /// ranks and scatters it: rank r's `out` = op over ranks q = 0..N-1 of
  /// rank q's in[r*n, (r+1)*n), as ncclReduceScatter / torch's
  /// reduce_scatter_tensor. `out` may be a view of its own slot in `in`.
  /// Dtypes: float32/64, bf16, fp16, integers, bool.
  virtual std::shared_ptr<Work> reduceScatter(at::Tensor out, at::Tensor in,
                                              ReduceOp op = ReduceOp::Sum) = 0;

  /// Uneven all-to-all by rows (MPI_Alltoallv; torch's all_to_all_single
  /// with split sizes), the exchange of expert parallelism's token dispatch
  /// and combine. Rows are slices along dim 0 (in.dim() and out.dim() >= 1,
  /// the same number of elements per row). `in` holds sum(sendCounts) rows:
  /// the first sendCounts[0] go to rank 0, the next sendCounts[1] to rank
  /// 1, ... `out` holds sum(recvCounts) rows: recvCounts[q] rows from rank
  /// q, in rank order. Counts are row counts, one per rank of this
  /// communicator, >= 0 (zeros allowed). Rank q's sendCounts[r] must equal
  /// rank r's recvCounts[q] (allToAllCounts gives them): the CPU backend
  /// reports a mismatch as CommError from wait() on the receiving rank, NCCL
  /// does not check it. `out` must not overlap `in`. Any dtype.
  virtual std::shared_ptr<Work> allToAll(at::Tensor out, at::Tensor in,
                                         const std::vector<int64_t> &sendCounts,
                                         const std::vector<int64_t> &recvCounts) = 0;

  /// In place: every rank's `t` becomes op over the ranks' `t`
  /// (ncclAllReduce). Dtypes as reduceScatter.
  virtual std::shared_ptr<Work> allReduce(at::Tensor t, ReduceOp op = ReduceOp::Sum) = 0;

  /// In place: every rank's `t` becomes rank `root`'s `t` (ncclBroadcast).
  /// root in [0, size()) (CommError otherwise). Any dtype.
  virtual std::shared_ptr<Work> broadcast(at::Tensor t, int64_t root) = 0;

  /// Point-to-point (pipeline parallelism's activations and their
  /// gradients): sends `t` to rank `peer` of this communicator, which
  /// receives it with recv(t', this rank). The k-th send to a peer matches
  /// the peer's k-th recv from this rank (same numel and dtype; the CPU
  /// backend reports a mismatch as CommError from the receiver's wait()).
  /// Only the two ranks take part; `peer` must be another rank (CommError
  /// otherwise). CPU backend: a send is done once its bytes are in the
  /// store, a recv waits for them (timeout). Any dtype, contiguous.
  virtual std::shared_ptr<Work> send(at::Tensor t, int64_t peer) = 0;
  /// Receives into `t` (contiguous) what rank `peer` sends; see send().
  virtual std::shared_ptr<Work> recv(at::Tensor t, int64_t peer) = 0;

  /// Blocks until every rank has called barrier() (and, for the CPU
  /// backend, every earlier collective of this rank is done). CommError on
  /// timeout.
  virtual void barrier() = 0;

  /// Sub-communicator of the ranks that pass the same `color` (>= 0),
  /// ordered by `key`, ties by rank in this communicator (MPI_Comm_split).
  /// A rank passing a negative color joins no group and gets nullptr.
  /// Every rank of this communicator must call it, in the same order with
  /// respect to the other collectives; it blocks until every rank has
  /// called it (timeout: CommError). `name` is the new communicator's name
  /// in messages. Sub-communicators have their own keys/NCCL communicators
  /// and can be used concurrently with their parent; they must not outlive
  /// the parent's store.
  virtual std::unique_ptr<Comm> split(int64_t color, int64_t key, const std::string &name) = 0;
};

/// The row counts this rank receives in an allToAll where it sends
/// sendCounts[r] rows to rank r: entry q is rank q's sendCounts[this rank]
/// (an all-to-all of one int64 per rank, waited; on NCCL one host sync).
/// CommError, on every rank that passes them, for counts that are not one
/// per rank or negative.
std::vector<int64_t> allToAllCounts(Comm &comm, const std::vector<int64_t> &sendCounts);

/// The default timeout of blocking waits: 300 s, or the value of the
/// environment variable BMT_COMM_TIMEOUT_S (seconds, > 0, fractions
/// allowed) when it is set. CommError naming the variable if it is not a
/// positive number.
std::chrono::milliseconds defaultCommTimeout();

/// Settings shared by the backends' factories.
struct CommOptions {
  /// Name in messages.
  std::string name = "world";
  /// Limit of every blocking wait (store waits; NCCL's watchdog timeout).
  /// Zero means defaultCommTimeout().
  std::chrono::milliseconds timeout{0};
  /// Prefix of every store key this communicator and its sub-communicators
  /// use (must be unique per communicator among those sharing a store, and
  /// the same on every rank). Keys look like "<prefix>/<seq>/<rank>".
  std::string keyPrefix = "bmt/world";
};

/// CPU reference backend over `store` (every rank of the communicator
/// passes a store connected to the same server, its own rank in [0, size)
/// and the same size and options). The communicator and each of its
/// sub-communicators talk through their own store->clone() (a TCPStore
/// connection serializes its requests, so a blocked wait would stall
/// everything else on it) and keep `store` alive. Collectives run in issue order on one
/// background thread per communicator, so the returned Work is truly
/// asynchronous; a failed collective breaks the communicator (later ones
/// fail at once with CommError).
///
/// Algorithm (key "<prefix>/<seq>/..." per collective, seq counting from 1;
/// each value is a 16-byte header {collective, dtype, numel} + raw bytes):
///   - all_gather: rank r sets "<seq>/<r>" to its input and gets the
///     others'; broadcast: the root sets "<seq>/<root>", the others get it;
///   - reduce_scatter: rank q sets "<seq>/<q>/<r>" to its slot r for every
///     r != q; rank r gets its N-1 slots;
///   - all_reduce: rank r sets "<seq>/<r>" to its tensor and gets all;
///   - all_to_all: rank q sets "<seq>/<q>/<r>" to its rows for rank r for
///     every r != q (an empty value when it sends none); rank r gets its N-1
///     values and deletes them (their sizes differ, so no "done" counter);
///   - reductions run in rank order 0..N-1 in float64 (floating dtypes) or
///     int64 (integers, bool) and round once to the tensor's dtype: the
///     result is bit-identical on every rank;
///   - the header is checked: a peer that passed another collective, dtype
///     or numel gives a CommError naming it;
///   - every wait is a store wait with the communicator's timeout (one
///     deadline for the whole collective); on expiry the CommError lists the
///     ranks whose keys are still missing;
///   - a value over 4 MiB is stored in 4 MiB pieces, "<key>/+1", "<key>/+2",
///     ... after the first, which is <key>'s and is set last (TCPStore's
///     libuv server, torchrun's, refuses messages over 8 MiB);
///   - after reading, each rank adds 1 to "<seq>/done"; the rank that brings
///     it to size() deletes the collective's keys.
/// Throws CommError for rank/size out of range.
std::unique_ptr<Comm> createCpuComm(c10::intrusive_ptr<c10d::Store> store, int64_t rank,
                                    int64_t size, const CommOptions &options = {});

/// A communicator of one rank (rank 0 of 1) without a store: allGather,
/// reduceScatter and allToAll copy in to out (nothing if they alias),
/// allReduce and broadcast leave the tensor as it is, barrier returns, split
/// gives another local communicator. Works on any device (copies go on the
/// current CUDA stream for CUDA tensors); argument checks as the other
/// backends.
std::unique_ptr<Comm> createLocalComm(const CommOptions &options = {});

/// The CPU backend for tensors on `device` (a GPU): each operation copies
/// its tensors to host memory (after the current stream's work), runs
/// `cpu`'s operation (createCpuComm's) on the copies, and its Work's
/// wait() copies the results back on the current stream. backend() is
/// "cpu-host-staged", device() `device`. For several ranks sharing one
/// GPU, which NCCL refuses (BMT_DEBUG_COMM=host; tests of the GPU paths of
/// the parallel modes on a one-GPU machine), slow by design. CommError for
/// a `cpu` of another backend.
std::unique_ptr<Comm> createHostStagedComm(std::unique_ptr<Comm> cpu, at::Device device);

/// A check the CPU backend's Work::wait() makes about once a second while
/// the collective `what` ("rank 0 of 2 (world): all_reduce #57") is not
/// done, the wait having begun at `waitStart`: it returns to go on
/// waiting, or ends the process (a stop signal received while a peer does
/// not answer: StopSignal.h installs one). Null: none (the default).
using WaitCheck = void (*)(const std::string &what, std::chrono::steady_clock::time_point waitStart);
void setWaitCheck(WaitCheck check);

/// True when this build has the NCCL backend (LibTorch's CUDA build).
bool ncclAvailable();

/// NCCL backend for CUDA tensors on `device` (cuda:LOCAL_RANK; made the
/// current device). Wraps c10d::ProcessGroupNCCL over a
/// c10d::PrefixStore(options.keyPrefix + "/nccl", store), with
/// high-priority streams and options.timeout as its watchdog timeout.
/// Collectives are enqueued on the process group's stream after the
/// current stream's pending work; Work::wait() makes the current stream
/// wait for them. Timeouts and NCCL errors: ProcessGroupNCCL's watchdog
/// aborts the communicator and, by default (TORCH_NCCL_ASYNC_ERROR_HANDLING
/// unset), ends the process, logging "[Rank r] Watchdog caught collective
/// operation timeout: WorkNCCL(SeqNum=k, OpType=ALLREDUCE, ...)". With
/// TORCH_NCCL_BLOCKING_WAIT=1 (and TORCH_NCCL_ASYNC_ERROR_HANDLING=2 to keep
/// the process alive) wait() blocks the host and throws CommError instead:
/// "rank 0 of 2 (world): all_reduce #2 timed out after 3 s: [Rank 0]
/// Watchdog caught ..." (seen on 2 H200s). split() all-gathers the
/// (color, key) pairs over NCCL (one host sync) and builds a new
/// ProcessGroupNCCL over PrefixStore(prefix + "/s<seq>c<color>/nccl").
/// Throws CommError when NCCL is not available in this build or the device
/// is not CUDA.
std::unique_ptr<Comm> createNcclComm(c10::intrusive_ptr<c10d::Store> store, int64_t rank,
                                     int64_t size, at::Device device,
                                     const CommOptions &options = {});

} // namespace bmt::runtime

#endif // BMT_RUNTIME_COMM_COMM_H
