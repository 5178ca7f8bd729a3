//===- bmt-run.cpp - train a compiled model -------------------------------===//
//
// bmt-run SHARDED.pt --data train.bin --steps N [options]   (see --help)
//
// One process, or one per rank under `torchrun --no-python bmt-run ...`
// (rendezvous from torchrun's environment; docs/runtime.md). Every failure
// is one "error: ..." line on stderr and exit status 1 (on every rank).
//
//===----------------------------------------------------------------------===//

#include "Options.h"

#include "bmt/Support/ErrorText.h"

#include "bmt/Plan/Archive.h"
#include "bmt/Runtime/Corruption.h"
#include "bmt/Runtime/Model.h"
#include "bmt/Runtime/OffloadAdam.h"
#include "bmt/Runtime/Rendezvous.h"
#include "bmt/Runtime/Safetensors.h"
#include "bmt/Runtime/Trainer.h"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sys/stat.h>
#include <unistd.h>

using namespace bmt;

namespace {

/// A failure to report as "error: ..." (exit 1).
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<char> readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Failure(path + ": cannot open");
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

/// Writes `value` (torch.save format) to `path` atomically.
void saveIValue(const std::string &path, const c10::IValue &value) {
  std::vector<char> bytes = torch::jit::pickle_save(value);
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out)
      throw Failure(path + ": cannot write");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out)
      throw Failure(path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Failure(path + ": cannot write");
  }
}

/// The (device, inode) of an existing path, for comparing files.
std::optional<std::pair<dev_t, ino_t>> fileId(const std::string &path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0)
    return std::nullopt;
  return std::make_pair(st.st_dev, st.st_ino);
}

/// Whether two paths name the same file, existing or not ("a.out",
/// "./a.out", "/abs/a.out", through symlinked directories).
bool samePath(const std::string &a, const std::string &b) {
  namespace fs = std::filesystem;
  std::error_code ea, eb;
  fs::path pa = fs::weakly_canonical(fs::absolute(a), ea);
  fs::path pb = fs::weakly_canonical(fs::absolute(b), eb);
  return !ea && !eb && pa == pb;
}

/// Refuses an output that is one of the inputs, and an output that cannot
/// be created, before anything is loaded or trained.
void checkOutputs(const tools::RunOptions &o) {
  std::vector<std::string> inputs = {o.archive, o.data, o.evalData, o.batchesFile, o.dumpInputs};
  for (const std::string &in : {o.data, o.evalData}) {
    // A token file is a pair: PREFIX.bin and PREFIX.json.
    if (in.size() > 4 && (in.rfind(".bin") == in.size() - 4 || in.rfind(".json") == in.size() - 5)) {
      std::string prefix = in.substr(0, in.rfind('.'));
      inputs.push_back(prefix + ".bin");
      inputs.push_back(prefix + ".json");
    }
  }
  std::vector<std::pair<std::string, std::string>> outputs = {
      {"--log-file", o.logFile}, {"--save-params", o.saveParams},
      {"--profile-trace", o.train.profileTrace}, {"--dump", o.dumpOutput}};
  for (const auto &[option, out] : outputs) {
    if (out.empty())
      continue;
    auto outId = fileId(out);
    for (const std::string &in : inputs)
      if (outId && fileId(in) == outId)
        throw Failure(option + " " + out + ": the output would overwrite the input " + in);
    for (const auto &[otherOption, other] : outputs)
      if (otherOption != option && !other.empty() &&
          (other == out || (outId && fileId(other) == outId) ||
           samePath(other, out)))
        throw Failure(option + " and " + otherOption + " name the same file " + out);
    struct stat st {};
    if (::stat(out.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      throw Failure(option + " " + out + ": is a directory");
    // Can the file be created there? (Written at the end, so find out now.)
    std::string probe = out + ".probe." + std::to_string(::getpid());
    std::ofstream test(probe);
    if (!test)
      throw Failure(option + " " + out + ": cannot write there");
    test.close();
    std::remove(probe.c_str());
  }
}

/// The device of this rank: "auto" is cuda:LOCAL_RANK when CUDA is
/// available, else the CPU; "cuda" without an index is cuda:LOCAL_RANK.
at::Device chooseDevice(const std::string &name, int64_t localRank) {
  if (name == "auto")
    return at::hasCUDA() ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(localRank))
                         : at::Device("cpu");
  try {
    at::Device d(name);
    if (d.is_cuda() && !at::hasCUDA())
      throw Failure("--device " + name + ": CUDA is not available on this machine");
    if (d.is_cuda() && !d.has_index())
      d = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(localRank));
    return d;
  } catch (const c10::Error &) {
    throw Failure("--device: unknown device '" + name + "'");
  }
}

