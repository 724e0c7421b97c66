// Rotary position embedding (RoPE) in the canonical half-split layout.
//
// Layout: within each head of `head_dim` values, dimension i (i < head_dim/2) pairs with
// i + head_dim/2 (HF's `rotate_half`). GGUF Q/K weights are converted to this layout at load.
// Rotation by angle a = pos * inv_freq[i]:  x1' = x1 cos a - x2 sin a,  x2' = x1 sin a + x2 cos a.
//
// Precision: cos/sin are computed in double and stored as fp32 (an fp32 angle at position ~1e5
// loses ~1e-2 of accuracy). Negative positions rotate backward (used by decode to move the query
// by -delta instead of moving every key by +delta).
#ifndef LAZYATTN_KERNELS_INCLUDE_ROPE_H_
#define LAZYATTN_KERNELS_INCLUDE_ROPE_H_

#include <cstdint>
#include <vector>

namespace lazyattn {

struct RopeScaling {
  enum class Type { kNone, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_positions = 8192;
};

struct RopeParams {
  int head_dim = 0;      // even
  double theta = 10000;  // rope_theta / freq_base
  RopeScaling scaling;
  // Optional per-frequency divisors (GGUF `rope_freqs.weight`, head_dim/2 values); when non-empty
  // they replace `scaling`: inv_freq[i] = theta^(-2i/d) / freq_factors[i].
  std::vector<double> freq_factors;
};

// Inverse frequencies (head_dim/2 values) in double, including Llama-3 scaling.
std::vector<double> RopeInverseFrequencies(const RopeParams& params);

// Table of cos/sin for positions [0, max_positions), computed in double, stored fp32,
// row-major [position][head_dim/2].
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(const RopeParams& params, int64_t max_positions);

  int head_dim() const { return head_dim_; }
  int64_t max_positions() const { return max_positions_; }
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  // Precondition: 0 <= pos < max_positions().
  const float* cos_row(int64_t pos) const { return cos_.data() + pos * (head_dim_ / 2); }
  const float* sin_row(int64_t pos) const { return sin_.data() + pos * (head_dim_ / 2); }
  const std::vector<float>& cos_data() const { return cos_; }
  const std::vector<float>& sin_data() const { return sin_; }

 private:
  int head_dim_ = 0;
  int64_t max_positions_ = 0;
  std::vector<double> inv_freq_;
  std::vector<float> cos_, sin_;
};

// Rotates one head vector `x[head_dim]` in place by `pos` (may be negative: |pos| < max_positions).
void RopeRotateHeadCpu(float* x, int64_t pos, const RopeTable& table);

// Rotates `x[n_tokens][n_heads][head_dim]` in place, token t by positions[t].
void RopeApplyCpu(float* x, int n_tokens, int n_heads, const int64_t* positions,
                  const RopeTable& table);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_ROPE_H_
