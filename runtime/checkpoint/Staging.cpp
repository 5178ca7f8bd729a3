//===- Staging.cpp - snapshots and the saving thread ----------------------===//
//
// CheckpointSaver (docs/checkpoint-format.md has the protocol):
//
//   main thread:  save(): snapshot the device tensors into pinned host
//                 buffers on a side stream (CUDA), queue the host ones;
//                 hand the snapshot to the saving thread; return.
//                 beforeStateChange() (before the next optimizer step): the
//                 compute stream waits for the copies; the host waits for
//                 the saving thread's host copies.
//   saving thread: host copies; wait for the device copies; write and
//                 fsync rank-R.safetensors with its CRC-32s; rank-R.done.
//                 Rank 0 then waits for every rank's marker and commits
//                 (FileStorage.h): the model's Hugging Face files (hf/),
//                 checkpoint.json, rename the folder, COMPLETE, remove old
//                 checkpoints.
//
// The saving thread runs no collective: the ranks meet through the files,
// so a save never stalls the training's communication.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/checkpoint/Checkpoint.h"
#include "FileStorage.h"
#include "Metadata.h"

#include "bmt/Runtime/Env.h"

#include "bmt/Plan/Plan.h"
#include "bmt/Runtime/comm/Comm.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/optim/LossScaler.h"
#include "bmt/Runtime/optim/Optimizer.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

namespace fs = std::filesystem;

namespace bmt::runtime {

using namespace checkpoint;

namespace {

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// One tensor of this rank's file: the live tensor and its host copy.
struct Item {
  std::string name;
  at::Tensor live;      ///< the state (device or host); undefined for derived items
  at::Tensor host;      ///< persistent host buffer (pinned on CUDA)
  at::Tensor deriveFrom; ///< host buffer of another item this one is a dtype conversion of
  bool hostCopy = false; ///< live is on the host: the saving thread copies it
};

struct Snapshot {
  int64_t step = 0;
  std::vector<Item *> items;
  std::optional<c10::Event> copied; ///< CUDA: the device copies are done
  std::string folder;               ///< the .tmp folder
  json metadata;                    ///< checkpoint.json without the loss scale
  at::Tensor lossScale, cleanSteps; ///< host copies
  Clock::time_point started;
};

} // namespace

struct CheckpointSaver::Impl {
  Model &model;
  Optimizer &optimizer;
  const LossScaler *scaler;
  CheckpointOptions options;
  RunIdentity identity;
  int64_t rank = 0, worldSize = 1;
  /// Tensor parallelism: T of the plan and this rank's TP rank (rank % T).
  int64_t tp = 1, tpRank = 0;
  /// Expert weights split over the expert group: E and this rank's
  /// position in its expert group (rank % E); 1 and 0 otherwise.
  int64_t ep = 1, epRank = 0;
  int version = kFormatVersion; ///< checkpointVersion(plan)
  std::vector<SpaceSlot> slots; ///< of this rank's spaces, in checkpoint.json
  /// Pipeline parallelism: P, this rank's stage, and by plan group the
  /// stage whose ranks write it (Model::groupSavingStages); 1, 0, empty
  /// without stages.
  int64_t stages = 1, stage = 0;
  std::vector<int64_t> savingStage;
  std::string nonce;
  at::Device device = at::kCPU;
  std::optional<c10::Stream> copyStream;
  std::map<std::string, Item> items; ///< persistent buffers, by name
  at::Tensor lossScaleHost, cleanStepsHost;

  std::thread thread;
  std::mutex mutex;
  std::condition_variable changed;
  bool hostCopiesDone = true;        ///< the saving thread finished reading live host tensors
  std::optional<c10::Event> pendingCopies; ///< CUDA copies not yet waited for by the compute stream
  std::optional<CheckpointResult> finished; ///< not yet reported
  std::vector<std::string> removedAtStart;  ///< removeDeadSaves' folder names
  /// Rank 0: the checkpoint folder's lock, held for the run's life.
  FolderLock folderLock;

  Impl(Model &m, Optimizer &o, const LossScaler *s, CheckpointOptions opts, RunIdentity id)
      : model(m), optimizer(o), scaler(s), options(std::move(opts)), identity(std::move(id)) {}

  void join() {
    if (thread.joinable())
      thread.join();
  }

