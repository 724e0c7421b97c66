// Test-only: the exact distribution the samplers (kernels/include/sampling.h) must draw from,
// computed the plain way (sort the vocabulary, cumulate in double), and a chi-square check of
// observed draws against it. Shared by the CPU and CUDA sampler tests.
#ifndef LAZYATTN_KERNELS_CPU_SAMPLING_REFERENCE_H_
#define LAZYATTN_KERNELS_CPU_SAMPLING_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/include/sampling.h"

namespace lazyattn::testing {

inline std::vector<double> ExactSamplingProbs(const std::vector<float>& logits,
                                              const SamplingRowParams& p,
                                              const std::vector<PenaltyEntry>& penalties,
                                              int32_t input_token = -1) {
  const int n = static_cast<int>(logits.size());
  std::vector<float> x = logits;
  if (AdjustsLogits(p)) {
    // Every id through the rule, not only the listed ones: an entry-free id must come out as it
    // went in.
    std::vector<PenaltyEntry> all(n);
    for (int i = 0; i < n; ++i) all[i].id = i;
    for (const PenaltyEntry& e : penalties) {
      all[e.id].output_count += e.output_count, all[e.id].in_prompt |= e.in_prompt;
      all[e.id].bias += e.bias;
    }
    if ((p.flags & kCountInputToken) && input_token >= 0) ++all[input_token].output_count;
    for (int i = 0; i < n; ++i) x[i] = PenalizedLogit(logits[i], p, all[i]);
  }
  std::vector<double> probs(n, 0.0);
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (SamplingIsGreedy(p)) {
    int best = 0;
    for (int i = 1; i < n; ++i) {
      if (x[i] > x[best] || (std::isnan(x[best]) && !std::isnan(x[i]))) best = i;
    }
    probs[best] = 1;
    return probs;
  }
  std::vector<float> y(n);
  for (int i = 0; i < n; ++i) y[i] = SamplingScaled(x[i], 1.0f / p.temperature);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return y[a] > y[b] || (y[a] == y[b] && a < b); });
  int keep = (p.top_k > 0 && p.top_k < n) ? p.top_k : n;
  const float m = y[order[0]];
  std::vector<double> w(keep);
  double z = 0;
  for (int r = 0; r < keep; ++r) z += w[r] = std::exp(double(y[order[r]]) - m);
  if (p.top_p < 1) {
    double before = 0;
    int r = 0;
    for (; r < keep; ++r) {
      if (!(before < p.top_p * z)) break;
      before += w[r];
    }
    keep = r;
  }
  const float min_y = p.min_p > 0 ? m + logf(p.min_p) : -INFINITY;
  double total = 0;
  for (int r = 0; r < keep; ++r) {
    if (y[order[r]] >= min_y) total += probs[order[r]] = w[r];
  }
  for (double& q : probs) q /= total;
  return probs;
}

// Pearson's chi-square of `counts` against `probs` (bins with expected count under 5 pooled);
// fails when a draw lands where the probability is 0, or when the statistic is past a bound a
// correct sampler exceeds with probability about 1e-6. Returns an empty string when it passes.
inline std::string ChiSquareFailure(const std::vector<int64_t>& counts,
                                    const std::vector<double>& probs) {
  int64_t draws = 0;
  for (int64_t c : counts) draws += c;
  std::ostringstream why;
  double chi2 = 0, pooled_e = 0, pooled_o = 0;
  int bins = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0 && counts[i] > 0) {
      why << "id " << i << " drawn " << counts[i] << " times with probability 0";
      return why.str();
    }
    const double e = probs[i] * double(draws);
    if (e < 5) {
      pooled_e += e, pooled_o += double(counts[i]);
      continue;
    }
    chi2 += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++bins;
  }
  if (pooled_e >= 5) {
    chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++bins;
  }
  const double df = std::max(1, bins - 1);
  // Wilson-Hilferty: chi2/df is near-normal with mean 1 - 2/(9df), sd sqrt(2/(9df)); 4.9 sd.
  const double sd = std::sqrt(2.0 / (9.0 * df));
  const double bound = df * std::pow(1 - 2.0 / (9.0 * df) + 4.9 * sd, 3.0);
  if (chi2 > bound) {
    why << "chi-square " << chi2 << " over " << df << " degrees of freedom (bound " << bound
        << ")";
    return why.str();
  }
  return "";
}

// The distribution cases both sampler tests run: a row of logits, the parameters, penalties.
struct SamplingCase {
  std::string name;
  std::vector<float> logits;
  SamplingRowParams params;
  std::vector<PenaltyEntry> penalties;
  int32_t input_token = -1;
};

