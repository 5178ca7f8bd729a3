//===- Metrics.cpp - what a run reports, as text and as JSON lines --------===//

#include "bmt/Runtime/train/Metrics.h"

#include <c10/cuda/CUDACachingAllocator.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <string>
#include <sys/resource.h>

namespace bmt::runtime {

namespace {

std::string jsonNumber(double v) {
  if (!std::isfinite(v))
    return "null";
  std::ostringstream os;
  os << std::setprecision(9) << v;
  return os.str();
}

} // namespace

MetricsWriter::MetricsWriter(std::ostream &out, std::ostream *json, int64_t logEvery)
    : out_(out), json_(json), logEvery_(logEvery) {}

void MetricsWriter::flushJson(int64_t step) {
  errno = 0;
  json_->flush();
  if (*json_)
    return;
  const int error = errno;
  out_ << "warning: --log-file: the line of step " << step << " could not be written ("
       << (error != 0 ? std::strerror(error) : "write failed")
       << "); the log is incomplete from there (bmt-run will exit 1)\n";
  out_.flush();
  json_ = nullptr;
}

void MetricsWriter::step(const StepMetrics &m) {
  if (m.skipped && m.skipReason) {
    out_ << "step " << m.step << "/" << m.steps << " | skipped: " << m.skipReason << "\n";
    out_.flush();
  } else if (m.skipped) {
    out_ << "step " << m.step << "/" << m.steps << " | loss " << std::fixed
         << std::setprecision(4) << m.loss << " | skipped: inf/NaN gradients, loss scale "
         << std::setprecision(0) << m.lossScale << " -> " << m.nextLossScale << std::defaultfloat
         << "\n";
    out_.flush();
  } else if (m.step % logEvery_ == 0 || m.step == m.steps) {
    out_ << "step " << m.step << "/" << m.steps << " | loss " << std::fixed
         << std::setprecision(4) << m.loss << " | lr " << std::scientific << std::setprecision(2)
         << m.lr << " | grad norm " << std::fixed << std::setprecision(3) << m.gradNorm << " | ";
    if (m.lossScale > 0)
      out_ << "loss scale " << std::setprecision(0) << m.lossScale << " | ";
    if (!std::isnan(m.expertTokensMin))
      out_ << "experts " << std::setprecision(0) << m.expertTokensMin << "-" << m.expertTokensMax
           << " tokens | ";
    if (!std::isnan(m.auxLoss))
      out_ << "aux " << std::setprecision(4) << m.auxLoss << " | ";
    out_ << std::setprecision(0) << m.tokensPerSecond << " tokens/s | " << std::setprecision(1)
         << m.elapsedSeconds << " s" << std::defaultfloat << "\n";
    out_.flush();
  }
  if (json_) {
    *json_ << "{\"kind\": \"train\", \"step\": " << m.step << ", \"loss\": " << jsonNumber(m.loss)
           << ", \"lr\": " << jsonNumber(m.lr) << ", \"grad_norm\": " << jsonNumber(m.gradNorm)
           << ", \"loss_scale\": " << (m.lossScale > 0 ? jsonNumber(m.lossScale) : "null")
           << ", \"skipped\": " << (m.skipped ? "true" : "false") << ", \"tokens\": " << m.tokens
           << ", \"target_tokens\": " << m.targetTokens
           << ", \"tokens_per_s\": " << jsonNumber(m.tokensPerSecond)
           << ", \"tflops\": " << jsonNumber(m.tflops)
           << ", \"elapsed_s\": " << jsonNumber(m.elapsedSeconds)
           << ", \"peak_mem_gib\": " << jsonNumber(m.peakMemoryGiB)
           << ", \"host_s\": " << jsonNumber(m.hostSeconds)
           << ", \"fused_lazy_kernels\": " << m.fusedLazyKernels
           << ", \"gradients_in_place\": " << m.gradientsInPlace
           << ", \"recompute_skipped\": " << m.recomputeSkipped;
    if (!std::isnan(m.expertTokensMin))
      *json_ << ", \"expert_tokens_min\": " << jsonNumber(m.expertTokensMin)
             << ", \"expert_tokens_max\": " << jsonNumber(m.expertTokensMax);
    if (!std::isnan(m.auxLoss))
      *json_ << ", \"aux_loss\": " << jsonNumber(m.auxLoss);
    if (!m.pipeline.empty())
      *json_ << ", \"pipeline\": " << m.pipeline;
    *json_ << "}\n";
    flushJson(m.step);
  }
}

void MetricsWriter::evaluation(int64_t step, const EvalResult &r) {
  out_ << "eval  step " << step << " | val loss " << std::fixed << std::setprecision(4) << r.loss
       << " | val ppl " << std::setprecision(2) << r.perplexity << " | " << r.tokens << " tokens"
       << std::defaultfloat << "\n";
  out_.flush();
  if (json_) {
    *json_ << "{\"kind\": \"eval\", \"step\": " << step << ", \"val_loss\": " << jsonNumber(r.loss)
           << ", \"val_ppl\": " << jsonNumber(r.perplexity) << ", \"tokens\": " << r.tokens
           << "}\n";
    flushJson(step);
  }
}

namespace {

/// `text` as a JSON string literal.
std::string jsonString(const std::string &text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20)
      out += ' ';
    else
      out += c;
  }
  return out + "\"";
}

} // namespace