  std::string tmpFolder(int64_t step) const {
    return (fs::path(options.dir) / (stepName(step) + ".tmp-" + nonce)).string();
  }

  Item &item(const std::string &name, const at::Tensor &live) {
    Item &it = items[name];
    it.name = name;
    it.live = live.detach();
    if (!it.host.defined() || it.host.sizes() != live.sizes() ||
        it.host.scalar_type() != live.scalar_type())
      it.host = at::empty(live.sizes(), at::TensorOptions().dtype(live.scalar_type())
                                            .pinned_memory(live.is_cuda()));
    it.hostCopy = !live.is_cuda();
    return it;
  }

  /// The index of this rank's space `k` in checkpoint.json's spaces (and
  /// its tensors' "s<index>." names): with T > 1 each space is listed once
  /// per TP rank, an expert-split group once per expert-group position
  /// (spaceSlots), this rank's copy at first + its TP rank or position.
  int64_t savedIndex(size_t k) const {
    const SpaceSlot &slot = slots.at(k);
    return slot.first + (slot.copies == 1 ? 0 : slot.expert ? epRank : tpRank);
  }

  /// Whether this rank writes its space `k`: the first replica of its
  /// shard, and in a pipeline on the stage that saves the group (a group
  /// stages 0 and P - 1 share is written once, by stage 0).
  bool writes(const ParameterSpace &s, size_t k) const {
    return s.writer &&
           (stages == 1 || savingStage.at(static_cast<size_t>(slots.at(k).group)) == stage);
  }

  /// The items of this rank's file, their live tensors as of now.
  std::vector<Item *> collectItems() {
    std::vector<ParameterSpace> spaces = model.parameterSpaces();
    OptimizerState state = optimizer.state();
    const bool derivedParams = [&] {
      for (const auto &[key, t] : state.tensors)
        if (splitStateKey(key).first == "master")
          return true;
      return false;
    }();
    std::vector<Item *> out;
    std::map<size_t, size_t> spaceOfParameter;
    for (size_t k = 0; k < spaces.size(); ++k)
      spaceOfParameter[spaces[k].parameter] = k;
    for (size_t k = 0; k < spaces.size(); ++k) {
      const ParameterSpace &s = spaces[k];
      if (!writes(s, k))
        continue;
      const at::Tensor &trainable = model.parameters().at(s.parameter);
      if (!derivedParams)
        out.push_back(&item(fieldName(savedIndex(k), "param"), s.value));
      if (lowPrecision(s.dtype) && trainable.scalar_type() != s.dtype)
        out.push_back(&item(fieldName(savedIndex(k), "master"), trainable.view({-1})));
    }
    for (const auto &[key, tensor] : state.tensors) {
      auto [slot, i] = splitStateKey(key);
      const size_t k = spaceOfParameter.at(i);
      const ParameterSpace &s = spaces[k];
      if (!writes(s, k))
        continue;
      // Replicated over the shard group (Adafactor's factors): shard 0 saves it.
      if (state.replicatedSlots.count(slot) && s.shardIndex != 0)
        continue;
      at::Tensor flat = tensor.dim() == 0 ? tensor : tensor.view({-1});
      if (slot == "master") {
        // An offloaded optimizer's master (host memory): the device
        // parameters are its copy, in flight on a side stream at this
        // point, so the saved parameters are converted from the master.
        Item &master = item(fieldName(savedIndex(k), "master"), flat);
        out.push_back(&master);
        if (!lowPrecision(s.dtype))
          masterOnlyForDerive.insert(master.name); // (float32: it is the parameter)
        Item &param = items[fieldName(savedIndex(k), "param")];
        param.name = fieldName(savedIndex(k), "param");
        param.live = at::Tensor();
        param.hostCopy = false;
        if (!param.host.defined() || param.host.numel() != flat.numel())
          param.host = at::empty({flat.numel()}, at::TensorOptions().dtype(s.dtype));
        param.deriveFrom = master.host;
        out.push_back(&param);
        continue;
      }
      out.push_back(&item(fieldName(savedIndex(k), slot), flat));
    }
    // The buffers training moves (the routers' score-correction biases):
    // the same on every rank, so rank 0 saves them.
    if (rank == 0)
      for (const auto &[name, buffer] : model.routerBiases())
        out.push_back(&item(kBufferPrefix + name, buffer));
    // The RNG states.
    out.push_back(&item("rng.cpu", at::detail::getDefaultCPUGenerator().get_state()));
    if (device.is_cuda())
      out.push_back(&item("rng.cuda", at::globalContext().defaultGenerator(device).get_state()));
    return out;
  }

