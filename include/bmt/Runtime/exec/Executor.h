//===- Executor.h - run a plan through the ATen dispatcher ------*- C++ -*-===//
//
// Executes the plan's functions instruction by instruction, calling each
// operator through c10::Dispatcher (so autograd records the graph exactly as
// in eager PyTorch); no TorchScript interpreter is involved. The few
// TorchScript-only operators a trace contains (aten::Int, aten::Float,
// aten::ScalarImplicit, aten::dim) and prim::NumToTensor are implemented here.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXEC_EXECUTOR_H
#define BMT_RUNTIME_EXEC_EXECUTOR_H

#include "bmt/Plan/Plan.h"
#include "bmt/Runtime/comm/Comm.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace bmt::fusion {
class FusedRegion;
}

namespace bmt::runtime {

namespace moe {
class ExpertLoad;
}
struct RecomputePlan;
class RecomputePlans;

/// An operator failed, or the plan cannot run. The message names the
/// function, the operator and its source location.
class ExecutionError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// What the executor delegates to the ZeRO runtime (Zero.h): the values of
/// sharded parameters, the plan's gather/release instructions and the calls
/// of blocks (which may be checkpointed). Without hooks every tensor comes
/// from the executor's own list, gather/release do nothing and blocks are
/// plain calls.
class ExecutorHooks {
public:
  virtual ~ExecutorHooks();
  /// The value of plan tensor `index`, a member of a storage group (plan
  /// TensorInfo::group >= 0): its shape and dtype, on the run device.
  virtual at::Tensor global(int64_t index) = 0;
  /// Instruction Gather / Release of storage group `group`.
  virtual void gather(int64_t group) = 0;
  virtual void release(int64_t group) = 0;
  /// Runs the call `inst` of a block: `run(args)` executes the callee;
  /// `recompute(args)` too, for a run whose results are used only for
  /// their autograd graph (a checkpointed block's backward): it may
  /// leave values that only those results need uncomputed
  /// (runtime/exec/Recompute.h), so its results' values are unspecified.
  using Run = std::function<std::vector<c10::IValue>(std::vector<c10::IValue>)>;
  virtual std::vector<c10::IValue> callBlock(const plan::Instruction &inst, const Run &run,
                                             const Run &recompute,
                                             std::vector<c10::IValue> args) = 0;
  /// Where the gradient of `param` (a tensor global() returned) may be
  /// written by the operator that computes it, in the backward of the
  /// current forward pass, so that no copy follows: a contiguous tensor of
  /// param's shape and dtype, or undefined (none: the operator makes its
  /// own). A slot is given once per forward pass. Default: none.
  virtual at::Tensor gradientSlot(const at::Tensor &param);
  /// The slot of `param` already given in the current backward (its
  /// operator has written it: a tied embedding's other use may add into
  /// it), or undefined. Default: none.
  virtual at::Tensor givenGradientSlot(const at::Tensor &param);
};

/// Watches an executor's runs (train/Inspect.h): the results of block
/// calls, and, while `checkInstructions` is set, of every instruction.
/// Without an observer (the default) the executor does nothing extra.
class ExecutorObserver {
public:
  virtual ~ExecutorObserver();
  /// After the call `inst` of a block (Instruction::blockList non-empty)
  /// returned `results`, in the function that calls the block.
  virtual void blockReturned(const plan::Instruction &inst,
                             const std::vector<c10::IValue> &results) = 0;
  /// While checkInstructions is set: after instruction `index` of function
  /// `function` (of kind Aten, Fused or Global) wrote its results into
  /// `registers` (the function's registers; its arguments are there too).
  virtual void instructionDone(size_t function, size_t index,
                               const std::vector<c10::IValue> &registers) = 0;
  bool checkInstructions = false;
};

class Executor {
public:
  /// Prepares `plan` to run on `device`: resolves every operator's schema
  /// and converts constant arguments to the schema's types. Device constants
  /// in the program (a trace records "cpu") are replaced by `device`. On a
  /// GPU, aten::to copies of host tensors to the device are made from
  /// pinned memory without blocking the host (a trace's host constants).
  /// `tensors` are the plan's parameters and buffers, by plan index, already
  /// on `device`; the executor reads them at every run, so the caller may
  /// replace their contents (optimizer steps) in place.
  /// Throws ExecutionError for an operator LibTorch does not have.
  Executor(const plan::Plan &plan, std::vector<at::Tensor> tensors,
           at::Device device);
  ~Executor();

  /// Runs the entry function. `inputs` are its arguments in order
  /// (input_ids: int64 [batch, seq]; attention_mask: int64 [batch, seq]);
  /// returns its results (logits: float [batch, seq, vocab]). Autograd is
  /// recorded when parameters require grad and grad mode is on.
  /// Throws ExecutionError naming the failing operator.
  std::vector<c10::IValue> run(const std::vector<c10::IValue> &inputs);