// `spread` > 1 places the few likely ids far apart in a larger vocabulary (the rest at -40), so
// a multi-CTA sampler sees them in different CTAs.
inline std::vector<SamplingCase> SamplingCases(int spread = 1) {
  auto place = [&](std::vector<float> few) {
    std::vector<float> row(few.size() * spread, -40.0f);
    for (size_t i = 0; i < few.size(); ++i) row[i * spread + (spread > 1 ? spread / 3 : 0)] = few[i];
    return row;
  };
  auto id = [&](int i) { return int32_t(i * spread + (spread > 1 ? spread / 3 : 0)); };
  const std::vector<float> quarter = {std::log(0.1f), std::log(0.4f), std::log(0.2f),
                                      std::log(0.3f)};
  std::vector<float> eleven = {0.3f, -1.2f, 2.0f, 0.7f, 0.7f, 1.5f, -0.4f, 0.7f, 1.1f, -2.0f, 0.0f};
  std::vector<SamplingCase> c;
  auto add = [&](std::string name, std::vector<float> few, SamplingRowParams p) {
    c.push_back({std::move(name), place(std::move(few)), p, {}, -1});
  };
  add("temperature", eleven, {.temperature = 0.7f});
  add("hot", eleven, {.temperature = 3.0f});
  add("top_k_3", eleven, {.temperature = 1.0f, .top_k = 3});
  // 0.7 appears three times: top_k 5 cuts inside the tie (keeps the two lowest ids).
  add("top_k_tie", eleven, {.temperature = 1.0f, .top_k = 5});
  // Probabilities 0.4 0.3 0.2 0.1: the nucleus boundary just below and just above 0.7.
  add("top_p_below", quarter, {.temperature = 1.0f, .top_p = 0.6999f});
  add("top_p_above", quarter, {.temperature = 1.0f, .top_p = 0.7001f});
  add("top_p_small", eleven, {.temperature = 2.0f, .top_p = 0.2f});
  add("min_p", quarter, {.temperature = 1.0f, .min_p = 0.49f});
  add("min_p_edge", quarter, {.temperature = 1.0f, .min_p = 0.51f});
  add("top_k_top_p", eleven, {.temperature = 1.2f, .top_k = 6, .top_p = 0.8f});
  add("all_cuts", eleven, {.temperature = 0.9f, .top_k = 7, .top_p = 0.9f, .min_p = 0.1f});
  // Below kMinSamplingTemperature a row is greedy: a denormal T's 1/T is inf, which would turn
  // the logit 0 into NaN and every positive one into the same clamped maximum.
  add("denormal_temperature", eleven, {.temperature = 1e-40f});
  add("below_min_temperature", eleven,
      {.temperature = 0.99f * kMinSamplingTemperature, .top_p = 0.9f});
  SamplingCase pen;
  pen.name = "penalties";
  pen.logits = place(eleven);
  pen.params = {.temperature = 1.0f, .repetition_penalty = 1.5f, .presence_penalty = 0.4f,
                .frequency_penalty = 0.3f, .flags = kCountInputToken};
  pen.penalties = {{id(2), 2, 1}, {id(5), 0, 1}, {id(9), 1, 0}, {id(3), 1, 0}};
  pen.input_token = id(8);  // not in the list: one output occurrence from the input
  pen.params.penalty_count = int32_t(pen.penalties.size());
  c.push_back(pen);
  SamplingCase pen2 = pen;
  pen2.name = "penalties_input_listed";
  pen2.input_token = id(2);  // listed: its output count becomes 3
  c.push_back(pen2);
  // Logit bias: alone (a ban, a boost of an unlikely id, a small nudge), and with the penalties
  // on ids that have both (the bias comes first: the repetition penalty then divides the biased
  // logit) and with the unlisted input token.
  SamplingCase bias;
  bias.name = "logit_bias";
  bias.logits = place(eleven);
  bias.params = {.temperature = 1.0f, .flags = kLogitBias};
  bias.penalties = {
      {.id = id(2), .bias = -100.0f}, {.id = id(9), .bias = 4.0f}, {.id = id(4), .bias = -0.5f}};
  bias.params.penalty_count = int32_t(bias.penalties.size());
  c.push_back(bias);
  SamplingCase bias_greedy = bias;
  bias_greedy.name = "logit_bias_greedy";  // id(9) at -2 + 4 overtakes id(5) at 1.5
  bias_greedy.params.temperature = 0.0f;
  c.push_back(bias_greedy);
  SamplingCase both = pen;
  both.name = "logit_bias_and_penalties";
  both.params.flags |= kLogitBias;
  both.penalties = {{id(2), 2, 1, -1.0f},
                    {id(5), 0, 1, 0.0f},
                    {id(9), 1, 0, 2.5f},
                    {id(3), 1, 0, 0.0f},
                    {id(6), 0, 0, 1.25f}};
  both.params.penalty_count = int32_t(both.penalties.size());
  c.push_back(both);
  return c;
}

}  // namespace lazyattn::testing

#endif  // LAZYATTN_KERNELS_CPU_SAMPLING_REFERENCE_H_
