//===- Objective.cpp - the training objective of a model ------------------===//

#include "bmt/Runtime/train/Trainer.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>

namespace bmt::runtime {

std::optional<Objective> parseObjective(const std::string &name) {
  for (Objective o : {Objective::CausalLM, Objective::MaskedLM, Objective::SpanCorruption})
    if (name == objectiveName(o))
      return o;
  return std::nullopt;
}

const char *objectiveName(Objective objective) {
  switch (objective) {
  case Objective::CausalLM:
    return "causal-lm";
  case Objective::MaskedLM:
    return "masked-lm";
  case Objective::SpanCorruption:
    return "span-corruption";
  }
  return "?";
}

at::Tensor modelLabels(Objective objective, const at::Tensor &targets) {
  if (objective != Objective::CausalLM)
    return targets;
  at::Tensor first = at::full({targets.size(0), 1}, -100, targets.options());
  return at::cat({first, targets.slice(1, 0, targets.size(1) - 1)}, 1);
}

Objective objectiveForModel(std::optional<Objective> requested, bool encoderDecoder,
                            const std::string &planObjective) {
  Objective chosen = requested               ? *requested
                     : encoderDecoder        ? Objective::SpanCorruption
                     : parseObjective(planObjective).value_or(Objective::CausalLM);
  if (encoderDecoder && chosen != Objective::SpanCorruption)
    throw std::invalid_argument(std::string("the model is an encoder-decoder (its forward takes "
                                            "decoder_input_ids); it trains with --objective "
                                            "span-corruption, not ") + objectiveName(chosen));
  if (!encoderDecoder && chosen == Objective::SpanCorruption)
    throw std::invalid_argument("--objective span-corruption trains an encoder-decoder (a "
                                "forward taking decoder_input_ids, such as T5); this model is "
                                "not one");
  return chosen;
}

} // namespace bmt::runtime
