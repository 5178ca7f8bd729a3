//===- TensorParallelTest.cpp - tensor parallelism at run time -----------===//
//
// Ranks are threads of this process with CPU communicators over one
// c10d::HashStore (as CommTest).
//
// - vocabParallelCrossEntropy on T = 1, 2, 4 ranks against ATen's
//   cross_entropy on the gathered logits (padded vocab, ignored rows):
//   the loss on every rank and each rank's slice of the gradient.
// - tp_all_gather / tp_reduce_scatter (sequence parallelism) on 3 ranks:
//   values and gradients, each the other's backward.
// - The same plan under the Trainer (the batch split over the
//   data-parallel ranks, the vocab-parallel loss, SGD and AdamW with its
//   weight-decay groups): T = 1 on 2 ranks, T = 2 on 2 and 4 ranks against
//   SGD / AdamW written out in eager ATen on the whole batch.
// - A hand-written TP plan (no compiler): a vocab-parallel embedding
//   (TpRank, masked lookup, TpAllReduce), a checkpointed block with TpCopy,
//   a replicated reduce_grad scale, a column-parallel linear, gelu, a
//   row-parallel linear + TpAllReduce, and a vocab-parallel LM head, under
//   ZeRO-3. T = 2 on 2 ranks, T = 2 on 4 ranks (2 data-parallel) and T = 4
//   on 4 ranks train SGD steps against the same model in eager ATen on the
//   whole weights and batch: losses, gradient norms and the final
//   parameters (gathered from the TP slices); bytes read per rank.
//
//===----------------------------------------------------------------------===//

#include "bmt/Plan/Archive.h"
#include "bmt/Runtime/comm/Comm.h"
#include "bmt/Runtime/exec/Executor.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/objectives/CrossEntropy.h"
#include "bmt/Runtime/train/Trainer.h"
#include "CpuRanks.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

namespace {

using namespace bmt;
using namespace bmt::runtime;
using namespace std::chrono_literals;

/// Ranks as threads (CpuRanks.h), with a longer timeout than the
/// collectives tests: a training step of several ranks on 2 loaded cores.
void runRanks(int64_t n, const std::function<void(int64_t, Comm &)> &fn) {
  test::runRanks(n, fn, test::StoreKind::Hash, 60s);
}

// --- vocab-parallel cross-entropy -------------------------------------------

void compareVocabParallel(int64_t ranks, at::ScalarType dtype) {
  SCOPED_TRACE(std::to_string(ranks) + " ranks, " + c10::toString(dtype));
  const int64_t rows = 11, vocab = 37, padded = 40, local = padded / ranks;
  at::manual_seed(3);
  at::Tensor logits = at::randn({rows, vocab}, at::TensorOptions().dtype(dtype)).mul(4);
  at::Tensor labels = at::randint(0, vocab, {rows}, at::TensorOptions().dtype(at::kLong));
  labels[2].fill_(-100);
  labels[5].fill_(vocab - 1); // the last real entry (next to the padding)
  labels[6].fill_(0);
  at::Tensor reference = logits.clone().requires_grad_(true);
  at::Tensor expected = at::cross_entropy_loss(reference, labels, {}, at::Reduction::Mean, -100);
  torch::autograd::backward({expected.mul(1.5)});
  // The padded logits; padding columns hold garbage the loss must ignore.
  at::Tensor full = at::cat({logits, at::full({rows, padded - vocab}, 50.0, logits.options())}, 1);
  runRanks(ranks, [&](int64_t r, Comm &comm) {
    at::Tensor mine = full.narrow(1, r * local, local).clone().requires_grad_(true);
    at::Tensor loss = vocabParallelCrossEntropy(mine, labels, comm, r * local, vocab);
    EXPECT_EQ(loss.scalar_type(), dtype);
    EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-6 * expected.item<double>())
        << "rank " << r;
    torch::autograd::backward({loss.mul(1.5)});
    at::Tensor want = at::zeros({rows, local}, logits.options());
    int64_t real = std::clamp<int64_t>(vocab - r * local, 0, local);
    want.narrow(1, 0, real).copy_(reference.grad().narrow(1, r * local, real));
    EXPECT_LE(mine.grad().sub(want).abs().max().item<double>(), 1e-7) << "rank " << r;
  });
}

