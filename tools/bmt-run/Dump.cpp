//===- Dump.cpp - bmt-run --dump: one batch's outputs and gradients ------===//

#include "Run.h"

#include "bmt/Plan/Plan.h"
#include "bmt/Runtime/objectives/CrossEntropy.h"
#include "bmt/Support/ErrorText.h"

#include <ATen/ops/ones_like.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cmath>
#include <iostream>
#include <optional>

namespace bmt::tools {

namespace {

/// For a plan compiled assuming attention_mask all ones (bmt-opt's
/// --assume-unpadded, the default: its attention has no padding term left),
/// refuses a --dump batch that breaks the assumption rather than compute
/// something else. Checked on the host: --dump is a debugging path.
void checkUnpadded(const tools::RunOptions &o, const at::Tensor &ids, const at::Tensor *mask) {
  std::string why;
  if (ids.dim() != 2) {
    why = "input_ids has shape " + c10::str(ids.sizes()) + ", not [batch, seq]";
  } else if (mask && mask->sizes() != ids.sizes()) {
    why = "attention_mask has shape " + c10::str(mask->sizes()) + ", not input_ids' " +
          c10::str(ids.sizes());
  } else if (mask) {
    int64_t padded = mask->cpu().ne(1).sum().item<int64_t>();
    if (padded > 0)
      why = "attention_mask has " + std::to_string(padded) + " of " +
            std::to_string(mask->numel()) + " entries that are not 1 (padding)";
  }
  if (!why.empty())
    throw Failure(o.dumpInputs + ": " + why + ", but " + o.archive +
                  " was compiled assuming attention_mask all ones (bmt-opt --assume-unpadded, "
                  "the default: its attention has no padding term); recompile with "
                  "bmt-opt --assume-unpadded=false to run padded batches");
}

} // namespace

/// --dump INPUTS OUT: forward + loss + backward on one given batch.
void runDump(runtime::Model &model, const tools::RunOptions &o, runtime::Objective objective,
             const DecoderConfig &decoder) {
  c10::IValue loaded;
  try {
    loaded = torch::jit::pickle_load(readFile(o.dumpInputs));
  } catch (const c10::Error &e) {
    throw Failure(o.dumpInputs + ": not a torch.save file: " + bmt::firstErrorLine(e.what_without_backtrace()));
  }
  if (!loaded.isGenericDict())
    throw Failure(o.dumpInputs + ": expected a dict of tensors");
  auto dict = loaded.toGenericDict();
  auto get = [&](const char *key) -> at::Tensor {
    auto it = dict.find(std::string(key));
    if (it == dict.end() || !it->value().isTensor())
      throw Failure(o.dumpInputs + ": no tensor '" + key + "'");
    return it->value().toTensor().to(model.device());
  };
  if (model.plan().assumes(plan::kAssumeAttentionMaskAllOnes)) {
    auto raw = [&](const char *key) -> std::optional<at::Tensor> {
      auto it = dict.find(std::string(key));
      if (it == dict.end() || !it->value().isTensor())
        return std::nullopt;
      return it->value().toTensor();
    };
    std::optional<at::Tensor> rawIds = raw("input_ids"), rawMask = raw("attention_mask");
    if (rawIds)
      checkUnpadded(o, *rawIds, rawMask ? &*rawMask : nullptr);
  }
  // A model traced or exported without attention_mask has no padding term:
  // its program would ignore a padded mask, so refuse one.
  bool takesMask = false;
  for (const std::string &name : model.plan().functions[model.plan().entry].paramNames)
    takesMask |= name == "attention_mask";
  if (!takesMask && dict.contains(std::string("attention_mask"))) {
    at::Tensor mask = get("attention_mask").cpu();
    int64_t padded = mask.ne(1).sum().item<int64_t>();
    if (padded > 0)
      throw Failure(o.dumpInputs + ": attention_mask has " + std::to_string(padded) + " of " +
                    std::to_string(mask.numel()) + " entries that are not 1 (padding), but " +
                    o.archive + "'s forward takes no attention_mask (the model was traced or "
                    "exported without one, so its attention has no padding term); export it "
                    "with attention_mask to run padded batches");
  }
  runtime::ModelInputs inputs;
  inputs.inputIds = get("input_ids");
  inputs.attentionMask = dict.contains(std::string("attention_mask"))
                             ? get("attention_mask")
                             : at::ones_like(inputs.inputIds);
  if (dict.contains(std::string("position_ids"))) // else 0 .. seq-1 where the forward takes them
    inputs.positionIds = get("position_ids");
  at::Tensor labels = dict.contains(std::string("labels")) ? get("labels") : inputs.inputIds;
  if (model.isEncoderDecoder()) {
    // Teacher forcing: the decoder reads the target shifted right, unless
    // the batch gives its own decoder_input_ids.
    if (!dict.contains(std::string("labels")))
      throw Failure(o.dumpInputs + ": the model is an encoder-decoder; give its target as "
                    "'labels' (and optionally 'decoder_input_ids', else the labels shifted "
                    "right behind the decoder start id: --decoder-start-id, else the config's)");
    const DecoderIds ids = decoderIds(o, decoder, nullptr);
    inputs.decoderInputIds = dict.contains(std::string("decoder_input_ids"))
                                 ? get("decoder_input_ids")
                                 : runtime::shiftRight(labels, ids.startId, ids.padId);
  }
  // A forward taking labels computes its loss: it gets the batch's labels
  // as given (transformers' convention; default input_ids), and its loss
  // is the one dumped and differentiated.
  if (model.takesLabels())
    inputs.labels = labels;
  c10::impl::GenericDict out(c10::StringType::get(), c10::TensorType::get());
  at::Tensor logits;
  const auto results = model.forwardAll(inputs);
  const at::Tensor modelLoss = model.takesLabels() ? model.lossOf(results).loss : at::Tensor();
  for (auto &[name, value] : results) {
    if (!value.isTensor())
      continue;
    out.insert(name, value.toTensor().detach().cpu());
    if (name == "logits")
      logits = value.toTensor();
  }
  if (!logits.defined() && !modelLoss.defined()) { // no language-model head: outputs only
    if (model.world().rank() != 0)
      return;
    saveIValue(o.dumpOutput, out);
    std::cout << "dump: " << out.size() << " outputs -> " << o.dumpOutput << "\n";
    return;
  }
  at::Tensor loss = modelLoss.defined()
                        ? modelLoss
                        : runtime::languageModelLoss(
                              logits, labels, /*shift=*/objective == runtime::Objective::CausalLM);
  if (!std::isfinite(loss.item<double>()))
    throw Failure(o.dumpInputs + ": the loss is " +
                  std::string(std::isnan(loss.item<double>()) ? "NaN" : "infinite") +
                  " (no label to predict, or a non-finite output); nothing written");
  loss.backward();
  out.insert_or_assign("loss", loss.detach().cpu());
  model.synchronizeGradients();
  auto grads = model.fullParameters(/*gradients=*/true);
  for (const auto &[name, g] : grads)
    out.insert("grad/" + name, g);
  if (model.world().rank() != 0)
    return;
  saveIValue(o.dumpOutput, out);
  std::cout << "dump: loss " << loss.item<double>() << ", " << grads.size()
            << " parameter gradients -> " << o.dumpOutput << "\n";
}

} // namespace bmt::tools