/// A progress bar on stderr while the weights load (only on a terminal).
void loadProgress(int64_t done, int64_t total) {
  static bool tty = ::isatty(2) && std::getenv("RANK") == nullptr;
  if (!tty || total <= 0)
    return;
  int width = 30, filled = static_cast<int>(width * done / total);
  std::fprintf(stderr, "\rloading weights [%.*s%*s] %5.1f%% of %.1f MiB",
               filled, "##############################", width - filled, "",
               100.0 * static_cast<double>(done) / static_cast<double>(total),
               static_cast<double>(total) / (1024.0 * 1024.0));
  if (done == total)
    std::fprintf(stderr, "\n");
}

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

/// Span corruption's token ids. The sentinels are the tokenizer's
/// <extra_id_0>, <extra_id_1>, ... (the data's "sentinel_ids") or, for a
/// tokenizer without them, the model's top ids vocab - 1, vocab - 2, ...
/// (T5's order) when no token of the data uses them (ids below the data's
/// vocab_size, or below `dataVocab` without a token file); EOS is the
/// data's eos_id (1, T5's, without a file); the decoder starts with
/// --decoder-start-id, else the data's pad_id, else 0. Prints them when
/// `print`.
runtime::SpanCorruptionConfig spanCorruptionSettings(const tools::RunOptions &o,
                                                     runtime::SpanCorruptionConfig span,
                                                     const runtime::SpanCorruptionLengths &lengths,
                                                     int64_t vocab, const runtime::TokenFile *data,
                                                     int64_t dataVocab, bool print) {
  span.eosId = data ? data->eosId() : 1;
  span.decoderStartId = o.decoderStartId >= 0      ? o.decoderStartId
                        : data && data->padId()     ? *data->padId()
                                                    : 0;
  if (span.decoderStartId >= vocab)
    throw Failure("--decoder-start-id " + std::to_string(span.decoderStartId) +
                  " is outside the model's vocabulary of " + std::to_string(vocab));
  std::string source;
  if (data && !data->sentinelIds().empty()) {
    span.sentinels = data->sentinelIds();
    source = "the tokenizer's <extra_id_N>";
    for (int64_t id : span.sentinels)
      if (id >= vocab)
        throw Failure(data->binPath() + ": the tokenizer's sentinel id " + std::to_string(id) +
                      " is outside the model's vocabulary of " + std::to_string(vocab) +
                      " (a model exported for another tokenizer?)");
    if (static_cast<int64_t>(span.sentinels.size()) < lengths.spans)
      throw Failure(data->binPath() + ": the tokenizer has " +
                    std::to_string(span.sentinels.size()) +
                    " sentinel tokens (<extra_id_N>), fewer than the " +
                    std::to_string(lengths.spans) + " corrupted spans of a window; lower "
                    "--seq-len or --noise-density, or raise --mean-span-length");
  } else {
    int64_t used = data ? data->vocabSize() : dataVocab;
    if (vocab - used < lengths.spans)
      throw Failure("span corruption needs " + std::to_string(lengths.spans) +
                    " sentinel ids per window: " +
                    (data ? data->binPath() + "'s tokenizer has no <extra_id_N> tokens"
                          : std::string("there is no token file")) +
                    ", and the model's vocabulary of " + std::to_string(vocab) + " leaves " +
                    std::to_string(std::max<int64_t>(vocab - used, 0)) +
                    " ids above the data's " + std::to_string(used) +
                    " (export the model with a larger vocab_size, or use a tokenizer with "
                    "sentinels)");
    for (int64_t i = 0; i < lengths.spans; ++i)
      span.sentinels.push_back(vocab - 1 - i);
    source = "the model's top ids";
  }
  if (print) {
    const int64_t window = lengths.inputLength + lengths.noiseTokens - lengths.spans - 1;
    std::cout << "bmt-run: span corruption: windows of " << window << " tokens -> encoder input "
              << lengths.inputLength << " + target " << lengths.targetLength << " tokens ("
              << lengths.noiseTokens << " corrupted in " << lengths.spans
              << (lengths.spans == 1 ? " span" : " spans") << "); sentinels from " << source << " (" << span.sentinels.front()
              << ", ...), eos " << span.eosId << ", decoder start " << span.decoderStartId
              << "\n";
  }
  return span;
}