  /// Routes sharded parameters, gather/release and block calls to `hooks`
  /// (not owned; must outlive the executor's runs). Null: no ZeRO.
  void setHooks(ExecutorHooks *hooks) { hooks_ = hooks; }
  /// Runs the tensor-parallel instructions (TpAllReduce, TpCopy, TpRank,
  /// TpAllGather, TpReduceScatter) over `tensorComm`, the TP group (not
  /// owned; must outlive the runs). Null (the default): a TP group of one,
  /// where they are identities and TpRank is 0. Each runs as an autograd
  /// function, so that a recomputed (checkpointed) block runs it again and
  /// the backward issues the matching collective (Megatron-LM's f and g:
  /// Shoeybi et al. 2019, "Megatron-LM", section 3).
  void setTensorParallel(Comm *tensorComm) { tensorComm_ = tensorComm; }
  /// Reports block results (and instructions) to `observer` (not owned;
  /// null: none).
  void setObserver(ExecutorObserver *observer) { observer_ = observer; }
  /// Adds every MoeDispatch's tokens per expert to `load` (not owned;
  /// null, the default: not counted), except in the recompute of a
  /// checkpointed block.
  void setExpertLoad(moe::ExpertLoad *load) { expertLoad_ = load; }
  /// Expert parallelism: runs MoeDispatch / MoeCombine over `expertComm`,
  /// the expert group (not owned; null, the default: every expert local).
  void setExpertParallel(Comm *expertComm) { expertComm_ = expertComm; }
  /// Whether LoRA adapters (lora_adapter instructions) apply their dropout:
  /// on in training (the default), off for evaluation as peft's model.eval()
  /// (no mask drawn). The program's own dropouts run as traced.
  void setAdapterDropout(bool on) { adapterDropout_ = on; }

  /// The parameters and buffers, by plan index (undefined for members of
  /// storage groups, which the hooks provide).
  std::vector<at::Tensor> &tensors() { return tensors_; }
  const plan::Plan &plan() const { return plan_; }
  /// The fused regions of the plan's Fused instructions that the generator
  /// takes (one per instruction), in plan order.
  std::vector<fusion::FusedRegion *> fusedRegions() const;
  /// Pipeline parallelism (docs/runtime/pipeline.md): from now on run()
  /// runs only stage `stage` of the plan's pipeline: in the function that
  /// calls the blocks of plan.pipelineBlockList and in each function on the
  /// way down to it from the entry, stage 0 the instructions before the
  /// cut after its last block, stage P - 1 those after the cut before its
  /// first block, a middle stage its blocks only; Gather / Release of a
  /// storage group run where `heldGroups[group]`, never elsewhere; a
  /// parameter (Global) or constant a stage reads across a cut it loads
  /// itself. The non-parameter values live across this stage's first cut
  /// (stage > 0) are taken from stageInputs (set them before run(), in the
  /// order of stageInputCount()); those live across its last cut (stage <
  /// P - 1) are left in stageOutputs by run(). The entry's results are
  /// meaningful on the last stage only. Throws ExecutionError for a plan
  /// whose block list is not found in one function on the entry's call
  /// chain, naming it.
  void setPipelineStage(int64_t stage, std::vector<bool> heldGroups);
  /// Virtual stages (plan.pipelineVirtualStages V > 1): this rank runs the
  /// chunks `chunks` (global chunk indices; a chunk is cut as a stage of P x
  /// V stages is above), chunk i's Gather / Release where heldGroups[i];
  /// selectPipelineChunk(i) picks the one the next run() runs (0 at
  /// first). Throws as setPipelineStage; std::out_of_range for an i not
  /// given.
  void setPipelineChunks(const std::vector<int64_t> &chunks,
                         const std::vector<std::vector<bool>> &heldGroups);
  void selectPipelineChunk(size_t i) { stage_ = stagePlans_.at(i).get(); }
  /// The storage groups (by plan group) whose members each stage (each
  /// chunk, with virtual stages) of `plan`'s pipeline reads: through the
  /// Global instructions it runs, in the functions those run call.
  /// [stage or chunk][group]. Throws as setPipelineStage.
  static std::vector<std::vector<bool>> stageGroups(const plan::Plan &plan);
  std::vector<c10::IValue> stageInputs, stageOutputs;
  struct StagePlan; ///< (runtime/exec/Stage.h)

  /// Instructions run without computing their value in recomputes
  /// (ExecutorHooks::callBlock's `recompute`) since construction.
  int64_t recomputeSkips() const { return recomputeSkips_; }

private:
  struct Prepared;
  /// Marks the aten::embedding instructions whose weight has one other
  /// reader, a linear layer, each run once a pass (a tied LM head): their
  /// backward may add into the slot the linear layer's was given.
  void markTiedEmbeddings();
  /// `graphOnly`: the plan of a run whose results' values are unused
  /// (null: every instruction runs as usual).
  /// `chainDepth`: the depth of a pipeline stage's call chain this call is
  /// (the entry 0), -1 outside it.
  std::vector<c10::IValue> call(size_t function, std::vector<c10::IValue> args,
                                const RecomputePlan *graphOnly = nullptr, int chainDepth = -1);
  std::vector<std::unique_ptr<StagePlan>> stagePlans_; ///< a stage's, or each chunk's
  StagePlan *stage_ = nullptr;                        ///< the one run() runs

  const plan::Plan &plan_;
  std::vector<at::Tensor> tensors_;
  at::Device device_;
  ExecutorHooks *hooks_ = nullptr;
  ExecutorObserver *observer_ = nullptr;
  Comm *tensorComm_ = nullptr;
  moe::ExpertLoad *expertLoad_ = nullptr;
  Comm *expertComm_ = nullptr;
  bool adapterDropout_ = true;
  int recomputing_ = 0; ///< depth of ExecutorHooks::callBlock recomputes running
  std::vector<std::vector<std::unique_ptr<Prepared>>> prepared_; // [function][instruction]
  std::unique_ptr<RecomputePlans> recomputePlans_;
  int64_t recomputeSkips_ = 0;
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_EXEC_EXECUTOR_H
