// The most likely tokens at a generated position, for SamplingParams::top_logprobs (OpenAI's
// top_logprobs): ranked by the softmax that kSampleLogprob reports (kernels/include/sampling.h:
// the penalized logits at temperature 1, before truncation), computed on the host from the row
// of logits the LM head gave (ForwardChunk::return_logits) and the draw's own results.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_TOP_LOGPROBS_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_TOP_LOGPROBS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/include/sampling.h"

namespace lazyattn {

struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

// The min(k, logits.size()) most likely tokens of `logits` (one row, before penalties), most
// likely first: penalized logit descending, the lowest id first among equals, NaN last.
//
// Their log-probabilities are anchored on the chosen token's, which the backend's draw already
// computed with the row's normalizer: logprob(i) = chosen_logprob + (x_i - x_chosen), x the
// penalized logits. So no pass over the vocabulary needs an exp (a 128K row is one pass of
// compares), the values agree with `chosen_logprob` to rounding and keep the list's order, and
// the chosen token's entry (and any tied with it) is exactly `chosen_logprob`. Where that anchor
// is not finite the row's own log-sum-exp is computed here instead. Values are clamped to at
// most 0; a NaN or -inf logit reports -inf, and so does every entry of a row without a finite
// logit (it has no distribution).
//
// `row` is the draw's parameters; `penalties` the entries of the history the draw saw
// (PenaltyEntries; its input token included, since kCountInputToken is not read here), used
// only when the row has penalties. Preconditions: k >= 0; chosen inside the row. O(vocab +
// inserts x k): once the list is full an id costs one float compare; one copy of the row only
// when it has penalties.
std::vector<TopLogprob> TopLogprobs(std::span<const float> logits, const SamplingRowParams& row,
                                    std::span<const PenaltyEntry> penalties, int32_t chosen,
                                    float chosen_logprob, int k);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_TOP_LOGPROBS_H_
