#include <cmath>
#include <cstdlib>
#include <numbers>

#include "kernels/include/rope.h"

namespace lazyattn {

std::vector<double> RopeInverseFrequencies(const RopeParams& p) {
  const int half = p.head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(p.theta, -2.0 * i / p.head_dim);
  }
  if (!p.freq_factors.empty()) {
    for (int i = 0; i < half; ++i) inv_freq[i] /= p.freq_factors[i];
    return inv_freq;
  }
  if (p.scaling.type == RopeScaling::Type::kLlama3) {
    // Llama-3.1 "llama3" rope scaling: long wavelengths are slowed by `factor`, short ones kept,
    // and the band between is interpolated smoothly.
    const RopeScaling& s = p.scaling;
    const double low_freq_wavelen = s.original_max_positions / s.low_freq_factor;
    const double high_freq_wavelen = s.original_max_positions / s.high_freq_factor;
    for (int i = 0; i < half; ++i) {
      const double wavelen = 2 * std::numbers::pi / inv_freq[i];
      if (wavelen < high_freq_wavelen) continue;
      if (wavelen > low_freq_wavelen) {
        inv_freq[i] /= s.factor;
        continue;
      }
      const double smooth = (s.original_max_positions / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      inv_freq[i] = (1 - smooth) * inv_freq[i] / s.factor + smooth * inv_freq[i];
    }
  }
  return inv_freq;
}

RopeTable::RopeTable(const RopeParams& params, int64_t max_positions)
    : head_dim_(params.head_dim),
      max_positions_(max_positions),
      inv_freq_(RopeInverseFrequencies(params)) {
  const int half = head_dim_ / 2;
  cos_.resize(max_positions * half);
  sin_.resize(max_positions * half);
  for (int64_t pos = 0; pos < max_positions; ++pos) {
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * inv_freq_[i];
      cos_[pos * half + i] = static_cast<float>(std::cos(angle));
      sin_[pos * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void RopeRotateHeadCpu(float* x, int64_t pos, const RopeTable& table) {
  const int half = table.head_dim() / 2;
  const float sign = pos < 0 ? -1.0f : 1.0f;  // sin(-a) = -sin(a), cos(-a) = cos(a)
  const float* c = table.cos_row(std::llabs(pos));
  const float* s = table.sin_row(std::llabs(pos));
  for (int i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    const float sn = sign * s[i];
    x[i] = x1 * c[i] - x2 * sn;
    x[i + half] = x1 * sn + x2 * c[i];
  }
}

void RopeApplyCpu(float* x, int n_tokens, int n_heads, const int64_t* positions,
                  const RopeTable& table) {
  const int d = table.head_dim();
  for (int t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      RopeRotateHeadCpu(x + (int64_t{t} * n_heads + h) * d, positions[t], table);
    }
  }
}

}  // namespace lazyattn