void MetricsWriter::checkpoint(int64_t step, bool ok, const std::string &where, int64_t bytes,
                               double writeSeconds, double heldSeconds, bool last) {
  std::string why = where;
  while (!why.empty() && why.back() == '\n')
    why.pop_back();
  if (ok)
    out_ << "checkpoint step " << step << " -> " << where << " | " << bytes
         << " bytes (rank 0) | written in " << std::fixed << std::setprecision(2) << writeSeconds
         << " s, training held " << std::setprecision(3) << heldSeconds << " s"
         << std::defaultfloat << "\n";
  else
    out_ << "warning: checkpoint step " << step << " failed: " << why
         << (last ? "; it is the last step's save"
                  : "; the previous checkpoints stay, training goes on")
         << "\n";
  out_.flush();
  if (json_) {
    *json_ << "{\"kind\": \"checkpoint\", \"step\": " << step << ", \"ok\": "
           << (ok ? "true" : "false") << ", " << (ok ? "\"path\": " : "\"error\": ")
           << jsonString(why) << ", \"bytes\": " << bytes
           << ", \"write_s\": " << jsonNumber(writeSeconds)
           << ", \"held_s\": " << jsonNumber(heldSeconds) << "}\n";
    flushJson(step);
  }
}

void MetricsWriter::inspection(int64_t step, const std::vector<BlockInspection> &blocks) {
  if (!json_)
    return;
  *json_ << "{\"kind\": \"inspect\", \"step\": " << step << ", \"blocks\": [";
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockInspection &b = blocks[i];
    *json_ << (i ? ", " : "") << "{\"name\": " << jsonString(b.name)
           << ", \"param_norm\": " << jsonNumber(b.paramNorm)
           << ", \"param_max_abs\": " << jsonNumber(b.paramMaxAbs)
           << ", \"grad_norm\": " << jsonNumber(b.gradNorm)
           << ", \"grad_max_abs\": " << jsonNumber(b.gradMaxAbs)
           << ", \"output_max_abs\": " << jsonNumber(b.outputMaxAbs) << "}";
  }
  *json_ << "]}\n";
  flushJson(step);
}

double peakMemoryGiB(c10::Device device) {
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(stats.allocated_bytes[0].peak) / (1024.0 * 1024.0 * 1024.0);
  }
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024.0); // ru_maxrss is KiB
}

} // namespace bmt::runtime
