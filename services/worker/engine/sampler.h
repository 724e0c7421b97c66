// Token sampling parameters of a request, and their per-step form for the runners.
//
// The rules (kernels/include/sampling.h): logit bias and penalties, temperature, top-k, top-p (over
// what top-k kept), min-p, then one Philox-seeded draw that is a function of (seed, step, logits):
// a fixed seed gives the same tokens on every run, at any batch composition, on either backend (up
// to exp/log rounding at a boundary). Temperature 0 is greedy (argmax of the penalized logits; the
// lowest id wins ties), and so is any temperature below kMinSamplingTemperature (1e-5). Both
// runners sample every row themselves (the CUDA one on the device) and return only the ids;
// Sampler below is the same draw on the host, for callers that hold logits.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_SAMPLER_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_SAMPLER_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "kernels/include/sampling.h"

namespace lazyattn {

struct SamplingParams {
  float temperature = 0.0f;  // 0 (or below kMinSamplingTemperature): greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  // Unset: the engine draws a fresh random seed when it accepts the request (EngineCore::Add), so
  // two unseeded requests differ; a set seed repeats its tokens.
  std::optional<uint64_t> seed;
  int max_tokens = 128;
  std::vector<std::string> stop;          // generation ends before any of these strings
  std::vector<int32_t> stop_token_ids;    // ... or after any of these tokens (besides EOS)
  bool ignore_eos = false;
  float min_p = 0.0f;               // 0: off; keeps p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1: off; over the question and the generated tokens
  float presence_penalty = 0.0f;    // 0: off; over the generated tokens
  float frequency_penalty = 0.0f;   // 0: off; over the generated tokens
  bool logprobs = false;            // report each chosen token's log-probability
  // With logprobs: also the top_logprobs most likely tokens at each position (TopLogprobs in
  // top_logprobs.h), [0, kMaxTopLogprobs]. Each such request's rows bring their logits to the
  // host every step.
  int top_logprobs = 0;
  // Distinct ids in increasing order, each inside the vocabulary, |bias| <= kMaxLogitBias.
  std::vector<LogitBias> logit_bias;
};

// InvalidArgument naming the field: temperature in [0, 100], top_k >= 0, top_p in (0, 1],
// min_p in [0, 1], repetition_penalty in (0, 100], presence/frequency_penalty in [-2, 2],
// max_tokens >= 1, stop strings non-empty (at most 16), stop ids inside the vocabulary,
// top_logprobs in [0, kMaxTopLogprobs] and above 0 only with logprobs, logit_bias as its
// comment says.
absl::Status ValidateSamplingParams(const SamplingParams& params, int64_t vocab_size);

// The per-row form of `params` for the draw of generated token number `step` (0 for the first).
// An unset seed draws as seed 0 here: the engine fills it in before any draw.
SamplingRowParams RowSamplingParams(const SamplingParams& params, uint64_t step);

// A row's penalty history, deduplicated: `tokens[0, prompt_tokens)` count for the repetition
// penalty only, the rest as output occurrences.
std::vector<PenaltyEntry> PenaltyEntries(std::span<const int32_t> tokens, int64_t prompt_tokens);

// PenaltyEntries of a history that only grows (a request's question, then its output), kept
// current a token at a time, so a decode step costs O(new tokens) rather than re-hashing the
// whole history (a 100K-token question, every step, for every penalized row of the batch). The
// entries are those PenaltyEntries gives for the same history, in the same order.
class PenaltyCounts {
 public:
  // Brings the counts to `history`, of which `history[0, prompt_tokens)` is the question. When it
  // extends the history counted last (as long or longer, the same prompt length) only the new
  // tokens are counted; otherwise it is counted whole. The span is valid until the next Sync.
  std::span<const PenaltyEntry> Sync(std::span<const int32_t> history, int64_t prompt_tokens);
  // Tokens counted since construction (for tests: shows what Sync skipped).
  int64_t tokens_counted() const { return tokens_counted_; }

 private:
  void Count(int32_t id, bool in_prompt);
  absl::flat_hash_map<int32_t, int32_t> index_;  // id -> position in entries_
  std::vector<PenaltyEntry> entries_;
  int64_t counted_ = 0;        // history tokens counted
  int64_t prompt_tokens_ = 0;  // of which the question
  int64_t tokens_counted_ = 0;
};

// Everything a row adjusts its logits by, as the samplers read it (distinct ids): the penalty
// entries (PenaltyEntries or PenaltyCounts of its history) when `row` has penalties, with the
// logit bias merged in when it has kLogitBias. Empty when neither (AdjustsLogits(row) false).
std::vector<PenaltyEntry> RowAdjustments(const SamplingRowParams& row,
                                         std::span<const PenaltyEntry> penalties,
                                         std::span<const LogitBias> logit_bias);

// Draws on the host, one call per generated token (the step counter advances per call). It keeps
// no history, so the penalties have nothing to act on; the logit bias applies.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Precondition: logits.size() == vocabulary size >= 1. `logprob` (optional) receives the chosen
  // token's log-probability.
  int32_t Sample(std::span<const float> logits, float* logprob = nullptr);

 private:
  SamplingParams params_;
  uint64_t step_ = 0;
};

int32_t ArgMax(std::span<const float> logits);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_SAMPLER_H_
