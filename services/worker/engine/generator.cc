#include "services/worker/engine/generator.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/worker/engine/stop_matcher.h"

namespace lazyattn {
namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The blocks of one sequence; returned to the cache however generation ends.
class SequenceBlocks {
 public:
  explicit SequenceBlocks(KvCacheCpu* kv) : kv_(kv) {}
  ~SequenceBlocks() {
    for (uint32_t b : blocks_) kv_->Free(b);
  }
  // Makes room for `length` tokens in total.
  absl::Status Reserve(int64_t length) {
    const int B = kv_->shape().block_size;
    while (static_cast<int64_t>(blocks_.size()) * B < length) {
      auto b = kv_->Allocate();
      if (!b) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "KV cache full: a sequence of ", length, " tokens needs ", (length + B - 1) / B,
            " blocks, ", kv_->num_blocks(), " exist"));
      }
      blocks_.push_back(*b);
    }
    return absl::OkStatus();
  }
  int64_t Slot(int64_t pos) const {
    const int B = kv_->shape().block_size;
    return int64_t{blocks_[pos / B]} * B + pos % B;
  }
  std::vector<KvBlockEntry> Table(int64_t length) const {
    const int B = kv_->shape().block_size;
    std::vector<KvBlockEntry> table;
    for (int64_t b = 0; b * B < length; ++b) {
      table.push_back(PackKvBlockEntry(blocks_[b], 0, static_cast<uint32_t>(std::min<int64_t>(B, length - b * B))));
    }
    return table;
  }

 private:
  KvCacheCpu* kv_;
  std::vector<uint32_t> blocks_;
};

}  // namespace

Generator::Generator(CpuRunner* runner, const Tokenizer* tokenizer, KvCacheCpu* kv,
                     int prefill_chunk_tokens)
    : runner_(runner), tokenizer_(tokenizer), kv_(kv), prefill_chunk_tokens_(prefill_chunk_tokens) {}

absl::StatusOr<GenerationResult> Generator::Generate(const std::vector<int32_t>& prompt,
                                                     const SamplingParams& sampling,
                                                     const TokenCallback& on_token) {
  const auto t0 = Clock::now();
  const ModelConfig& config = runner_->config();
  RETURN_IF_ERROR(ValidateSamplingParams(sampling, config.vocab_size));
  if (prompt.empty()) return absl::InvalidArgumentError("prompt: must contain at least one token");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: token id ", prompt[i], " at index ",
                                                     i, " is outside the vocabulary"));
    }
  }
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt >= config.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", n_prompt,
                                                   " tokens leave no room in the model's context of ",
                                                   config.max_positions));
  }

  SequenceBlocks blocks(kv_);
  GenerationResult result;
  result.prompt_tokens = n_prompt;
  std::vector<float> logits;
  std::vector<int64_t> slots;

  // Runs tokens [start, start + n) of the sequence; returns the logits of the last one.
  auto step = [&](std::span<const int32_t> tokens, int64_t start) -> absl::Status {
    const int64_t n = static_cast<int64_t>(tokens.size());
    RETURN_IF_ERROR(blocks.Reserve(start + n));
    slots.resize(n);
    for (int64_t i = 0; i < n; ++i) slots[i] = blocks.Slot(start + i);
    const std::vector<KvBlockEntry> table = blocks.Table(start + n);
    const ForwardChunk chunk{.tokens = tokens, .local_start = start, .kv_slots = slots,
                             .block_table = table, .first_query_index = start};
    ASSIGN_OR_RETURN(logits, runner_->Forward(std::span(&chunk, 1), *kv_));
    return absl::OkStatus();
  };

  for (int64_t start = 0; start < n_prompt; start += prefill_chunk_tokens_) {
    const int64_t n = std::min<int64_t>(prefill_chunk_tokens_, n_prompt - start);
    RETURN_IF_ERROR(step(std::span(prompt).subspan(start, n), start));
  }
  result.first_logits = logits;

  std::vector<int32_t> stop_ids = sampling.stop_token_ids;
  if (!sampling.ignore_eos) {
    for (int32_t id : tokenizer_->end_of_generation_ids()) stop_ids.push_back(id);
  }
  Sampler sampler(sampling);
  StreamingDecoder decoder(tokenizer_);
  StopMatcher stop(sampling.stop);
  Clock::time_point first_token_time;
  result.finish_reason = "length";
  int64_t length = n_prompt;
  while (true) {
    const int32_t id = sampler.Sample(logits);
    if (result.token_ids.empty()) {
      first_token_time = Clock::now();
      result.ttft_ms = MillisSince(t0);
    }
    if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) {
      result.finish_reason = "stop";
      break;
    }
    result.token_ids.push_back(id);
    ASSIGN_OR_RETURN(const std::string decoded_piece, decoder.Push(id));
    const std::string piece = stop.Push(decoded_piece);
    result.text += piece;
    if (on_token) on_token(id, piece);
    if (stop.stopped()) {
      result.finish_reason = "stop";
      break;
    }
    if (static_cast<int>(result.token_ids.size()) >= sampling.max_tokens ||
        length + 1 >= config.max_positions) {
      break;
    }
    RETURN_IF_ERROR(step(std::span(&result.token_ids.back(), 1), length));
    ++length;
  }
  if (!stop.stopped()) {
    const std::string tail = stop.Push(decoder.Flush());
    const std::string rest = stop.stopped() ? tail : tail + stop.Flush();
    result.text += rest;
    if (on_token && !rest.empty()) on_token(-1, rest);
  }
  const size_t generated = result.token_ids.size();
  if (generated > 1) {
    const double seconds =
        std::chrono::duration<double>(Clock::now() - first_token_time).count();
    result.decode_tokens_per_s = (generated - 1) / seconds;
  }
  return result;
}

}  // namespace lazyattn
