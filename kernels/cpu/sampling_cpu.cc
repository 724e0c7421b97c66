#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <span>
#include <cstdint>
#include <vector>

#include "kernels/include/sampling.h"

namespace lazyattn {
namespace {

uint32_t FloatBits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
uint64_t Rank(float y, int32_t i) {
  return (uint64_t{SamplingOrderKey(y, FloatBits(y))} << 32) | uint32_t(~uint32_t(i));
}

}  // namespace

const char* SamplingRowParamsError(const SamplingRowParams& p) {
  if (!(p.temperature >= 0.0f && p.temperature <= 100.0f)) return "temperature: must be in [0, 100]";
  if (p.top_k < 0) return "top_k: must be >= 0 (0 disables it)";
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return "top_p: must be in (0, 1]";
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return "min_p: must be in [0, 1]";
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= 100.0f)) {
    return "repetition_penalty: must be in (0, 100]";
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return "presence_penalty: must be in [-2, 2]";
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return "frequency_penalty: must be in [-2, 2]";
  }
  if (p.penalty_begin < 0 || p.penalty_count < 0) return "penalty entries: negative range";
  return nullptr;
}

int32_t SampleRowCpu(const float* logits, int32_t vocab, const SamplingRowParams& p,
                     const PenaltyEntry* penalty_entries, int32_t num_penalties,
                     int32_t input_token, float* logprob) {
  const int32_t V = vocab;
  std::vector<float> x(logits, logits + V);
  const std::span<const PenaltyEntry> penalties(penalty_entries, num_penalties);
  if (AdjustsLogits(p)) {
    bool input_seen = false;
    const bool count_input = (p.flags & kCountInputToken) && input_token >= 0 && input_token < V;
    for (const PenaltyEntry& e : penalties) {
      if (e.id < 0 || e.id >= V) continue;
      const int32_t extra = count_input && e.id == input_token ? 1 : 0;
      input_seen |= extra != 0;
      x[e.id] = PenalizedLogit(logits[e.id], p, e, extra);
    }
    if (count_input && !input_seen) {
      x[input_token] = PenalizedLogit(logits[input_token], p, PenaltyEntry{.id = input_token}, 1);
    }
  }
  // Greedy argmax key: (order key, lowest id), NaN lowest.
  uint64_t best = 0;
  for (int32_t i = 0; i < V; ++i) best = std::max(best, Rank(x[i], i));
  const int32_t argmax = static_cast<int32_t>(~static_cast<uint32_t>(best));
  auto log_prob_of = [&](int32_t c) {
    float mx = -INFINITY;
    for (float v : x) mx = std::max(mx, SamplingScaled(v, 1.0f));
    double z = 0;
    for (float v : x) z += std::exp(double(SamplingScaled(v, 1.0f)) - mx);
    return static_cast<float>(double(SamplingScaled(x[c], 1.0f)) - mx - std::log(z));
  };
  int32_t chosen = argmax;
  if (!SamplingIsGreedy(p)) {
    const float inv_t = 1.0f / p.temperature;
    std::vector<float> y(V);
    float m = -INFINITY;
    uint64_t top = 0;  // the top of the scaled order: taken when no draw is accepted
    for (int32_t i = 0; i < V; ++i) {
      m = std::max(m, y[i] = SamplingScaled(x[i], inv_t));
      top = std::max(top, Rank(y[i], i));
    }
    const int32_t top_id = static_cast<int32_t>(~static_cast<uint32_t>(top));
    chosen = top_id;
    if (m > -INFINITY) {
      // Top-k: the k-th largest rank by partial selection.
      uint64_t t_k = 0;
      if (p.top_k > 0 && p.top_k < V) {
        std::vector<uint64_t> ranks(V);
        for (int32_t i = 0; i < V; ++i) ranks[i] = Rank(y[i], i);
        std::nth_element(ranks.begin(), ranks.begin() + (p.top_k - 1), ranks.end(),
                         std::greater<>());
        t_k = ranks[p.top_k - 1];
      }
      const float min_y = p.min_p > 0.0f ? m + logf(p.min_p) : -INFINITY;
      double z_k = 0;
      if (p.top_p < 1.0f) {
        for (int32_t i = 0; i < V; ++i) {
          if (Rank(y[i], i) >= t_k) z_k += std::exp(double(y[i]) - m);
        }
      }
      uint64_t lower = 0;  // the set: rank > lower
      chosen = -1;
      auto member = [&](int32_t i) {
        const uint64_t r = Rank(y[i], i);
        return r >= t_k && r > lower && y[i] >= min_y;
      };
      for (uint32_t round = 0; round < kMaxSamplingRounds && chosen < 0; ++round) {
        // Gumbel-max over the draw groups (each group's log-sum-exp over the set plus one
        // noise), then the inverse CDF inside the winner: the kernel's draw, in the same order.
        uint64_t best_key = 0;
        int32_t group = -1;
        for (int32_t g = 0; int64_t{g} * kSamplingGroup < V; ++g) {
          const int32_t lo = g * kSamplingGroup, hi = std::min(V, lo + kSamplingGroup);
          float gm = -INFINITY;
          for (int32_t i = lo; i < hi; ++i) {
            if (member(i)) gm = std::max(gm, y[i]);
          }
          if (!(gm > -INFINITY)) continue;
          double s = 0;
          for (int32_t i = lo; i < hi; ++i) {
            if (member(i)) s += std::exp(double(y[i]) - gm);
          }
          const Philox4 bits = SamplingBits(p.seed, p.step, round, static_cast<uint32_t>(g));
          const uint64_t key = Rank(SamplingGroupKey(gm, float(s), bits.v[0]), g);
          if (key > best_key) best_key = key, group = g;
        }
        if (group < 0) break;
        int32_t c = -1;
        {
          const int32_t lo = group * kSamplingGroup, hi = std::min(V, lo + kSamplingGroup);
          float gm = -INFINITY;
          for (int32_t i = lo; i < hi; ++i) {
            if (member(i)) gm = std::max(gm, y[i]);
          }
          double total = 0;
          for (int32_t i = lo; i < hi; ++i) {
            if (member(i)) total += std::exp(double(y[i]) - gm);
          }
          const Philox4 bits = SamplingBits(p.seed, p.step, round, static_cast<uint32_t>(group));
          const double target = double(SamplingUniform(bits.v[1])) * total;
          double cum = 0;
          int32_t last = -1;
          for (int32_t i = lo; i < hi && c < 0; ++i) {
            if (!member(i)) continue;
            const double w = std::exp(double(y[i]) - gm);
            if (!(w > 0)) continue;
            cum += w;
            last = i;
            if (cum > target) c = i;
          }
          if (c < 0) c = last;
        }
        if (c < 0) break;
        if (p.top_p >= 1.0f) {
          chosen = c;
          break;
        }
        const uint64_t rc = Rank(y[c], c);
        double before = 0;
        for (int32_t i = 0; i < V; ++i) {
          const uint64_t r = Rank(y[i], i);
          if (r >= t_k && r > rc) before += std::exp(double(y[i]) - m);
        }
        if (before < double(p.top_p) * z_k) {
          chosen = c;
        } else {
          lower = rc;
        }
      }
      if (chosen < 0) chosen = top_id;
    }
  }
  if (logprob != nullptr) *logprob = log_prob_of(chosen);
  return chosen;
}

}  // namespace lazyattn
