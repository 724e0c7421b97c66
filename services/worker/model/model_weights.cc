#include "services/worker/model/model_weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/safetensors_file.h"

namespace lazyattn {
namespace {

namespace fs = std::filesystem;

// Reads a named tensor of a known row-major shape into fp32, whatever the file format.
using TensorReader =
    std::function<absl::Status(const std::string& name, std::vector<int64_t> shape, float* dst)>;

std::string ShapeString(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

absl::Status CheckShape(const std::string& file, const std::string& name,
                        const std::vector<int64_t>& expected, const std::vector<int64_t>& actual) {
  if (expected == actual) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", name, " has shape ",
                                                 ShapeString(actual), ", expected ",
                                                 ShapeString(expected)));
}

// Reads everything through `read` with the tensor names of one format.
struct TensorNames {
  std::string embedding, output_norm, lm_head;
  std::function<std::string(int layer, std::string_view part)> layer;
};

absl::Status AssembleWeights(ModelWeights& w, const TensorNames& names, const TensorReader& read,
                             bool gguf_rope_layout) {
  const ModelConfig& c = w.config;
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_size(), KV = c.kv_size();
  w.token_embedding.resize(c.vocab_size * H);
  RETURN_IF_ERROR(read(names.embedding, {c.vocab_size, H}, w.token_embedding.data()));
  w.output_norm.resize(H);
  RETURN_IF_ERROR(read(names.output_norm, {H}, w.output_norm.data()));
  if (!c.tie_word_embeddings) {
    w.lm_head.resize(c.vocab_size * H);
    RETURN_IF_ERROR(read(names.lm_head, {c.vocab_size, H}, w.lm_head.data()));
  }
  w.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = w.layers[l];
    auto n = [&](std::string_view part) { return names.layer(l, part); };
    L.attn_norm.resize(H);
    RETURN_IF_ERROR(read(n("attn_norm"), {H}, L.attn_norm.data()));
    L.wqkv.resize((Q + 2 * KV) * H);
    RETURN_IF_ERROR(read(n("q"), {Q, H}, L.wqkv.data()));
    RETURN_IF_ERROR(read(n("k"), {KV, H}, L.wqkv.data() + Q * H));
    RETURN_IF_ERROR(read(n("v"), {KV, H}, L.wqkv.data() + (Q + KV) * H));
    if (gguf_rope_layout) {
      UnpermuteGgufRopeRows(L.wqkv.data(), c.num_heads, c.head_dim, H);
      UnpermuteGgufRopeRows(L.wqkv.data() + Q * H, c.num_kv_heads, c.head_dim, H);
    }
    L.wo.resize(H * Q);
    RETURN_IF_ERROR(read(n("o"), {H, Q}, L.wo.data()));
    L.ffn_norm.resize(H);
    RETURN_IF_ERROR(read(n("ffn_norm"), {H}, L.ffn_norm.data()));
    L.w_gate_up.resize(2 * I * H);
    RETURN_IF_ERROR(read(n("gate"), {I, H}, L.w_gate_up.data()));
    RETURN_IF_ERROR(read(n("up"), {I, H}, L.w_gate_up.data() + I * H));
    L.w_down.resize(H * I);
    RETURN_IF_ERROR(read(n("down"), {H, I}, L.w_down.data()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadGguf(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  auto w = std::make_unique<ModelWeights>();
  ASSIGN_OR_RETURN(w->config, ModelConfigFromGguf(*file));
  TensorReader read = [&](const std::string& name, std::vector<int64_t> shape,
                          float* dst) -> absl::Status {
    ASSIGN_OR_RETURN(const GgufTensorInfo* t, file->FindTensor(name));
    std::vector<int64_t> row_major(t->dims.rbegin(), t->dims.rend());
    RETURN_IF_ERROR(CheckShape(path, name, shape, row_major));
    absl::Status s = DequantizeToF32(t->type, t->data, t->num_elements, dst);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": tensor ", name, ": ", s.message()));
    return absl::OkStatus();
  };
  static const std::map<std::string_view, std::string> kParts = {
      {"attn_norm", "attn_norm"}, {"q", "attn_q"},     {"k", "attn_k"},
      {"v", "attn_v"},            {"o", "attn_output"}, {"ffn_norm", "ffn_norm"},
      {"gate", "ffn_gate"},       {"up", "ffn_up"},     {"down", "ffn_down"}};
  TensorNames names{.embedding = "token_embd.weight",
                    .output_norm = "output_norm.weight",
                    .lm_head = "output.weight",
                    .layer = [](int l, std::string_view part) {
                      return absl::StrCat("blk.", l, ".", kParts.at(part), ".weight");
                    }};
  RETURN_IF_ERROR(AssembleWeights(*w, names, read, /*gguf_rope_layout=*/true));
  // Llama-3 rope scaling travels as per-frequency divisors.
  if (auto freqs = file->FindTensor("rope_freqs.weight"); freqs.ok()) {
    std::vector<float> factors(w->config.head_dim / 2);
    RETURN_IF_ERROR(read("rope_freqs.weight", {w->config.head_dim / 2}, factors.data()));
    w->config.rope.freq_factors.assign(factors.begin(), factors.end());
  }
  return w;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadHf(const std::string& path) {
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  auto w = std::make_unique<ModelWeights>();
  ASSIGN_OR_RETURN(w->config, ModelConfigFromHfJson((dir / "config.json").string()));
  std::vector<std::string> shards;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") shards.push_back(entry.path().string());
  }
  std::sort(shards.begin(), shards.end());
  if (shards.empty()) {
    return absl::NotFoundError(absl::StrCat(dir.string(), ": no *.safetensors files"));
  }
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  for (const auto& s : shards) {
    ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(s));
    files.push_back(std::move(f));
  }
  TensorReader read = [&](const std::string& name, std::vector<int64_t> shape,
                          float* dst) -> absl::Status {
    for (const auto& f : files) {
      auto t = f->FindTensor(name);
      if (!t.ok()) continue;
      RETURN_IF_ERROR(CheckShape(f->path(), name, shape, (*t)->shape));
      return f->ReadAsF32(**t, dst);
    }
    return absl::NotFoundError(absl::StrCat(dir.string(), ": tensor ", name, " not found in ",
                                            absl::StrJoin(shards, ", ")));
  };
  static const std::map<std::string_view, std::string> kParts = {
      {"attn_norm", "input_layernorm"},   {"q", "self_attn.q_proj"},
      {"k", "self_attn.k_proj"},          {"v", "self_attn.v_proj"},
      {"o", "self_attn.o_proj"},          {"ffn_norm", "post_attention_layernorm"},
      {"gate", "mlp.gate_proj"},          {"up", "mlp.up_proj"},
      {"down", "mlp.down_proj"}};
  TensorNames names{.embedding = "model.embed_tokens.weight",
                    .output_norm = "model.norm.weight",
                    .lm_head = "lm_head.weight",
                    .layer = [](int l, std::string_view part) {
                      return absl::StrCat("model.layers.", l, ".", kParts.at(part), ".weight");
                    }};
  RETURN_IF_ERROR(AssembleWeights(*w, names, read, /*gguf_rope_layout=*/false));
  return w;
}

}  // namespace

