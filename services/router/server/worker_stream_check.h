// What a worker's Worker.Generate stream may hold, checked message by message at the router.
//
// The grammar (proto/lazyattn/v1/inference.proto): PrefillProgress events, then token chunks,
// then exactly one Final, then nothing. A chunk carries a token id of the model's vocabulary, or
// -1 for the one last chunk of held-back text (after it no other token comes), a finite
// log-probability when it carries one, and its own bytes (at most kTextBytesPerToken); there are
// at most the request's max_tokens real tokens (ids >= 0), or, when the request leaves max_tokens
// to the worker's default, at most the smaller of the model's context and the router's
// limits.max_tokens (which bounds the worker's default where a cluster sets its limits alike,
// as docs/worker.md asks). The chunks' text is what the tokens'
// bytes complete: at most kTextBytesPerToken a token on average, plus kTextSlackBytes of
// held-back text. A real token carries the request's sampling.top_logprobs alternatives: exactly
// min(top_logprobs, vocab_size) from a worker that advertises them (ModelInfo.max_top_logprobs at
// least that), at most top_logprobs from one that does not (an older worker sends none); none on
// the held-back text chunk, none when not asked for; most likely first, each a token of the
// vocabulary of at most kTextBytesPerToken bytes with a finite log-probability of at most
// kMaxLogprob, and all the alternatives' bytes together at most kTextBytesPerToken a token on
// average plus kTextSlackBytes, as the text (20 of them would otherwise let a stream hold 20
// times the text's bytes); checking them costs O(entries). The final message's usage counts are
// never negative. A PrefillProgress event counts prompt tokens, so it is never negative nor past
// the context; events after the first token are tolerated and dropped (they keep nothing alive). A
// message with no event set is tolerated: a newer worker may send events this router does not
// know, and they are dropped.
//
// The router relays a worker's stream to its client. A stream outside the grammar comes from a
// broken or hostile worker: the attempt is cut there (worker_attempt.h) and counted against the
// worker, instead of relaying tokens past the client's limit or after the end of its answer.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_STREAM_CHECK_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_STREAM_CHECK_H_

#include <cstdint>
#include <string>

#include "lazyattn/v1/inference.pb.h"

namespace lazyattn::router {

class WorkerStreamCheck {
 public:
  struct Bounds {
    int64_t max_tokens = 0;          // real tokens a stream may carry; 0: no bound known
    int64_t vocab_size = 0;          // token ids below it; 0: unknown
    int64_t max_context_tokens = 0;  // bound of PrefillProgress; 0: unknown
    int64_t top_logprobs = 0;        // alternatives a token may carry (sampling.top_logprobs)
    // Alternatives every real token must carry (0: no such promise): min(top_logprobs,
    // vocab_size) when the worker advertises at least top_logprobs (ModelInfo.max_top_logprobs).
    int64_t exact_top_logprobs = 0;
  };
  // The bounds of `request` on a worker of `model` (its WorkerStatus.model). `max_tokens_limit`:
  // the router's limits.max_tokens, which, with the model's context, bounds a request without
  // max_tokens (the worker's default); 0 for none.
  static Bounds For(const lazyattn::v1::GenerateRequest& request,
                    const lazyattn::v1::ModelInfo& model, int64_t max_tokens_limit);

  // A token's bytes are at most a few hundred (a vocabulary entry), each shown as up to 3 bytes
  // of text (U+FFFD for a byte that is not UTF-8 alone); held-back text is at most a stop string
  // (limits.max_stop_bytes, 256) and a partial character.
  static constexpr int64_t kTextBytesPerToken = 1024;
  static constexpr int64_t kTextSlackBytes = 64 << 10;
  // A log-probability is at most 0 in exact arithmetic; a worker's float log-softmax of a
  // near-certain token can come out a few ulps above it (around 1e-7: an online softmax whose
  // rescaled sum rounds below 1, fast __expf/__logf approximations). 1e-3 (a probability of
  // 1.001) takes any such rounding and still refuses what is not a log-probability at all (a raw
  // logit, a probability).
  static constexpr float kMaxLogprob = 1e-3f;

  explicit WorkerStreamCheck(Bounds bounds) : bounds_(bounds) {}

  // Empty when `message` may come next (and it is taken as come); otherwise what is wrong with
  // it, naming the field, for the attempt's status and the log.
  std::string Next(const lazyattn::v1::GenerateResponse& message);

 private:
  std::string NextToken(const lazyattn::v1::TokenChunk& token);
  std::string CheckTopLogprobs(const lazyattn::v1::TokenChunk& token);
  std::string NextFinal(const lazyattn::v1::Final& final);

  const Bounds bounds_;
  int64_t tokens_ = 0;           // real tokens so far
  int64_t text_bytes_ = 0;       // of every chunk so far
  int64_t alternative_bytes_ = 0;  // of every chunk's top_logprobs so far
  bool held_back_sent_ = false;  // the token_id -1 chunk came
  bool final_sent_ = false;
};

// A final message's usage, each count at most kMaxObservedTokens (2^40): the router adds them
// up (a request's choices, prompt and completion, Prefetch replicas), and a broken or hostile
// worker's INT64_MAX must not overflow the sums. The stream check has refused negative counts.
void ClampUsage(lazyattn::v1::Usage& usage);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_STREAM_CHECK_H_
