#include "services/worker/engine/model_runner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "services/worker/engine/sampler.h"

namespace lazyattn {

absl::Status ModelRunner::Launch(std::span<const ForwardChunk>, std::span<const int32_t>) {
  return absl::UnimplementedError(
      absl::StrCat("backend ", backend_name(), " does not pipeline decode steps"));
}

absl::StatusOr<ForwardOutput> ModelRunner::Collect() {
  return absl::UnimplementedError(
      absl::StrCat("backend ", backend_name(), " does not pipeline decode steps"));
}

ForwardOutput SampleRowsOnHost(std::span<const ForwardChunk> chunks, std::vector<float> logits,
                               int64_t vocab_size) {
  ForwardOutput out;
  bool all_rows = true;
  for (const ForwardChunk& ch : chunks) all_rows &= !ch.emit_logits || ch.return_logits;
  int64_t row = 0;
  for (const ForwardChunk& ch : chunks) {
    if (!ch.emit_logits) continue;
    const int64_t rows = ch.logits_for_all_tokens ? static_cast<int64_t>(ch.tokens.size()) : 1;
    const std::vector<PenaltyEntry> penalties =
        RowAdjustments(ch.sampling, ch.penalties, ch.logit_bias);
    for (int64_t r = 0; r < rows; ++r, ++row) {
      const float* begin = logits.data() + row * vocab_size;
      float logprob = 0;
      // The row's own input token, which kCountInputToken counts as one more output occurrence.
      const int32_t input =
          ch.tokens.empty() ? -1 : ch.tokens[ch.logits_for_all_tokens ? r : ch.tokens.size() - 1];
      out.token_ids.push_back(
          SampleRowCpu(begin, static_cast<int32_t>(vocab_size), ch.sampling, penalties.data(),
                       static_cast<int32_t>(penalties.size()), input,
                       (ch.sampling.flags & kSampleLogprob) ? &logprob : nullptr));
      out.logprobs.push_back(logprob);
      if (ch.return_logits && !all_rows) out.logits.insert(out.logits.end(), begin, begin + vocab_size);
    }
  }
  if (all_rows) out.logits = std::move(logits);
  return out;
}

absl::StatusOr<TableSummary> ValidateForwardChunk(const ForwardChunk& ch, size_t i,
                                                  const ModelConfig& c, int64_t num_kv_blocks,
                                                  int block_size, int64_t checked,
                                                  TableSummary summary) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("forward chunk ", i, ": ", what));
  };
  if (ch.tokens.empty()) return bad("no tokens");
  if (ch.emit_logits) {
    if (const char* why = SamplingRowParamsError(ch.sampling)) return bad(why);
    if (HasPenalties(ch.sampling)) {
      for (const PenaltyEntry& e : ch.penalties) {
        if (e.id < 0 || e.id >= c.vocab_size) return bad("penalty entry id outside the vocabulary");
        if (e.output_count < 0 || (e.in_prompt != 0 && e.in_prompt != 1)) {
          return bad("penalty entry counts out of range");
        }
      }
    }
    if (ch.sampling.flags & kLogitBias) {
      for (size_t k = 0; k < ch.logit_bias.size(); ++k) {
        const LogitBias& b = ch.logit_bias[k];
        if (b.id < 0 || b.id >= c.vocab_size) return bad("logit_bias id outside the vocabulary");
        if (k > 0 && b.id <= ch.logit_bias[k - 1].id) return bad("logit_bias ids not increasing");
        if (!(std::fabs(b.bias) <= kMaxLogitBias)) return bad("logit_bias value out of range");
      }
    }
  }
  if (ch.kv_slots.size() != ch.tokens.size()) return bad("kv_slots size differs from tokens");
  for (int32_t t : ch.tokens) {
    if (t < 0 || t >= c.vocab_size) {
      return bad(absl::StrCat("token id ", t, " outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  for (int64_t s : ch.kv_slots) {
    if (s < 0 || s >= num_kv_blocks * block_size) return bad("kv slot out of range");
  }
  const int64_t end = ch.local_start + static_cast<int64_t>(ch.tokens.size());
  if (ch.segment_delta < 0 || ch.local_start < 0 || ch.k_rotation_base < 0 ||
      ch.segment_delta + end > c.max_positions || ch.k_rotation_base + end > c.max_positions) {
    return bad(absl::StrCat("positions exceed the model's context of ", c.max_positions));
  }
  const int64_t size = static_cast<int64_t>(ch.block_table.size());
  if (checked < 0 || checked > size) return bad("table checked past its end");
  for (KvBlockEntry e : ch.block_table.subspan(static_cast<size_t>(checked))) {
    if (KvEntryBlock(e) >= num_kv_blocks) return bad("block table names a block out of range");
    if (KvEntryDelta(e) >= c.max_positions) return bad("block delta past the model's context");
    summary.keys += KvEntryValid(e);
    summary.delta_entries += KvEntryDelta(e) != 0;
  }
  if (ch.first_query_index < 0 ||
      ch.first_query_index + static_cast<int64_t>(ch.tokens.size()) > summary.keys) {
    return bad("block table does not cover the chunk's own tokens");
  }
  return summary;
}

absl::Status ValidateForwardChunks(std::span<const ForwardChunk> chunks, const ModelConfig& c,
                                   int64_t num_kv_blocks, int block_size) {
  for (size_t i = 0; i < chunks.size(); ++i) {
    absl::StatusOr<TableSummary> s =
        ValidateForwardChunk(chunks[i], i, c, num_kv_blocks, block_size, 0, {});
    if (!s.ok()) return s.status();
  }
  return absl::OkStatus();
}

}  // namespace lazyattn