/// --batches FILE: the fixed global micro-batches of all ranks, either
/// token windows int64 [n, rows, W] or an encoder-decoder's ready pairs
/// (inputIds int64 [n, rows, S], labels [n, rows, T]). Checks the format
/// and that the rows split evenly over the ranks; the ids are checked
/// against the vocabulary later.
struct FixedBatches {
  at::Tensor windows, inputIds, labels;
};

FixedBatches loadBatches(const tools::RunOptions &o, bool encoderDecoder,
                         const std::string &modelType, int64_t worldSize) {
  c10::IValue v;
  try {
    v = torch::jit::pickle_load(readFile(o.batchesFile));
  } catch (const c10::Error &e) {
    throw Failure(o.batchesFile + ": not a torch.save file: " +
                  bmt::firstErrorLine(e.what_without_backtrace()));
  }
  // Every rank reads the whole file and trains on its rows of each batch.
  auto rows = [&](const at::Tensor &t) {
    if (t.size(1) % worldSize != 0)
      throw Failure(o.batchesFile + ": a batch of " + std::to_string(t.size(1)) +
                    " rows cannot be split evenly over " + std::to_string(worldSize) + " ranks");
    return t.contiguous();
  };
  auto isIds = [](const c10::IValue &x) {
    return x.isTensor() && x.toTensor().dim() == 3 && x.toTensor().scalar_type() == at::kLong &&
           x.toTensor().numel() > 0;
  };
  FixedBatches fixed;
  if (v.isGenericDict()) {
    auto d = v.toGenericDict();
    auto ids = d.find(std::string("input_ids")), labels = d.find(std::string("labels"));
    if (ids == d.end() || labels == d.end() || !isIds(ids->value()) || !isIds(labels->value()) ||
        ids->value().toTensor().size(0) != labels->value().toTensor().size(0) ||
        ids->value().toTensor().size(1) != labels->value().toTensor().size(1))
      throw Failure(o.batchesFile + ": expected {\"input_ids\": [n, micro-batch, S], "
                    "\"labels\": [n, micro-batch, T]} (int64, the same n and micro-batch)");
    if (!encoderDecoder)
      throw Failure(o.batchesFile + ": source/target pairs train an encoder-decoder; " +
                    o.archive + " (" + modelType + ") is not one (give token windows)");
    fixed.inputIds = rows(ids->value().toTensor());
    fixed.labels = rows(labels->value().toTensor());
    return fixed;
  }
  if (!isIds(v) || v.toTensor().size(2) < 2)
    throw Failure(o.batchesFile + ": expected an int64 tensor [n, micro-batch, seq-len + 1]" +
                  std::string(encoderDecoder ? " or a dict {\"input_ids\", \"labels\"}" : ""));
  fixed.windows = rows(v.toTensor());
  return fixed;
}

