//===- Options.cpp - bmt-run's command line -------------------------------===//

#include "Options.h"

#include "bmt/Runtime/optim/LRSchedule.h"
#include "bmt/Runtime/optim/Optimizers.h"

#include <cmath>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>
#include <vector>

namespace bmt::tools {

namespace {

/// The number `text` spells in full (std::stoll / std::stod), finite and
/// at least `min`; UsageError naming `option` otherwise.
template <typename T>
T parseNumber(const std::string &option, const std::string &text, T min) {
  constexpr bool integer = std::is_integral_v<T>;
  size_t used = 0;
  T v = 0;
  try {
    if constexpr (integer)
      v = std::stoll(text, &used);
    else
      v = std::stod(text, &used);
  } catch (const std::exception &) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw UsageError(option + (integer ? " expects an integer, got '" : " expects a number, got '") +
                     text + "'");
  if constexpr (!integer)
    if (!std::isfinite(v))
      throw UsageError(option + " expects a finite number, got '" + text + "'");
  if (!(v >= min))
    throw UsageError(option + " must be at least " + (std::ostringstream() << min).str() +
                     ", got " + text);
  return v;
}

int64_t toInt(const std::string &option, const std::string &text, int64_t min) {
  return parseNumber<int64_t>(option, text, min);
}

double toDouble(const std::string &option, const std::string &text, double min) {
  return parseNumber<double>(option, text, min);
}

/// One option: its flag, the name of its value(s) in --help ("" for a
/// switch; two words for an option of two values), its section, its help
/// text (lines after the first are continuations) and what it sets.
struct Option {
  const char *flag;
  const char *metavar;
  const char *section;
  const char *help;
  std::function<void(RunOptions &, const std::string &flag, const std::vector<std::string> &)>
      set;
};

unsigned valueCount(const Option &option) {
  std::string m = option.metavar;
  if (m.empty())
    return 0;
  return m.find(' ') == std::string::npos ? 1 : 2;
}

const char *const kSections[] = {"data", "training", "mixed precision", "objective",
                                 "evaluation", "checkpoints", "output"};

using Values = std::vector<std::string>;

const std::vector<Option> &optionTable() {
  static const std::vector<Option> table = {
      // data
      {"--data", "PATH", "data", "training tokens (PREFIX.bin or PREFIX.json from bmt-prepare-data)",
       [](RunOptions &o, auto &, const Values &v) { o.data = v[0]; }},
      {"--eval-data", "PATH", "data", "held-out tokens for evaluation",
       [](RunOptions &o, auto &, const Values &v) { o.evalData = v[0]; }},
      {"--batches", "FILE", "data",
       "use the batches in FILE instead of sampling --data: torch.save\n"
       "of an int64 tensor [n, micro-batch, seq-len + 1] of token\n"
       "windows (span corruption corrupts each window whole: their\n"
       "length, not --seq-len, sets the sizes), or, for an\n"
       "encoder-decoder, of a dict of ready pairs\n"
       "{\"input_ids\": [n, micro-batch, S], \"labels\": [n, micro-batch, T]};\n"
       "micro-batch is the global one, split over the ranks",
       [](RunOptions &o, auto &, const Values &v) { o.batchesFile = v[0]; }},
      {"--sequences", "LAYOUT", "data",
       "how whole documents of a version-2 token file become rows\n"
       "(supervised fine-tuning; docs/runtime/data.md): padded (one document a\n"
       "row, right-padded; needs a forward taking attention_mask) |\n"
       "packed (whole documents packed into rows of --seq-len + 1 tokens,\n"
       "position_ids restarting at each; needs a model exported with\n"
       "bmt-export-hf --position-ids) | windows (random windows of the\n"
       "token stream, ignoring the documents). Default for supervised\n"
       "data (a loss mask): packed for a model exported with\n"
       "--position-ids, else padded; for other data: windows",
       [](RunOptions &o, auto &k, const Values &v) {
         if (v[0] == "padded")
           o.sequences = runtime::SequenceLayout::Padded;
         else if (v[0] == "packed")
           o.sequences = runtime::SequenceLayout::Packed;
         else if (v[0] == "windows")
           o.windows = true;
         else
           throw UsageError(k + " must be padded, packed or windows, got '" + v[0] + "'");
       }},
      {"--overlong", "WHAT", "data",
       "a document longer than --seq-len + 1 tokens: truncate (keep its\n"
       "first --seq-len + 1 tokens; the count is printed at start; default)\n"
       "| error (refuse the data)",
       [](RunOptions &o, auto &k, const Values &v) {
         if (v[0] != "truncate" && v[0] != "error")
           throw UsageError(k + " must be truncate or error, got '" + v[0] + "'");
         o.overlongError = v[0] == "error";
       }},
      // training
      {"--steps", "N", "training", "optimizer steps (required unless --eval-only / --dump)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.steps = toInt(k, v[0], 1); }},
      {"--micro-batch", "N", "training", "sequences per micro-batch (default 8)",
       [](RunOptions &o, auto &k, const Values &v) { o.microBatch = toInt(k, v[0], 1); }},
      {"--seq-len", "N", "training",
       "tokens per sequence (default 128; span corruption: the encoder\n"
       "input's, read from longer windows)",
       [](RunOptions &o, auto &k, const Values &v) { o.seqLen = toInt(k, v[0], 2); }},
      {"--grad-accum", "N", "training", "micro-batches per step (default 1)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.gradAccum = toInt(k, v[0], 1); }},
      {"--micro-batches", "M", "training",
       "a plan cut into P pipeline stages: split each micro-batch's rows\n"
       "into M >= P pieces, run in the 1F1B order (default P)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.pipelineMicroBatches = toInt(k, v[0], 1);
         o.pipelineMicroBatchesGiven = true;
       }},
      {"--lr", "F", "training", "peak learning rate (default 3e-4)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.schedule.peakLR = toDouble(k, v[0], 0);
       }},
      {"--warmup", "N", "training", "warmup steps (default 0)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.schedule.warmupSteps = toInt(k, v[0], 0);
       }},
      {"--schedule", "NAME", "training",
       "constant | noam | linear | cosine | exponential (default cosine)",
       [](RunOptions &o, auto &k, const Values &v) {
         try {
           o.train.schedule.kind = runtime::parseLRScheduleKind(v[0]);
         } catch (const std::invalid_argument &e) {
           throw UsageError(k + ": " + e.what());
         }
       }},
      {"--min-lr", "F", "training", "floor of linear/cosine decay (default 0)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.schedule.minLR = toDouble(k, v[0], 0); }},
      {"--lr-gamma", "F", "training", "per-step factor of exponential decay (default 0.999)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.schedule.gamma = toDouble(k, v[0], 0); }},
      {"--optimizer", "NAME", "training",
       "sgd | adam | adamw | lion | adafactor (default adamw), each\n"
       "with torch.optim's update and defaults (docs/runtime/optimizers.md)",
       [](RunOptions &o, auto &k, const Values &v) {
         std::optional<runtime::OptimizerKind> kind = runtime::parseOptimizerKind(v[0]);
         if (!kind)
           throw UsageError(k + ": unknown optimizer '" + v[0] +
                            "' (sgd, adam, adamw, lion or adafactor)");
         o.train.optimizer.kind = *kind;
       }},
      {"--weight-decay", "F", "training",
       "weight decay: decoupled for adamw, lion, adafactor, L2 added to\n"
       "the gradient for sgd, adam (default 0.01 for adamw, else 0)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.optimizer.weightDecay = toDouble(k, v[0], 0);
       }},
      {"--weight-decay-params", "WHICH", "training",
       "matrices: decay parameters of 2+ dimensions only, none on biases\n"
       "and norm weights (default); all: every parameter",
       [](RunOptions &o, auto &k, const Values &v) {
         if (v[0] == "matrices")
           o.train.optimizer.decayParams = runtime::WeightDecayParams::Matrices;
         else if (v[0] == "all")
           o.train.optimizer.decayParams = runtime::WeightDecayParams::All;
         else
           throw UsageError(k + ": '" + v[0] + "' is neither matrices nor all");
       }},
      {"--beta1", "F", "training",
       "adam/adamw/lion first-moment decay (default 0.9)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.optimizer.beta1 = toDouble(k, v[0], 0); }},
      {"--beta2", "F", "training",
       "adam/adamw second-moment decay (default 0.999); lion's\n"
       "momentum decay (default 0.99)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.optimizer.beta2 = toDouble(k, v[0], 0); }},
      {"--eps", "F", "training", "adam/adamw epsilon (default 1e-8)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.optimizer.eps = toDouble(k, v[0], 0); }},
      {"--momentum", "F", "training", "sgd momentum (default 0)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.optimizer.momentum = toDouble(k, v[0], 0); }},
      {"--dampening", "F", "training", "sgd dampening (default 0)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.optimizer.dampening = toDouble(k, v[0], 0); }},
      {"--nesterov", "", "training", "sgd Nesterov momentum",
       [](RunOptions &o, auto &, const Values &) { o.train.optimizer.nesterov = true; }},
      {"--adafactor-beta2-decay", "F", "training",
       "adafactor: beta2_t = 1 - t^F (default -0.8)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.optimizer.beta2Decay = toDouble(k, v[0], -std::numeric_limits<double>::infinity());
       }},
      {"--adafactor-eps1", "F", "training",
       "adafactor: floor of the second moment (default: the dtype's\n"
       "machine epsilon)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.optimizer.eps1 = toDouble(k, v[0], 0); }},
      {"--adafactor-eps2", "F", "training",
       "adafactor: floor of the parameter RMS in the relative step\n"
       "(default 1e-3)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.optimizer.eps2 = toDouble(k, v[0], 0); }},
      {"--adafactor-d", "F", "training",
       "adafactor: update clipping threshold d (default 1)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.optimizer.clipThreshold = toDouble(k, v[0], 0);
       }},
      {"--clip-grad", "F", "training", "clip the global gradient norm to F; 0 = off (default 1.0)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.clipGrad = toDouble(k, v[0], 0); }},
      {"--moe-bias-update-rate", "U", "training",
       "after each step move each router's score-correction bias\n"
       "(DeepSeek-V3's e_score_correction_bias) by U x sign(mean - load)\n"
       "per expert: auxiliary-loss-free balancing (default 0: off)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.moeBiasUpdateRate = toDouble(k, v[0], 0);
       }},
      {"--no-prewarm-kernels", "", "training",
       "compile the fused regions' CUDA kernels at their first call in\n"
       "a step instead of before step 1 (docs/runtime/prewarm.md)",
       [](RunOptions &o, auto &, const Values &) { o.train.prewarmKernels = false; }},
      {"--no-memory-check", "", "training",
       "start even when a micro-batch's forward, measured at 1 and 2\n"
       "rows, would need more memory than the device (or host) has free",
       [](RunOptions &o, auto &, const Values &) { o.memoryCheck = false; }},
      {"--offload-optimizer", "", "training",
       "keep the float32 master weights and Adam/AdamW moments in\n"
       "(pinned) host memory and run the optimizer on the CPU; gradients\n"
       "are copied to the host during the backward (adam and adamw,\n"
       "ZeRO plans only; docs/runtime/offload.md)",
       [](RunOptions &o, auto &, const Values &) { o.offloadOptimizer = true; }},
      // mixed precision
      {"--loss-scale", "F", "mixed precision",
       "initial dynamic loss scale; 0 = off (default 65536 for a\n"
       "float16 model, off for bfloat16/float32)",
       [](RunOptions &o, auto &k, const Values &v) { o.lossScale = toDouble(k, v[0], 0); }},
      {"--loss-scale-factor", "F", "mixed precision",
       "divide the scale by F on inf/NaN gradients (the step is\n"
       "skipped on every rank), multiply after a window of clean\n"
       "steps (default 2)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.lossScaleFactor = toDouble(k, v[0], 1);
       }},
      {"--loss-scale-window", "N", "mixed precision",
       "clean steps before the scale grows (default 1024)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.lossScaleWindow = toInt(k, v[0], 1);
       }},
      {"--min-loss-scale", "F", "mixed precision", "the scale never drops below F (default 1)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.minLossScale = toDouble(k, v[0], 0); }},
      {"--reduce-dtype", "NAME", "mixed precision",
       "float32 | bfloat16 | float16: reduce-scatter gradients in this\n"
       "dtype (default: the model's; float32 = full-precision reduction)",
       [](RunOptions &o, auto &k, const Values &v) {
         for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf})
           if (v[0] == dtypeFlagName(t)) {
             o.reduceDtype = t;
             return;
           }
         throw UsageError(k + " must be float32, bfloat16 or float16, got " + v[0]);
       }},
      // objective
      {"--objective", "NAME", "objective",
       "auto | causal-lm | masked-lm | span-corruption | model-loss\n"
       "(default auto: span-corruption for an encoder-decoder such as T5,\n"
       "masked-lm for *ForMaskedLM, else causal-lm). A model whose forward\n"
       "takes labels (exported with them: bmt-export-hf --labels) trains on\n"
       "the loss it returns, fed the labels transformers expect for that\n"
       "objective (causal-lm: input_ids, the model shifts;\n"
       "docs/runtime/objectives.md);\n"
       "model-loss: the same, and an error for a forward without labels",
       [](RunOptions &o, auto &k, const Values &v) {
         o.modelLoss = v[0] == "model-loss";
         if (v[0] == "auto" || o.modelLoss) {
           o.objective.reset();
           return;
         }
         o.objective = runtime::parseObjective(v[0]);
         if (!o.objective)
           throw UsageError(k + " must be auto, causal-lm, masked-lm, span-corruption or "
                            "model-loss, got " + v[0]);
       }},
      {"--mask-prob", "F", "objective", "masked-LM selection probability (default 0.15)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.maskProb = toDouble(k, v[0], 0); }},
      {"--noise-density", "F", "objective",
       "span corruption: fraction of tokens corrupted (default 0.15)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.spanCorruption.noiseDensity = toDouble(k, v[0], 0);
       }},
      {"--mean-span-length", "F", "objective",
       "span corruption: mean corrupted span length (default 3)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.spanCorruption.meanSpanLength = toDouble(k, v[0], 1);
       }},
      {"--decoder-start-id", "N", "objective",
       "first decoder input token (default: the model's config.json\n"
       "decoder_start_token_id, else the data's pad_id, else 0, T5's)",
       [](RunOptions &o, auto &k, const Values &v) { o.decoderStartId = toInt(k, v[0], 0); }},
      {"--seed", "N", "objective", "seed of sampling, masking and dropout (default 0)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.seed = static_cast<uint64_t>(toInt(k, v[0], 0));
       }},
      // evaluation
      {"--eval-every", "N", "evaluation", "evaluate every N steps (default: only after the last step)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.evalEvery = toInt(k, v[0], 0); }},
      {"--eval-batches", "N", "evaluation", "batches per evaluation (default 0 = the whole file)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.evalBatches = toInt(k, v[0], 0); }},
      {"--eval-only", "", "evaluation", "evaluate the model as it is and exit",
       [](RunOptions &o, auto &, const Values &) { o.evalOnly = true; }},
      // output
      {"--log-file", "FILE", "output", "JSON lines: one per step and per evaluation",
       [](RunOptions &o, auto &, const Values &v) { o.logFile = v[0]; }},
      {"--log-every", "N", "output", "print a step line every N steps (default 1)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.logEvery = toInt(k, v[0], 1); }},
      {"--inspect-every", "N", "output",
       "every N steps, add to --log-file a line {\"kind\": \"inspect\"} with,\n"
       "per block and for the parameters outside blocks, the L2 norm\n"
       "and max-abs of the parameters and of the gradients and the\n"
       "max-abs of the block's output (global over the ranks)",
       [](RunOptions &o, auto &k, const Values &v) { o.train.inspectEvery = toInt(k, v[0], 1); }},
      {"--save-params", "FILE", "output",
       "after training, save the parameters as safetensors (every name\n"
       "of the state dict; transformers' from_pretrained reads it)",
       [](RunOptions &o, auto &, const Values &v) { o.saveParams = v[0]; }},
      // checkpoints
      {"--checkpoint-dir", "DIR", "checkpoints",
       "save checkpoints in DIR/step-NNNNNNNN (every rank its shards;\n"
       "docs/checkpoint-format.md), after --checkpoint-every steps and\n"
       "after the last step",
       [](RunOptions &o, auto &, const Values &v) { o.checkpoints.dir = v[0]; }},
      {"--checkpoint-every", "N", "checkpoints", "save after every N-th step (needs --checkpoint-dir)",
       [](RunOptions &o, auto &k, const Values &v) { o.checkpoints.every = toInt(k, v[0], 1); }},
      {"--checkpoint-every-minutes", "M", "checkpoints",
       "also save when M minutes have passed since the last save (rank\n"
       "0's clock; every rank saves the same step; needs --checkpoint-dir)",
       [](RunOptions &o, auto &k, const Values &v) {
         o.train.saveEveryMinutes = toDouble(k, v[0], -std::numeric_limits<double>::infinity());
         if (!(o.train.saveEveryMinutes > 0))
           throw UsageError(k + " must be positive, got " + v[0]);
       }},
      {"--keep", "K", "checkpoints",
       "keep the newest K complete checkpoints, removing older ones\n"
       "once a newer one is complete (default 0: keep all)",
       [](RunOptions &o, auto &k, const Values &v) { o.checkpoints.keep = toInt(k, v[0], 1); }},
      {"--resume", "DIR|auto", "checkpoints",
       "continue from the checkpoint folder DIR (bit-identical to a run\n"
       "never interrupted; any world size, ZeRO stage, shard group); auto:\n"
       "the newest complete one in --checkpoint-dir, or a fresh start",
       [](RunOptions &o, auto &, const Values &v) { o.resume = v[0]; }},
      {"--dump", "INPUTS OUT", "output",
       "debugging: run forward and backward on the batch in INPUTS\n"
       "(torch.save of {\"input_ids\", \"attention_mask\", \"labels\"}, optionally\n"
       "\"position_ids\") and save logits, loss and gradients to OUT: a\n"
       "plain dict of tensors, read by torch.load(OUT) (weights_only=True)",
       [](RunOptions &o, auto &, const Values &v) {
         o.dumpInputs = v[0];
         o.dumpOutput = v[1];
       }},
      {"--profile", "A:B", "output",
       "profile steps A to B (LibTorch's Kineto profiler): rank 0 prints\n"
       "the time per step of each op (CUDA: the kernels it launched)",
       [](RunOptions &o, auto &k, const Values &v) {
         size_t colon = v[0].find(':');
         if (colon == std::string::npos)
           throw UsageError(k + " expects A:B (first and last step), got '" + v[0] + "'");
         o.train.profileFrom = toInt(k, v[0].substr(0, colon), 1);
         o.train.profileTo = toInt(k, v[0].substr(colon + 1), 1);
         if (o.train.profileTo < o.train.profileFrom)
           throw UsageError(k + ": the last step " + std::to_string(o.train.profileTo) +
                            " is before the first " + std::to_string(o.train.profileFrom));
       }},
      {"--profile-trace", "FILE", "output", "with --profile: also write the Chrome trace (JSON) to FILE",
       [](RunOptions &o, auto &, const Values &v) { o.train.profileTrace = v[0]; }},
      {"--device", "NAME", "output", "cpu | cuda | cuda:N | auto (default auto)",
       [](RunOptions &o, auto &, const Values &v) { o.device = v[0]; }},
      {"--help", "", "output", "this text (also -h)",
       [](RunOptions &o, auto &, const Values &) { o.help = true; }},
  };
  return table;
}

/// The checks that involve several options, after all are read.
void checkCombination(const RunOptions &o) {
  const runtime::LRScheduleConfig &s = o.train.schedule;
  if (!std::isfinite(s.peakLR) || !std::isfinite(s.minLR))
    throw UsageError("--lr and --min-lr must be finite");
  if (s.minLR > s.peakLR)
    throw UsageError("--min-lr " + std::to_string(s.minLR) + " is above --lr " +
                     std::to_string(s.peakLR));
  if (!std::isfinite(o.lossScale) || !std::isfinite(o.train.lossScaleFactor) ||
      !std::isfinite(o.train.minLossScale))
    throw UsageError("--loss-scale, --loss-scale-factor and --min-loss-scale must be finite");
  if (!(o.train.minLossScale > 0))
    throw UsageError("--min-loss-scale must be positive");
  if (o.lossScale > 0 && o.train.minLossScale > o.lossScale)
    throw UsageError("--min-loss-scale is above --loss-scale");
  try {
    runtime::checkOptimizerConfig(o.train.optimizer);
  } catch (const std::invalid_argument &e) {
    throw UsageError(e.what());
  }
  if (o.offloadOptimizer && o.train.optimizer.kind != runtime::OptimizerKind::Adam &&
      o.train.optimizer.kind != runtime::OptimizerKind::AdamW)
    throw UsageError(std::string("--offload-optimizer runs adam or adamw on the host; "
                                 "--optimizer ") +
                     runtime::optimizerKindName(o.train.optimizer.kind) +
                     " is not offloaded (drop --offload-optimizer)");
  if (!(o.train.maskProb > 0 && o.train.maskProb < 1))
    throw UsageError("--mask-prob must be in (0, 1)");
  const runtime::SpanCorruptionConfig &span = o.train.spanCorruption;
  if (!(span.noiseDensity > 0 && span.noiseDensity < 1))
    throw UsageError("--noise-density must be in (0, 1)");
  if (!std::isfinite(span.meanSpanLength))
    throw UsageError("--mean-span-length must be finite");
  const bool training = !o.evalOnly && o.dumpInputs.empty();
  const std::string other = o.evalOnly ? "--eval-only" : "--dump";
  if (o.train.profileFrom > 0 && !training)
    throw UsageError("--profile profiles training steps; it has no effect with " + other);
  if (o.train.profileFrom > 0 && o.train.steps > 0 && o.train.profileTo > o.train.steps)
    throw UsageError("--profile " + std::to_string(o.train.profileFrom) + ":" +
                     std::to_string(o.train.profileTo) + " reaches beyond --steps " +
                     std::to_string(o.train.steps));
  if (!o.train.profileTrace.empty() && o.train.profileFrom == 0)
    throw UsageError("--profile-trace needs --profile A:B");
  if (training && o.train.steps == 0)
    throw UsageError("--steps is required for training");
  if (training && o.data.empty() && o.batchesFile.empty())
    throw UsageError("training needs --data (or --batches)");
  if (o.evalOnly && o.evalData.empty())
    throw UsageError("--eval-only needs --eval-data");
  if (!training && o.offloadOptimizer)
    throw UsageError("--offload-optimizer moves the optimizer to the host; it has no effect "
                     "with " + other);
  if (o.checkpoints.dir.empty() &&
      (o.checkpoints.every > 0 || o.checkpoints.keep > 0 || o.train.saveEveryMinutes > 0))
    throw UsageError("--checkpoint-every, --checkpoint-every-minutes and --keep need "
                     "--checkpoint-dir");
  if (o.resume == "auto" && o.checkpoints.dir.empty())
    throw UsageError("--resume auto looks in --checkpoint-dir; give it");
  if (!training && (!o.checkpoints.dir.empty() || !o.resume.empty()))
    throw UsageError("--checkpoint-dir and --resume are for training; they have no effect "
                     "with " + other);
  if (!training && o.train.inspectEvery > 0)
    throw UsageError("--inspect-every inspects training steps; it has no effect with " + other);
  if (o.train.inspectEvery > 0 && o.logFile.empty())
    throw UsageError("--inspect-every writes its lines to the JSON log: give --log-file FILE");
  if (!training && !o.saveParams.empty())
    throw UsageError("--save-params writes trained parameters; it has no effect with " + other);
}

} // namespace

RunOptions::RunOptions() {
  train.steps = 0; // required for training: checked after parsing
  train.schedule.kind = runtime::LRScheduleKind::Cosine;
  train.schedule.peakLR = 3e-4;
}

std::string dtypeFlagName(at::ScalarType dtype) {
  switch (dtype) {
  case at::kFloat:
    return "float32";
  case at::kBFloat16:
    return "bfloat16";
  case at::kHalf:
    return "float16";
  default:
    return c10::toString(dtype);
  }
}

std::string runUsage() {
  std::ostringstream out;
  out << "usage: bmt-run SHARDED.pt [options]\n\n"
         "Trains (or evaluates) a model compiled by `bmt-opt MODEL -o SHARDED.pt`.\n";
  constexpr size_t kHelpColumn = 25;
  for (const char *section : kSections) {
    out << "\n" << section << ":\n";
    for (const Option &option : optionTable()) {
      if (std::string(option.section) != section)
        continue;
      std::string head = std::string("  ") + option.flag;
      if (*option.metavar)
        head += std::string(" ") + option.metavar;
      std::istringstream help(option.help);
      std::string line;
      bool first = true;
      while (std::getline(help, line)) {
        if (first && head.size() + 1 <= kHelpColumn)
          out << std::left << std::setw(kHelpColumn) << head << line << "\n";
        else if (first)
          out << head << "\n" << std::string(kHelpColumn, ' ') << line << "\n";
        else
          out << std::string(kHelpColumn, ' ') << line << "\n";
        first = false;
      }
    }
  }
  return out.str();
}

RunOptions parseRunOptions(int argc, char **argv) {
  RunOptions o;
  std::map<std::string, const Option *> byFlag;
  for (const Option &option : optionTable())
    byFlag[option.flag] = &option;
  // The command line as (option, flag, values), read whole before any
  // option is applied: an option given twice would keep its last value
  // (`--lr 1e-3 ... --lr 2e-3`), so it is refused first, whatever the
  // values. No option of the table is repeatable.
  struct Given {
    const Option *option;
    std::string key;
    std::vector<std::string> values;
  };
  std::vector<Given> given;
  std::map<std::string, int> times;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h")
      arg = "--help";
    std::string key = arg;
    std::optional<std::string> inlineValue;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      key = arg.substr(0, eq);
      inlineValue = arg.substr(eq + 1);
    }
    auto it = byFlag.find(key);
    if (it == byFlag.end()) {
      if (arg.rfind("-", 0) == 0)
        throw UsageError("unknown option " + arg + " (see bmt-run --help)");
      if (!o.archive.empty())
        throw UsageError("more than one archive given: " + o.archive + " and " + arg);
      o.archive = arg;
      continue;
    }
    const Option &option = *it->second;
    const unsigned count = valueCount(option);
    std::vector<std::string> values;
    if (inlineValue && count == 1) {
      values.push_back(*inlineValue);
    } else if (inlineValue) {
      throw UsageError(key + (count ? " does not take KEY=VALUE form" : " takes no value"));
    } else {
      if (i + static_cast<int>(count) >= argc)
        throw UsageError(count == 2 ? key + " expects two values: " + option.metavar
                                    : key + " expects a value");
      for (unsigned n = 0; n < count; ++n)
        values.push_back(argv[++i]);
    }
    if (key == "--help") { // (what follows is not read)
      o.help = true;
      return o;
    }
    ++times[key];
    given.push_back({&option, key, std::move(values)});
  }
  for (const Given &g : given)
    if (times[g.key] > 1)
      throw UsageError(g.key + " was given " + std::to_string(times[g.key]) +
                       " times; give it once");
  for (const Given &g : given)
    g.option->set(o, g.key, g.values);
  if (o.archive.empty())
    throw UsageError("no archive given (usage: bmt-run SHARDED.pt [options])");
  checkCombination(o);
  return o;
}

} // namespace bmt::tools
