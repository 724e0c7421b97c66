// Token sampling, one draw per logits row: the contract shared by the CUDA kernel
// (kernels/cuda/sampling.h) and its CPU twin (SampleRowCpu below), which the CPU backend uses.
//
// Order of operations (vLLM's): penalties change the logits, temperature scales them, top-k keeps
// the k most likely, top-p keeps the smallest prefix of what top-k kept (renormalized) whose
// probability reaches p, min-p keeps tokens whose probability is at least min_p times the most
// likely one's, then one draw. "Order" is (scaled logit desc, id asc) throughout, so every cut
// is exact and ties at a boundary keep the lowest ids. Temperature 0 is greedy: the argmax of
// the penalized logits (the lowest id among equal maxima, NaN lowest), nothing random. So is
// any temperature below kMinSamplingTemperature, and top_k 1 (SamplingIsGreedy).
//
// Penalties (vLLM/OpenAI semantics) over the row's history of token ids: repetition r divides a
// positive logit by r and multiplies a negative one by r for every id in the history (prompt or
// output part); frequency f subtracts f * (times the id occurs in the output part); presence
// subtracts `presence` once for any id in the output part. A row's logit bias (OpenAI's
// logit_bias, kLogitBias rows) is added to its ids' logits before the penalties, as vLLM does.
// Bias and history travel as one list of entries per row (PenaltyEntry: distinct ids).
//
// The draw, without sorting the vocabulary: Gumbel-max over groups, then inside the winner.
// The row's ids fall into aligned groups of kSamplingGroup (128); a group's key is the
// log-sum-exp of its scaled logits over the allowed set plus one Gumbel noise G_g =
// -log(-log(u)), and the largest key wins: the maximum over a group of y_i + G_i is distributed
// as log(sum exp(y_i)) + G, so this picks group g with probability exactly its share of the
// set's mass. Inside the winner a second uniform picks an id by the inverse of its cumulative
// distribution (ids in order). Together: an exact draw from softmax(y) restricted to the set, at
// one exp per id. Top-p and min-p by rejection: the drawn c is accepted when the mass ranked
// before it is below top_p of the kept mass and c passes min-p; otherwise every token ranked at
// or after c is out of the final set too, so the next round draws only among those ranked
// before c. Accepted draws follow the truncated distribution exactly; after kMaxSamplingRounds
// rejections (probability under (1 - top_p)^32 for top-p alone), or when no logit is finite, the
// top of the scaled order (NaN as -inf) is taken.
//
// Reproducibility: a round's two uniforms for group g (the Gumbel noise, the pick inside) come
// from Philox-4x32-10 keyed by the row's 64-bit seed with counter (g, round, step), step being
// the index of the token being generated. The draw is then a
// function of (seed, step, logits) alone: the same on every run, at any batch composition or row
// order, and after a preemption recomputes the request. Both backends share this function; they
// pick the same token unless exp/log rounding differs at a boundary (rare), and they always
// sample the same distribution.
#ifndef LAZYATTN_KERNELS_INCLUDE_SAMPLING_H_
#define LAZYATTN_KERNELS_INCLUDE_SAMPLING_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define LAZYATTN_HD __host__ __device__ __forceinline__
#else
#define LAZYATTN_HD inline
#endif

