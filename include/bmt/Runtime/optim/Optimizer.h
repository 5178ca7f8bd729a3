//===- Optimizer.h - the optimizer interface --------------------*- C++ -*-===//
//
// What the trainer calls on an optimizer, whichever it is (AdamW, SGD, Lion,
// Adafactor on the device, OffloadAdamW with its state in host memory): one step over the
// parameters it was built with (a rank's ZeRO shards, or the replicated
// parameters), clearing the gradients, and its state as named tensors and
// scalars, which it saves and loads itself (a checkpoint's unit, in the
// manner of torch.optim.Optimizer.state_dict / load_state_dict).
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_OPTIM_OPTIMIZER_H
#define BMT_RUNTIME_OPTIM_OPTIMIZER_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace bmt::runtime {

/// One step's inputs besides the gradients (each parameter's .grad(), or the
/// host copies an offloaded optimizer is fed). Every tensor has one element
/// and lives on the parameters' device.
struct StepInputs {
  double lr = 0;
  /// Non-zero: an inf/NaN gradient on some rank; the step changes nothing
  /// (parameters, moments, step counts), decided on the device.
  std::optional<at::Tensor> foundInf;
  /// float64: the loss scale the device gradients were unscaled by
  /// (multiplied by float(1 / scale)) since the backward. The device
  /// optimizer reads the unscaled gradients and ignores it; the offloaded
  /// one applies the same unscaling to its host copies.
  std::optional<at::Tensor> lossScale;
  /// With maxNorm > 0: the global norm of the unclipped gradients; the
  /// update clips them to maxNorm as torch.nn.utils.clip_grad_norm_.
  std::optional<at::Tensor> gradNorm;
  double maxNorm = 0;
};

/// An optimizer's state: tensors by name (e.g. "exp_avg.3": the first moment
/// of parameter 3) and scalars by name (e.g. "num_params").
struct OptimizerState {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, double> scalars;
  /// Slots (the "<name>" of "<name>.<i>") whose tensors are not shaped
  /// like parameter i but are the same on every rank of the shard group
  /// (Adafactor's factored row and column statistics of its members): a
  /// checkpoint saves them once (with shard 0) and loads them whole.
  std::set<std::string> replicatedSlots;
};

/// What an optimizer parameter holds: a flat ZeRO shard holds a contiguous
/// piece of its storage group's buffer, which holds the group's member
/// tensors at element offsets (Model::parameterLayouts(); Plan.h's
/// StorageGroup); a replicated parameter is one member, whole. Optimizers
/// use it for the weight-decay groups (a member's number of dimensions)
/// and for Adafactor's factored statistics (a member's shape).
struct ParameterLayout {
  struct Member {
    std::string name;           ///< the plan tensor's name (for messages)
    std::vector<int64_t> shape; ///< its full shape (this TP rank's slice)
    int64_t offset = 0;         ///< its first element in the buffer
    /// Tensor parallelism: the dim of `shape` split over the TP group (-1:
    /// whole on every TP rank), and the whole tensor's shape without the
    /// split's zero padding (empty: `shape`). A statistic over the whole
    /// member (Adafactor's) sums over the TP group along that dim.
    int64_t tpDim = -1;
    std::vector<int64_t> globalShape;
  };
  std::vector<Member> members; ///< in buffer order, not overlapping
  /// The buffer element at the parameter's (flattened) element 0: the
  /// shard's index times the shard size under ZeRO, else 0.
  int64_t begin = 0;
  /// The buffer is split over the shard group (more than one shard): a
  /// statistic over a whole member (Adafactor's) needs the group's sum.
  bool split = false;
};

/// The layout of a tensor that is one member, whole.
ParameterLayout wholeLayout(const at::Tensor &param, const std::string &name = "");

/// Which parameters get weight decay (bmt-run --weight-decay-params).
enum class WeightDecayParams {
  /// Matrices and embeddings (2 or more dimensions) only; biases and
  /// normalization weights (fewer than 2 dimensions) get none, the rule of
  /// Megatron-LM, nanoGPT and the Hugging Face Trainer. The default.
  Matrices,
  All, ///< every parameter (torch.optim with one parameter group)
};

/// Whether a member of shape `shape` gets weight decay under `rule`.
bool decays(const std::vector<int64_t> &shape, WeightDecayParams rule);

/// A member's piece inside an optimizer parameter (flattened): elements
/// [offset, offset + numel) of the parameter are elements [memberOffset,
/// memberOffset + numel) of layout.members[member] (row-major).
struct ParameterPiece {
  size_t member = 0;
  int64_t offset = 0, numel = 0, memberOffset = 0;
};