TEST(VocabParallelCrossEntropy, MatchesAtenOnTheGatheredLogits) {
  for (int64_t ranks : {1, 2, 4})
    for (at::ScalarType dtype : {at::kFloat, at::kDouble})
      compareVocabParallel(ranks, dtype);
}

TEST(VocabParallelCrossEntropy, RejectsLabelsOutsideTheVocab) {
  std::unique_ptr<Comm> local = createLocalComm();
  at::Tensor logits = at::randn({2, 8});
  EXPECT_THROW(vocabParallelCrossEntropy(logits, at::full({2}, 7, at::kLong), *local, 0, 6),
               std::invalid_argument); // 7 is padding
  EXPECT_THROW(vocabParallelCrossEntropy(logits, at::zeros({3}, at::kLong), *local, 0, 8),
               std::invalid_argument);
}

// --- sequence-parallel instructions -----------------------------------------

/// A plan whose entry returns `kind` (TpAllGather or TpReduceScatter along
/// dim 1) of its input.
plan::Plan oneInstructionPlan(plan::Instruction::Kind kind, int64_t tp) {
  plan::Plan p;
  p.tensorParallel = tp;
  plan::Function f;
  f.name = "forward";
  f.params = {0};
  f.paramNames = {"x"};
  f.numRegisters = 2;
  plan::Instruction inst;
  inst.kind = kind;
  inst.op = "1";
  inst.args = {plan::Arg::ofRegister(0)};
  inst.results = {1};
  f.body = {inst};
  f.returns = {1};
  p.functions = {f};
  return plan::fromIValue(plan::toIValue(p));
}

TEST(SequenceParallel, AllGatherAndReduceScatterAreEachOthersBackward) {
  const int64_t tp = 3, cols = 2;
  // Rank r's input x_r [rows, cols] and upstream gradient g_r [rows, 3 cols]
  // of the gathered [rows, 3 cols].
  auto x = [](int64_t r) { return at::arange(4, at::kDouble).view({2, 2}) + 10.0 * r; };
  auto g = [](int64_t r) { return at::arange(12, at::kDouble).view({2, 6}) * (r + 1.0); };
  plan::Plan gather = oneInstructionPlan(plan::Instruction::Kind::TpAllGather, tp);
  plan::Plan scatter = oneInstructionPlan(plan::Instruction::Kind::TpReduceScatter, tp);
  runRanks(tp, [&](int64_t r, Comm &comm) {
    Executor allGather(gather, {}, at::kCPU);
    allGather.setTensorParallel(&comm);
    at::Tensor in = x(r).requires_grad_(true);
    at::Tensor out = allGather.run({in}).at(0).toTensor();
    EXPECT_TRUE(at::equal(out, at::cat({x(0), x(1), x(2)}, 1))) << "rank " << r;
    torch::autograd::backward({out}, {g(r)});
    // Backward: the sum over ranks of their gradients, this rank's columns.
    at::Tensor want = (g(0) + g(1) + g(2)).narrow(1, r * cols, cols);
    EXPECT_TRUE(at::allclose(in.grad(), want)) << "rank " << r;

    Executor reduceScatter(scatter, {}, at::kCPU);
    reduceScatter.setTensorParallel(&comm);
    at::Tensor wide = g(r).requires_grad_(true);
    at::Tensor part = reduceScatter.run({wide}).at(0).toTensor();
    EXPECT_TRUE(at::allclose(part, (g(0) + g(1) + g(2)).narrow(1, r * cols, cols)))
        << "rank " << r;
    torch::autograd::backward({part}, {x(r)});
    EXPECT_TRUE(at::equal(wide.grad(), at::cat({x(0), x(1), x(2)}, 1))) << "rank " << r;
  });
}

// --- a hand-written TP plan against eager ATen ------------------------------

constexpr int64_t kHidden = 8, kFfn = 16, kVocab = 37, kPadded = 40;

/// The weights by name, global shapes.
std::map<std::string, at::Tensor> initialWeights() {
  at::manual_seed(7);
  std::map<std::string, at::Tensor> w;
  w["wte"] = at::randn({kVocab, kHidden}) * 0.5;
  w["h.0.scale"] = at::rand({kHidden}) + 0.5;
  w["h.0.fc1.weight"] = at::randn({kFfn, kHidden}) * 0.3;
  w["h.0.fc1.bias"] = at::randn({kFfn}) * 0.1;
  w["h.0.fc2.weight"] = at::randn({kHidden, kFfn}) * 0.3;
  w["h.0.fc2.bias"] = at::randn({kHidden}) * 0.1;
  w["lm_head.weight"] = at::randn({kVocab, kHidden}) * 0.5;
  return w;
}

