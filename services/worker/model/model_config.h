// Hyper-parameters of a llama-architecture model (Llama 2/3.x, SmolLM2, Mistral), read from GGUF
// metadata or an HF config.json, validated in one place.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_MODEL_CONFIG_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/include/kv_block_entry.h"
#include "kernels/include/rope.h"
#include "services/worker/model/gguf_file.h"

namespace lazyattn {

// Bounds every model reader enforces before it allocates anything sized by a file (docs/worker.md
// lists them). They sit well above every model we serve (Llama 3.1 405B: hidden 16,384, 126 layers,
// 128 heads, FFN 53,248; Gemma's 256K vocabulary) and well below sizes whose products could
// overflow or whose allocation could take a machine down. The weights themselves are bounded by
// the file: every tensor's shape and bytes are checked against the file before the fp32 copy is
// allocated (model_weights.h).
inline constexpr int64_t kMaxHiddenSize = 65536;            // hidden_size, and q_size()
inline constexpr int64_t kMaxIntermediateSize = 1 << 18;    // 262,144
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr int64_t kMaxHeads = 1024;                  // query and key/value heads
inline constexpr int64_t kMaxHeadDim = 512;                 // even
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 21;  // 2,097,152 tokens
// A segment's RoPE offset travels in the packed block entry's 24-bit delta, so no position may
// reach 2^24 (16,777,216 tokens; the CPU RoPE table of such a model would also be 2^24 rows).
inline constexpr int64_t kMaxContextLength = int64_t{kMaxKvDelta} + 1;

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

// Checks every field against the bounds above and for consistency (kv heads dividing heads, even
// head dim, q_size() <= kMaxHiddenSize, finite positive rms_norm_eps, rope_theta > 1, finite rope
// scaling, 64 <= max_positions <= kMaxContextLength: a chat prompt and one generated token must
// fit). InvalidArgument naming the field and its value.
absl::Status ValidateModelConfig(const ModelConfig& config);

// From GGUF metadata (`general.architecture` must be "llama"; keys `llama.*`). Every key is
// range-checked as it is read, before any narrowing; InvalidArgument naming the file and the key
// (e.g. "m.gguf: llama.context_length = 4294967295: must be in [64, 16777216] ...").
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file);

// From an HF config.json (LlamaForCausalLM / MistralForCausalLM). The file may be at most
// kMaxConfigJsonBytes; integer keys must be JSON integers (or integral floats) in range, checked
// before any narrowing; errors name the file and the key.
inline constexpr int64_t kMaxConfigJsonBytes = 16 << 20;
absl::StatusOr<ModelConfig> ModelConfigFromHfJson(const std::string& config_json_path);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_MODEL_CONFIG_H_
