//===- PrewarmTest.cpp - the fused kernels a run needs, found before step 1 -===//
//
// Tiny fixture models (test/fixtures) compiled by bmt-opt's default
// pipeline (ZeRO storage groups, fused regions) train on the CPU with their
// regions emulating the GPU's kernel path (FusedRegion::setEmulation: the
// kernels' result layouts and bookkeeping, ATen's values). The kernels the
// prewarm's dry run collects must be exactly those the training steps then
// request; after the prewarm no step makes a kernel ready itself, without
// it every requested kernel is made ready at its call (the count bmt-run
// reports); the dry run changes nothing about training (same losses and
// parameters, bit for bit); the kernels compile with NVRTC for sm_90 into a
// fresh disk cache, and a second prewarm reads them all from there.
//
//===----------------------------------------------------------------------===//

#include "bmt/Plan/Archive.h"
#include "bmt/Runtime/data/Batches.h"
#include "bmt/Runtime/data/TokenData.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/fusion/Nvrtc.h"
#include "bmt/Runtime/fusion/Prewarm.h"
#include "bmt/Runtime/train/Trainer.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unistd.h>

using namespace bmt;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kMicroBatch = 2, kSeqLen = 16, kSteps = 2;

/// A fresh directory under the test's temporary directory.
fs::path freshDir(const std::string &name) {
  fs::path dir = fs::path(testing::TempDir()) / ("bmt-prewarm-" + std::to_string(getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// A fixture model and the bmt-opt options it is compiled with (the
/// default pipeline and `flags`).
struct Case {
  const char *name, *model, *flags;
};

/// The case's plan; empty when the fixture is missing.
std::string compiledPlan(const Case &c) {
  fs::path pt = fs::path(BMT_FIXTURES_DIR) / (std::string(c.model) + ".pt");
  if (!fs::exists(pt))
    return "";
  fs::path out = freshDir("plans") / (std::string(c.name) + ".sharded.pt");
  std::string command = std::string(BMT_OPT) + " " + pt.string() + " " + c.flags + " -o " +
                        out.string() + " 2>" + (out.string() + ".log");
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return out.string();
}

/// PREFIX.bin/.json of seeded random tokens below 100 (every fixture's
/// vocabulary has 128).
std::string tokenFile(const fs::path &dir) {
  std::string prefix = (dir / "tokens").string();
  const int64_t n = 4000;
  std::ofstream bin(prefix + ".bin", std::ios::binary);
  uint32_t x = 12345;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    uint16_t v = static_cast<uint16_t>((x >> 16) % 100);
    bin.write(reinterpret_cast<const char *>(&v), sizeof v);
  }
  std::ofstream(prefix + ".json")
      << "{\"format\": \"bmt-tokens\", \"version\": 1, \"dtype\": \"uint16\", \"num_tokens\": "
      << n << ", \"num_documents\": 1, \"vocab_size\": 128, \"eos_id\": 0, \"mask_id\": null, "
      << "\"pad_id\": null, \"tokenizer\": \"t\", \"source\": \"s\"}\n";
  return prefix;
}

/// The requests as (the region's index in the model, device and spec).
std::set<std::pair<size_t, std::string>>
keys(const std::vector<fusion::KernelRecorder::Request> &requests,
     const std::vector<fusion::FusedRegion *> &regions) {
  std::set<std::pair<size_t, std::string>> out;
  for (const auto &r : requests) {
    size_t index = std::find(regions.begin(), regions.end(), r.region) - regions.begin();
    EXPECT_LT(index, regions.size()) << "a request of a region outside the model";
    out.insert({index, r.device.str() + " " + r.spec.key()});
  }
  return out;
}

std::string describe(const std::set<std::pair<size_t, std::string>> &keys) {
  std::ostringstream os;
  for (const auto &[region, key] : keys)
    os << "  region " << region << ": " << key << "\n";
  return os.str();
}

/// One training run of the plan on the CPU with the regions emulating the
/// kernel path, optionally prewarmed first.
struct TrainingRun {
  std::unique_ptr<plan::Archive> archive;
  std::unique_ptr<runtime::Model> model;
  std::unique_ptr<runtime::Trainer> trainer;
  std::ostringstream out;
  runtime::Trainer::KernelPrewarm prewarm;
  std::vector<fusion::KernelRecorder::Request> stepRequests; ///< what the steps asked for
  int64_t lazyKernels = 0; ///< kernels the steps made ready themselves
  std::vector<std::pair<std::string, at::Tensor>> parameters; ///< after training

  TrainingRun(const std::string &plan, const std::string &tokens, bool prewarmFirst) {
    archive = std::make_unique<plan::Archive>(plan);
    model = std::make_unique<runtime::Model>(*archive, at::Device(at::kCPU));
    for (fusion::FusedRegion *r : model->fusedRegions())
      r->setEmulation(true);
    runtime::TrainConfig config;
    config.steps = kSteps;
    config.schedule.peakLR = 1e-2;
    config.schedule.totalSteps = kSteps + 1;
    config.objective = runtime::Objective::CausalLM;
    trainer = std::make_unique<runtime::Trainer>(*model, config, out, nullptr);
    runtime::TokenFile data(tokens + ".bin");
    std::unique_ptr<runtime::MicroBatchSource> source =
        runtime::randomWindows(data, kMicroBatch, kSeqLen + 1, /*seed=*/3, 0, 1);
    if (prewarmFirst) {
      fusion::PrewarmOptions options;
      options.threads = 2;
      options.major = 9; // sm_90 (H100/H200): compiled as CUBIN, no GPU needed
      prewarm = trainer->prewarmFusedKernels(*source, options);
    }
    fusion::KernelRecorder observed(/*dryRun=*/false);
    const int64_t before = fusion::FusedRegion::lazyKernels();
    {
      fusion::RecordingScope recording(model->fusedRegions(), &observed);
      trainer->train(*source, nullptr, kSeqLen, kMicroBatch);
    }
    lazyKernels = fusion::FusedRegion::lazyKernels() - before;
    stepRequests = observed.requests();
    parameters = model->fullParameters();
  }
};

class Prewarm : public testing::TestWithParam<Case> {};

TEST_P(Prewarm, DryRunFindsExactlyTheKernelsOfTheSteps) {
  if (!fusion::nvrtcAvailable())
    GTEST_SKIP() << "no NVRTC library";
  std::string plan = compiledPlan(GetParam());
  if (plan.empty())
    GTEST_SKIP() << "no fixture " << GetParam().model << " in " << BMT_FIXTURES_DIR;
  fs::path dir = freshDir(GetParam().name);
  std::string tokens = tokenFile(dir);
  fs::path cache = dir / "kernels";
  setenv("BMT_KERNEL_CACHE", cache.c_str(), 1);

  TrainingRun lazy(plan, tokens, /*prewarmFirst=*/false);
  TrainingRun warm(plan, tokens, /*prewarmFirst=*/true);
  const std::vector<fusion::FusedRegion *> regions = warm.model->fusedRegions();
  ASSERT_FALSE(regions.empty()) << "the plan has no fused regions";

  // What the dry run found is what the steps asked for, and nothing else.
  auto found = keys(warm.prewarm.requests, regions);
  auto requested = keys(warm.stepRequests, regions);
  EXPECT_EQ(found, requested) << "dry run:\n" << describe(found) << "steps:\n" << describe(requested);
  EXPECT_EQ(keys(lazy.stepRequests, lazy.model->fusedRegions()), requested)
      << "the steps of a run without the prewarm ask for other kernels";
  bool forward = false, backward = false, rowVector = false;
  for (const auto &r : warm.prewarm.requests) {
    (r.spec.backward ? backward : forward) = true;
    rowVector = rowVector || r.spec.rowVector.has_value();
  }
  EXPECT_TRUE(forward && backward && rowVector) << describe(found);

  // No step made a kernel ready after the prewarm; without it, each one.
  EXPECT_EQ(warm.lazyKernels, 0);
  EXPECT_EQ(lazy.lazyKernels, static_cast<int64_t>(requested.size()));

  // Every distinct source compiled once into the fresh cache.
  std::set<std::string> sources;
  for (const auto &r : warm.prewarm.requests)
    sources.insert(r.region->kernelSource(r.spec).second);
  EXPECT_EQ(warm.prewarm.compiled.kernels, static_cast<int64_t>(sources.size()));
  EXPECT_EQ(warm.prewarm.compiled.cached, 0);
  EXPECT_EQ(warm.prewarm.compiled.installed, static_cast<int64_t>(found.size()));
  size_t files = 0;
  for (const auto &e : fs::directory_iterator(cache))
    files += e.path().extension() == ".cubin" ? 1 : 0;
  EXPECT_EQ(files, sources.size());

  // The dry run changed nothing: the same losses and parameters, bit for bit.
  ASSERT_EQ(warm.trainer->losses().size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(warm.trainer->losses(), lazy.trainer->losses());
  ASSERT_EQ(warm.parameters.size(), lazy.parameters.size());
  for (size_t i = 0; i < warm.parameters.size(); ++i)
    EXPECT_TRUE(at::equal(warm.parameters[i].second, lazy.parameters[i].second))
        << warm.parameters[i].first;

  // A second prewarm (a new process's regions) reads every kernel from the cache.
  TrainingRun again(plan, tokens, /*prewarmFirst=*/true);
  EXPECT_EQ(again.prewarm.compiled.kernels, warm.prewarm.compiled.kernels);
  EXPECT_EQ(again.prewarm.compiled.cached, again.prewarm.compiled.kernels);
  EXPECT_EQ(again.lazyKernels, 0);
  unsetenv("BMT_KERNEL_CACHE");
  fs::remove_all(dir);
}

// LLaMA: RMSNorm (8-wide row kernels with a weight's column sums), RoPE with
// rotate_half, SwiGLU (every block recomputed in backward, the default
// pipeline's choice here), without recompute, and with SDPA
// reading the kv heads (grouped-query attention). GPT-2 and BERT:
// LayerNorm, attention softmax, GELU.
INSTANTIATE_TEST_SUITE_P(Fixtures, Prewarm,
                         testing::Values(Case{"llama", "llama", ""},
                                         Case{"llama_no_recompute", "llama", "--checkpoint=none"},
                                         Case{"llama_gqa", "llama", "--grouped-query-attention"},
                                         Case{"gpt2", "gpt2", ""}, Case{"bert", "bert", ""}),
                         [](const testing::TestParamInfo<Case> &i) { return std::string(i.param.name); });

/// A model without fused regions: no dry run at all.
TEST(PrewarmPlain, NothingWithoutRegions) {
  fs::path pt = fs::path(BMT_FIXTURES_DIR) / "llama.pt";
  if (!fs::exists(pt))
    GTEST_SKIP() << "no fixture llama";
  fs::path dir = freshDir("plain");
  fs::path out = dir / "plain.sharded.pt";
  std::string command = std::string(BMT_OPT) + " " + pt.string() + " --fuse-elementwise=false -o " +
                        out.string() + " 2>" + (dir / "log").string();
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  plan::Archive archive(out.string());
  runtime::Model model(archive, at::Device(at::kCPU));
  EXPECT_TRUE(model.fusedRegions().empty());
  EXPECT_FALSE(model.usesFusedKernels());
  runtime::TrainConfig config;
  std::ostringstream text;
  runtime::Trainer trainer(model, config, text, nullptr);
  runtime::TokenFile data(tokenFile(dir) + ".bin");
  auto source = runtime::randomWindows(data, kMicroBatch, kSeqLen + 1, 3, 0, 1);
  const runtime::DataPosition before = source->position();
  runtime::Trainer::KernelPrewarm p = trainer.prewarmFusedKernels(*source);
  EXPECT_TRUE(p.requests.empty());
  EXPECT_EQ(p.compiled.kernels, 0);
  EXPECT_EQ(source->position().windows, before.windows);
  fs::remove_all(dir);
}

} // namespace