/// The pieces of `layout`'s members that lie in a parameter of `numel`
/// elements (buffer elements [layout.begin, layout.begin + numel)), in
/// order; members outside it are left out, padding is in no piece.
std::vector<ParameterPiece> piecesOf(const ParameterLayout &layout, int64_t numel);

/// Mixed precision (ZeRO's float32 masters of bf16/fp16 shards, Zero.h): a
/// parameter whose low-precision copy the optimizer writes in its update,
/// and whose gradient it reads as the storage reduced it, so that neither
/// a cast of the gradient to float32 nor a copy of the master into the
/// shard is a pass of its own.
struct LowPrecisionCopy {
  size_t param = 0; ///< an index of params(): a float32 tensor
  /// bfloat16 or float16, param's number of elements and device,
  /// contiguous: after every update that changes the param it holds the
  /// param rounded to nearest even (a copy_ of it).
  at::Tensor copy;
  /// The param's .grad() (float32, bfloat16 or float16, its number of
  /// elements) is gradDivisor times the gradient: ZeRO's sum over the
  /// data-parallel ranks, whose average the optimizer takes itself.
  int64_t gradDivisor = 1;
};

class Optimizer {
public:
  virtual ~Optimizer();

  /// One update of every parameter that has a gradient this step.
  /// Throws std::invalid_argument when maxNorm > 0 without a gradNorm.
  virtual void step(const StepInputs &inputs) = 0;
  /// Sets every parameter's grad to undefined (torch.optim's set_to_none).
  virtual void zeroGrad() = 0;
  /// The tensors the optimizer updates, in the order it was given them.
  virtual const std::vector<at::Tensor> &params() const = 0;

  /// The optimizer's state (not the parameters it updates, which belong to
  /// the model). The tensors are the live state, not copies: save or clone
  /// them before the next step.
  virtual OptimizerState state() const = 0;
  /// Replaces the state by `state` (as state() returned it, from an
  /// optimizer of the same kind over parameters of the same shapes), copying
  /// each tensor into the optimizer's own (device and dtype stay the
  /// optimizer's). Throws std::invalid_argument, changing nothing, for a
  /// missing or unexpected name or a tensor of another shape.
  virtual void loadState(const OptimizerState &state) = 0;

  /// Asks the optimizer to take over `copies` (at most one a param) from
  /// the next step on: it reads their params' gradients as LowPrecisionCopy
  /// says and writes the copies itself. Returns whether it did; false
  /// (the default, changing nothing) when it cannot, and then the caller
  /// keeps float32 gradients and copies the params itself. AdamW/Adam
  /// take them on CUDA with the runtime's kernels (AdamW.h). Throws
  /// std::invalid_argument, changing nothing, for a copy that does not fit
  /// LowPrecisionCopy's rules (an optimizer that takes none checks nothing).
  virtual bool writeLowPrecisionCopies(const std::vector<LowPrecisionCopy> &copies);
};

/// For implementations: per-parameter state tensors, one list a name (e.g.
/// {"exp_avg", &expAvg_}), saved as "<name>.<i>".
using StateSlots = std::vector<std::pair<std::string, std::vector<at::Tensor> *>>;
using ConstStateSlots = std::vector<std::pair<std::string, const std::vector<at::Tensor> *>>;

/// For implementations: the tensors of `slots` (live, not copied) and the
/// scalar "num_params" = the size of each list.
OptimizerState stateOf(const ConstStateSlots &slots);

/// For implementations: checks that `state` holds exactly the tensors of
/// `slots`, "<name>.<i>" for i < params.size() of params[i]'s shape (0-dim
/// for the name "step"), and "num_params" = params.size(); then copies them
/// into the slots' tensors. Throws std::invalid_argument naming `who` and
/// the first mismatch before copying anything.
void loadStateInto(const OptimizerState &state, const StateSlots &slots,
                   const std::vector<at::Tensor> &params, const std::string &who);

/// For implementations: throws std::invalid_argument naming `who` when
/// inputs.maxNorm > 0 without inputs.gradNorm.
void checkStepInputs(const StepInputs &inputs, const std::string &who);

/// For implementations: the views of `params` (and of same-shaped state
/// tensors) that one weight-decay group updates: the whole tensor when its
/// layout is one member covering it, else one flat view a member piece.
/// `decay` selects the pieces that decays() says get weight decay (true) or
/// none (false). index[k] is the parameter of view k.
struct PieceViews {
  std::vector<at::Tensor> params, grads;
  std::vector<std::vector<at::Tensor>> states; ///< one list a state slot
  std::vector<size_t> index;
};
PieceViews pieceViews(const std::vector<at::Tensor> &params,
                      const std::vector<at::Tensor> &grads,
                      const std::vector<const std::vector<at::Tensor> *> &states,
                      const std::vector<ParameterLayout> &layouts, WeightDecayParams rule,
                      bool decay);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_OPTIM_OPTIMIZER_H