/// --dump INPUTS OUT: forward + loss + backward on one given batch.
void runDump(runtime::Model &model, const tools::RunOptions &o, runtime::Objective objective) {
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
  at::Tensor labels = dict.contains(std::string("labels")) ? get("labels") : inputs.inputIds;
  if (model.isEncoderDecoder()) {
    // Teacher forcing: the decoder reads the target shifted right, unless
    // the batch gives its own decoder_input_ids.
    if (!dict.contains(std::string("labels")))
      throw Failure(o.dumpInputs + ": the model is an encoder-decoder; give its target as "
                    "'labels' (and optionally 'decoder_input_ids', else the labels shifted "
                    "right behind --decoder-start-id)");
    inputs.decoderInputIds =
        dict.contains(std::string("decoder_input_ids"))
            ? get("decoder_input_ids")
            : runtime::shiftRight(labels, std::max<int64_t>(o.decoderStartId, 0));
  }
  c10::impl::GenericDict out(c10::StringType::get(), c10::TensorType::get());
  at::Tensor logits;
  for (auto &[name, value] : model.forwardAll(inputs)) {
    if (!value.isTensor())
      continue;
    out.insert(name, value.toTensor().detach().cpu());
    if (name == "logits")
      logits = value.toTensor();
  }
  if (!logits.defined()) { // no language-model head: outputs only
    if (model.world().rank() != 0)
      return;
    saveIValue(o.dumpOutput, out);
    std::cout << "dump: " << out.size() << " outputs -> " << o.dumpOutput << "\n";
    return;
  }
  at::Tensor loss = runtime::languageModelLoss(
      logits, labels, /*shift=*/objective == runtime::Objective::CausalLM);
  if (!std::isfinite(loss.item<double>()))
    throw Failure(o.dumpInputs + ": the loss is " +
                  std::string(std::isnan(loss.item<double>()) ? "NaN" : "infinite") +
                  " (no label to predict, or a non-finite output); nothing written");
  loss.backward();
  out.insert("loss", loss.detach().cpu());
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

int run(const tools::RunOptions &o) {
  checkOutputs(o);
  runtime::RendezvousInfo rendezvous = runtime::rendezvousFromEnvironment();
  at::Device device = chooseDevice(o.device, rendezvous.localRank);
  plan::Archive archive(o.archive);
  archive.setInitSeed(o.train.seed); // weights-free plans: initial values by --seed
  if (o.offloadOptimizer && archive.plan().groups.empty())
    throw tools::UsageError("--offload-optimizer keeps each rank's shard of the optimizer state "
                            "in host memory and needs a plan with ZeRO storage groups; " +
                            o.archive + " has none (compile it with bmt-opt's default pipeline "
                            "or --bmt-zero)");
  std::unique_ptr<runtime::Comm> world = runtime::connect(rendezvous, device);
  const bool rank0 = world->rank() == 0;
  runtime::ModelOptions modelOptions;
  modelOptions.offloadOptimizer = o.offloadOptimizer;
  runtime::Model model(archive, device, world.get(), rank0 ? loadProgress : nullptr,
                       modelOptions);
  const plan::Plan &p = model.plan();
  const int64_t worldSize = world->size(), rank = world->rank();
  const bool encoderDecoder = model.isEncoderDecoder();
  runtime::Objective objectiveKind;
  try {
    objectiveKind = runtime::objectiveForModel(o.objective, encoderDecoder, p.objective);
  } catch (const std::invalid_argument &e) {
    throw Failure(o.archive + " (" + p.modelType + "): " + e.what());
  }
  const std::string objective = runtime::objectiveName(objectiveKind);
  if (!model.hasLogits() && o.dumpInputs.empty())
    throw Failure(o.archive + ": the model has no language-model head (no 'logits' "
                  "result: " + p.modelType + "); it can be run with --dump but not trained");
  const bool maskedLM = objectiveKind == runtime::Objective::MaskedLM;
  const bool spanCorruption = objectiveKind == runtime::Objective::SpanCorruption;
  // Span corruption: --seq-len is the encoder input's length; the windows
  // read from the data are longer (their noise spans become sentinels).
  const runtime::SpanCorruptionConfig &span = o.train.spanCorruption;
  int64_t windowLength = o.seqLen + 1; // tokens read per sequence
  runtime::SpanCorruptionLengths spanLengths;
  if (spanCorruption && o.batchesFile.empty()) {
    try {
      windowLength = runtime::spanCorruptionWindow(o.seqLen, span);
      spanLengths = runtime::spanCorruptionLengths(windowLength, span);
    } catch (const std::invalid_argument &e) {
      throw tools::UsageError(std::string("--seq-len, --noise-density, --mean-span-length: ") +
                              e.what());
    }
  }
  // Bytes each rank read from the archive (rank-local loading).
  at::Tensor bytesRead;
  {
    at::Tensor mine = at::full({1}, archive.bytesRead(), at::TensorOptions().dtype(at::kLong))
                          .to(world->device());
    at::Tensor all = at::empty({worldSize}, mine.options());
    world->allGather(all, mine)->wait();
    bytesRead = all.cpu();
  }
  // The weight records' bytes: storage groups (with their alignment
  // padding) and the tensors outside them.
  int64_t weightBytes = 0;
  for (const plan::StorageGroup &g : p.groups)
    weightBytes += g.nbytes();
  for (const plan::TensorInfo &t : p.tensors)
    if (t.group < 0)
      weightBytes += t.nbytes();
  if (rank0) {
    std::cout << "bmt-run: " << o.archive << " (" << p.modelType << "), "
              << model.numParameters() << " parameters, " << archive.bytesRead()
              << " bytes read, objective " << objective << ", device " << device << "\n";
    if (worldSize > 1) {
      std::cout << "bmt-run: " << worldSize << " ranks (" << world->backend() << "), ZeRO-"
                << p.zeroStage << ", weights " << weightBytes << " bytes; bytes read per rank:";
      for (int64_t r = 0; r < worldSize; ++r)
        std::cout << " " << bytesRead[r].item<int64_t>();
      std::cout << "\n";
    }
  }

  if (!o.dumpInputs.empty()) {
    runDump(model, o, objectiveKind);
    return 0;
  }

  // --batches: this rank's rows, read now so that the probe below runs at
  // their shapes.
  FixedBatches fixed;
  if (!o.batchesFile.empty() && !o.evalOnly)
    fixed = loadBatches(o, encoderDecoder, p.modelType, worldSize);

  // The model's vocabulary: the logits' last dimension on one micro-batch
  // of the run's shape, which also finds a --seq-len the model cannot take
  // (beyond its position embeddings, or not the shape a torch.export
  // program was fixed to) before anything else is done.
  int64_t vocab;
  {
    c10::NoGradGuard noGrad;
    int64_t rows = o.microBatch, length = o.seqLen, target = spanLengths.targetLength;
    if (fixed.inputIds.defined()) {
      rows = fixed.inputIds.size(1) / worldSize;
      length = fixed.inputIds.size(2);
      target = fixed.labels.size(2);
    } else if (fixed.windows.defined()) {
      rows = fixed.windows.size(1) / worldSize;
      length = fixed.windows.size(2) - 1;
      if (spanCorruption) {
        runtime::SpanCorruptionLengths l =
            runtime::spanCorruptionLengths(fixed.windows.size(2), span);
        length = l.inputLength;
        target = l.targetLength;
      }
    }
    at::TensorOptions ids = at::TensorOptions().dtype(at::kLong).device(device);
    runtime::ModelInputs probe;
    probe.inputIds = at::zeros({rows, length}, ids);
    if (encoderDecoder)
      probe.decoderInputIds = at::zeros({rows, target}, ids);
    try {
      vocab = model.forward(probe).size(-1);
    } catch (const runtime::ExecutionError &e) {
      std::string shape = std::to_string(rows) + " x " + std::to_string(length) +
                          (encoderDecoder ? " (decoder " + std::to_string(target) + ")" : "");
      throw Failure((o.batchesFile.empty() ? "--micro-batch " + std::to_string(o.microBatch) +
                                                 " --seq-len " + std::to_string(o.seqLen)
                                           : o.batchesFile) +
                    ": the model cannot run a micro-batch of " + shape +
                    " tokens (it may have fewer positions, or be a torch.export program fixed "
                    "to other shapes): " + e.what());
    }
  }

  std::unique_ptr<runtime::TokenFile> train, eval;
  if (!o.data.empty()) {
    train = std::make_unique<runtime::TokenFile>(o.data);
    train->checkIds(vocab);
  }
  if (!o.evalData.empty()) {
    eval = std::make_unique<runtime::TokenFile>(o.evalData);
    eval->checkIds(vocab);
    int64_t needed = o.microBatch * windowLength;
    if (eval->numTokens() < needed)
      throw runtime::DataError(eval->binPath() + ": " + std::to_string(eval->numTokens()) +
                               " tokens, fewer than one evaluation batch of " +
                               std::to_string(o.microBatch) + " x " +
                               std::to_string(windowLength) + " = " + std::to_string(needed) +
                               " (lower --micro-batch or --seq-len)");
  }

  // The command line's settings, completed by what the model and the data say.
  runtime::TrainConfig config = o.train;
  // Linear and cosine decay reach --min-lr one step after the last step, so
  // that the last step still learns (with the default --min-lr 0 it would
  // run at lr 0); with --steps 1 and no warmup the one step runs at --lr.
  config.schedule.totalSteps = std::max<int64_t>(o.train.steps, 1) + 1;
  config.objective = objectiveKind;
  config.vocabSize = vocab;
  // Mixed precision.
  at::ScalarType modelDtype = model.parameterDtype();
  config.lossScale = o.lossScale >= 0 ? o.lossScale : (modelDtype == at::kHalf ? 65536.0 : 0.0);
  if (o.reduceDtype)
    model.setReduceDtype(*o.reduceDtype);
  if (rank0 && (modelDtype != at::kFloat || config.lossScale > 0 || o.reduceDtype))
    std::cout << "bmt-run: parameters " << c10::toString(modelDtype)
              << (modelDtype == at::kHalf || modelDtype == at::kBFloat16
                      ? " with float32 master weights (ZeRO shards)"
                      : "")
              << ", gradient reduction "
              << (o.reduceDtype ? tools::dtypeFlagName(*o.reduceDtype)
                                : std::string(c10::toString(modelDtype)))
              << ", loss scale "
              << (config.lossScale > 0 ? std::to_string(static_cast<int64_t>(config.lossScale))
                                       : std::string("off"))
              << "\n";
  if (rank0 && model.offloadsOptimizer()) {
    // Per element of this rank's shards: the float32 master, the two
    // moments and the gradient copy (float64 for float64 groups).
    int64_t elements = 0, bytes = 0;
    for (const at::Tensor &shard : model.parameters()) {
      elements += shard.numel();
      bytes += shard.numel() * 4 *
               static_cast<int64_t>(c10::elementSize(runtime::masterDtype(shard.scalar_type())));
    }
    std::cout << "bmt-run: --offload-optimizer: float32 master weights, AdamW moments and "
                 "gradient copies of "
              << elements << " elements in " << (device.is_cuda() ? "pinned " : "")
              << "host memory (" << std::fixed << std::setprecision(1)
              << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB on rank 0); AdamW "
              << "runs on the CPU" << std::defaultfloat << "\n";
  }
  if (maskedLM) {
    runtime::TokenFile *source = train ? train.get() : eval.get();
    if (!source || !source->maskId())
      throw Failure("masked-LM training needs a [MASK] token id, and the data's metadata has "
                    "none (prepare the data with a tokenizer that has [MASK])");
    config.maskId = *source->maskId();
  }
  if (spanCorruption && o.batchesFile.empty()) // (--batches: below, from the file's windows)
    config.spanCorruption = spanCorruptionSettings(o, span, spanLengths, vocab,
                                                   train ? train.get() : eval.get(), 0, rank0);

  std::function<runtime::MicroBatch()> next;
  std::unique_ptr<runtime::BatchSampler> sampler;
  int64_t cursor = 0;
  if (fixed.inputIds.defined()) { // ready encoder-decoder pairs
    config.spanCorruption.decoderStartId = std::max<int64_t>(o.decoderStartId, 0);
    if (fixed.inputIds.max().item<int64_t>() >= vocab || fixed.inputIds.min().item<int64_t>() < 0 ||
        fixed.labels.max().item<int64_t>() >= vocab ||
        fixed.labels.ne(-100).logical_and(fixed.labels.lt(0)).any().item<bool>())
      throw Failure(o.batchesFile + ": token ids outside the model's vocabulary of " +
                    std::to_string(vocab) + " (labels may also be -100)");
    const int64_t rows = fixed.inputIds.size(1) / worldSize;
    next = [&, rows]() {
      int64_t i = cursor++ % fixed.inputIds.size(0);
      return runtime::MicroBatch{{}, fixed.inputIds[i], fixed.labels[i], rank * rows,
                                 (rank + 1) * rows};
    };
  } else if (fixed.windows.defined()) {
    if (fixed.windows.max().item<int64_t>() >= vocab || fixed.windows.min().item<int64_t>() < 0)
      throw Failure(o.batchesFile + ": token ids outside the model's vocabulary of " +
                    std::to_string(vocab));
    if (spanCorruption)
      config.spanCorruption = spanCorruptionSettings(
          o, span, runtime::spanCorruptionLengths(fixed.windows.size(2), span), vocab, nullptr,
          fixed.windows.max().item<int64_t>() + 1, rank0);
    const int64_t rows = fixed.windows.size(1) / worldSize;
    next = [&, rows]() {
      return runtime::MicroBatch{fixed.windows[cursor++ % fixed.windows.size(0)], {}, {},
                                 rank * rows, (rank + 1) * rows};
    };
  } else if (train) {
    // Every rank draws the same global batch (micro-batch x ranks windows)
    // and trains on its own rows of it.
    sampler = std::make_unique<runtime::BatchSampler>(*train, o.microBatch * worldSize,
                                                      windowLength - 1, o.train.seed);
    next = [&]() {
      return runtime::MicroBatch{sampler->next(), {}, {}, rank * o.microBatch,
                                 (rank + 1) * o.microBatch};
    };
  }

  std::unique_ptr<std::ofstream> log;
  if (!o.logFile.empty()) {
    log = std::make_unique<std::ofstream>(o.logFile, std::ios::trunc);
    if (!*log)
      throw Failure(o.logFile + ": cannot write the log");
  }
  runtime::Trainer trainer(model, config, std::cout, log.get());

  if (o.evalOnly) {
    trainer.reportEvaluation(
        0, trainer.evaluate(*eval, windowLength - 1, o.microBatch, o.train.evalBatches));
    return 0;
  }

  trainer.train(next, eval.get(), windowLength - 1, o.microBatch);

  if (!o.saveParams.empty()) {
    // Every name of every parameter (tied ones under each name, as a
    // state dict has them), so that transformers can load the file.
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto &[name, value] : model.fullParameters()) { // collective
      named.emplace_back(name, value);
      for (const std::string &alias : p.tensors.at(p.findTensor(name)).aliases)
        named.emplace_back(alias, value);
    }
    if (!rank0)
      return 0;
    try {
      runtime::saveSafetensors(o.saveParams, named, {{"format", "pt"}, {"source", "bmt-run"}});
    } catch (const std::runtime_error &e) {
      throw Failure(e.what());
    }
    std::cout << "saved " << named.size() << " parameters -> " << o.saveParams << "\n";
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    tools::RunOptions options = tools::parseRunOptions(argc, argv);
    if (options.help) {
      std::cout << tools::runUsage();
      return 0;
    }
    return run(options);
  } catch (const tools::UsageError &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const plan::PlanError &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const runtime::DataError &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const runtime::TrainingError &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const runtime::ExecutionError &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const Failure &e) {
    std::cerr << "error: " << e.what() << "\n";
  } catch (const c10::Error &e) {
    std::cerr << "error: " << bmt::firstErrorLine(e.what_without_backtrace()) << "\n";
  } catch (const std::exception &e) {
    std::cerr << "error: " << e.what() << "\n";
  }
  return 1;
}