namespace lazyattn {

inline constexpr int kMaxSamplingRounds = 32;

// The most alternatives a request may ask for at each generated token (SamplingParams'
// top_logprobs in inference.proto; OpenAI's bound and vLLM's default): every API layer checks it.
inline constexpr int kMaxTopLogprobs = 20;

// The largest |bias| of a logit_bias entry (SamplingParams.logit_bias; OpenAI's bound).
inline constexpr float kMaxLogitBias = 100.0f;

// Temperatures below this draw as greedy (temperature 0), on every backend and in every test
// reference (vLLM's _SAMPLING_EPS, so clients see the same behaviour). Why a threshold and not
// `> 0`: a denormal or tiny positive T makes 1/T overflow to inf (T < 2.9e-39), and then
// x * inf is NaN for x = 0 and +-inf otherwise, so the draw picks among garbage; a T just above
// that scales ordinary logits past FLT_MAX, where SamplingScaled clamps them into ties. At
// 1e-5 the scaled logits of a real model (|x| < 1e3) stay below 1e8, and a logit gap of 1e-3
// already weighs e^-100: below it the draw is greedy in all but exact ties anyway.
inline constexpr float kMinSamplingTemperature = 1e-5f;

// One logits row's sampling parameters (device-copyable, 48 bytes).
struct SamplingRowParams {
  float temperature = 0.0f;         // 0 (or below kMinSamplingTemperature): greedy
  int32_t top_k = 0;                // 0 (or >= vocab): off
  float top_p = 1.0f;               // in (0, 1]; 1: off
  float min_p = 0.0f;               // in [0, 1]; 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off
  float presence_penalty = 0.0f;    // 0: off
  float frequency_penalty = 0.0f;   // 0: off
  // The row's penalty history and logit bias, as entries [penalty_begin, penalty_begin +
  // penalty_count) of the launch's PenaltyEntry array (distinct ids).
  int32_t penalty_begin = 0;
  int32_t penalty_count = 0;
  uint32_t flags = 0;  // kSampleLogprob | kCountInputToken | kLogitBias
  uint64_t seed = 0;
  uint64_t step = 0;  // index of the token being generated (the Philox counter)
};
// Also return the chosen token's log-probability (softmax of the penalized logits at
// temperature 1, before truncation: the model's own belief in the token).
inline constexpr uint32_t kSampleLogprob = 1;
// Count the row's input token as one more output occurrence (pipelined decode: the token the
// previous step drew on the device is not in the host's history yet).
inline constexpr uint32_t kCountInputToken = 2;
// The row's entries carry a logit bias (PenaltyEntry::bias) to apply, with or without penalties.
inline constexpr uint32_t kLogitBias = 4;

// One id's adjustments: its history counts (for the penalties) and its logit bias.
struct PenaltyEntry {
  int32_t id = 0;
  int32_t output_count = 0;  // occurrences in the output part
  int32_t in_prompt = 0;     // 1: occurs in the prompt part
  float bias = 0.0f;         // added to the logit before the penalties (0: none)
};

// One entry of a request's logit bias (OpenAI's logit_bias), as the host keeps it: `bias` is
// added to token `id`'s logit at every generated token, before the penalties. The rows' entry
// lists (PenaltyEntry) carry it to the samplers.
struct LogitBias {
  int32_t id = 0;
  float bias = 0.0f;
};

// The row draws nothing: its token is the argmax of the penalized logits. The one rule every
// backend and reference applies (NaN temperature counts as greedy too; validation refuses it).
LAZYATTN_HD bool SamplingIsGreedy(const SamplingRowParams& p) {
  return !(p.temperature >= kMinSamplingTemperature) || p.top_k == 1;
}

LAZYATTN_HD bool HasPenalties(const SamplingRowParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
         p.frequency_penalty != 0.0f;
}

// The row has entries to apply: penalties, a logit bias, or both.
LAZYATTN_HD bool AdjustsLogits(const SamplingRowParams& p) {
  return HasPenalties(p) || (p.flags & kLogitBias) != 0;
}

// The adjusted logit of entry `e`'s id (see the file comment): its bias, then the penalties,
// counting `extra_output` more output occurrences than the entry holds (kCountInputToken).
LAZYATTN_HD float PenalizedLogit(float x, const SamplingRowParams& p, const PenaltyEntry& e,
                                 int32_t extra_output = 0) {
  if (e.bias != 0.0f) x += e.bias;  // a zero bias leaves even -0 as it is
  const int32_t output_count = e.output_count + extra_output;
  if (output_count > 0 || e.in_prompt != 0) {
    x = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
  }
  if (output_count > 0) {
    x -= p.frequency_penalty * static_cast<float>(output_count) + p.presence_penalty;
  }
  return x;
}

// Philox-4x32-10 (Salmon et al., SC'11), the generator of cuRAND and JAX.
struct Philox4 {
  uint32_t v[4];
};
LAZYATTN_HD Philox4 Philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                               uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The random bits of draw group `group` in `round` of a row's draw: v[0] the group's Gumbel
// noise, v[1] the pick inside the group.
LAZYATTN_HD Philox4 SamplingBits(uint64_t seed, uint64_t step, uint32_t round, uint32_t group) {
  return Philox4x32(group, round, static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32),
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Order-preserving key of a float (NaN lowest, -0 == +0): larger key, larger value.
LAZYATTN_HD uint32_t SamplingOrderKey(float x, uint32_t bits) {
  if (x != x) return 0u;
  if (x == 0.0f) bits = 0u;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Scaled logit with NaN as -inf and overflow clamped (a row may hold +inf).
LAZYATTN_HD float SamplingScaled(float x, float inv_t) {
  if (x != x) return -INFINITY;
  const float y = x * inv_t;
  return y > 3.4028235e38f ? 3.4028235e38f : y;
}

// A uniform in (0, 1) from 24 of the bits (never 0 or 1).
LAZYATTN_HD float SamplingUniform(uint32_t bits) {
  return (static_cast<float>(bits >> 8) + 0.5f) * 5.9604645e-8f;  // 2^-24
}

// Gumbel noise from 24 of the bits (u in (0, 1), never 0 or 1).
LAZYATTN_HD float SamplingGumbel(uint32_t bits) {
  return -logf(-logf(SamplingUniform(bits)));
}

// The draw groups: ids [128 g, 128 g + 128) of a row (aligned, so a group's place does not
// depend on how a backend splits the row).
inline constexpr int kSamplingGroup = 128;

// A group's key in the draw: its log-sum-exp over the set, log(sum exp(y_i)) = max + log(sum),
// plus one Gumbel noise. The largest key wins with probability proportional to the group's mass.
LAZYATTN_HD float SamplingGroupKey(float group_max, float sum_rel_max, uint32_t bits) {
  return group_max + logf(sum_rel_max) + SamplingGumbel(bits);
}

// Validation shared by both backends' callers: the rule each field breaks, or null.
const char* SamplingRowParamsError(const SamplingRowParams& p);

// The CPU twin: bias and penalties, then the draw above, from a row of `vocab` >= 1 logits.
// `penalties` are the row's entries (its penalty_begin/count are ignored), applied when
// AdjustsLogits(params); `input_token` is used with kCountInputToken. Selection is by partial
// selection (std::nth_element) and thresholds, never by sorting the vocabulary. Returns the id;
// `logprob` (optional) receives the chosen token's log-probability.
int32_t SampleRowCpu(const float* logits, int32_t vocab, const SamplingRowParams& params,
                     const PenaltyEntry* penalties, int32_t num_penalties, int32_t input_token,
                     float* logprob = nullptr);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_SAMPLING_H_