/// Eager ATen: the model on the whole weights. ids [b, s] -> logits [b, s, V].
at::Tensor eagerLogits(std::map<std::string, at::Tensor> &w, const at::Tensor &ids) {
  at::Tensor h = at::embedding(w["wte"], ids);
  at::Tensor x = h * w["h.0.scale"];
  x = at::gelu(at::linear(x, w["h.0.fc1.weight"], w["h.0.fc1.bias"]));
  h = h + at::linear(x, w["h.0.fc2.weight"], w["h.0.fc2.bias"]);
  return at::linear(h, w["lm_head.weight"]);
}

plan::Instruction instruction(plan::Instruction::Kind kind, std::vector<plan::Arg> args,
                              std::vector<int64_t> results, std::string op = "",
                              int64_t target = -1) {
  plan::Instruction inst;
  inst.kind = kind;
  inst.args = std::move(args);
  inst.results = std::move(results);
  inst.op = std::move(op);
  inst.target = target;
  return inst;
}

plan::Instruction aten(const std::string &op, std::vector<plan::Arg> args, int64_t result) {
  return instruction(plan::Instruction::Kind::Aten, std::move(args), {result}, op);
}

plan::Arg reg(int64_t r) { return plan::Arg::ofRegister(r); }
plan::Arg constant(c10::IValue v) { return plan::Arg::ofConstant(std::move(v)); }

