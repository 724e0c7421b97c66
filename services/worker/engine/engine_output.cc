// EngineCore: what a step's results do to a request: sampling, streaming, finishing.
#include <algorithm>

#include "common/monotonic_time.h"
#include "common/utf8.h"
#include "services/worker/engine/engine_core_state.h"

namespace lazyattn {

void EngineCore::Finish(Request& r, const absl::Status& status) {
  if (r.phase == Request::Phase::kDone) return;  // on_done exactly once
  Release(r);
  r.phase = Request::Phase::kDone;
  if (status.ok()) {
    ++stats_.requests_ok;
  } else {
    ++stats_.requests_failed;
  }
  RequestResult& res = r.result;
  res.usage.completion_tokens = static_cast<int64_t>(res.token_ids.size());
  if (res.token_ids.size() > 1) {
    const double seconds = absl::ToDoubleSeconds(MonotonicNow() - r.first_token);
    if (seconds > 0) res.decode_tokens_per_s = (res.token_ids.size() - 1) / seconds;
  }
  if (r.prepared.callbacks.on_done) r.prepared.callbacks.on_done(status, res);
}

void EngineCore::SampleAndEmit(Request& r, std::span<const float> logits,
                               std::optional<int32_t> chosen, float logprob) {
  RequestResult& res = r.result;
  const int32_t id = chosen ? *chosen : r.sampler->Sample(logits, &logprob);
  if (res.token_ids.empty() && r.first_token == absl::Time()) {
    r.first_token = MonotonicNow();  // after this step's forward pass, not at its start
    res.ttft_ms = absl::ToDoubleMilliseconds(r.first_token - r.submitted);
    if (options_.keep_first_logits) res.first_logits.assign(logits.begin(), logits.end());
  }
  auto finish = [&](const char* reason) {
    res.finish_reason = reason;
    if (!r.stop->stopped()) {
      const std::string tail = r.stop->Push(ToValidUtf8(r.decoder->Flush()));
      const std::string rest = r.stop->stopped() ? tail : tail + r.stop->Flush();
      res.text += rest;
      if (!rest.empty() && r.prepared.callbacks.on_token) r.prepared.callbacks.on_token(-1, rest);
    }
    Finish(r, absl::OkStatus());
  };
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), id) != r.stop_ids.end()) {
    finish("stop");
    return;
  }
  Segment& q = r.query();
  const bool want_logprob = r.prepared.sampling.logprobs;
  std::vector<TopLogprob> top;
  if (want_logprob && r.prepared.sampling.top_logprobs > 0) {
    // One entry per token. The step brought this row's logits back (the plan asks for them);
    // ranked under the draw's own row parameters and history (before this token; in a chained
    // step it already holds the input token the device counted), as the runner drew `id`.
    const SamplingRowParams row = RowSamplingParams(r.prepared.sampling, res.token_ids.size());
    const std::vector<PenaltyEntry> penalties =
        RowAdjustments(row, r.PenaltyCountsNow(row), r.prepared.sampling.logit_bias);
    if (!logits.empty()) {
      top = TopLogprobs(logits, row, penalties, id, logprob, r.prepared.sampling.top_logprobs);
    }
    // A caller that streams them (on_logprob) has them there: a long generation does not hold
    // its lists (up to 160 bytes a token) twice.
    if (!r.prepared.callbacks.on_logprob) res.top_logprobs.push_back(top);
  }
  res.token_ids.push_back(id);
  if (want_logprob) res.logprobs.push_back(logprob);
  q.tokens.push_back(id);
  // Stop strings are matched against the text the client gets: bytes that can never be UTF-8
  // become U+FFFD here, as they would at the server, so a stop string holding U+FFFD is honoured
  // (it never matched the raw bytes). The decoder hands out whole characters or such bytes.
  auto piece = r.decoder->Push(id);
  const std::string text = r.stop->Push(piece.ok() ? ToValidUtf8(*piece) : std::string());
  res.text += text;
  if (want_logprob && r.prepared.callbacks.on_logprob)
    r.prepared.callbacks.on_logprob(logprob, top);
  if (r.prepared.callbacks.on_token) r.prepared.callbacks.on_token(id, text);
  if (r.stop->stopped()) {
    res.finish_reason = "stop";
    Finish(r, absl::OkStatus());
    return;
  }
  if (static_cast<int>(res.token_ids.size()) >= r.prepared.sampling.max_tokens ||
      q.offset + q.length() >= config().max_positions) {
    finish("length");
    return;
  }
  r.phase = Request::Phase::kDecode;
}

void EngineCore::OnPrefillDone(Request& r, std::span<const float> logits,
                               std::optional<int32_t> chosen, float logprob) {
  Segment& q = r.query();
  const PreparedRequest& p = r.prepared;
  // Share what later requests can reuse: the whole prompt in mode prefix, the system prefix in
  // mode full (block/lazy insert their prefix segment when it completes).
  int64_t shareable = 0;
  if (p.mode == CacheMode::kPrefix) shareable = q.length() - static_cast<int64_t>(r.result.token_ids.size());
  if (p.mode == CacheMode::kFull) shareable = static_cast<int64_t>(p.system_prefix.size());
  if (shareable > 0) {
    cache_.prefixes().Insert(
        std::span(q.tokens).first(shareable),
        std::span(q.blocks).first(std::min<size_t>(q.blocks.size(), shareable / block_size())),
        cache_.Tick(), p.prefix_scope);
  }
  SampleAndEmit(r, logits, chosen, logprob);
}

}  // namespace lazyattn
