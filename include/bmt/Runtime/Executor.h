//===- Executor.h - run a plan through the ATen dispatcher ------*- C++ -*-===//
//
// Executes the plan's functions instruction by instruction, calling each
// operator through c10::Dispatcher (so autograd records the graph exactly as
// in eager PyTorch); no TorchScript interpreter is involved. The few
// TorchScript-only operators a trace contains (aten::Int, aten::Float,
// aten::ScalarImplicit, aten::dim) and prim::NumToTensor are implemented here.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_EXECUTOR_H
#define BMT_RUNTIME_EXECUTOR_H

#include "bmt/Plan/Plan.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace bmt::runtime {

/// An operator failed, or the plan cannot run. The message names the
/// function, the operator and its source location.
class ExecutionError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

class Executor {
public:
  /// Prepares `plan` to run on `device`: resolves every operator's schema
  /// and converts constant arguments to the schema's types. Device constants
  /// in the program (a trace records "cpu") are replaced by `device`.
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

  /// The parameters and buffers, by plan index.
  std::vector<at::Tensor> &tensors() { return tensors_; }
  const plan::Plan &plan() const { return plan_; }

private:
  struct Prepared;
  std::vector<c10::IValue> call(size_t function, std::vector<c10::IValue> args);

  const plan::Plan &plan_;
  std::vector<at::Tensor> tensors_;
  at::Device device_;
  std::vector<std::vector<std::unique_ptr<Prepared>>> prepared_; // [function][instruction]
};

} // namespace bmt::runtime

#endif // BMT_RUNTIME_EXECUTOR_H
