#include "services/worker/model/model_config.h"

#include <fstream>
#include <sstream>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace lazyattn {

int64_t ModelConfig::num_parameters() const {
  const int64_t per_layer = hidden_size * (q_size() + 2 * kv_size()) + q_size() * hidden_size +
                            3 * hidden_size * intermediate_size + 2 * hidden_size;
  return vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2) + num_layers * per_layer +
         hidden_size;
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  auto bad = [](absl::string_view field, auto value, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: ", field, " = ", value, ": ", why));
  };
  if (c.vocab_size <= 0) return bad("vocab_size", c.vocab_size, "must be positive");
  if (c.hidden_size <= 0) return bad("hidden_size", c.hidden_size, "must be positive");
  if (c.intermediate_size <= 0) return bad("intermediate_size", c.intermediate_size, "must be positive");
  if (c.num_layers <= 0) return bad("num_layers", c.num_layers, "must be positive");
  if (c.num_heads <= 0) return bad("num_heads", c.num_heads, "must be positive");
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return bad("num_kv_heads", c.num_kv_heads,
               absl::StrCat("must divide num_heads (", c.num_heads, ")"));
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0 || c.head_dim > 512) {
    return bad("head_dim", c.head_dim, "must be even and in [2, 512]");
  }
  if (c.rope.head_dim != c.head_dim) {
    return bad("rope.dimension_count", c.rope.head_dim,
               absl::StrCat("partial rotary embeddings are not supported (head_dim ", c.head_dim,
                            ")"));
  }
  if (!(c.rope.theta > 1)) return bad("rope_theta", c.rope.theta, "must be > 1");
  if (!(c.rms_norm_eps > 0)) return bad("rms_norm_eps", c.rms_norm_eps, "must be positive");
  if (c.max_positions <= 0) return bad("max_positions", c.max_positions, "must be positive");
  if (c.rope.scaling.type == RopeScaling::Type::kLlama3) {
    const RopeScaling& s = c.rope.scaling;
    if (!(s.factor >= 1)) return bad("rope_scaling.factor", s.factor, "must be >= 1");
    if (!(s.high_freq_factor > s.low_freq_factor) || !(s.low_freq_factor > 0)) {
      return bad("rope_scaling.high_freq_factor", s.high_freq_factor,
                 "must exceed low_freq_factor > 0");
    }
    if (!(s.original_max_positions > 0)) {
      return bad("rope_scaling.original_max_position_embeddings", s.original_max_positions,
                 "must be positive");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& f) {
  ModelConfig c;
  ASSIGN_OR_RETURN(c.architecture, f.GetString("general.architecture"));
  if (c.architecture != "llama") {
    return absl::UnimplementedError(absl::StrCat(
        f.path(), ": general.architecture = \"", c.architecture,
        "\" is not supported (only \"llama\": Llama 2/3.x, SmolLM2, Mistral)"));
  }
  if (f.Has("general.name")) {
    ASSIGN_OR_RETURN(c.name, f.GetString("general.name"));
  }
  ASSIGN_OR_RETURN(c.hidden_size, f.GetInt("llama.embedding_length"));
  ASSIGN_OR_RETURN(c.intermediate_size, f.GetInt("llama.feed_forward_length"));
  ASSIGN_OR_RETURN(int64_t layers, f.GetInt("llama.block_count"));
  ASSIGN_OR_RETURN(int64_t heads, f.GetInt("llama.attention.head_count"));
  int64_t kv_heads = heads;
  if (f.Has("llama.attention.head_count_kv")) {
    ASSIGN_OR_RETURN(kv_heads, f.GetInt("llama.attention.head_count_kv"));
  }
  c.num_layers = static_cast<int>(layers);
  c.num_heads = static_cast<int>(heads);
  c.num_kv_heads = static_cast<int>(kv_heads);
  c.head_dim = heads > 0 ? static_cast<int>(c.hidden_size / heads) : 0;
  if (f.Has("llama.attention.key_length")) {
    ASSIGN_OR_RETURN(int64_t kl, f.GetInt("llama.attention.key_length"));
    c.head_dim = static_cast<int>(kl);
  }
  c.rope.head_dim = c.head_dim;
  if (f.Has("llama.rope.dimension_count")) {
    ASSIGN_OR_RETURN(int64_t rd, f.GetInt("llama.rope.dimension_count"));
    c.rope.head_dim = static_cast<int>(rd);
  }
  if (f.Has("llama.rope.freq_base")) {
    ASSIGN_OR_RETURN(c.rope.theta, f.GetFloat("llama.rope.freq_base"));
  }
  if (f.Has("llama.rope.scaling.type")) {
    ASSIGN_OR_RETURN(std::string type, f.GetString("llama.rope.scaling.type"));
    if (type != "none") {
      return absl::UnimplementedError(absl::StrCat(
          f.path(), ": llama.rope.scaling.type = \"", type,
          "\" is not supported (Llama-3 scaling comes as the rope_freqs.weight tensor)"));
    }
  }
  ASSIGN_OR_RETURN(double eps, f.GetFloat("llama.attention.layer_norm_rms_epsilon"));
  c.rms_norm_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(c.max_positions, f.GetInt("llama.context_length"));
  if (f.Has("llama.vocab_size")) {
    ASSIGN_OR_RETURN(c.vocab_size, f.GetInt("llama.vocab_size"));
  } else {
    ASSIGN_OR_RETURN(const GgufTensorInfo* embd, f.FindTensor("token_embd.weight"));
    c.vocab_size = embd->dims.size() == 2 ? embd->dims[1] : 0;
  }
  c.tie_word_embeddings = !f.FindTensor("output.weight").ok();
  RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

namespace {

using nlohmann::json;

template <typename T>
absl::Status ReadField(const json& j, const char* key, T* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("config.json: missing \"", key, "\""));
    return absl::OkStatus();
  }
  const bool ok = std::is_same_v<T, bool> ? it->is_boolean() : it->is_number();
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" must be a ",
                                                   std::is_same_v<T, bool> ? "boolean" : "number",
                                                   ", got ", it->dump()));
  }
  *out = it->get<T>();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromHfJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  const json j = json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  ModelConfig c;
  const std::string model_type = j.value("model_type", std::string());
  if (auto a = j.find("architectures"); a != j.end() && a->is_array() && !a->empty() &&
                                        (*a)[0].is_string()) {
    c.architecture = (*a)[0].get<std::string>();
  }
  if (model_type != "llama" && model_type != "mistral") {
    return absl::UnimplementedError(absl::StrCat(
        path, ": model_type = \"", model_type, "\" is not supported (llama or mistral)"));
  }
  c.name = j.value("_name_or_path", std::string());
  RETURN_IF_ERROR(ReadField(j, "vocab_size", &c.vocab_size, true));
  RETURN_IF_ERROR(ReadField(j, "hidden_size", &c.hidden_size, true));
  RETURN_IF_ERROR(ReadField(j, "intermediate_size", &c.intermediate_size, true));
  RETURN_IF_ERROR(ReadField(j, "num_hidden_layers", &c.num_layers, true));
  RETURN_IF_ERROR(ReadField(j, "num_attention_heads", &c.num_heads, true));
  c.num_kv_heads = c.num_heads;
  RETURN_IF_ERROR(ReadField(j, "num_key_value_heads", &c.num_kv_heads, false));
  c.head_dim = c.num_heads > 0 ? static_cast<int>(c.hidden_size / c.num_heads) : 0;
  RETURN_IF_ERROR(ReadField(j, "head_dim", &c.head_dim, false));
  c.rope.head_dim = c.head_dim;
  double eps = 1e-6;
  RETURN_IF_ERROR(ReadField(j, "rms_norm_eps", &eps, false));
  c.rms_norm_eps = static_cast<float>(eps);
  RETURN_IF_ERROR(ReadField(j, "rope_theta", &c.rope.theta, false));
  c.max_positions = 2048;
  RETURN_IF_ERROR(ReadField(j, "max_position_embeddings", &c.max_positions, false));
  RETURN_IF_ERROR(ReadField(j, "tie_word_embeddings", &c.tie_word_embeddings, false));
  if (auto sw = j.find("sliding_window"); sw != j.end() && sw->is_number_integer() &&
                                          sw->get<int64_t>() < c.max_positions) {
    // Mistral-7B-v0.1 attends within a 4,096-token window; we serve it only up to that length,
    // where windowed and full attention are the same function.
    c.max_positions = sw->get<int64_t>();
  }
  // transformers 5 writes theta and scaling together as `rope_parameters` (and no longer
  // rope_theta / rope_scaling); older files have the two separate keys.
  const char* scaling_key = "rope_scaling";
  if (auto rp = j.find("rope_parameters"); rp != j.end() && rp->is_object()) {
    RETURN_IF_ERROR(ReadField(*rp, "rope_theta", &c.rope.theta, false));
    scaling_key = "rope_parameters";
  }
  if (auto rs = j.find(scaling_key); rs != j.end() && !rs->is_null()) {
    if (!rs->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", scaling_key, " must be an object"));
    }
    std::string type = rs->value("rope_type", rs->value("type", std::string()));
    if (type == "llama3") {
      RopeScaling& s = c.rope.scaling;
      s.type = RopeScaling::Type::kLlama3;
      RETURN_IF_ERROR(ReadField(*rs, "factor", &s.factor, true));
      RETURN_IF_ERROR(ReadField(*rs, "low_freq_factor", &s.low_freq_factor, true));
      RETURN_IF_ERROR(ReadField(*rs, "high_freq_factor", &s.high_freq_factor, true));
      RETURN_IF_ERROR(ReadField(*rs, "original_max_position_embeddings",
                                &s.original_max_positions, true));
    } else if (type != "default") {
      return absl::UnimplementedError(absl::StrCat(
          path, ": ", scaling_key, ".rope_type = \"", type,
          "\" is not supported (llama3 or default)"));
    }
  }
  RETURN_IF_ERROR(ValidateModelConfig(c));
  return c;
}

}  // namespace lazyattn
