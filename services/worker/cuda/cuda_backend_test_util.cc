// Helpers shared by the CUDA backend's tests: cuda_backend_test_util.h.
#include "services/worker/cuda/cuda_backend_test_util.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "services/worker/model/random_weights.h"

namespace lazyattn {

LogitsDiff CompareLogits(std::span<const float> ours, std::span<const float> ref) {
  LogitsDiff d;
  double mean = 0, dot = 0, n_ours = 0, n_ref = 0, max_err = 0;
  for (float r : ref) mean += r;
  mean /= static_cast<double>(ref.size());
  double var = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    var += (ref[i] - mean) * (ref[i] - mean);
    max_err = std::max(max_err, std::abs(double{ours[i]} - ref[i]));
    dot += double{ours[i]} * ref[i];
    n_ours += double{ours[i]} * ours[i];
    n_ref += double{ref[i]} * ref[i];
  }
  d.max_abs = max_err;
  d.rel_err = max_err / std::sqrt(var / static_cast<double>(ref.size()));
  d.cosine = dot / std::sqrt(n_ours * n_ref);
  d.same_argmax = std::max_element(ours.begin(), ours.end()) - ours.begin() ==
                  std::max_element(ref.begin(), ref.end()) - ref.begin();
  double top = -INFINITY, second = -INFINITY;
  for (float r : ref) {
    if (r > top) {
      second = top;
      top = r;
    } else if (r > second) {
      second = r;
    }
  }
  d.ref_margin = (top - second) / std::sqrt(var / static_cast<double>(ref.size()));
  return d;
}

std::unique_ptr<ModelRunner> CudaRunnerFor(
    const ModelWeights& w, int64_t blocks,
    int wgmma_max_rows) {
  auto gpu = CudaModelWeights::Upload(w);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  if (!gpu.ok()) return nullptr;
  auto runner = CudaModelRunner::Create(std::move(*gpu), {.num_kv_blocks = blocks,
                                                          .wgmma_max_rows = wgmma_max_rows});
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return nullptr;
  return std::move(*runner);
}

ModelConfig SmallConfig() {
  auto c = NamedModelShape("small");
  return *c;
}

std::unique_ptr<ModelWeights> HfLikeWeights(const ModelConfig& c, uint32_t seed) {
  auto w = MakeRandomWeights(c, seed, 0.02f);
  auto round = [](std::vector<float>& v, float scale) {
    for (float& x : v) x = testing::RoundBf16(x * scale);
  };
  round(w->token_embedding, 0.02f);
  round(w->output_norm, 1);
  round(w->lm_head, 1);
  for (LayerWeights& L : w->layers) {
    round(L.attn_norm, 1);
    round(L.wqkv, 0.25f);  // MakeRandomWeights draws QKV at 4x stddev
    round(L.wo, 1);
    round(L.ffn_norm, 1);
    round(L.w_gate_up, 1);
    round(L.w_down, 1);
  }
  return w;
}

}  // namespace lazyattn
