#include "services/worker/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/mapped_file.h"

namespace lazyattn {

int64_t ModelConfig::num_parameters() const {
  const int64_t per_layer = hidden_size * (q_size() + 2 * kv_size()) + q_size() * hidden_size +
                            3 * hidden_size * intermediate_size + 2 * hidden_size;
  return vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2) + num_layers * per_layer +
         hidden_size;
}

namespace {

// "[lo, hi]" for messages.
std::string Range(int64_t lo, int64_t hi) { return absl::StrCat("[", lo, ", ", hi, "]"); }

// The shortest context a model is served with. A request needs its prompt (at least one
// question token, with the chat template's framing around it) and one generated token inside the
// context (CheckPreparedRequest): a context of one position loaded, then refused every request,
// and one shorter than a chat prompt refuses every chat request. The longest prompt a supported
// template makes of a one-token question is Llama-3.1's, about 36 tokens with its always-present
// system turn (SmolLM2-Instruct's, with its default system message: 31; plain ChatML: 9;
// Llama-3: 11): 64, four KV blocks, holds each with a generated token. The kernels themselves
// need one position (the RoPE tables), and attention is never windowed, so a sliding window has
// the same minimum as the context it caps.
constexpr int64_t kMinContextLength = 64;

// Why a bound is what it is, appended to range errors of the keys that carry one.
constexpr absl::string_view kContextWhy =
    " (a chat prompt and one generated token must fit; a RoPE offset must fit the packed KV "
    "block entry's 24-bit delta)";
// The window is the longest context served (see ParseHfConfig).
constexpr absl::string_view kSlidingWindowWhy =
    " (it caps the context, which must hold a chat prompt and one generated token)";

}  // namespace

absl::Status ValidateModelConfig(const ModelConfig& c) {
  auto bad = [](absl::string_view field, auto value, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: ", field, " = ", value, ": ", why));
  };
  auto in = [&](absl::string_view field, int64_t v, int64_t lo, int64_t hi,
                absl::string_view why = "") -> absl::Status {
    if (v >= lo && v <= hi) return absl::OkStatus();
    return bad(field, v, absl::StrCat("must be in ", Range(lo, hi), why));
  };
  RETURN_IF_ERROR(in("vocab_size", c.vocab_size, 1, kMaxVocabSize));
  RETURN_IF_ERROR(in("hidden_size", c.hidden_size, 1, kMaxHiddenSize));
  RETURN_IF_ERROR(in("intermediate_size", c.intermediate_size, 1, kMaxIntermediateSize));
  RETURN_IF_ERROR(in("num_layers", c.num_layers, 1, kMaxLayers));
  RETURN_IF_ERROR(in("num_heads", c.num_heads, 1, kMaxHeads));
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return bad("num_kv_heads", c.num_kv_heads,
               absl::StrCat("must divide num_heads (", c.num_heads, ")"));
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0 || c.head_dim > kMaxHeadDim) {
    return bad("head_dim", c.head_dim, absl::StrCat("must be even and in ", Range(2, kMaxHeadDim)));
  }
  if (c.q_size() > kMaxHiddenSize) {
    return bad("num_heads * head_dim", c.q_size(),
               absl::StrCat("must be at most ", kMaxHiddenSize));
  }
  if (c.rope.head_dim != c.head_dim) {
    return bad(
        "rope.dimension_count", c.rope.head_dim,
        absl::StrCat("partial rotary embeddings are not supported (head_dim ", c.head_dim, ")"));
  }
  if (!(c.rope.theta > 1) || !std::isfinite(c.rope.theta)) {
    return bad("rope_theta", c.rope.theta, "must be finite and > 1");
  }
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) {
    return bad("rms_norm_eps", c.rms_norm_eps, "must be finite and positive");
  }
  RETURN_IF_ERROR(
      in("max_positions", c.max_positions, kMinContextLength, kMaxContextLength, kContextWhy));
  if (c.rope.scaling.type == RopeScaling::Type::kLlama3) {
    const RopeScaling& s = c.rope.scaling;
    if (!(s.factor >= 1) || !std::isfinite(s.factor)) {
      return bad("rope_scaling.factor", s.factor, "must be finite and >= 1");
    }
    if (!(s.high_freq_factor > s.low_freq_factor) || !(s.low_freq_factor > 0) ||
        !std::isfinite(s.high_freq_factor)) {
      return bad("rope_scaling.high_freq_factor", s.high_freq_factor,
                 "must be finite and exceed low_freq_factor > 0");
    }
    if (!(s.original_max_positions > 0) || !std::isfinite(s.original_max_positions)) {
      return bad("rope_scaling.original_max_position_embeddings", s.original_max_positions,
                 "must be finite and positive");
    }
  }
  for (size_t i = 0; i < c.rope.freq_factors.size(); ++i) {
    const double f = c.rope.freq_factors[i];
    if (!(f > 0) || !std::isfinite(f)) {
      return bad(absl::StrCat("rope_freqs[", i, "]"), f, "must be finite and positive");
    }
  }
  return absl::OkStatus();
}