/// The TP plan for T ranks per TP group (see the file comment).
plan::Plan tensorParallelPlan(int64_t tp) {
  using K = plan::Instruction::Kind;
  plan::Plan p;
  p.source = "test";
  p.modelType = "TensorParallelMlp";
  p.objective = "causal-lm";
  p.zeroStage = 3;
  p.tensorParallel = tp;
  p.vocabParallel = true;
  p.vocabSize = kVocab;
  const int64_t vocabLocal = kPadded / tp;
  auto tensor = [&](const std::string &name, std::vector<int64_t> shape, int64_t dim,
                    int64_t paddedSize = 0, bool reduceGrad = false) {
    plan::TensorInfo t;
    t.name = name;
    t.shape = std::move(shape);
    t.split.dim = dim;
    t.split.paddedSize = paddedSize;
    t.split.reduceGrad = reduceGrad;
    p.tensors.push_back(t);
    return static_cast<int64_t>(p.tensors.size() - 1);
  };
  const int64_t wte = tensor("wte", {kVocab, kHidden}, 0, kPadded);
  const int64_t head = tensor("lm_head.weight", {kVocab, kHidden}, 0, kPadded);
  const int64_t scale = tensor("h.0.scale", {kHidden}, -1, 0, /*reduceGrad=*/true);
  const int64_t w1 = tensor("h.0.fc1.weight", {kFfn, kHidden}, 0);
  const int64_t b1 = tensor("h.0.fc1.bias", {kFfn}, 0);
  const int64_t w2 = tensor("h.0.fc2.weight", {kHidden, kFfn}, 1);
  const int64_t b2 = tensor("h.0.fc2.bias", {kHidden}, -1);
  // Storage groups of local shapes, each in T copies (tp_rank 0..T-1).
  auto group = [&](const std::string &name, std::vector<int64_t> members, std::string blockList,
                   int64_t blockIndex) {
    int64_t first = static_cast<int64_t>(p.groups.size());
    for (int64_t t = 0; t < tp; ++t) {
      plan::StorageGroup g;
      g.name = name;
      g.members = members;
      g.blockList = blockList;
      g.blockIndex = blockIndex;
      g.tpRank = tp > 1 ? t : -1;
      for (int64_t m : members) {
        g.offsets.push_back(g.size);
        g.size += p.tensors[m].localNumel(tp);
      }
      p.groups.push_back(g);
    }
    for (int64_t m : members)
      p.tensors[m].group = first;
    return first;
  };
  const int64_t rest = group("rest.float32", {wte, head}, "", -1);
  const int64_t block = group("h.0.float32", {scale, w1, b1, w2, b2}, "h", 0);

  plan::Function entry;
  entry.name = "forward";
  entry.paramNames = {"input_ids"};
  entry.resultNames = {"logits"};
  entry.params = {0};
  entry.body = {
      instruction(K::Gather, {}, {}, "", rest),
      instruction(K::Global, {}, {1}, "", wte),
      // The vocab-parallel embedding: ids outside [t*V/T, (t+1)*V/T) give 0.
      instruction(K::TpRank, {}, {2}),
      instruction(K::NumToTensor, {reg(2)}, {3}),
      aten("aten::mul.Scalar", {reg(3), constant(vocabLocal)}, 4),
      aten("aten::sub.Tensor", {reg(0), reg(4), constant(1)}, 5),
      aten("aten::lt.Scalar", {reg(5), constant(0)}, 6),
      aten("aten::ge.Scalar", {reg(5), constant(vocabLocal)}, 7),
      aten("aten::logical_or", {reg(6), reg(7)}, 8),
      aten("aten::masked_fill.Scalar", {reg(5), reg(8), constant(0)}, 9),
      aten("aten::embedding", {reg(1), reg(9), constant(-1), constant(false), constant(false)}, 10),
      aten("aten::unsqueeze", {reg(8), constant(-1)}, 11),
      aten("aten::masked_fill.Scalar", {reg(10), reg(11), constant(0.0)}, 12),
      instruction(K::TpAllReduce, {reg(12)}, {13}),
      instruction(K::Gather, {}, {}, "", block),
      instruction(K::Call, {reg(13)}, {14}, "", 1),
      instruction(K::Release, {}, {}, "", block),
      // The vocab-parallel LM head.
      instruction(K::TpCopy, {reg(14)}, {15}),
      instruction(K::Global, {}, {16}, "", head),
      aten("aten::linear", {reg(15), reg(16), constant(c10::IValue())}, 17),
  };
  entry.body[15].blockList = "h";
  entry.body[15].blockIndex = 0;
  entry.body[15].checkpoint = true; // recomputed in backward, Tp* instructions included
  entry.returns = {17};
  entry.numRegisters = 18;

  plan::Function mlp;
  mlp.name = "h.0.forward";
  mlp.modulePath = "h.0";
  mlp.params = {0};
  mlp.paramNames = {"hidden_states"};
  mlp.body = {
      instruction(K::TpCopy, {reg(0)}, {1}),
      instruction(K::Global, {}, {2}, "", scale),
      aten("aten::mul.Tensor", {reg(1), reg(2)}, 3), // replicated, partial gradient: reduce_grad
      instruction(K::Global, {}, {4}, "", w1),
      instruction(K::Global, {}, {5}, "", b1),
      aten("aten::linear", {reg(3), reg(4), reg(5)}, 6), // column-parallel
      aten("aten::gelu", {reg(6), constant(std::string("none"))}, 7),
      instruction(K::Global, {}, {8}, "", w2),
      aten("aten::linear", {reg(7), reg(8), constant(c10::IValue())}, 9), // row-parallel
      instruction(K::TpAllReduce, {reg(9)}, {10}),
      instruction(K::Global, {}, {11}, "", b2),
      aten("aten::add.Tensor", {reg(10), reg(11), constant(1)}, 12),
      aten("aten::add.Tensor", {reg(0), reg(12), constant(1)}, 13),
  };
  mlp.returns = {13};
  mlp.numRegisters = 14;
  p.functions = {entry, mlp};
  return p;
}