  std::set<std::string> masterOnlyForDerive; ///< host copies used to derive params, not saved
  bool committing = false; ///< rank 0's saving thread: waitForRanks of commit() has run
  /// The bytes of each checksummed chunk of a tensor (kChunkBytes;
  /// BMT_DEBUG_CHECKPOINT_CHUNK_BYTES sets another, for tests of tiny
  /// models whose tensors are smaller than a chunk).
  int64_t chunkBytes = env::debugCheckpointChunkBytes().value_or(kChunkBytes);
  /// BMT_DEBUG_CHECKPOINT_SLOW_MS: sleep after writing each tensor (tests
  /// that kill a rank during a save).
  int64_t slowWriteMs = env::debugCheckpointSlowMs();

  /// The saving thread: copies, writes, commits.
  void write(std::shared_ptr<Snapshot> snap) {
    committing = false;
    CheckpointResult result;
    result.step = snap->step;
    const std::string myFile = (fs::path(snap->folder) / rankName(rank, ".safetensors")).string();
    const std::string failedFile = (fs::path(snap->folder) / rankName(rank, ".failed")).string();
    RankMarker marker(snap->folder, rank);
    try {
      {
        c10::NoGradGuard noGrad;
        for (Item *it : snap->items)
          if (it->hostCopy)
            it->host.copy_(it->live);
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        hostCopiesDone = true;
      }
      changed.notify_all();
      if (snap->copied)
        snap->copied->synchronize();
      for (Item *it : snap->items)
        if (it->deriveFrom.defined())
          it->host.copy_(it->deriveFrom.view({-1}));
      // This rank's file.
      std::vector<std::pair<std::string, at::Tensor>> saved;
      for (Item *it : snap->items)
        if (!masterOnlyForDerive.count(it->name))
          saved.emplace_back(it->name, it->host);
      result.bytes = writeRankFile(myFile, saved, version, rank, chunkBytes, slowWriteMs);
      marker.write(std::to_string(result.bytes) + "\n",
                  (fs::path(snap->folder) / rankName(rank, ".done")).string());
      result.ok = true;
      if (rank == 0)
        commit(*snap, result);
    } catch (const std::exception &e) {
      result.ok = false;
      result.error = e.what();
      std::error_code ec;
      fs::remove(myFile, ec); // give the space back
      try {
        marker.write(result.error.substr(0, 4000) + "\n", failedFile);
      } catch (const std::exception &) {
      }
      if (rank == 0) {
        // Remove the folder once no rank writes into it any more.
        if (!committing) {
          try {
            waitForRanks(snap->folder, worldSize);
          } catch (const std::exception &) {
          }
        }
        fs::remove_all(snap->folder, ec);
      }
      std::lock_guard<std::mutex> lock(mutex);
      hostCopiesDone = true;
    }
    changed.notify_all();
    result.writeSeconds = secondsSince(snap->started);
    std::lock_guard<std::mutex> lock(mutex);
    finished = result;
  }

