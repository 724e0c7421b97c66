// Single-sequence generation on the CPU runner: chunked prefill of the prompt, then decode until
// EOS, a stop string/token, max_tokens or the end of the model's context.
//
// This is the engine's first slice; continuous batching of many requests, the document cache and
// the cache modes build on the same runner and KV layout.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_GENERATOR_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/engine/sampler.h"
#include "services/worker/model/tokenizer/tokenizer.h"

namespace lazyattn {

struct GenerationResult {
  // Generated ids. The EOS or stop token that ends generation is not included (as in vLLM).
  std::vector<int32_t> token_ids;
  std::string text;                // decoded generated text, cut before any stop string
  int64_t prompt_tokens = 0;
  double ttft_ms = 0;              // submission to first sampled token
  double decode_tokens_per_s = 0;  // tokens after the first / time after the first
  std::string finish_reason;       // "stop" (EOS, stop token or string) or "length"
  std::vector<float> first_logits; // logits of the first step (for checks and --logprobs)
};

// Called for every generated token with the text it completes (may be empty while UTF-8 or a
// possible stop string is incomplete).
using TokenCallback = std::function<void(int32_t id, std::string_view text)>;

class Generator {
 public:
  // Borrowed pointers; all must outlive the generator.
  Generator(CpuRunner* runner, const Tokenizer* tokenizer, KvCacheCpu* kv,
            int prefill_chunk_tokens = 512);

  // InvalidArgument for an empty prompt, ids outside the vocabulary, a prompt that fills the
  // model's context, or bad sampling parameters (the message names the field);
  // ResourceExhausted when the KV cache cannot hold the sequence. Every block taken is returned.
  absl::StatusOr<GenerationResult> Generate(const std::vector<int32_t>& prompt_ids,
                                            const SamplingParams& sampling,
                                            const TokenCallback& on_token = {});

 private:
  CpuRunner* runner_;
  const Tokenizer* tokenizer_;
  KvCacheCpu* kv_;
  int prefill_chunk_tokens_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_GENERATOR_H_
