//===- Preflight.cpp - bmt-run's checks of the run's shape before step 1 -===//
//
// The sequence length against the model's positions, and the memory a
// micro-batch needs against what the device or the host has (docs/runtime.md,
// "Memory check").
//
//===----------------------------------------------------------------------===//

#include "Run.h"

#include "bmt/Runtime/fusion/Prewarm.h"
#include "bmt/Runtime/train/MemoryCheck.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <optional>

namespace bmt::tools {

void checkPositions(const std::string &archiveName,
                    const std::vector<std::pair<std::string, std::string>> &hfFiles,
                    int64_t length, const std::string &what) {
  for (const auto &[name, content] : hfFiles) {
    if (name != "config.json")
      continue;
    nlohmann::json config = nlohmann::json::parse(content, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object())
      return;
    // (Not n_positions: T5's configs carry one its relative positions
    // ignore, and GPT-2's learned positions fail in the probe's forward.)
    auto it = config.find("max_position_embeddings");
    if (it == config.end() || !it->is_number_integer())
      return;
    const int64_t positions = it->get<int64_t>();
    if (positions > 0 && length > positions)
      throw ConfigFailure(what + ": sequences of " + std::to_string(length) + " tokens, but " +
                          archiveName + "'s model has " + std::to_string(positions) +
                          " positions (max_position_embeddings in its config.json); lower "
                          "--seq-len, or export the model with more positions");
    return;
  }
}

void checkMemory(const RunOptions &o, runtime::Model &model, int64_t rows, int64_t length,
                 int64_t target, const std::string &shape) {
  if (length > 0 && rows > std::numeric_limits<int64_t>::max() / 4 / length)
    throw ConfigFailure(shape + ": " + std::to_string(rows) + " x " + std::to_string(length) +
                        " tokens a micro-batch is beyond any memory (its sizes overflow 64-bit "
                        "byte counts); lower --micro-batch or --seq-len");
  if (!o.memoryCheck || rows <= 2)
    return;
  const at::Device device = model.device();
  const bool encoderDecoder = model.isEncoderDecoder();
  at::TensorOptions ids = at::TensorOptions().dtype(at::kLong).device(device);
  // The bytes a forward (and the loss) at r rows allocates, its graph kept
  // for the backward as a step keeps it. (Collective under ZeRO.)
  auto measure = [&](int64_t r) {
    runtime::ModelInputs in;
    in.inputIds = at::zeros({r, length}, ids);
    if (encoderDecoder)
      in.decoderInputIds = at::zeros({r, target}, ids);
    at::Tensor labels = at::zeros({r, encoderDecoder ? target : length}, ids);
    std::optional<fusion::KernelRecorder> dryRun;
    std::optional<fusion::RecordingScope> recording;
    if (model.usesFusedKernels()) { // (compiles nothing for these shapes)
      dryRun.emplace(/*dryRun=*/true);
      recording.emplace(model.fusedRegions(), &*dryRun);
    }
    return runtime::peakBytesDuring(device, [&] {
      c10::AutoGradMode grad(true);
      if (model.takesLabels()) {
        in.labels = labels;
        at::Tensor loss = model.forwardLoss(in).loss;
      } else {
        at::Tensor loss = model.loss(model.forward(in), labels);
      }
    });
  };
  int64_t one = 0, two = 0;
  try {
    measure(1); // (a first forward allocates what stays: cuBLAS workspaces, caches)
    one = measure(1);
    two = measure(2);
  } catch (const runtime::ExecutionError &) {
    return; // a program fixed to other shapes: the probe at the run's shape says so
  }
  const double perRow = static_cast<double>(std::max<int64_t>(two - one, 0));
  const double need = static_cast<double>(std::max<int64_t>(one, 0)) - perRow +
                      perRow * static_cast<double>(rows);
  runtime::AvailableMemory available = runtime::availableMemory(device);
  if (available.bytes < 0)
    return;
  // CPU ranks of one host share its memory.
  int64_t sharing = 1;
  if (device.is_cpu())
    if (const char *v = std::getenv("LOCAL_WORLD_SIZE"))
      sharing = std::max<int64_t>(std::atoll(v), 1);
  const double have = static_cast<double>(available.bytes) / static_cast<double>(sharing);
  if (need <= have)
    return;
  // (Failure, printed by each rank that refuses: the ranks' free memory may differ.)
  throw Failure(
      shape + ": a forward of this micro-batch allocates at least " + runtime::formatMemory(need) +
      " on each rank (measured at 1 and 2 rows: " + runtime::formatMemory(perRow) +
      " a row), more than the " + runtime::formatMemory(have) + " " + available.source +
      (sharing > 1 ? " shared by its " + std::to_string(sharing) + " ranks" : std::string()) +
      "; lower --micro-batch (a larger --grad-accum keeps the batch) or --seq-len, or pass "
      "--no-memory-check");
}

} // namespace bmt::tools
