//===- Checkpoint.cpp - loading sharded training checkpoints ---------------===//
//
// loadCheckpoint: each rank reads only the slices of its own layout from
// the rank files (docs/checkpoint-format.md). Saving is Staging.cpp's,
// checkpoint.json Metadata.cpp's, the folder protocol FileStorage.cpp's.
//
//===----------------------------------------------------------------------===//

#include "bmt/Runtime/checkpoint/Checkpoint.h"
#include "FileStorage.h"
#include "LoadPlan.h"
#include "Metadata.h"

#include "bmt/Runtime/Env.h"

#include "bmt/Plan/Plan.h"
#include "bmt/Runtime/comm/Comm.h"
#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/io/Safetensors.h"
#include "bmt/Runtime/optim/LossScaler.h"
#include "bmt/Runtime/optim/Optimizer.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <cerrno>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace bmt::runtime {

using namespace checkpoint;

// --- loading ----------------------------------------------------------------

namespace {

/// Reads this rank's pieces from the checkpoint's rank files.
class CheckpointReader {
public:
  CheckpointReader(std::string folder, const SavedLayout &layout)
      : folder_(std::move(folder)), layout_(layout) {}

  const SavedLayout &layout() const { return layout_; }

  SafetensorsFile &file(int64_t rank) {
    auto it = files_.find(rank);
    if (it != files_.end())
      return *it->second;
    const std::string path = (fs::path(folder_) / rankName(rank, ".safetensors")).string();
    std::error_code ec;
    if (!fs::exists(path, ec))
      throw CheckpointError(path + ": missing (the checkpoint of " + std::to_string(layout_.worldSize()) +
                            " ranks has no file of rank " + std::to_string(rank) + ")");
    std::unique_ptr<SafetensorsFile> f;
    try {
      f = std::make_unique<SafetensorsFile>(path);
    } catch (const std::runtime_error &e) {
      throw CheckpointError(e.what());
    }
    auto crc = f->metadata().find("crc32");
    if (f->metadata().count("format") == 0 || f->metadata().at("format") != kFormat ||
        crc == f->metadata().end())
      throw CheckpointError(path + ": not a bmt checkpoint shard");
    try {
      const json table = json::parse(crc->second);
      for (const auto &[name, value] : table.items())
        crcs_[{rank, name}] = parseCrc(value.get<std::string>());
      // Per-chunk CRC-32s (checkpoints written before them have none: a
      // tensor is then one chunk, checked by its whole CRC-32).
      auto chunkBytes = f->metadata().find("crc32_chunk_bytes");
      auto chunks = f->metadata().find("crc32_chunks");
      if ((chunkBytes == f->metadata().end()) != (chunks == f->metadata().end()))
        throw std::invalid_argument("half a chunk table");
      if (chunks != f->metadata().end()) {
        chunkBytes_[rank] = std::stoll(chunkBytes->second);
        if (chunkBytes_[rank] <= 0)
          throw std::invalid_argument("chunk size");
        const json chunkTable = json::parse(chunks->second);
        for (const auto &[name, value] : chunkTable.items()) {
          const std::string hex = value.get<std::string>();
          const SafetensorsEntry *e = f->find(name);
          const int64_t n = e ? (e->nbytes() + chunkBytes_[rank] - 1) / chunkBytes_[rank] : 0;
          if (!e || static_cast<int64_t>(hex.size()) != 8 * n)
            throw std::invalid_argument("chunk count of " + name);
          std::vector<uint32_t> &list = chunkCrcs_[{rank, name}];
          for (int64_t i = 0; i < n; ++i)
            list.push_back(parseCrc(hex.substr(static_cast<size_t>(8 * i), 8)));
        }
      }
      for (const SafetensorsEntry &e : f->entries())
        if (!crcs_.count({rank, e.name}) ||
            (chunks != f->metadata().end() && !chunkCrcs_.count({rank, e.name})))
          throw std::invalid_argument("no checksum of " + e.name);
    } catch (const std::exception &e) {
      throw CheckpointError(path + ": bad checksums in its header (" + e.what() + ")");
    }
    return *files_.emplace(rank, std::move(f)).first->second;
  }

