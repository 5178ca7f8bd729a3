//===- SaveParameters.cpp - trained parameters as safetensors -------------===//

#include "bmt/Runtime/checkpoint/SaveParameters.h"

#include "bmt/Runtime/exec/Model.h"
#include "bmt/Runtime/io/Safetensors.h"

#include <ATen/ops/full.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <unistd.h>
#include <vector>

namespace bmt::runtime {

namespace {

/// The parameters of --save-params's file: the trained ones
/// (fullParameterOrder), then the frozen ones: the whole model.
std::vector<int64_t> savedParameterOrder(Model &model) {
  std::vector<int64_t> order = model.fullParameterOrder();
  std::vector<int64_t> frozen = model.frozenParameterOrder();
  order.insert(order.end(), frozen.begin(), frozen.end());
  return order;
}

/// The entries of --save-params's file: every parameter under each of its
/// names, then the buffers training moves (Model::routerBiases).
/// A parameter's entries: its name, then each alias.
void addEntries(std::vector<SafetensorsEntry> &entries, const plan::TensorInfo &t) {
  entries.push_back({t.name, t.dtype, t.shape});
  for (const std::string &alias : t.aliases)
    entries.push_back({alias, t.dtype, t.shape});
}

std::vector<SafetensorsEntry> savedParameterEntries(Model &model) {
  const plan::Plan &p = model.plan();
  std::vector<SafetensorsEntry> entries;
  for (int64_t index : savedParameterOrder(model))
    addEntries(entries, p.tensors.at(index));
  for (const auto &[name, buffer] : model.routerBiases())
    entries.push_back({name, buffer.scalar_type(), buffer.sizes().vec()});
  return entries;
}

} // namespace

int64_t savedParameterBytes(Model &model) {
  int64_t bytes = 8;
  for (const SafetensorsEntry &e : savedParameterEntries(model)) {
    int64_t n = static_cast<int64_t>(c10::elementSize(e.dtype));
    for (int64_t d : e.shape)
      n *= d;
    bytes += n + 256;
  }
  return bytes;
}

void saveParameters(Model &model, const std::string &path) {
  const plan::Plan &p = model.plan();
  const bool rank0 = model.world().rank() == 0;
  std::vector<SafetensorsEntry> entries = savedParameterEntries(model);
  // A pipeline: each stage holds its own parameters; rank 0 collects them
  // all (Model::fullParameters) and writes them in plan order.
  std::vector<std::pair<int64_t, at::Tensor>> collected;
  std::map<int64_t, at::Tensor> frozen; // (a pipeline's, on rank 0)
  if (model.pipelineStages() > 1) {
    std::map<int64_t, at::Tensor> byIndex;
    for (auto &[name, value] : model.fullParameters()) // collective
      byIndex.emplace(p.findTensor(name), value);
    entries.clear();
    for (const auto &[index, value] : byIndex) {
      addEntries(entries, p.tensors.at(index));
      collected.emplace_back(index, value);
    }
    for (auto &[name, value] : model.frozenStageParameters()) // collective
      frozen.emplace(p.findTensor(name), value);
    for (int64_t index : model.frozenParameterOrder())
      addEntries(entries, p.tensors.at(index));
    for (const auto &[name, buffer] : model.routerBiases())
      entries.push_back({name, buffer.scalar_type(), buffer.sizes().vec()});
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::unique_ptr<SafetensorsWriter> writer;
  std::string failure;
  auto fail = [&](const std::exception &e) {
    failure = path + ": cannot write: " + e.what();
    writer.reset();
    std::remove(tmp.c_str());
  };
  if (rank0) {
    try {
      writer = std::make_unique<SafetensorsWriter>(
          tmp, entries, std::map<std::string, std::string>{{"format", "pt"}, {"source", "bmt-run"}});
    } catch (const std::runtime_error &e) {
      fail(e);
    }
  }
  auto write = [&](int64_t index, const at::Tensor &value) {
    if (!writer)
      return;
    try {
      at::Tensor host = value.cpu().contiguous();
      for (size_t k = 0; k <= p.tensors[index].aliases.size(); ++k)
        writer->write(host.data_ptr(), static_cast<int64_t>(host.nbytes()));
    } catch (const std::runtime_error &e) {
      fail(e);
    }
  };
  if (model.pipelineStages() > 1) {
    for (const auto &[index, value] : collected)
      write(index, value);
  } else {
    model.forEachFullParameter(write); // collective
  }
  for (int64_t index : model.frozenParameterOrder())
    write(index, model.pipelineStages() > 1 ? frozen[index] : model.frozenParameter(index));
  if (writer) {
    try {
      for (const auto &[name, buffer] : model.routerBiases()) {
        at::Tensor host = buffer.cpu().contiguous();
        writer->write(host.data_ptr(), static_cast<int64_t>(host.nbytes()));
      }
      writer->close();
      if (std::rename(tmp.c_str(), path.c_str()) != 0)
        throw std::runtime_error(std::strerror(errno));
    } catch (const std::runtime_error &e) {
      fail(e);
    }
  }
  // Every rank learns whether rank 0 wrote the file (so that every rank
  // exits alike).
  Comm &world = model.world();
  if (world.size() > 1) {
    at::Tensor failed = at::full({1}, failure.empty() ? 0.0 : 1.0,
                                 at::TensorOptions().dtype(at::kDouble));
    at::Tensor t = world.backend() == "local" ? failed : failed.to(world.device());
    world.allReduce(t)->wait();
    if (!rank0 && t.cpu().item<double>() > 0)
      throw SaveParametersError(path + ": rank 0 could not write the parameters");
  }
  if (!failure.empty())
    throw SaveParametersError(failure);
  if (rank0)
    std::cout << "saved " << entries.size() << " parameters -> " << path << "\n";
}

} // namespace bmt::runtime