class TensorParallelTraining : public ::testing::Test {
protected:
  void SetUp() override {
    char tmpl[] = "/tmp/bmt-tptest-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// Trains `steps` SGD steps on `world` ranks with T = tp and checks them
  /// against eager ATen (whole model, whole batch).
  void trainAndCompare(int64_t world, int64_t tp) {
    SCOPED_TRACE("N = " + std::to_string(world) + ", T = " + std::to_string(tp));
    const int64_t steps = 3, batch = 4, seq = 5, dp = world / tp, rows = batch / dp;
    const double lr = 0.5;
    std::map<std::string, at::Tensor> weights = initialWeights();
    plan::Plan p = tensorParallelPlan(tp);
    std::string path = (dir_ / ("tp" + std::to_string(tp) + ".pt")).string();
    plan::writeArchive(path, p, "module {}",
                       [&](size_t i) { return weights.at(p.tensors[i].name); });
    int64_t archiveBytes = 0;
    for (const plan::StorageGroup &g : p.groups)
      archiveBytes += g.nbytes();

    // The batches, and eager ATen's training on them.
    at::manual_seed(11);
    std::vector<at::Tensor> ids, labels;
    for (int64_t s = 0; s < steps; ++s) {
      ids.push_back(at::randint(0, kVocab, {batch, seq}, at::kLong));
      at::Tensor y = at::randint(0, kVocab, {batch, seq}, at::kLong);
      y.select(1, 0).fill_(-100); // the same count of targets in every row
      y.select(1, 2).fill_(kVocab - 1);
      labels.push_back(y);
    }
    std::vector<double> norms;
    std::vector<std::vector<double>> rankLosses(steps); // [step][data-parallel rank]
    for (auto &[name, t] : weights)
      t.requires_grad_(true);
    for (int64_t s = 0; s < steps; ++s) {
      {
        at::NoGradGuard noGrad;
        for (int64_t d = 0; d < dp; ++d) {
          at::Tensor l = eagerLogits(weights, ids[s].narrow(0, d * rows, rows));
          rankLosses[s].push_back(at::cross_entropy_loss(l.reshape({-1, kVocab}),
                                                         labels[s].narrow(0, d * rows, rows).reshape({-1}),
                                                         {}, at::Reduction::Mean, -100)
                                      .item<double>());
        }
      }
      at::Tensor l = eagerLogits(weights, ids[s]);
      at::Tensor loss = at::cross_entropy_loss(l.reshape({-1, kVocab}), labels[s].reshape({-1}),
                                               {}, at::Reduction::Mean, -100);
      loss.backward();
      double sumSquares = 0;
      at::NoGradGuard noGrad;
      for (auto &[name, t] : weights) {
        sumSquares += t.grad().pow(2).sum().item<double>();
        t.sub_(t.grad() * lr);
        t.mutable_grad() = at::Tensor();
      }
      norms.push_back(std::sqrt(sumSquares));
    }

    std::mutex mutex;
    runRanks(world, [&](int64_t rank, Comm &comm) {
      plan::Archive archive(path);
      Model model(archive, at::kCPU, &comm);
      ASSERT_NE(model.tensorParallel(), nullptr);
      EXPECT_EQ(model.tensorParallel()->size(), tp);
      EXPECT_EQ(model.tensorParallel()->rank(), rank % tp);
      EXPECT_EQ(model.dataParallel().size(), dp);
      EXPECT_EQ(model.dataParallel().rank(), rank / tp);
      // Rank-local loading: this rank's ZeRO shard of its TP rank's copies
      // (each range widened to whole checksummed chunks: a chunk more at
      // either end at most).
      int64_t chunks = 0;
      for (const plan::StorageGroup &g : archive.plan().groups)
        chunks += 2 * g.chunkBytes;
      EXPECT_LE(archive.bytesRead(), archiveBytes / world + archiveBytes / 100 + chunks)
          << "rank " << rank;
      const int64_t d = rank / tp;
      for (int64_t s = 0; s < steps; ++s) {
        at::Tensor logits = model.forward(ids[s].narrow(0, d * rows, rows).contiguous(), {});
        EXPECT_EQ(logits.size(-1), kPadded / tp);
        at::Tensor loss = model.loss(logits, labels[s].narrow(0, d * rows, rows).contiguous());
        EXPECT_NEAR(loss.item<double>(), rankLosses[s][d], 1e-5) << "rank " << rank << " step " << s;
        loss.backward();
        model.synchronizeGradients();
        double norm = model.gradNorm().item<double>();
        EXPECT_NEAR(norm, norms[s], 1e-5 * norms[s]) << "rank " << rank << " step " << s;
        {
          at::NoGradGuard noGrad;
          for (const at::Tensor &param : model.parameters()) {
            at::Tensor p = param;
            if (p.grad().defined())
              p.sub_(p.grad() * lr);
            p.mutable_grad() = at::Tensor();
          }
        }
        model.afterOptimizerStep();
      }
      std::vector<std::pair<std::string, at::Tensor>> trained = model.fullParameters();
      std::lock_guard<std::mutex> lock(mutex);
      EXPECT_EQ(trained.size(), weights.size());
      for (const auto &[name, value] : trained) {
        const at::Tensor &want = weights.at(name);
        ASSERT_EQ(value.sizes(), want.sizes()) << name;
        EXPECT_LE(value.sub(want).abs().max().item<double>(), 1e-4) << "rank " << rank << " " << name;
      }
    });
  }

  std::filesystem::path dir_;
};

/// The same global windows every step, this data-parallel rank's rows.
class FixedWindows : public MicroBatchSource {
public:
  FixedWindows(std::vector<at::Tensor> windows, int64_t rank, int64_t rows)
      : windows_(std::move(windows)), rank_(rank), rows_(rows) {}
  MicroBatch next() override {
    MicroBatch b;
    b.window = windows_.at(next_++);
    b.rowBegin = rank_ * rows_;
    b.rowEnd = (rank_ + 1) * rows_;
    return b;
  }
  DataPosition position() const override { return {"fixed-batches", "", 0, next_, 0}; }
  void seek(const DataPosition &p) override { next_ = p.microBatches; }

private:
  std::vector<at::Tensor> windows_;
  int64_t rank_, rows_, next_ = 0;
};

/// Trainer on `world` ranks with T = tp against eager ATen: SGD, or AdamW
/// (decay 0.1 on matrices only, bmt-run's default groups) written out.
void trainerAgainstEager(const std::filesystem::path &dir_, int64_t world, int64_t tp,
                         bool adamw) {
  SCOPED_TRACE("N = " + std::to_string(world) + ", T = " + std::to_string(tp) +
               (adamw ? ", AdamW" : ", SGD"));
  const int64_t dp = world / tp, steps = 3, batch = 4, seq = 5;
  const double lr = adamw ? 0.05 : 0.5, decay = 0.1, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::map<std::string, at::Tensor> weights = initialWeights();
  plan::Plan p = tensorParallelPlan(tp);
  std::string path = (dir_ / "trainer.pt").string();
  plan::writeArchive(path, p, "module {}", [&](size_t i) { return weights.at(p.tensors[i].name); });
  at::manual_seed(5);
  std::vector<at::Tensor> windows;
  for (int64_t s = 0; s < steps; ++s)
    windows.push_back(at::randint(0, kVocab, {batch, seq + 1}, at::kLong));
  // Eager ATen: causal LM on the whole batch, SGD.
  std::vector<double> losses;
  std::map<std::string, at::Tensor> m, v;
  for (auto &[name, t] : weights) {
    t.requires_grad_(true);
    m[name] = at::zeros_like(t);
    v[name] = at::zeros_like(t);
  }
  for (int64_t step = 1; step <= steps; ++step) {
    const at::Tensor &w = windows[step - 1];
    at::Tensor logits = eagerLogits(weights, w.narrow(1, 0, seq));
    at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, kVocab}),
                                             w.narrow(1, 1, seq).reshape({-1}));
    loss.backward();
    losses.push_back(loss.item<double>());
    at::NoGradGuard noGrad;
    for (auto &[name, t] : weights) {
      at::Tensor g = t.grad();
      if (adamw) {
        m[name] = m[name] * beta1 + g * (1 - beta1);
        v[name] = v[name] * beta2 + g * g * (1 - beta2);
        if (t.dim() >= 2)
          t.mul_(1 - lr * decay);
        at::Tensor mHat = m[name] / (1 - std::pow(beta1, step));
        at::Tensor vHat = v[name] / (1 - std::pow(beta2, step));
        t.sub_(mHat / (vHat.sqrt() + eps) * lr);
      } else {
        t.sub_(g * lr);
      }
      t.mutable_grad() = at::Tensor();
    }
  }
  std::string log;
  std::mutex mutex;
  runRanks(world, [&](int64_t rank, Comm &comm) {
    plan::Archive archive(path);
    Model model(archive, at::kCPU, &comm);
    TrainConfig config;
    config.steps = steps;
    config.schedule.peakLR = lr;
    config.schedule.totalSteps = steps + 1;
    config.optimizer.kind = adamw ? OptimizerKind::AdamW : OptimizerKind::SGD;
    if (adamw)
      config.optimizer.weightDecay = decay;
    config.clipGrad = 0;
    std::ostringstream out, json;
    Trainer trainer(model, config, out, &json);
    FixedWindows source(windows, model.dataParallel().rank(), batch / dp);
    trainer.train(source, nullptr, seq, batch / dp);
    std::vector<std::pair<std::string, at::Tensor>> trained = model.fullParameters();
    std::lock_guard<std::mutex> lock(mutex);
    if (rank == 0)
      log = json.str();
    for (const auto &[name, value] : trained)
      EXPECT_LE(value.sub(weights.at(name)).abs().max().item<double>(), 1e-4)
          << "rank " << rank << " " << name;
  });
  std::regex train("\\{\"kind\": \"train\", \"step\": (\\d+), \"loss\": ([-0-9.e+]+)");
  int64_t found = 0;
  for (std::sregex_iterator it(log.begin(), log.end(), train), end; it != end; ++it, ++found) {
    int64_t step = std::stoll((*it)[1]);
    ASSERT_LE(step, steps);
    EXPECT_NEAR(std::stod((*it)[2]), losses[step - 1], 1e-5) << "step " << step;
  }
  EXPECT_EQ(found, steps) << log;
}

