//===- DocumentLayout.cpp - whole documents or random windows --------------===//

#include "bmt/Runtime/train/DocumentLayout.h"

#include "bmt/Runtime/data/TokenData.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/train/Preflight.h"

#include <iostream>

namespace bmt::runtime {

std::optional<SequenceLayout> documentLayout(const LayoutRequest &r, Model &model,
                                             Objective objective, const TokenFile *train,
                                             const TokenFile *eval, int64_t windowLength,
                                             bool print) {
  const bool rank0 = print;
  const TokenFile *data = train ? train : eval;
  if (r.windows || !data || r.fixedBatches) {
    if (r.sequences && r.fixedBatches)
      throw ConfigError("--sequences lays out the documents of --data; --batches gives "
                              "ready batches");
    return std::nullopt;
  }
  // Supervised data: packed for a program exported for it (position_ids and
  // no attention_mask: bmt-export-hf --position-ids), else padded.
  const bool exportedForPacking =
      model.takesInput("position_ids") && !model.takesInput("attention_mask");
  std::optional<SequenceLayout> layout = r.sequences;
  if (!layout && data->hasLossMask())
    layout = exportedForPacking ? SequenceLayout::Packed
                                : SequenceLayout::Padded;
  if (!layout) {
    if (rank0 && eval && eval->hasLossMask())
      std::cout << "bmt-run: note: " << eval->binPath() << " is supervised, but the training "
                << "data is read in random windows: evaluation reads windows too and ignores "
                << "its loss mask (--sequences padded or packed evaluates its documents)\n";
    return std::nullopt;
  }
  const char *name = *layout == SequenceLayout::Padded ? "padded" : "packed";
  if (!data->hasDocuments())
    throw PreflightError(data->binPath() + ": --sequences " + name + " trains on whole documents, and "
                  "this version-1 token file has no document boundaries (prepare it again "
                  "with bmt-prepare-data, which writes version 2)");
  if (objective != Objective::CausalLM)
    throw PreflightError(std::string("--sequences ") + name + " trains causal LMs on whole documents; "
                  "the objective is " + objectiveName(objective));
  // The other layout is suggested only where this program can run it.
  const bool paddedRuns = model.takesInput("attention_mask");
  const std::string orPacked = exportedForPacking ? ", or train with --sequences packed" : "";
  const std::string orPadded = paddedRuns ? ", or train with --sequences padded" : "";
  if (*layout == SequenceLayout::Padded) {
    // A plan compiled assuming attention_mask all ones (bmt-opt's default)
    // is fed all ones (Trainer): right padding only follows a row's tokens,
    // which a causal LM's earlier positions never see, so the loss on them
    // is the same with or without the padding term.
    if (!paddedRuns)
      throw PreflightError(r.archiveName + "'s forward takes no attention_mask, which padded sequences "
                    "(--sequences padded) need; export the model with attention_mask "
                    "(bmt-export-hf does by default)" + orPacked);
  } else {
    if (!model.takesInput("position_ids"))
      throw PreflightError(r.archiveName + "'s forward takes no position_ids, which packed sequences "
                    "(--sequences packed) need to keep documents apart; export the model with "
                    "bmt-export-hf --position-ids and compile it again" + orPadded);
    if (model.takesInput("attention_mask"))
      throw PreflightError(r.archiveName + "'s forward takes attention_mask as well as position_ids, and "
                    "transformers keeps packed documents apart (from position_ids) only "
                    "without one; export the model with bmt-export-hf --position-ids (which "
                    "traces without attention_mask) and compile it again");
  }
  for (const TokenFile *f : {train, eval}) {
    if (!f || !f->hasDocuments())
      continue;
    auto [overlong, first] = overlongDocuments(*f, windowLength);
    if (overlong > 0 && r.overlongError)
      throw DataError(
          f->binPath() + ": " + std::to_string(overlong) + " of " +
          std::to_string(f->numDocuments()) + " documents are longer than --seq-len + 1 = " +
          std::to_string(windowLength) + " tokens (the first: document " +
          std::to_string(first) + ", " +
          std::to_string(f->documentEnd(first) - f->documentStart(first)) +
          " tokens); raise --seq-len, or drop --overlong error to truncate them");
    if (rank0)
      std::cout << "bmt-run: " << (f == train ? "training" : "evaluation") << " data: "
                << f->numDocuments() << " documents" << (f->hasLossMask() ? " (supervised)" : "")
                << ", sequences " << name << " in rows of "
                << (*layout == SequenceLayout::Padded ? "up to " : "") << windowLength
                << " tokens; " << overlong << " truncated to " << windowLength << " tokens"
                << (f->preparedTruncated() > 0
                        ? " (and " + std::to_string(f->preparedTruncated()) +
                              " cut to max_length by bmt-prepare-data)"
                        : std::string())
                << "\n";
  }
  return layout;
}

} // namespace bmt::runtime
