//===- DocumentLayout.h - whole documents or random windows -----*- C++ -*-===//
//
// How a run lays out its token data (docs/runtime/data.md): random windows, or whole documents padded or packed into
// rows, checked against the data, the objective and the model's inputs.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_TRAIN_DOCUMENTLAYOUT_H
#define BMT_RUNTIME_TRAIN_DOCUMENTLAYOUT_H

#include "bmt/Runtime/data/Batches.h"
#include "bmt/Runtime/train/Trainer.h"

#include <optional>
#include <string>

namespace bmt::runtime {

class Model;
class TokenFile;

/// What the command line asks of the layout.
struct LayoutRequest {
  std::string archiveName;                 ///< sharded.pt, for messages
  std::optional<SequenceLayout> sequences; ///< --sequences padded|packed; none: by the data
  bool windows = false;                    ///< --sequences windows
  bool fixedBatches = false;               ///< --batches gives ready batches
  bool overlongError = false;              ///< --overlong error
};

/// The layout of `train` (else `eval`; either may be null) in rows of
/// `windowLength` tokens, or none for random windows: supervised data is
/// packed for a program exported for it (position_ids, no attention_mask),
/// else padded. ConfigError for --sequences with --batches; a
/// PreflightError (Preflight.h) when the data, `objective` or the model's
/// inputs do not fit the layout, saying what to change; DataError for
/// overlong documents with --overlong error. Rank 0 (`print`) prints the
/// documents and how many are truncated.
std::optional<SequenceLayout> documentLayout(const LayoutRequest &r, Model &model,
                                             Objective objective, const TokenFile *train,
                                             const TokenFile *eval, int64_t windowLength,
                                             bool print);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_TRAIN_DOCUMENTLAYOUT_H