  static uint32_t parseCrc(const std::string &hex) {
    if (hex.size() != 8 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
      throw std::invalid_argument("not a CRC-32: " + hex);
    return static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
  }

  /// Queues a copy of `numel` elements of field `field` of saved space
  /// `space`, from element `begin` of its flat buffer, to `dst`.
  void request(size_t space, const std::string &field, int64_t begin, int64_t numel,
               char *dst, c10::ScalarType dtype) {
    const int64_t elementSize = static_cast<int64_t>(c10::elementSize(dtype));
    for (const SavedLayout::ShardRead &r : layout_.shardReads(space, begin, numel, elementSize)) {
      Piece p;
      p.offset = r.offset;
      p.nbytes = r.nbytes;
      p.dst = dst + r.dst;
      p.dtype = dtype;
      Pending &pending = pending_[{r.rank, fieldName(static_cast<int64_t>(space), field)}];
      pending.space = space;
      pending.shard = r.shard;
      pending.pieces.push_back(p);
    }
  }

  /// Reads every queued piece and checks every byte it reads: the chunks
  /// of the saved tensor that the pieces touch are read (one pread per run
  /// of adjacent chunks, at most 16 MiB at a time) and each is checked
  /// against its CRC-32. A tensor without per-chunk CRC-32s (a checkpoint
  /// written before them) is one chunk: read whole and checked against its
  /// CRC-32. Throws CheckpointError naming the file, the tensor, the
  /// chunk's bytes and the model tensors in them (the destinations then
  /// hold unchecked bytes: the caller discards them with the error).
  void flush() {
    constexpr int64_t kSpan = 16 << 20;
    std::vector<char> span;
    for (auto &[key, pending] : pending_) {
      const auto &[rank, name] = key;
      std::vector<Piece> &pieces = pending.pieces;
      SafetensorsFile &f = file(rank);
      const SafetensorsEntry *e = f.find(name);
      if (!e)
        throw CheckpointError(f.path() + ": has no tensor " + name);
      if (e->dtype != pieces.front().dtype)
        throw CheckpointError(f.path() + ": tensor " + name + " is " +
                              c10::toString(e->dtype) + ", this run keeps it in " +
                              c10::toString(pieces.front().dtype));
      std::sort(pieces.begin(), pieces.end(),
                [](const Piece &a, const Piece &b) { return a.offset < b.offset; });
      const auto chunked = chunkCrcs_.find(key);
      const bool legacy = chunked == chunkCrcs_.end();
      const int64_t size = e->nbytes();
      const int64_t chunk = legacy ? std::max<int64_t>(size, 1) : chunkBytes_.at(rank);
      // The runs of adjacent chunks the pieces touch: [first, last] chunk.
      std::vector<std::pair<int64_t, int64_t>> runs;
      for (const Piece &p : pieces) {
        if (p.nbytes <= 0)
          continue;
        const int64_t first = p.offset / chunk, last = (p.offset + p.nbytes - 1) / chunk;
        if (!runs.empty() && first <= runs.back().second + 1)
          runs.back().second = std::max(runs.back().second, last);
        else
          runs.emplace_back(first, last);
      }
      size_t firstPiece = 0;
      try {
        for (const auto &[firstChunk, lastChunk] : runs) {
          const int64_t runEnd = std::min(size, (lastChunk + 1) * chunk);
          // Whole chunks per read where a chunk fits in a span.
          const int64_t step = chunk <= kSpan ? kSpan / chunk * chunk : kSpan;
          uint32_t crc = 0; // of the current chunk's bytes so far
          for (int64_t at = firstChunk * chunk; at < runEnd;) {
            const int64_t n = std::min(step, runEnd - at);
            span.resize(static_cast<size_t>(n));
            f.read(name, at, n, span.data());
            // Check each chunk that ends in this span.
            for (int64_t c = at; c < at + n;) {
              const int64_t index = c / chunk;
              const int64_t chunkEnd = std::min(size, (index + 1) * chunk);
              const int64_t upTo = std::min(chunkEnd, at + n);
              crc = plan::crc32(span.data() + (c - at), static_cast<size_t>(upTo - c), crc);
              if (upTo == chunkEnd) {
                const uint32_t want = legacy ? crcs_.at(key) : chunked->second.at(index);
                if (crc != want)
                  throw CheckpointError(corruption(f, pending, *e, index, chunk, legacy));
                crc = 0;
              }
              c = upTo;
            }
            // The pieces' bytes in this span.
            while (firstPiece < pieces.size() &&
                   pieces[firstPiece].offset + pieces[firstPiece].nbytes <= at)
              ++firstPiece;
            for (size_t i = firstPiece; i < pieces.size() && pieces[i].offset < at + n; ++i) {
              const Piece &p = pieces[i];
              const int64_t from = std::max(at, p.offset);
              const int64_t to = std::min(at + n, p.offset + p.nbytes);
              if (from < to)
                std::memcpy(p.dst + (from - p.offset), span.data() + (from - at),
                            static_cast<size_t>(to - from));
            }
            at += n;
          }
        }
      } catch (const CheckpointError &) {
        throw;
      } catch (const std::exception &ex) {
        throw CheckpointError(ex.what());
      }
    }
    pending_.clear();
  }

  /// Tensor `name` of rank `rank`'s file, whole, checked against its CRC-32.
  at::Tensor readChecked(int64_t rank, const std::string &name) {
    SafetensorsFile &f = file(rank);
    at::Tensor t;
    try {
      t = f.readTensor(name);
    } catch (const std::runtime_error &e) {
      throw CheckpointError(e.what());
    }
    auto crc = crcs_.find({rank, name});
    if (crc == crcs_.end() || plan::crc32(t.data_ptr(), t.nbytes()) != crc->second)
      throw CheckpointError(f.path() + ": corrupt tensor " + name + " (checksum mismatch)");
    return t;
  }

  int64_t bytesRead() const {
    int64_t n = 0;
    for (const auto &[rank, f] : files_)
      n += f->bytesRead();
    return n;
  }

private:
  struct Piece {
    int64_t offset = 0, nbytes = 0; ///< in the saved tensor
    char *dst = nullptr;
    c10::ScalarType dtype = c10::ScalarType::Float; ///< the reader's
  };
  /// The pieces of one saved tensor (shard `shard` of saved space `space`).
  struct Pending {
    size_t space = 0;
    int64_t shard = 0;
    std::vector<Piece> pieces;
  };

  /// The error of chunk `index` of `e` (in `pending`'s file) that failed
  /// its check: the file, the tensor, the chunk's bytes (in the tensor's
  /// data and in the file) and the model tensors whose elements are in it.
  std::string corruption(const SafetensorsFile &f, const Pending &pending,
                         const SafetensorsEntry &e, int64_t index, int64_t chunk,
                         bool legacy) const {
    const int64_t begin = index * chunk, end = std::min(e.nbytes(), begin + chunk);
    const int64_t elementSize = static_cast<int64_t>(c10::elementSize(e.dtype));
    const SavedSpace &s = layout_.spaces().at(pending.space);
    const int64_t first = pending.shard * s.shardSize + begin / elementSize;
    const int64_t last = pending.shard * s.shardSize + (end + elementSize - 1) / elementSize;
    std::string inside;
    for (size_t m = 0; m < s.members.size(); ++m)
      if (s.members[m].first < last && s.members[m].first + s.members[m].second > first)
        inside += (inside.empty() ? "" : ", ") + s.names[m];
    const int64_t chunks = (e.nbytes() + chunk - 1) / chunk;
    return f.path() + ": corrupt tensor " + e.name + " (" +
           (legacy ? std::string("checked whole: a checkpoint without per-chunk checksums")
                   : "chunk " + std::to_string(index) + " of " + std::to_string(chunks)) +
           ", bytes [" + std::to_string(begin) + ", " + std::to_string(end) +
           ") of its data, file bytes [" + std::to_string(e.begin + begin) + ", " +
           std::to_string(e.begin + end) + "), holding " +
           (inside.empty() ? std::string("padding only") : inside) +
           "): checksum mismatch; resume another checkpoint";
  }

  std::string folder_;
  const SavedLayout &layout_;
  std::map<int64_t, std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::pair<int64_t, std::string>, uint32_t> crcs_; ///< whole tensors'
  std::map<std::pair<int64_t, std::string>, std::vector<uint32_t>> chunkCrcs_;
  std::map<int64_t, int64_t> chunkBytes_; ///< by rank file
  std::map<std::pair<int64_t, std::string>, Pending> pending_;
};

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Throws CheckpointError naming the first trainable tensor that differs
/// between the checkpoint and `plan`.
void checkSameModel(const SavedLayout &layout, const plan::Plan &p,
                    const std::string &folder) {
  std::set<std::string> seen;
  for (const plan::TensorInfo &t : p.tensors) {
    if (!(t.isParameter && t.requiresGrad))
      continue;
    seen.insert(t.name);
    auto it = layout.members().find(t.name);
    if (it == layout.members().end())
      throw CheckpointError(folder + " is a checkpoint of another model: it has no parameter " +
                            t.name);
    if (it->second.shape != t.shape)
      throw CheckpointError(folder + " is a checkpoint of another model: " + t.name + " is " +
                            shapeText(it->second.shape) + " there, " + shapeText(t.shape) +
                            " here");
    if (it->second.dtype != plan::dtypeName(t.dtype))
      throw CheckpointError(folder + ": " + t.name + " is " + it->second.dtype +
                            " in the checkpoint, " + plan::dtypeName(t.dtype) +
                            " in this plan (compile with the checkpoint's --dtype)");
  }
  for (const auto &[name, member] : layout.members())
    if (!seen.count(name))
      throw CheckpointError(folder + " is a checkpoint of another model: it has a parameter " +
                            name + " that this model has not");
}

} // namespace

ResumeReport loadCheckpoint(const std::string &folder, Model &model, Optimizer &optimizer,
                            LossScaler *scaler, const OptimizerConfig *expected) {
  fs::path dir = fs::path(folder).lexically_normal();
  if (dir.filename().empty())
    dir = dir.parent_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw CheckpointError(folder + ": no such checkpoint folder");
  const json meta = readCheckpointJson(folder, dir.string());
  if (expected)
    checkSameOptimizer(meta.value("optimizer", json::object()), *expected, folder);
  const SavedLayout layout(folder, meta);
  CheckpointReader reader(folder, layout);
  const plan::Plan &p = model.plan();
  checkSameModel(layout, p, folder);

  ResumeReport report;
  report.savedWorldSize = layout.worldSize();
  report.savedTensorParallel = layout.tensorParallel();
  report.savedSchedule = savedSchedule(meta, folder);
  const json batch = meta.value("batch", json::object());
  report.savedSequencesPerStep = batch.value("sequences_per_step", int64_t{0});
  report.savedSeqLen = batch.value("seq_len", int64_t{0});
  // Tensor parallelism: this run's T and TP rank, and the checkpoint's T.
  const int64_t tp = p.tensorParallel;
  const int64_t tpRank = model.tensorParallel() ? model.tensorParallel()->rank() : 0;
  const int64_t savedTp = layout.tensorParallel();
  auto layoutOf = [&](const plan::TensorInfo &t) {
    SliceLayout l;
    l.shape = t.shape;
    l.tp = tp;
    l.tpRank = tpRank;
    if (tp > 1 && t.split.isSplit()) {
      l.split.dim = t.split.dim;
      l.split.chunks = t.split.chunks;
      l.split.paddedSize = t.split.paddedSize;
    }
    return l;
  };
  // The checkpoint's slicing of `saved`; an unsplit tensor is read from
  // the copy of the TP rank this rank has, or of tpRank % savedTp.
  auto savedLayoutOf = [&](const SavedMember &saved) {
    SliceLayout l = saved.layout;
    l.tpRank = tpRank % savedTp;
    return l;
  };
  std::vector<ParameterSpace> spaces = model.parameterSpaces();
  // Host buffers of every field of every space, filled by the reader.
  struct Fields {
    std::map<std::string, at::Tensor> byName;
  };
  std::vector<Fields> loaded(spaces.size());
  OptimizerState state = optimizer.state();
  std::map<size_t, size_t> spaceOfParameter;
  for (size_t k = 0; k < spaces.size(); ++k)
    spaceOfParameter[spaces[k].parameter] = k;

  // Which fields each space needs, with their dtypes.
  std::vector<std::map<std::string, c10::ScalarType>> needed(spaces.size());
  for (size_t k = 0; k < spaces.size(); ++k) {
    const ParameterSpace &s = spaces[k];
    needed[k]["param"] = s.dtype;
    const at::Tensor &trainable = model.parameters().at(s.parameter);
    if (trainable.scalar_type() != s.dtype)
      needed[k]["master"] = trainable.scalar_type();
  }
  for (const auto &[key, tensor] : state.tensors) {
    auto [slot, i] = splitStateKey(key);
    if (slot != "step" && !state.replicatedSlots.count(slot))
      needed[spaceOfParameter.at(i)][slot] = tensor.scalar_type();
  }
  bool resharded = layout.worldSize() != model.world().size() || savedTp != tp;
  for (size_t k = 0; k < spaces.size(); ++k) {
    const ParameterSpace &s = spaces[k];
    const int64_t begin = s.shardIndex * s.shardSize;
    const int64_t end = std::min(s.size, begin + s.shardSize);
    for (const auto &[field, dtype] : needed[k]) {
      at::Tensor buffer = at::zeros({s.shardSize}, at::TensorOptions().dtype(dtype));
      loaded[k].byName[field] = buffer;
      const size_t elementSize = c10::elementSize(dtype);
      for (size_t m = 0; m < s.members.size(); ++m) {
        const plan::TensorInfo &t = p.tensors.at(s.members[m]);
        const int64_t from = std::max(begin, s.offsets[m]);
        const int64_t to = std::min(end, s.offsets[m] + t.localNumel(tp));
        if (from >= to)
          continue;
        const SavedMember &saved = layout.members().at(t.name);
        const SliceLayout mine = layoutOf(t), theirs = savedLayoutOf(saved);
        char *const dst = static_cast<char *>(buffer.data_ptr()) + (from - begin) * elementSize;
        // Elements [local, local + n) of TP rank savedRank's saved slice to
        // dst + at.
        auto copy = [&](int64_t savedRank, int64_t local, int64_t at, int64_t n) {
          const auto &[space, offset] = saved.copies.at(static_cast<size_t>(savedRank));
          const SavedSpace &savedSpace = layout.spaces()[space];
          resharded = resharded || savedSpace.name != s.name || offset != s.offsets[m] ||
                      savedSpace.shards != s.numShards;
          // A float32 space's master is its parameter.
          std::string savedField = field;
          if (field == "master" && !savedSpace.master)
            savedField = "param";
          reader.request(space, savedField, offset + local, n,
                         dst + at * static_cast<int64_t>(elementSize), dtype);
        };
        // Another TP split: the elements of this slice through the global
        // tensor to the saved slices that hold them (padding stays zero).
        if (planSlice(mine, theirs, from - s.offsets[m], to - s.offsets[m], copy))
          resharded = true;
      }
    }
  }
  reader.flush();
  // The step counts: the saved space of each space's first member (in
  // shard 0's file, rank 0's).
  for (size_t k = 0; k < spaces.size(); ++k) {
    const plan::TensorInfo &t = p.tensors.at(spaces[k].members.at(0));
    const SavedMember &first = layout.members().at(t.name);
    const size_t savedSpace = first.copies.at(static_cast<size_t>(tpRank % savedTp)).first;
    if (state.tensors.count("step." + std::to_string(spaces[k].parameter)))
      loaded[k].byName["step"] = reader.readChecked(
          layout.rankOf(savedSpace, 0), fieldName(static_cast<int64_t>(savedSpace), "step"));
    // Replicated slots (Adafactor's factors, concatenated over the space's
    // members): whole, from shard 0, when the saved space has the same
    // members (any number of shards) and the same TP split (this TP
    // rank's factors are those of its slices).
    for (const std::string &slot : state.replicatedSlots) {
      if (!state.tensors.count(slot + "." + std::to_string(spaces[k].parameter)))
        continue;
      const SavedSpace &saved = layout.spaces()[savedSpace];
      bool sameMembers = saved.name == spaces[k].name && savedTp == tp;
      for (size_t m = 0; m < spaces[k].members.size() && sameMembers; ++m) {
        const SavedMember &member = layout.members().at(p.tensors.at(spaces[k].members[m]).name);
        const auto &copy = member.copies.at(static_cast<size_t>(tpRank % savedTp));
        sameMembers = copy.first == savedSpace && copy.second == spaces[k].offsets[m];
      }
      if (!sameMembers)
        throw CheckpointError(folder + ": the optimizer's " + slot + " of " + spaces[k].name +
                              " is kept per storage group, and the checkpoint's groups differ "
                              "(another plan's layout" +
                              (savedTp != tp ? ", saved with tensor parallel " +
                                                   std::to_string(savedTp) + ", this run " +
                                                   std::to_string(tp)
                                             : std::string()) +
                              "): resume with the plan it was saved with");
      loaded[k].byName[slot] = reader.readChecked(
          layout.rankOf(savedSpace, 0), fieldName(static_cast<int64_t>(savedSpace), slot));
    }
  }

  // Into the model and the optimizer.
  {
    c10::NoGradGuard noGrad;
    for (size_t k = 0; k < spaces.size(); ++k) {
      const ParameterSpace &s = spaces[k];
      s.value.copy_(loaded[k].byName.at("param").view(s.value.sizes()));
      const at::Tensor &trainable = model.parameters().at(s.parameter);
      if (trainable.scalar_type() != s.dtype)
        trainable.detach().view({-1}).copy_(loaded[k].byName.at("master"));
    }
  }
  OptimizerState restored;
  restored.scalars = state.scalars;
  for (const auto &[key, tensor] : state.tensors) {
    auto [slot, i] = splitStateKey(key);
    at::Tensor value = loaded[spaceOfParameter.at(i)].byName.at(slot);
    restored.tensors[key] = value.view(tensor.sizes());
  }
  try {
    optimizer.loadState(restored);
  } catch (const std::invalid_argument &e) {
    throw CheckpointError(folder + ": " + e.what());
  }
  model.parametersChanged();

  // The rest of the state.
  report.progress = savedProgress(meta, folder);
  if (scaler && report.progress.lossScale)
    scaler->setState(*report.progress.lossScale, report.progress.cleanSteps);
  // Each rank's generators, when the ranks are the same.
  if (layout.worldSize() == model.world().size() && savedTp == tp) {
    const int64_t rank = model.world().rank();
    SafetensorsFile &mine = reader.file(rank);
    auto restore = [&](at::Generator g, const char *name) {
      if (!mine.find(name))
        return;
      at::Tensor state = reader.readChecked(rank, name);
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(state);
    };
    restore(at::detail::getDefaultCPUGenerator(), "rng.cpu");
    if (model.device().is_cuda())
      restore(at::globalContext().defaultGenerator(model.device()), "rng.cuda");
  }
  report.bytesRead = reader.bytesRead();
  report.resharded = resharded;
  return report;
}

} // namespace bmt::runtime