void UnpermuteGgufRopeRows(float* rows, int n_heads, int head_dim, int64_t cols) {
  // llama.cpp's converter reshapes each head's rows as [2][head_dim/2] and swaps the axes, so GGUF
  // row 2i + j holds HF row j * head_dim/2 + i. Undo that, head by head.
  const int half = head_dim / 2;
  std::vector<float> head(int64_t{head_dim} * cols);
  for (int h = 0; h < n_heads; ++h) {
    float* base = rows + int64_t{h} * head_dim * cols;
    for (int i = 0; i < half; ++i) {
      for (int j = 0; j < 2; ++j) {
        std::memcpy(&head[(int64_t{j} * half + i) * cols], base + (int64_t{2} * i + j) * cols,
                    cols * sizeof(float));
      }
    }
    std::memcpy(base, head.data(), head.size() * sizeof(float));
  }
}

absl::StatusOr<ModelFormat> DetectModelFormat(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "config.json")) return ModelFormat::kHfSafetensors;
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": directory without config.json (expected an HF model directory)"));
  }
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat("model not found: ", path));
  if (absl::EndsWith(path, ".gguf")) return ModelFormat::kGguf;
  if (fs::path(path).filename() == "config.json") return ModelFormat::kHfSafetensors;
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": unknown model format (expected a .gguf file or an HF directory with config.json)"));
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::string& path) {
  ASSIGN_OR_RETURN(ModelFormat format, DetectModelFormat(path));
  return format == ModelFormat::kGguf ? LoadGguf(path) : LoadHf(path);
}

}  // namespace lazyattn
