// Hyper-parameters of a llama-architecture model (Llama 2/3.x, SmolLM2, Mistral), read from GGUF
// metadata or an HF config.json, validated in one place.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_MODEL_CONFIG_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/include/rope.h"
#include "services/worker/model/gguf_file.h"

namespace lazyattn {

struct ModelConfig {
  std::string architecture;  // "llama" (GGUF) / "LlamaForCausalLM" ... (HF)
  std::string name;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-5f;
  RopeParams rope;  // rope.freq_factors filled by the weight loader from GGUF rope_freqs.weight
  int64_t max_positions = 0;  // the model's maximum context
  bool tie_word_embeddings = false;

  int64_t q_size() const { return int64_t{num_heads} * head_dim; }
  int64_t kv_size() const { return int64_t{num_kv_heads} * head_dim; }
  int64_t num_parameters() const;
};

// Checks every field for consistency (positive sizes, heads divisible by kv heads, even head dim,
// ...). The error names the offending field and its value.
absl::Status ValidateModelConfig(const ModelConfig& config);

// From GGUF metadata (`general.architecture` must be "llama"; keys `llama.*`).
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file);

// From an HF config.json (LlamaForCausalLM / MistralForCausalLM).
absl::StatusOr<ModelConfig> ModelConfigFromHfJson(const std::string& config_json_path);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_MODEL_CONFIG_H_