TEST_F(TensorParallelTraining, TrainerSplitsTheBatchOverDataParallelRanks) {
  trainerAgainstEager(dir_, 2, 1, /*adamw=*/false);
  trainerAgainstEager(dir_, 4, 2, /*adamw=*/false);
  trainerAgainstEager(dir_, 4, 2, /*adamw=*/true);
  trainerAgainstEager(dir_, 2, 2, /*adamw=*/true);
}

TEST_F(TensorParallelTraining, TwoRanksOneTensorParallelGroup) { trainAndCompare(2, 2); }

TEST_F(TensorParallelTraining, FourRanksTwoDataParallelTimesTwoTensorParallel) {
  trainAndCompare(4, 2);
}

TEST_F(TensorParallelTraining, FourRanksOneTensorParallelGroup) { trainAndCompare(4, 4); }

TEST_F(TensorParallelTraining, RefusesAWorldSizeThatIsNotAMultipleOfT) {
  std::map<std::string, at::Tensor> weights = initialWeights();
  plan::Plan p = tensorParallelPlan(2);
  std::string path = (dir_ / "odd.pt").string();
  plan::writeArchive(path, p, "module {}", [&](size_t i) { return weights.at(p.tensors[i].name); });
  runRanks(3, [&](int64_t, Comm &comm) {
    plan::Archive archive(path);
    try {
      Model model(archive, at::kCPU, &comm);
      ADD_FAILURE() << "3 ranks with T = 2 were accepted";
    } catch (const ExecutionError &e) {
      EXPECT_NE(std::string(e.what()).find("multiple of 2, not 3 ranks"), std::string::npos)
          << e.what();
    }
  });
}