namespace {

// An integer metadata key in [lo, hi], checked before anything narrows it.
absl::StatusOr<int64_t> GgufIntIn(const GgufFile& f, std::string_view key, int64_t lo, int64_t hi,
                                  absl::string_view why = "") {
  ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", std::string(key), " = ", v,
                                                   ": must be in ", Range(lo, hi), why));
  }
  return v;
}

absl::StatusOr<double> GgufFiniteFloat(const GgufFile& f, std::string_view key) {
  ASSIGN_OR_RETURN(double v, f.GetFloat(key));
  if (!std::isfinite(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": ", std::string(key), " = ", v, ": must be finite"));
  }
  return v;
}

// ValidateModelConfig's error, prefixed with the file it came from.
absl::Status InFile(const std::string& path, absl::Status s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

}  // namespace

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
  ASSIGN_OR_RETURN(c.hidden_size, GgufIntIn(f, "llama.embedding_length", 1, kMaxHiddenSize));
  ASSIGN_OR_RETURN(c.intermediate_size,
                   GgufIntIn(f, "llama.feed_forward_length", 1, kMaxIntermediateSize));
  ASSIGN_OR_RETURN(const int64_t layers, GgufIntIn(f, "llama.block_count", 1, kMaxLayers));
  ASSIGN_OR_RETURN(const int64_t heads, GgufIntIn(f, "llama.attention.head_count", 1, kMaxHeads));
  int64_t kv_heads = heads;
  if (f.Has("llama.attention.head_count_kv")) {
    ASSIGN_OR_RETURN(kv_heads, GgufIntIn(f, "llama.attention.head_count_kv", 1, heads));
  }
  c.num_layers = static_cast<int>(layers);
  c.num_heads = static_cast<int>(heads);
  c.num_kv_heads = static_cast<int>(kv_heads);
  if (f.Has("llama.attention.key_length")) {
    ASSIGN_OR_RETURN(int64_t kl, GgufIntIn(f, "llama.attention.key_length", 2, kMaxHeadDim));
    c.head_dim = static_cast<int>(kl);
  } else if (c.hidden_size % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.path(), ": llama.embedding_length = ", c.hidden_size,
        ": must be a multiple of llama.attention.head_count (", heads,
        ") when llama.attention.key_length is absent"));
  } else {
    c.head_dim = static_cast<int>(c.hidden_size / heads);  // <= kMaxHiddenSize: fits
  }
  c.rope.head_dim = c.head_dim;
  if (f.Has("llama.rope.dimension_count")) {
    ASSIGN_OR_RETURN(int64_t rd, GgufIntIn(f, "llama.rope.dimension_count", 2, kMaxHeadDim));
    c.rope.head_dim = static_cast<int>(rd);
  }
  if (f.Has("llama.rope.freq_base")) {
    ASSIGN_OR_RETURN(c.rope.theta, GgufFiniteFloat(f, "llama.rope.freq_base"));
  }
  if (f.Has("llama.rope.scaling.type")) {
    ASSIGN_OR_RETURN(std::string type, f.GetString("llama.rope.scaling.type"));
    if (type != "none") {
      return absl::UnimplementedError(absl::StrCat(
          f.path(), ": llama.rope.scaling.type = \"", type,
          "\" is not supported (Llama-3 scaling comes as the rope_freqs.weight tensor)"));
    }
  }
  {
    constexpr std::string_view kEps = "llama.attention.layer_norm_rms_epsilon";
    ASSIGN_OR_RETURN(const double eps, f.GetFloat(kEps));
    // Checked in double: a value that is finite there may still overflow the float it becomes.
    if (!(eps > 0) || !std::isfinite(static_cast<float>(eps))) {
      return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", std::string(kEps), " = ",
                                                     eps, ": must be finite and positive"));
    }
    c.rms_norm_eps = static_cast<float>(eps);
  }
  ASSIGN_OR_RETURN(c.max_positions, GgufIntIn(f, "llama.context_length", kMinContextLength,
                                              kMaxContextLength, kContextWhy));
  if (f.Has("llama.vocab_size")) {
    ASSIGN_OR_RETURN(c.vocab_size, GgufIntIn(f, "llama.vocab_size", 1, kMaxVocabSize));
  } else {
    ASSIGN_OR_RETURN(const GgufTensorInfo* embd, f.FindTensor("token_embd.weight"));
    c.vocab_size = embd->dims.size() == 2 ? embd->dims[1] : 0;
    if (c.vocab_size < 1 || c.vocab_size > kMaxVocabSize) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": vocabulary size ", c.vocab_size,
          " (from tensor token_embd.weight, llama.vocab_size being absent): must be in ",
          Range(1, kMaxVocabSize)));
    }
  }
  c.tie_word_embeddings = !f.FindTensor("output.weight").ok();
  RETURN_IF_ERROR(InFile(f.path(), ValidateModelConfig(c)));
  return c;
}

