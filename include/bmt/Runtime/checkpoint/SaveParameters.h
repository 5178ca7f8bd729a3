//===- SaveParameters.h - trained parameters as safetensors -----*- C++ -*-===//
//
// bmt-run --save-params FILE: the trained parameters of every rank in one
// safetensors file that transformers loads (every name of the state dict,
// tied ones under each), streamed by rank 0 one storage group at a time.
//
//===----------------------------------------------------------------------===//

#ifndef BMT_RUNTIME_CHECKPOINT_SAVEPARAMETERS_H
#define BMT_RUNTIME_CHECKPOINT_SAVEPARAMETERS_H

#include <cstdint>
#include <stdexcept>
#include <string>

namespace bmt::runtime {

class Model;

/// A failure to write the parameters that every rank throws alike (they
/// agreed on it by a collective): print it once (rank 0).
struct SaveParametersError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The size of the file saveParameters writes for `model`: the tensors'
/// bytes and at most 256 header bytes an entry (to check the free space
/// before training).
int64_t savedParameterBytes(Model &model);

/// Writes every trained tensor of `model` under each of its names (and the
/// buffers training moves, Model::routerBiases) to
/// `path` (rank 0; a temporary name renamed, removed on failure) and prints
/// "saved N parameters -> PATH". Gathers one storage group at a time: no
/// rank holds more than its shards and one group. Collective: a failure to
/// write is found after the last gather and thrown on every rank as a
/// SaveParametersError ("PATH: cannot write: ..." on rank 0).
void saveParameters(Model &model, const std::string &path);

} // namespace bmt::runtime

#endif // BMT_RUNTIME_CHECKPOINT_SAVEPARAMETERS_H
