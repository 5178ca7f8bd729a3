//===- Plan.h - the runtime plan inside sharded.pt --------------*- C++ -*-===//
//
// The plan is what bmt-run executes: the compiled program as a flat list of
// instructions per function, the parameters and buffers with the place of
// their bytes in the archive, and the training objective. It is written by
// the exporter (lib/Export) and read by the runtime without MLIR.
//
// Serialized as an IValue (nested tuples, lists, strings, ints, tensors)
// with torch::jit::pickle_save into the archive record `plan.pkl`; see
// docs/sharded-format.md for the record layout. The format is versioned by
// kPlanFormatVersion; readers reject any other version.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_PLAN_PLAN_H
#define BMT_PLAN_PLAN_H

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace bmt::plan {

/// Version of the plan and archive layout. Bumped on any incompatible change.
constexpr int64_t kPlanFormatVersion = 1;

/// A malformed plan or archive; the message names what is wrong.
class PlanError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A parameter or buffer of the model.
struct TensorInfo {
  std::string name;                 ///< dotted path, e.g. "transformer.h.0.ln_1.weight"
  std::vector<std::string> aliases; ///< other names of the same (tied) tensor
  bool isParameter = true;          ///< false for buffers
  bool requiresGrad = true;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  std::string record; ///< archive record holding the bytes (row-major, contiguous)
  int64_t offset = 0; ///< byte offset of the tensor in `record`
  /// CRC-32 (zlib's polynomial) of the tensor's bytes; readers check it,
  /// since the zip container's own CRCs are not checked by LibTorch.
  int64_t crc32 = 0;

  int64_t numel() const;
  int64_t nbytes() const;
};

/// One argument of an instruction: a register, a constant, or a list of
/// arguments (for `int[]`, `Tensor[]`, `Tensor?[]` schema arguments).
struct Arg {
  enum class Kind { Register, Constant, List };
  Kind kind = Kind::Constant;
  int64_t reg = -1;          ///< Register: index into the function's registers
  c10::IValue constant;      ///< Constant
  std::vector<Arg> elements; ///< List

  static Arg ofRegister(int64_t r);
  static Arg ofConstant(c10::IValue v);
};

/// One step of a function.
struct Instruction {
  enum class Kind {
    Aten,        ///< call operator `op` with `args`; results in `results`
    Call,        ///< call function `target` with `args` (registers)
    Global,      ///< results[0] = tensor `target` of the plan
    Constant,    ///< results[0] = args[0].constant
    NumToTensor, ///< results[0] = 0-dim tensor of scalar args[0]
  };
  Kind kind = Kind::Aten;
  std::string op;               ///< Aten: "aten::softmax.int"
  std::vector<Arg> args;
  int64_t target = -1;          ///< Call: function index; Global: tensor index
  std::vector<int64_t> results; ///< registers written
  std::string location;         ///< source location for messages ("f.py:3:1"), may be empty
};

/// One function of the program (a submodule's forward).
struct Function {
  std::string name;       ///< symbol, e.g. "transformer.h.0.forward"
  std::string modulePath; ///< e.g. "transformer.h.0"
  int64_t numRegisters = 0;
  std::vector<int64_t> params;  ///< registers holding the arguments
  std::vector<Instruction> body;
  std::vector<int64_t> returns; ///< registers returned
  std::vector<std::string> paramNames;  ///< "input_ids", ... (may be empty strings)
  std::vector<std::string> resultNames; ///< "logits", ...
};

/// The whole plan.
struct Plan {
  int64_t version = kPlanFormatVersion;
  std::string source;    ///< the model file it was compiled from
  std::string modelType; ///< root module class, e.g. "transformers...GPT2LMHeadModel"
  std::string objective; ///< "causal-lm" or "masked-lm"
  std::vector<TensorInfo> tensors;
  std::vector<Function> functions;
  int64_t entry = 0; ///< index of the function to run ("forward")

  /// The index of the tensor named `name` (or aliased so), or -1.
  int64_t findTensor(const std::string &name) const;
};

/// Plan <-> IValue. fromIValue throws PlanError on a malformed value or a
/// version other than kPlanFormatVersion (naming both versions).
c10::IValue toIValue(const Plan &plan);
Plan fromIValue(const c10::IValue &value);

/// The objective bmt trains a model with, from its root class name:
/// "masked-lm" for *ForMaskedLM / *ForPreTraining, else "causal-lm".
std::string objectiveForModelType(const std::string &modelType);

} // namespace bmt::plan

#endif // BMT_PLAN_PLAN_H