namespace {

using nlohmann::json;

// A JSON value for an error message: scalars as written (cut at 64 bytes; invalid UTF-8
// replaced rather than thrown on), containers by kind only (dumping one is recursive and could be
// huge).
std::string Shown(const json& v) {
  if (v.is_structured()) return v.is_array() ? "an array" : "an object";
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 64) s = s.substr(0, 64) + "...";
  return s;
}

// The checked readers of config.json keys. `where` names the key in messages ("rope_scaling." for
// nested objects); absent or null keys leave `*out` as it is unless `required`.
struct JsonKeys {
  const std::string& path;
  const json& j;
  std::string where;

  const json* Find(const char* key, bool required, absl::Status* status) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required) {
        *status = absl::InvalidArgumentError(
            absl::StrCat(path, ": missing \"", where, key, "\""));
      }
      return nullptr;
    }
    return &*it;
  }

  absl::Status Bad(const char* key, const json& v, absl::string_view why) const {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"", where, key, "\" = ", Shown(v), ": ", why));
  }

  // An integer in [lo, hi]; an integral float (4096.0) is accepted, anything else is refused
  // before it is converted (a float past int64 would be undefined behaviour to cast).
  template <typename T>
  absl::Status Int(const char* key, T* out, int64_t lo, int64_t hi, bool required,
                   absl::string_view why = "") const {
    absl::Status status;
    const json* v = Find(key, required, &status);
    if (v == nullptr) return status;
    const std::string range = absl::StrCat("must be an integer in ", Range(lo, hi), why);
    int64_t x = 0;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(hi)) return Bad(key, *v, range);
      x = static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else if (v->is_number_float()) {
      const double d = v->get<double>();
      if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi)) || d != std::floor(d)) {
        return Bad(key, *v, range);
      }
      x = static_cast<int64_t>(d);
    } else {
      return Bad(key, *v, range);
    }
    if (x < lo || x > hi) return Bad(key, *v, range);
    *out = static_cast<T>(x);
    return absl::OkStatus();
  }

  absl::Status Finite(const char* key, double* out, bool required) const {
    absl::Status status;
    const json* v = Find(key, required, &status);
    if (v == nullptr) return status;
    if (!v->is_number()) return Bad(key, *v, "must be a number");
    const double d = v->get<double>();
    if (!std::isfinite(d)) return Bad(key, *v, "must be finite");
    *out = d;
    return absl::OkStatus();
  }

  absl::Status Bool(const char* key, bool* out) const {
    absl::Status status;
    const json* v = Find(key, false, &status);
    if (v == nullptr) return status;
    if (!v->is_boolean()) return Bad(key, *v, "must be a boolean");
    *out = v->get<bool>();
    return absl::OkStatus();
  }
};

