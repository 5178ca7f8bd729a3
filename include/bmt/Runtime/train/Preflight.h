//===- Preflight.h - a run's checks before step 1 ---------------*- C++ -*-===//
//
// What bmt-run checks once the model is loaded and before it trains
// (docs/runtime/failures.md, "Memory check"): the sequence length against the
// model's positions, a micro-batch against the memory it needs, and one
// forward at the run's shape, which also gives the vocabulary.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_PREFLIGHT_H
#define BMT_RUNTIME_TRAIN_PREFLIGHT_H

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace bmt::runtime {

class Model;

/// A refusal that follows from the options and the plan alone, so that
/// every rank makes it alike: print it once (rank 0).
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A refusal that may differ between ranks (their free memory, a forward
/// that fails): every rank prints its own.
struct PreflightError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// ConfigError when `length` tokens (`what` names where the length comes
/// from) exceed the max_position_embeddings of the model's config.json
/// (among `hfFiles`, carried by sharded.pt); nothing without one.
void checkPositions(const std::string &archiveName,
                    const std::vector<std::pair<std::string, std::string>> &hfFiles,
                    int64_t length, const std::string &what);

/// Collective under ZeRO. ConfigError when `rows` x `length` tokens
/// overflow 64-bit byte counts; unless !`measureBytes` or rows <= 2, a
/// PreflightError when a forward and loss of `rows` rows (measured at 1
/// and 2 rows, scaled) need more than the device's free memory or the
/// host's available memory (shared by LOCAL_WORLD_SIZE CPU ranks), naming
/// both numbers. `shape` names the options that set the shape.
void checkMemory(Model &model, int64_t rows, int64_t length, int64_t target,
                 const std::string &shape, bool measureBytes);

/// The shape of one micro-batch of the run, for probeVocabulary.
struct ProbeShape {
  std::string archive;     ///< sharded.pt's name, for messages
  int64_t rows = 0;        ///< this rank's rows
  int64_t length = 0;      ///< the (encoder) input's tokens
  int64_t target = 0;      ///< an encoder-decoder's decoder tokens
  std::string shape;       ///< what set it: "--micro-batch 4 --seq-len 8" or the --batches file
  std::string runName;     ///< what a failed forward names: the --batches file or the options
  bool fixedShape = false; ///< the shape comes from a --batches file
  /// The shape of an evaluation micro-batch when it differs (--batches
  /// with --eval-data): (--micro-batch, --seq-len).
  std::optional<std::pair<int64_t, int64_t>> evalShape;
  bool checkMemory = true;   ///< false: --eval-only (no checkMemory)
  bool measureMemory = true; ///< false: --no-memory-check (checkMemory's `measureBytes`)
  std::vector<std::pair<std::string, std::string>> hfFiles;
};

/// The model's vocabulary (the logits' last dimension; INT64_MAX for a
/// model that returns its loss and no logits) from one forward of a
/// micro-batch of `s`, run after checkPositions and checkMemory. A
/// --sequence-parallel plan needs a length the TP group divides
/// (ConfigError); a shape the model cannot run (fewer positions, a
/// torch.export program fixed to other shapes) is a PreflightError naming
/// it. Collective under ZeRO.
int64_t probeVocabulary(Model &model, const ProbeShape &s);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_PREFLIGHT_H