  /// Rank 0: waits for every rank's file, then makes the checkpoint
  /// complete (docs/checkpoint-format.md). Throws std::runtime_error.
  void commit(Snapshot &snap, CheckpointResult &result) {
    committing = true; // from here on every rank has its marker
    json meta = snap.metadata;
    meta["rank_bytes"] = waitForRanks(snap.folder, worldSize);
    if (snap.lossScale.defined())
      meta["loss_scale"] = {{"scale", snap.lossScale.item<double>()},
                            {"clean_steps", static_cast<int64_t>(snap.cleanSteps.item<double>())}};
    result.path = commitFolder(options.dir, snap.folder, snap.step, version, worldSize,
                               meta.dump(1) + "\n", identity.hfFiles);
    removeOldCheckpoints(options.dir, options.keep);
  }
};

CheckpointSaver::CheckpointSaver(Model &model, Optimizer &optimizer, const LossScaler *scaler,
                                 CheckpointOptions options, RunIdentity identity)
    : impl_(std::make_unique<Impl>(model, optimizer, scaler, std::move(options),
                                   std::move(identity))) {
  Impl &s = *impl_;
  checkCheckpointLayout(model.plan(), s.options.dir);
  Comm &world = model.world();
  s.rank = world.rank();
  s.worldSize = world.size();
  s.tp = model.plan().tensorParallel;
  if (s.tp > 1)
    s.tpRank = model.tensorParallel()->rank();
  if (model.plan().splitsExperts()) {
    s.ep = model.plan().expertParallel;
    s.epRank = s.rank % s.ep; // expert group g: ranks [g*E, (g+1)*E)
  }
  s.version = checkpointVersion(model.plan());
  if (model.pipelineStages() > 1) {
    s.stages = model.pipelineStages();
    s.stage = model.pipelineStage();
    s.savingStage = model.groupSavingStages();
    s.slots = pipelineSpaceSlots(model.plan(), model.parameterSpaces(), s.tp);
  } else {
    s.slots = spaceSlots(model.plan(), model.parameterSpaces().size(), s.tp);
  }
  s.device = model.device();
  // The run's name for its save folders: rank 0's random number, so that
  // the folder of a save that died (in an earlier run) is never mistaken
  // for this run's.
  // With it, whether rank 0 got the folder's lock: two runs saving into one
  // folder would replace each other's checkpoints (and remove each other's
  // saves in progress as dead), each reporting its saves as done.
  std::error_code ec;
  fs::create_directories(s.options.dir, ec);
  const bool locked = s.rank != 0 || s.folderLock.acquire(s.options.dir);
  at::Tensor nonce = at::empty({2}, at::TensorOptions().dtype(at::kLong));
  nonce.data_ptr<int64_t>()[0] = static_cast<int64_t>(std::random_device{}() >> 1);
  nonce.data_ptr<int64_t>()[1] = locked ? 1 : 0;
  if (s.worldSize > 1) {
    at::Tensor t = world.backend() == "local" ? nonce : nonce.to(world.device());
    world.broadcast(t, 0)->wait();
    nonce = t.cpu();
  }
  if (nonce[1].item<int64_t>() == 0)
    throw CheckpointError(s.options.dir + ": another run is saving checkpoints into this folder "
                          "(it holds the folder's lock); its saves and this run's would replace "
                          "each other: wait for it to end, or use another --checkpoint-dir");
  char hex[17];
  std::snprintf(hex, sizeof hex, "%08llx", static_cast<unsigned long long>(nonce[0].item<int64_t>()));
  s.nonce = hex;
  // Saves of this run into a folder that holds checkpoints of later steps
  // would replace them (or be dropped beside them): refuse before training.
  if (std::vector<std::string> later = checkpointsAfter(s.options.dir, s.options.startStep);
      !later.empty()) {
    std::string names;
    for (const std::string &name : later)
      names += " " + name;
    throw CheckpointError(
        s.options.dir + " holds checkpoints of steps after step " +
        std::to_string(s.options.startStep) + ", where this run starts:" + names +
        "; its saves would replace or mix with them: resume the latest (--resume auto), move "
        "them out of " + s.options.dir + ", or save into another --checkpoint-dir");
  }
  const fs::path probe = fs::path(s.options.dir) / (".probe-" + s.nonce + "-" + std::to_string(s.rank));
  try {
    writeSynced(probe.string(), "");
    fs::remove(probe, ec);
  } catch (const std::runtime_error &e) {
    throw CheckpointError(s.options.dir + ": cannot write checkpoints there (" +
                          (ec ? ec.message() : std::string(e.what())) + ")");
  }
  if (s.rank == 0)
    s.removedAtStart = removeDeadSaves(s.options.dir, s.nonce);
  if (s.worldSize > 1)
    world.barrier(); // rank 0 removed the dead saves before anyone writes
  if (s.device.is_cuda())
    s.copyStream = c10::impl::VirtualGuardImpl(s.device.type())
                       .getStreamFromGlobalPool(s.device, /*isHighPriority=*/false);
  // The host buffers now, not in the first save: pinning the rank's share
  // of the state takes seconds (cudaHostAlloc of 18 GB: 13 s on an H200
  // host) that would otherwise hold the training loop.
  s.collectItems();
}

CheckpointSaver::~CheckpointSaver() { impl_->join(); }

int64_t CheckpointSaver::hostBytes() const {
  int64_t n = 0;
  for (const auto &[name, item] : impl_->items)
    n += static_cast<int64_t>(item.host.nbytes());
  return n;
}

const std::vector<std::string> &CheckpointSaver::removedDeadSaves() const {
  return impl_->removedAtStart;
}

bool CheckpointSaver::due(int64_t step) const {
  return impl_->options.every > 0 && step % impl_->options.every == 0;
}

double CheckpointSaver::save(const TrainingProgress &progress) {
  Impl &s = *impl_;
  const auto start = Clock::now();
  s.join(); // the previous save
  auto snap = std::make_shared<Snapshot>();
  snap->step = progress.step;
  snap->started = start;
  snap->folder = s.tmpFolder(progress.step);
  std::error_code ec;
  fs::create_directories(snap->folder, ec);
  snap->items = s.collectItems();
  if (s.rank == 0 && s.stages > 1) {
    // Every stage's groups (rank 0 holds stage 0's only), and who wrote
    // them: each TP rank's copy sharded over the stage's D = N / (P x T).
    snap->metadata = checkpointJson(
        s.identity, s.version, s.worldSize, s.tp, s.ep, progress,
        pipelineSpacesJson(s.model.plan(), s.savingStage, s.worldSize / (s.stages * s.tp),
                           s.tp));
    snap->metadata["pipeline_stages"] = s.stages;
    if (s.model.pipelineVirtualStages() > 1)
      snap->metadata["virtual_stages"] = s.model.pipelineVirtualStages();
  } else if (s.rank == 0) {
    snap->metadata = checkpointJson(s.identity, s.version, s.worldSize, s.tp, s.ep, progress,
                                    spacesJson(s.model.plan(), s.model.parameterSpaces(), s.tp));
  }
  // Device tensors: copied on the side stream once the compute stream has
  // produced them.
  if (s.copyStream) {
    c10::impl::VirtualGuardImpl guard(s.device.type());
    c10::Stream compute = guard.getStream(s.device);
    c10::Event produced(s.device.type());
    produced.record(compute);
    produced.block(*s.copyStream);
    {
      c10::StreamGuard onCopy(*s.copyStream);
      c10::NoGradGuard noGrad;
      for (Item *it : snap->items)
        if (it->live.defined() && it->live.is_cuda())
          it->host.copy_(it->live, /*non_blocking=*/true);
      if (s.scaler) {
        s.lossScaleHost = at::empty({1}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
        s.cleanStepsHost = at::empty({1}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
        s.lossScaleHost.copy_(s.scaler->scale(), true);
        s.cleanStepsHost.copy_(s.scaler->cleanSteps(), true);
      }
    }
    snap->copied.emplace(s.device.type());
    snap->copied->record(*s.copyStream);
    s.pendingCopies.emplace(s.device.type());
    s.pendingCopies->record(*s.copyStream);
  } else if (s.scaler) {
    s.lossScaleHost = s.scaler->scale().cpu().clone();
    s.cleanStepsHost = s.scaler->cleanSteps().cpu().clone();
  }
  if (s.scaler) {
    snap->lossScale = s.lossScaleHost;
    snap->cleanSteps = s.cleanStepsHost;
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.hostCopiesDone = false;
  }
  s.thread = std::thread([&s, snap] { s.write(snap); });
  return secondsSince(start);
}

double CheckpointSaver::beforeStateChange() {
  Impl &s = *impl_;
  const auto start = Clock::now();
  if (s.pendingCopies) {
    c10::impl::VirtualGuardImpl guard(s.device.type());
    s.pendingCopies->block(guard.getStream(s.device));
    s.pendingCopies.reset();
  }
  std::unique_lock<std::mutex> lock(s.mutex);
  s.changed.wait(lock, [&] { return s.hostCopiesDone; });
  return secondsSince(start);
}

std::optional<CheckpointResult> CheckpointSaver::poll() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::optional<CheckpointResult> r = std::move(impl_->finished);
  impl_->finished.reset();
  return r;
}

std::optional<CheckpointResult> CheckpointSaver::wait() {
  impl_->join();
  return poll();
}

} // namespace bmt::runtime