TEST_F(TensorParallelTraining, WeightsFreeSlicesAreTheirTpRanksOwn) {
  // Init rules on local slices: a split tensor's slices differ between TP
  // ranks, a replicated one is the same on every TP rank, vocab padding is
  // zero.
  plan::Plan p = tensorParallelPlan(2);
  for (plan::TensorInfo &t : p.tensors)
    t.init = "normal:0.5";
  std::string path = (dir_ / "free.pt").string();
  plan::writeArchive(path, p, "module {}", [](size_t) -> at::Tensor {
    throw plan::PlanError("weights of a weights-free plan were asked for");
  });
  std::map<int64_t, std::vector<std::pair<std::string, at::Tensor>>> params;
  std::mutex mutex;
  runRanks(2, [&](int64_t rank, Comm &comm) {
    plan::Archive archive(path);
    Model model(archive, at::kCPU, &comm);
    EXPECT_EQ(archive.bytesRead(), 0);
    auto all = model.fullParameters();
    std::lock_guard<std::mutex> lock(mutex);
    params[rank] = all;
  });
  ASSERT_EQ(params.size(), 2u);
  for (size_t i = 0; i < params[0].size(); ++i) {
    const auto &[name, value] = params[0][i];
    EXPECT_TRUE(at::equal(value, params[1][i].second)) << name; // gathered: the same global tensor
    if (name == "wte") {
      // The halves (TP slices of 20 rows) are not copies of each other.
      EXPECT_FALSE(at::allclose(value.narrow(0, 0, 17), value.narrow(0, 20, 17)));
      EXPECT_GT(value.abs().max().item<double>(), 0.0);
    }
  }
}

} // namespace