absl::StatusOr<ModelConfig> ParseHfConfig(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text,
                   ReadBoundedFile(path, kMaxConfigJsonBytes, "a model config"));
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  ModelConfig c;
  const JsonKeys keys{path, j, ""};
  std::string model_type;
  if (auto t = j.find("model_type"); t != j.end() && t->is_string()) {
    model_type = t->get<std::string>();
  }
  if (auto a = j.find("architectures"); a != j.end() && a->is_array() && !a->empty() &&
                                        (*a)[0].is_string()) {
    c.architecture = (*a)[0].get<std::string>();
  }
  if (model_type != "llama" && model_type != "mistral") {
    return absl::UnimplementedError(absl::StrCat(
        path, ": model_type = \"", model_type, "\" is not supported (llama or mistral)"));
  }
  if (auto n = j.find("_name_or_path"); n != j.end() && n->is_string()) {
    c.name = n->get<std::string>();
  }
  RETURN_IF_ERROR(keys.Int("vocab_size", &c.vocab_size, 1, kMaxVocabSize, true));
  RETURN_IF_ERROR(keys.Int("hidden_size", &c.hidden_size, 1, kMaxHiddenSize, true));
  RETURN_IF_ERROR(
      keys.Int("intermediate_size", &c.intermediate_size, 1, kMaxIntermediateSize, true));
  RETURN_IF_ERROR(keys.Int("num_hidden_layers", &c.num_layers, 1, kMaxLayers, true));
  RETURN_IF_ERROR(keys.Int("num_attention_heads", &c.num_heads, 1, kMaxHeads, true));
  c.num_kv_heads = c.num_heads;
  RETURN_IF_ERROR(keys.Int("num_key_value_heads", &c.num_kv_heads, 1, c.num_heads, false));
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    RETURN_IF_ERROR(keys.Int("head_dim", &c.head_dim, 2, kMaxHeadDim, false));
  } else if (c.hidden_size % c.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": \"hidden_size\" = ", c.hidden_size, ": must be a multiple of ",
        "\"num_attention_heads\" (", c.num_heads, ") when \"head_dim\" is absent"));
  } else {
    c.head_dim = static_cast<int>(c.hidden_size / c.num_heads);
  }
  c.rope.head_dim = c.head_dim;
  double eps = 1e-6;
  RETURN_IF_ERROR(keys.Finite("rms_norm_eps", &eps, false));
  if (!(eps > 0) || !std::isfinite(static_cast<float>(eps))) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": \"rms_norm_eps\" = ", eps,
                                                   ": must be finite and positive"));
  }
  c.rms_norm_eps = static_cast<float>(eps);
  RETURN_IF_ERROR(keys.Finite("rope_theta", &c.rope.theta, false));
  c.max_positions = 2048;
  RETURN_IF_ERROR(keys.Int("max_position_embeddings", &c.max_positions, kMinContextLength,
                           kMaxContextLength, false, kContextWhy));
  RETURN_IF_ERROR(keys.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  int64_t sliding_window = 0;
  RETURN_IF_ERROR(keys.Int("sliding_window", &sliding_window, kMinContextLength,
                           std::numeric_limits<int64_t>::max(), false, kSlidingWindowWhy));
  if (sliding_window > 0 && sliding_window < c.max_positions) {
    // Mistral-7B-v0.1 attends within a 4,096-token window; we serve it only up to that length,
    // where windowed and full attention are the same function.
    c.max_positions = sliding_window;
  }
  // transformers 5 writes theta and scaling together as `rope_parameters` (and no longer
  // rope_theta / rope_scaling); older files have the two separate keys.
  const char* scaling_key = "rope_scaling";
  if (auto rp = j.find("rope_parameters"); rp != j.end() && rp->is_object()) {
    RETURN_IF_ERROR(
        (JsonKeys{path, *rp, "rope_parameters."}.Finite("rope_theta", &c.rope.theta, false)));
    scaling_key = "rope_parameters";
  }
  if (auto rs = j.find(scaling_key); rs != j.end() && !rs->is_null()) {
    if (!rs->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", scaling_key, " must be an object"));
    }
    std::string type;
    for (const char* key : {"type", "rope_type"}) {
      if (auto t = rs->find(key); t != rs->end() && t->is_string()) type = t->get<std::string>();
    }
    if (type == "llama3") {
      const JsonKeys sk{path, *rs, absl::StrCat(scaling_key, ".")};
      RopeScaling& s = c.rope.scaling;
      s.type = RopeScaling::Type::kLlama3;
      RETURN_IF_ERROR(sk.Finite("factor", &s.factor, true));
      RETURN_IF_ERROR(sk.Finite("low_freq_factor", &s.low_freq_factor, true));
      RETURN_IF_ERROR(sk.Finite("high_freq_factor", &s.high_freq_factor, true));
      RETURN_IF_ERROR(
          sk.Finite("original_max_position_embeddings", &s.original_max_positions, true));
    } else if (type != "default") {
      return absl::UnimplementedError(absl::StrCat(
          path, ": ", scaling_key, ".rope_type = \"", type,
          "\" is not supported (llama3 or default)"));
    }
  }
  RETURN_IF_ERROR(InFile(path, ValidateModelConfig(c)));
  return c;
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromHfJson(const std::string& path) {
  // Every access above checks the type first; this is the last resort that keeps a type error
  // nlohmann would throw from escaping as an abort.
  try {
    return ParseHfConfig(path);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed config: ", e.what()));
  }
}

}  // namespace lazyattn
