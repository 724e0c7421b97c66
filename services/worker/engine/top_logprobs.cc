#include "services/worker/engine/top_logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace lazyattn {
namespace {

// The draw's order (sampling_cpu.cc's Rank): order key of the value, then the lowest id.
uint64_t Rank(float x, int32_t id) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (uint64_t{SamplingOrderKey(x, bits)} << 32) | uint32_t(~uint32_t(id));
}

int32_t IdOf(uint64_t rank) { return static_cast<int32_t>(~static_cast<uint32_t>(rank)); }

// log(sum exp(x)) over the row as SampleRowCpu's log-probability computes it (double sum).
double LogNormalizer(std::span<const float> x) {
  float mx = -INFINITY;
  for (float v : x) mx = std::max(mx, SamplingScaled(v, 1.0f));
  if (!(mx > -INFINITY)) return NAN;  // no finite logit: no distribution
  double z = 0;
  for (float v : x) z += std::exp(double(SamplingScaled(v, 1.0f)) - mx);
  return double(mx) + std::log(z);
}

}  // namespace

std::vector<TopLogprob> TopLogprobs(std::span<const float> logits, const SamplingRowParams& row,
                                    std::span<const PenaltyEntry> penalties, int32_t chosen,
                                    float chosen_logprob, int k) {
  const int32_t V = static_cast<int32_t>(logits.size());
  std::vector<float> penalized;
  std::span<const float> x = logits;
  if (AdjustsLogits(row)) {
    // The draw's bias and penalties (SampleRowCpu), each id once. The history already holds a
    // chained step's input token, which the runner counted with kCountInputToken.
    penalized.assign(logits.begin(), logits.end());
    for (const PenaltyEntry& e : penalties) {
      if (e.id < 0 || e.id >= V) continue;
      penalized[e.id] = PenalizedLogit(logits[e.id], row, e);
    }
    x = penalized;
  }

  // The k best ranks, best first. Once the list is full a value below its last one's is skipped
  // by one float compare: ranking every id (its sign decides the order key's branch) cost about
  // 5 ns an id on random logits, 0.6 ms for a 128K row, against ~0.02 ms for the compare.
  const size_t want = static_cast<size_t>(std::clamp<int64_t>(k, 0, V));
  std::vector<uint64_t> best;
  best.reserve(want + 1);
  float floor = -INFINITY;  // the list's last value once full (NaN ranks below everything)
  bool full = false;
  const float* values = x.data();
  for (int32_t i = 0; i < V && want > 0; ++i) {
    if (full) {
      while (i < V && !(values[i] >= floor)) ++i;  // below the last, or NaN: the hot loop
      if (i == V) break;
    }
    const uint64_t r = Rank(values[i], i);
    if (full && r <= best.back()) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), r, std::greater<>()), r);
    if (best.size() > want) best.pop_back();
    if (best.size() == want) {
      full = true;
      const float last = values[IdOf(best.back())];
      floor = last == last ? last : -INFINITY;
    }
  }

  // Anchored as a difference from the chosen token, chosen_logprob + (x_i - x_chosen), not as
  // x_i - (x_chosen - chosen_logprob): with logits at the float limit (+inf scales to FLT_MAX)
  // that normalizer rounds away the log of the tie count, and an id tied with the chosen one
  // would come out above it. As a difference, a tie gives chosen_logprob exactly, and the values
  // keep the list's order.
  const double x_chosen = SamplingScaled(x[chosen], 1.0f);
  const bool anchored = std::isfinite(chosen_logprob) && std::isfinite(x_chosen);
  const double log_z = anchored ? 0.0 : LogNormalizer(x);
  std::vector<TopLogprob> out;
  out.reserve(best.size());
  for (uint64_t r : best) {
    const double x_i = SamplingScaled(x[IdOf(r)], 1.0f);
    double lp = anchored ? double(chosen_logprob) + (x_i - x_chosen) : x_i - log_z;
    if (!(lp <= 0.0)) lp = lp > 0.0 ? 0.0 : -INFINITY;  // rounding above 0; no distribution
    out.push_back({IdOf(r), static_cast<float>(lp)});
  }
  return out;
}

}  // namespace lazyattn
