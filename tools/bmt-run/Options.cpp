//===- Options.cpp - bmt-run's command line -------------------------------===//

#include "Options.h"

#include "bmt/Runtime/LRSchedule.h"

#include <cmath>
#include <functional>
#include <map>
#include <sstream>

namespace bmt::tools {

namespace {

int64_t toInt(const std::string &option, const std::string &text, int64_t min) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception &) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw UsageError(option + " expects an integer, got '" + text + "'");
  if (v < min)
    throw UsageError(option + " must be at least " + std::to_string(min) + ", got " + text);
  return v;
}

double toDouble(const std::string &option, const std::string &text, double min) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception &) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw UsageError(option + " expects a number, got '" + text + "'");
  if (!(v >= min))
    throw UsageError(option + " must be at least " + std::to_string(min) + ", got " + text);
  return v;
}

} // namespace

std::string runUsage() {
  return R"(usage: bmt-run SHARDED.pt [options]

Trains (or evaluates) a model compiled by `bmt-opt MODEL -o SHARDED.pt`.

data:
  --data PATH            training tokens (PREFIX.bin or PREFIX.json from bmt-prepare-data)
  --eval-data PATH       held-out tokens for evaluation
  --batches FILE         use the batches in FILE instead of sampling --data: torch.save
                         of an int64 tensor [n, micro-batch, seq-len + 1] of token
                         windows (span corruption corrupts each window whole: their
                         length, not --seq-len, sets the sizes), or, for an
                         encoder-decoder, of a dict of ready pairs
                         {"input_ids": [n, micro-batch, S], "labels": [n, micro-batch, T]};
                         micro-batch is the global one, split over the ranks
training:
  --steps N              optimizer steps (required unless --eval-only / --dump)
  --micro-batch N        sequences per micro-batch (default 8)
  --seq-len N            tokens per sequence (default 128; span corruption: the encoder
                         input's, read from longer windows)
  --grad-accum N         micro-batches per step (default 1)
  --lr F                 peak learning rate (default 3e-4)
  --warmup N             warmup steps (default 0)
  --schedule NAME        constant | noam | linear | cosine | exponential (default cosine)
  --min-lr F             floor of linear/cosine decay (default 0)
  --lr-gamma F           per-step factor of exponential decay (default 0.999)
  --weight-decay F       AdamW decoupled weight decay (default 0.01)
  --beta1 F, --beta2 F, --eps F   AdamW (defaults 0.9, 0.999, 1e-8)
  --clip-grad F          clip the global gradient norm to F; 0 = off (default 1.0)
  --offload-optimizer    keep the float32 master weights and AdamW moments in (pinned)
                         host memory and run AdamW on the CPU; gradients are copied to
                         the host during the backward (ZeRO plans only; docs/runtime.md)
mixed precision (a model exported with bmt-export-hf --dtype bfloat16|float16):
  --loss-scale F         initial dynamic loss scale; 0 = off (default 65536 for a
                         float16 model, off for bfloat16/float32)
  --loss-scale-factor F  divide the scale by F on inf/NaN gradients (the step is
                         skipped on every rank), multiply after a window of clean
                         steps (default 2)
  --loss-scale-window N  clean steps before the scale grows (default 1024)
  --min-loss-scale F     the scale never drops below F (default 1)
  --reduce-dtype NAME    float32 | bfloat16 | float16: reduce-scatter gradients in this
                         dtype (default: the model's; float32 = full-precision reduction)
  --objective NAME       auto | causal-lm | masked-lm | span-corruption (default auto:
                         span-corruption for an encoder-decoder such as T5, masked-lm
                         for *ForMaskedLM, else causal-lm)
  --mask-prob F          masked-LM selection probability (default 0.15)
  --noise-density F      span corruption: fraction of tokens corrupted (default 0.15)
  --mean-span-length F   span corruption: mean corrupted span length (default 3)
  --decoder-start-id N   first decoder input token (default: the data's pad_id, else 0,
                         T5's decoder_start_token_id)
  --seed N               seed of sampling and masking (default 0)
evaluation:
  --eval-every N         evaluate every N steps (default: only after the last step)
  --eval-batches N       batches per evaluation (default 0 = the whole file)
  --eval-only            evaluate the model as it is and exit
output:
  --log-file FILE        JSON lines: one per step and per evaluation
  --log-every N          print a step line every N steps (default 1)
  --save-params FILE     after training, save the parameters as safetensors (every name
                         of the state dict; transformers' from_pretrained reads it)
  --dump INPUTS OUT      debugging: run forward and backward on the batch in INPUTS
                         (torch.save of {"input_ids", "attention_mask", "labels"}) and
                         save logits, loss and gradients to OUT
  --profile A:B          profile steps A to B (LibTorch's Kineto profiler): rank 0 prints
                         the time per step of each op (CUDA: the kernels it launched)
  --profile-trace FILE   with --profile: also write the Chrome trace (JSON) to FILE
  --device NAME          cpu | cuda | cuda:N | auto (default auto)
  -h, --help             this text
)";
}

RunOptions parseRunOptions(int argc, char **argv) {
  RunOptions o;
  using Setter = std::function<void(const std::string &, const std::string &)>;
  std::map<std::string, Setter> withValue = {
      {"--data", [&](auto &, auto &v) { o.data = v; }},
      {"--eval-data", [&](auto &, auto &v) { o.evalData = v; }},
      {"--batches", [&](auto &, auto &v) { o.batchesFile = v; }},
      {"--steps", [&](auto &k, auto &v) { o.steps = toInt(k, v, 1); }},
      {"--micro-batch", [&](auto &k, auto &v) { o.microBatch = toInt(k, v, 1); }},
      {"--seq-len", [&](auto &k, auto &v) { o.seqLen = toInt(k, v, 2); }},
      {"--grad-accum", [&](auto &k, auto &v) { o.gradAccum = toInt(k, v, 1); }},
      {"--lr", [&](auto &k, auto &v) { o.lr = toDouble(k, v, 0); }},
      {"--warmup", [&](auto &k, auto &v) { o.warmup = toInt(k, v, 0); }},
      {"--schedule", [&](auto &, auto &v) { o.schedule = v; }},
      {"--min-lr", [&](auto &k, auto &v) { o.minLR = toDouble(k, v, 0); }},
      {"--lr-gamma", [&](auto &k, auto &v) { o.lrGamma = toDouble(k, v, 0); }},
      {"--weight-decay", [&](auto &k, auto &v) { o.weightDecay = toDouble(k, v, 0); }},
      {"--beta1", [&](auto &k, auto &v) { o.beta1 = toDouble(k, v, 0); }},
      {"--beta2", [&](auto &k, auto &v) { o.beta2 = toDouble(k, v, 0); }},
      {"--eps", [&](auto &k, auto &v) { o.eps = toDouble(k, v, 0); }},
      {"--clip-grad", [&](auto &k, auto &v) { o.clipGrad = toDouble(k, v, 0); }},
      {"--objective", [&](auto &, auto &v) { o.objective = v; }},
      {"--loss-scale", [&](auto &k, auto &v) { o.lossScale = toDouble(k, v, 0); }},
      {"--loss-scale-factor", [&](auto &k, auto &v) { o.lossScaleFactor = toDouble(k, v, 1); }},
      {"--loss-scale-window", [&](auto &k, auto &v) { o.lossScaleWindow = toInt(k, v, 1); }},
      {"--min-loss-scale", [&](auto &k, auto &v) { o.minLossScale = toDouble(k, v, 0); }},
      {"--reduce-dtype", [&](auto &, auto &v) { o.reduceDtype = v; }},
      {"--mask-prob", [&](auto &k, auto &v) { o.maskProb = toDouble(k, v, 0); }},
      {"--noise-density", [&](auto &k, auto &v) { o.noiseDensity = toDouble(k, v, 0); }},
      {"--mean-span-length", [&](auto &k, auto &v) { o.meanSpanLength = toDouble(k, v, 1); }},
      {"--decoder-start-id", [&](auto &k, auto &v) { o.decoderStartId = toInt(k, v, 0); }},
      {"--seed", [&](auto &k, auto &v) { o.seed = static_cast<uint64_t>(toInt(k, v, 0)); }},
      {"--eval-every", [&](auto &k, auto &v) { o.evalEvery = toInt(k, v, 0); }},
      {"--eval-batches", [&](auto &k, auto &v) { o.evalBatches = toInt(k, v, 0); }},
      {"--log-file", [&](auto &, auto &v) { o.logFile = v; }},
      {"--log-every", [&](auto &k, auto &v) { o.logEvery = toInt(k, v, 1); }},
      {"--save-params", [&](auto &, auto &v) { o.saveParams = v; }},
      {"--device", [&](auto &, auto &v) { o.device = v; }},
      {"--profile", [&](auto &k, auto &v) {
         size_t colon = v.find(':');
         if (colon == std::string::npos)
           throw UsageError(k + " expects A:B (first and last step), got '" + v + "'");
         o.profileFrom = toInt(k, v.substr(0, colon), 1);
         o.profileTo = toInt(k, v.substr(colon + 1), 1);
         if (o.profileTo < o.profileFrom)
           throw UsageError(k + ": the last step " + std::to_string(o.profileTo) +
                            " is before the first " + std::to_string(o.profileFrom));
       }},
      {"--profile-trace", [&](auto &, auto &v) { o.profileTrace = v; }},
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      return o;
    }
    if (arg == "--eval-only") {
      o.evalOnly = true;
      continue;
    }
    if (arg == "--offload-optimizer") {
      o.offloadOptimizer = true;
      continue;
    }
    if (arg == "--dump") {
      if (i + 2 >= argc)
        throw UsageError("--dump expects two files: INPUTS OUT");
      o.dumpInputs = argv[++i];
      o.dumpOutput = argv[++i];
      continue;
    }
    std::string key = arg, value;
    bool inlineValue = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      key = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      inlineValue = true;
    }
    auto it = withValue.find(key);
    if (it != withValue.end()) {
      if (!inlineValue) {
        if (i + 1 >= argc)
          throw UsageError(key + " expects a value");
        value = argv[++i];
      }
      it->second(key, value);
      continue;
    }
    if (arg.rfind("-", 0) == 0)
      throw UsageError("unknown option " + arg + " (see bmt-run --help)");
    if (!o.archive.empty())
      throw UsageError("more than one archive given: " + o.archive + " and " + arg);
    o.archive = arg;
  }
  if (o.archive.empty())
    throw UsageError("no archive given (usage: bmt-run SHARDED.pt [options])");
  if (o.objective != "auto" && o.objective != "causal-lm" && o.objective != "masked-lm" &&
      o.objective != "span-corruption")
    throw UsageError("--objective must be auto, causal-lm, masked-lm or span-corruption, got " +
                     o.objective);
  try {
    runtime::parseLRScheduleKind(o.schedule);
  } catch (const std::invalid_argument &e) {
    throw UsageError(std::string("--schedule: ") + e.what());
  }
  if (!std::isfinite(o.lr) || !std::isfinite(o.minLR))
    throw UsageError("--lr and --min-lr must be finite");
  if (o.minLR > o.lr)
    throw UsageError("--min-lr " + std::to_string(o.minLR) + " is above --lr " +
                     std::to_string(o.lr));
  if (!o.reduceDtype.empty() && o.reduceDtype != "float32" && o.reduceDtype != "bfloat16" &&
      o.reduceDtype != "float16")
    throw UsageError("--reduce-dtype must be float32, bfloat16 or float16, got " + o.reduceDtype);
  if (!std::isfinite(o.lossScale) || !std::isfinite(o.lossScaleFactor) ||
      !std::isfinite(o.minLossScale))
    throw UsageError("--loss-scale, --loss-scale-factor and --min-loss-scale must be finite");
  if (!(o.minLossScale > 0))
    throw UsageError("--min-loss-scale must be positive");
  if (o.lossScale > 0 && o.minLossScale > o.lossScale)
    throw UsageError("--min-loss-scale is above --loss-scale");
  if (!(o.beta1 < 1) || !(o.beta2 < 1))
    throw UsageError("--beta1 and --beta2 must lie in [0, 1)");
  if (!(o.maskProb > 0 && o.maskProb < 1))
    throw UsageError("--mask-prob must be in (0, 1)");
  if (!(o.noiseDensity > 0 && o.noiseDensity < 1))
    throw UsageError("--noise-density must be in (0, 1)");
  if (!std::isfinite(o.meanSpanLength))
    throw UsageError("--mean-span-length must be finite");
  bool training = !o.evalOnly && o.dumpInputs.empty();
  if (o.profileFrom > 0 && !training)
    throw UsageError("--profile profiles training steps; it has no effect with " +
                     std::string(o.evalOnly ? "--eval-only" : "--dump"));
  if (o.profileFrom > 0 && o.steps > 0 && o.profileTo > o.steps)
    throw UsageError("--profile " + std::to_string(o.profileFrom) + ":" +
                     std::to_string(o.profileTo) + " reaches beyond --steps " +
                     std::to_string(o.steps));
  if (!o.profileTrace.empty() && o.profileFrom == 0)
    throw UsageError("--profile-trace needs --profile A:B");
  if (training && o.steps == 0)
    throw UsageError("--steps is required for training");
  if (training && o.data.empty() && o.batchesFile.empty())
    throw UsageError("training needs --data (or --batches)");
  if (o.evalOnly && o.evalData.empty())
    throw UsageError("--eval-only needs --eval-data");
  if (!training && o.offloadOptimizer)
    throw UsageError("--offload-optimizer moves the optimizer to the host; it has no effect "
                     "with " + std::string(o.evalOnly ? "--eval-only" : "--dump"));
  if (!training && !o.saveParams.empty())
    throw UsageError("--save-params writes trained parameters; it has no effect with " +
                     std::string(o.evalOnly ? "--eval-only" : "--dump"));
  return o;
}

} // namespace bmt::tools
