#include "services/worker/model/random_weights.h"

#include <random>
#include <string>

#include "absl/strings/str_cat.h"

namespace lazyattn {
namespace {

void Fill(std::vector<float>& v, size_t n, std::mt19937_64& rng, float mean, float stddev) {
  std::normal_distribution<float> dist(mean, stddev);
  v.resize(n);
  for (float& x : v) x = dist(rng);
}

}  // namespace

std::unique_ptr<ModelWeights> MakeRandomWeights(const ModelConfig& c, uint64_t seed,
                                                float stddev) {
  std::mt19937_64 rng(seed);
  auto w = std::make_unique<ModelWeights>();
  w->config = c;
  const size_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_size(), KV = c.kv_size();
  Fill(w->token_embedding, c.vocab_size * H, rng, 0, 1.0f);
  Fill(w->output_norm, H, rng, 1, 0.1f);
  if (!c.tie_word_embeddings) Fill(w->lm_head, c.vocab_size * H, rng, 0, stddev);
  w->layers.resize(c.num_layers);
  for (auto& L : w->layers) {
    Fill(L.attn_norm, H, rng, 1, 0.1f);
    Fill(L.wqkv, (Q + 2 * KV) * H, rng, 0, stddev * 4);
    Fill(L.wo, H * Q, rng, 0, stddev);
    Fill(L.ffn_norm, H, rng, 1, 0.1f);
    Fill(L.w_gate_up, 2 * I * H, rng, 0, stddev);
    Fill(L.w_down, H * I, rng, 0, stddev);
  }
  return w;
}

absl::StatusOr<ModelConfig> NamedModelShape(std::string_view name) {
  ModelConfig c;
  c.architecture = "llama";
  c.name = std::string(name);
  c.rms_norm_eps = 1e-5f;
  c.tie_word_embeddings = false;
  if (name == "llama3-8b" || name == "llama3-8b-2l") {
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = name == "llama3-8b" ? 32 : 2;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.rope = RopeParams{.head_dim = 128,
                        .theta = 500000,
                        .scaling = {.type = RopeScaling::Type::kLlama3,
                                    .factor = 8,
                                    .low_freq_factor = 1,
                                    .high_freq_factor = 4,
                                    .original_max_positions = 8192}};
    c.max_positions = 131072;
  } else if (name == "small") {
    c.vocab_size = 1024;
    c.hidden_size = 512;
    c.intermediate_size = 1408;
    c.num_layers = 4;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.rope = RopeParams{.head_dim = 64, .theta = 10000};
    c.max_positions = 4096;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown model shape \"", std::string(name), "\" (known: llama3-8b, llama3-8b-2l, small)"));
  }
  return c;
}

ModelConfig TinyTestConfig() {
  ModelConfig c;
  c.architecture = "llama";
  c.name = "tiny-test";
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-5f;
  c.rope = RopeParams{.head_dim = 16, .theta = 10000};
  c.max_positions = 4096;
  c.tie_word_embeddings = false;
  return c;
}

}  // namespace lazyattn
