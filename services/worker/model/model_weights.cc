#include "services/worker/model/model_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/safetensors_file.h"
#include "services/worker/model/safetensors_shards.h"

namespace lazyattn {
namespace {

namespace fs = std::filesystem;

// A tensor as a file stores it: its bytes in ggml's encoding of `type` (safetensors' F32, F16 and
// BF16 are those of ggml), inside the mapping of `file`.
struct StoredTensor {
  const std::string* file;
  GgmlType type;
  const uint8_t* data;
  int64_t num_elements;
};

// One file format's tensors: `check` verifies that a named tensor exists with this row-major
// shape and a type the loader converts, touching no tensor data and allocating nothing sized by
// the file; `locate` finds a checked tensor's bytes.
struct TensorSource {
  std::function<absl::Status(const std::string& name, const std::vector<int64_t>& shape)> check;
  std::function<absl::StatusOr<StoredTensor>(const std::string& name)> locate;
};

absl::string_view NonFiniteName(float v) {
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

// Elements checked and then converted at a time: a multiple of every ggml block (256 for the K
// quants), and small enough (128 KiB of F32) that the conversion reads the bytes the check has just
// brought into cache. So refusing NaN and Inf costs no second pass over the weights in memory:
// the check rides on the one pass that copies or dequantizes them anyway.
constexpr int64_t kConvertChunk = 32768;

// Calls `convert(first_element, count, bytes, num_bytes)` over consecutive chunks of `t`, each
// once FindNonFinite has cleared it. A NaN or Inf weight would make every logit NaN (and every
// request end at once with no tokens), so it is InvalidArgument naming the file, the tensor and
// the first bad element (its index in the file's order) with its value.
absl::Status ConvertFinite(
    const std::string& name, const StoredTensor& t,
    const std::function<absl::Status(int64_t, int64_t, const uint8_t*, size_t)>& convert) {
  ASSIGN_OR_RETURN(const GgmlBlockLayout layout, GgmlLayout(t.type));
  for (int64_t begin = 0; begin < t.num_elements; begin += kConvertChunk) {
    const int64_t count = std::min(kConvertChunk, t.num_elements - begin);
    const uint8_t* src = t.data + begin / layout.block_elements * layout.block_bytes;
    if (const std::optional<NonFiniteElement> bad = FindNonFinite(t.type, src, count)) {
      return absl::InvalidArgumentError(absl::StrCat(
          *t.file, ": tensor ", name, " has a non-finite value at element ", begin + bad->index,
          " (", NonFiniteName(bad->value), "); model weights must be finite"));
    }
    RETURN_IF_ERROR(convert(begin, count, src, count / layout.block_elements * layout.block_bytes));
  }
  return absl::OkStatus();
}

// `t` in fp32 at `dst`.
absl::Status ReadF32(const std::string& name, const StoredTensor& t, float* dst) {
  return ConvertFinite(name, t, [&](int64_t begin, int64_t count, const uint8_t* src, size_t) {
    absl::Status s = DequantizeToF32(t.type, src, count, dst + begin);
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat(*t.file, ": tensor ", name, ": ", s.message()));
  });
}

std::optional<WeightType> KernelType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return WeightType::kF32;
    case GgmlType::kF16:
      return WeightType::kF16;
    case GgmlType::kBF16:
      return WeightType::kBF16;
    case GgmlType::kQ8_0:
      return WeightType::kQ8_0;
    case GgmlType::kQ4_0:
      return WeightType::kQ4_0;
    case GgmlType::kQ4_1:
      return WeightType::kQ4_1;
    default:
      return std::nullopt;
  }
}

// `t` into `part` in its stored type, or converted to fp32 when the kernels do not take it.
absl::Status ReadPacked(const std::string& name, const StoredTensor& t, PackedPart& part) {
  if (const std::optional<WeightType> type = KernelType(t.type)) {
    part.type = *type;
    ASSIGN_OR_RETURN(const size_t num_bytes, GgmlRowBytes(t.type, t.num_elements));
    part.bytes.clear();
    part.bytes.reserve(num_bytes);  // appended chunk by chunk: no zero fill before the copy
    return ConvertFinite(name, t, [&](int64_t, int64_t, const uint8_t* src, size_t n) {
      part.bytes.insert(part.bytes.end(), src, src + n);
      return absl::OkStatus();
    });
  }
  part.type = WeightType::kF32;
  part.bytes.resize(t.num_elements * sizeof(float));
  return ReadF32(name, t, reinterpret_cast<float*>(part.bytes.data()));
}

std::string ShapeString(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

absl::Status CheckShape(const std::string& file, const std::string& name,
                        const std::vector<int64_t>& expected, const std::vector<int64_t>& actual) {
  if (expected == actual) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", name, " has shape ",
                                                 ShapeString(actual), ", expected ",
                                                 ShapeString(expected)));
}

// The tensor names of one file format.
struct TensorNames {
  std::string embedding, output_norm, lm_head;
  std::function<std::string(int layer, std::string_view part)> layer;
};

// Every tensor of a Llama checkpoint and where it lands (fused QKV and gate|up matrices).
std::vector<WeightPlacement> Placements(const ModelConfig& c, const TensorNames& names,
                                        bool gguf_rope_layout) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_size(), KV = c.kv_size();
  std::vector<WeightPlacement> p = {
      {.name = names.embedding, .shape = {c.vocab_size, H}, .slot = WeightSlot::kTokenEmbedding},
      {.name = names.output_norm, .shape = {H}, .slot = WeightSlot::kOutputNorm}};
  if (!c.tie_word_embeddings) {
    p.push_back({.name = names.lm_head, .shape = {c.vocab_size, H}, .slot = WeightSlot::kLmHead});
  }
  for (int l = 0; l < c.num_layers; ++l) {
    auto add = [&](std::string_view part, std::vector<int64_t> shape, WeightSlot slot,
                   int64_t offset = 0, int rope_heads = 0) {
      p.push_back({.name = names.layer(l, part), .shape = std::move(shape), .slot = slot,
                   .layer = l, .offset = offset,
                   .rope_heads = gguf_rope_layout ? rope_heads : 0});
    };
    add("attn_norm", {H}, WeightSlot::kAttnNorm);
    add("q", {Q, H}, WeightSlot::kWqkv, 0, c.num_heads);
    add("k", {KV, H}, WeightSlot::kWqkv, Q * H, c.num_kv_heads);
    add("v", {KV, H}, WeightSlot::kWqkv, (Q + KV) * H);
    add("o", {H, Q}, WeightSlot::kWo);
    add("ffn_norm", {H}, WeightSlot::kFfnNorm);
    add("gate", {I, H}, WeightSlot::kGateUp);
    add("up", {I, H}, WeightSlot::kGateUp, I * H);
    add("down", {H, I}, WeightSlot::kDown);
  }
  return p;
}

// Checks every placed tensor first, so that nothing is allocated for a config the file does not
// back (a header that claims 2^31 embeddings over a 1 MB file fails here, not in operator new):
// once every tensor's shape matched and its bytes lie inside the file, apart from every other
// tensor's (the readers' Open checked both: CheckTensorsDisjoint), the fp32 copy is at most a
// small multiple of the file's size. Then reads each tensor into
// its slot.
// With `packed`, matrices keep their stored type; the parts of a fused matrix arrive in row order
// (Placements lists them so) and consecutive parts of one type merge into one run.
absl::Status AssembleWeights(ModelWeights& w, const std::vector<WeightPlacement>& placements,
                             const TensorSource& source, bool packed) {
  for (const WeightPlacement& p : placements) RETURN_IF_ERROR(source.check(p.name, p.shape));
  const ModelConfig& c = w.config;
  w.layers.resize(c.num_layers);
  for (const WeightPlacement& p : placements) {
    if (PackedMatrix* m = packed ? WeightSlotPacked(w, p.slot, p.layer) : nullptr) {
      const int64_t cols = p.shape.back(), rows = p.shape.front();
      m->cols = cols;
      if (p.offset != m->rows() * cols) {
        return absl::InternalError(absl::StrCat("tensor ", p.name, " placed out of row order"));
      }
      PackedPart part;
      ASSIGN_OR_RETURN(const StoredTensor t, source.locate(p.name));
      RETURN_IF_ERROR(ReadPacked(p.name, t, part));
      part.rows = rows;
      if (p.rope_heads > 0) {
        UnpermuteGgufRopeRowBytes(part.bytes.data(), p.rope_heads, c.head_dim,
                                  WeightTypeRowBytes(part.type, cols));
      }
      if (!m->parts.empty() && m->parts.back().type == part.type) {
        PackedPart& last = m->parts.back();
        last.bytes.insert(last.bytes.end(), part.bytes.begin(), part.bytes.end());
        last.rows += part.rows;
      } else {
        m->parts.push_back(std::move(part));
      }
      continue;
    }
    std::vector<float>& dst = WeightSlotVector(w, p.slot, p.layer);
    dst.resize(WeightSlotElements(c, p.slot));
    ASSIGN_OR_RETURN(const StoredTensor t, source.locate(p.name));
    RETURN_IF_ERROR(ReadF32(p.name, t, dst.data() + p.offset));
    if (p.rope_heads > 0) {
      UnpermuteGgufRopeRows(dst.data() + p.offset, p.rope_heads, c.head_dim, p.shape.back());
    }
  }
  return absl::OkStatus();
}

const TensorNames& GgufNames() {
  static const std::map<std::string_view, std::string> kParts = {
      {"attn_norm", "attn_norm"}, {"q", "attn_q"},     {"k", "attn_k"},
      {"v", "attn_v"},            {"o", "attn_output"}, {"ffn_norm", "ffn_norm"},
      {"gate", "ffn_gate"},       {"up", "ffn_up"},     {"down", "ffn_down"}};
  static const TensorNames names{.embedding = "token_embd.weight",
                                 .output_norm = "output_norm.weight",
                                 .lm_head = "output.weight",
                                 .layer = [](int l, std::string_view part) {
                                   return absl::StrCat("blk.", l, ".", kParts.at(part), ".weight");
                                 }};
  return names;
}

absl::Status CheckGgufTensor(const GgufFile& file, const std::string& name,
                             const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(const GgufTensorInfo* t, file.FindTensor(name));
  const std::vector<int64_t> row_major(t->dims.rbegin(), t->dims.rend());
  RETURN_IF_ERROR(CheckShape(file.path(), name, shape, row_major));
  if (!GgmlIsDequantizable(t->type)) {
    return absl::UnimplementedError(absl::StrCat(file.path(), ": tensor ", name,
                                                 ": dequantizing ggml type ",
                                                 std::string(GgmlTypeName(t->type)),
                                                 " is not supported"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadGguf(const std::string& path, bool packed) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  auto w = std::make_unique<ModelWeights>();
  ASSIGN_OR_RETURN(w->config, GgufModelConfig(*file));
  TensorSource source;
  source.check = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return CheckGgufTensor(*file, name, shape);
  };
  source.locate = [&](const std::string& name) -> absl::StatusOr<StoredTensor> {
    ASSIGN_OR_RETURN(const GgufTensorInfo* t, file->FindTensor(name));
    return StoredTensor{&path, t->type, t->data, t->num_elements};
  };
  RETURN_IF_ERROR(AssembleWeights(*w, GgufWeightPlacements(w->config), source, packed));
  return w;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadHf(const std::string& path, bool packed) {
  std::error_code ec;  // the throwing forms would end the worker on a directory it cannot list
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  auto w = std::make_unique<ModelWeights>();
  ASSIGN_OR_RETURN(w->config, ModelConfigFromHfJson((dir / "config.json").string()));
  ASSIGN_OR_RETURN(const std::unique_ptr<SafetensorsShards> shards,
                   SafetensorsShards::Open(dir.string()));
  TensorSource source;
  source.check = [&](const std::string& name, const std::vector<int64_t>& shape) -> absl::Status {
    ASSIGN_OR_RETURN(const SafetensorsShards::Found found, shards->Find(name));
    RETURN_IF_ERROR(CheckShape(found.file->path(), name, shape, found.tensor->shape));
    if (!found.tensor->supported) {
      return absl::UnimplementedError(absl::StrCat(found.file->path(), ": tensor '", name,
                                                   "' has dtype ", found.tensor->dtype_name,
                                                   "; only F32, F16 and BF16 are supported"));
    }
    return absl::OkStatus();
  };
  source.locate = [&](const std::string& name) -> absl::StatusOr<StoredTensor> {
    ASSIGN_OR_RETURN(const SafetensorsShards::Found found, shards->Find(name));
    const SafetensorsTensor& t = *found.tensor;
    GgmlType type = GgmlType::kF32;
    if (t.dtype == SafetensorsDtype::kF16) type = GgmlType::kF16;
    if (t.dtype == SafetensorsDtype::kBF16) type = GgmlType::kBF16;
    if (t.dtype != SafetensorsDtype::kF32 && type == GgmlType::kF32) {
      return absl::InternalError(absl::StrCat(found.file->path(), ": tensor ", name, ": dtype ",
                                              t.dtype_name, " read unchecked"));
    }
    return StoredTensor{&found.file->path(), type, t.data, t.num_elements};
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
  RETURN_IF_ERROR(AssembleWeights(*w, Placements(w->config, names, /*gguf_rope_layout=*/false),
                                  source, packed));
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

void UnpermuteGgufRopeRowBytes(uint8_t* rows, int n_heads, int head_dim, size_t row_bytes) {
  const int half = head_dim / 2;
  std::vector<uint8_t> head(head_dim * row_bytes);
  for (int h = 0; h < n_heads; ++h) {
    uint8_t* base = rows + size_t(h) * head_dim * row_bytes;
    for (int i = 0; i < half; ++i) {
      for (int j = 0; j < 2; ++j) {
        std::memcpy(&head[(size_t(j) * half + i) * row_bytes],
                    base + (size_t(2) * i + j) * row_bytes, row_bytes);
      }
    }
    std::memcpy(base, head.data(), head.size());
  }
}

int64_t PackedMatrix::rows() const {
  int64_t n = 0;
  for (const PackedPart& p : parts) n += p.rows;
  return n;
}

size_t PackedMatrix::bytes() const {
  size_t n = 0;
  for (const PackedPart& p : parts) n += p.bytes.size();
  return n;
}

void PackedMatrix::RowValues(int64_t row, float* dst) const {
  for (size_t i = 0; i < parts.size(); ++i) {
    if (row < parts[i].rows) {
      DequantizeRowsCpu(view(i), row, 1, dst);
      return;
    }
    row -= parts[i].rows;
  }
}

std::vector<float> PackedMatrix::Values(int64_t begin, int64_t end) const {
  std::vector<float> out;
  if (cols == 0 || end <= begin) return out;
  out.reserve(end - begin);
  std::vector<float> row(cols);
  for (int64_t r = begin / cols; r * cols < end; ++r) {
    RowValues(r, row.data());
    const int64_t lo = std::max(begin, r * cols), hi = std::min(end, (r + 1) * cols);
    out.insert(out.end(), row.begin() + (lo - r * cols), row.begin() + (hi - r * cols));
  }
  return out;
}

PackedMatrix* WeightSlotPacked(ModelWeights& w, WeightSlot slot, int layer) {
  switch (slot) {
    case WeightSlot::kTokenEmbedding: return &w.token_embedding_packed;
    case WeightSlot::kLmHead: return &w.lm_head_packed;
    case WeightSlot::kWqkv: return &w.layers[layer].wqkv_packed;
    case WeightSlot::kWo: return &w.layers[layer].wo_packed;
    case WeightSlot::kGateUp: return &w.layers[layer].w_gate_up_packed;
    case WeightSlot::kDown: return &w.layers[layer].w_down_packed;
    default: return nullptr;
  }
}

const PackedMatrix* WeightSlotPacked(const ModelWeights& w, WeightSlot slot, int layer) {
  return WeightSlotPacked(const_cast<ModelWeights&>(w), slot, layer);
}

std::vector<float>& WeightSlotVector(ModelWeights& w, WeightSlot slot, int layer) {
  switch (slot) {
    case WeightSlot::kTokenEmbedding: return w.token_embedding;
    case WeightSlot::kOutputNorm: return w.output_norm;
    case WeightSlot::kLmHead: return w.lm_head;
    case WeightSlot::kAttnNorm: return w.layers[layer].attn_norm;
    case WeightSlot::kWqkv: return w.layers[layer].wqkv;
    case WeightSlot::kWo: return w.layers[layer].wo;
    case WeightSlot::kFfnNorm: return w.layers[layer].ffn_norm;
    case WeightSlot::kGateUp: return w.layers[layer].w_gate_up;
    case WeightSlot::kDown: return w.layers[layer].w_down;
  }
  return w.token_embedding;  // unreachable
}

const std::vector<float>& WeightSlotVector(const ModelWeights& w, WeightSlot slot, int layer) {
  return WeightSlotVector(const_cast<ModelWeights&>(w), slot, layer);
}

int64_t WeightSlotElements(const ModelConfig& c, WeightSlot slot) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_size(), KV = c.kv_size();
  switch (slot) {
    case WeightSlot::kTokenEmbedding: return c.vocab_size * H;
    case WeightSlot::kOutputNorm: return H;
    case WeightSlot::kLmHead: return c.tie_word_embeddings ? 0 : c.vocab_size * H;
    case WeightSlot::kAttnNorm: return H;
    case WeightSlot::kWqkv: return (Q + 2 * KV) * H;
    case WeightSlot::kWo: return H * Q;
    case WeightSlot::kFfnNorm: return H;
    case WeightSlot::kGateUp: return 2 * I * H;
    case WeightSlot::kDown: return H * I;
  }
  return 0;
}

std::vector<WeightPlacement> GgufWeightPlacements(const ModelConfig& config) {
  return Placements(config, GgufNames(), /*gguf_rope_layout=*/true);
}

absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& file) {
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfigFromGguf(file));
  // Llama-3 rope scaling travels as per-frequency divisors.
  if (auto freqs = file.FindTensor("rope_freqs.weight"); freqs.ok()) {
    const GgufTensorInfo& t = **freqs;
    if (t.num_elements != config.head_dim / 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": tensor rope_freqs.weight has ", t.num_elements,
                       " values, expected ", config.head_dim / 2));
    }
    std::vector<float> factors(t.num_elements);
    absl::Status s = DequantizeToF32(t.type, t.data, t.num_elements, factors.data());
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(file.path(), ": tensor rope_freqs.weight: ",
                                                 s.message()));
    }
    config.rope.freq_factors.assign(factors.begin(), factors.end());
    // A zero or NaN divisor would put inf/NaN in every rotation: refuse the file instead.
    if (absl::Status v = ValidateModelConfig(config); !v.ok()) {
      return absl::Status(v.code(), absl::StrCat(file.path(), ": tensor rope_freqs.weight: ",
                                                 v.message()));
    }
  }
  return config;
}

absl::StatusOr<ModelFormat> DetectModelFormat(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  // fs::status tells a missing path (or a missing folder on the way) by file_type::not_found;
  // any other error is a path that cannot be looked at (a symbolic-link loop, a folder without
  // search permission, a name too long), which "not found" would misdescribe.
  if (status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat("model not found: ", path));
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot look at the model path: ", ec.message()));
  }
  if (fs::is_directory(status)) {
    if (fs::exists(fs::path(path) / "config.json", ec)) return ModelFormat::kHfSafetensors;
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": directory without config.json (expected an HF model directory)"));
  }
  if (absl::EndsWith(path, ".gguf")) return ModelFormat::kGguf;
  if (fs::path(path).filename() == "config.json") return ModelFormat::kHfSafetensors;
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": unknown model format (expected a .gguf file or an HF directory with config.json)"));
}

absl::Status CheckGgufWeights(const GgufFile& file, const ModelConfig& config) {
  for (const WeightPlacement& p : GgufWeightPlacements(config)) {
    RETURN_IF_ERROR(CheckGgufTensor(file, p.name, p.shape));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::string& path,
                                                               const WeightLoadOptions& options) {
  ASSIGN_OR_RETURN(ModelFormat format, DetectModelFormat(path));
  // Every size is bounded before it is allocated (model_config.h, AssembleWeights); this catch is
  // the last resort that keeps a worker alive if a model that passed every check still does not
  // fit in memory.
  try {
    return format == ModelFormat::kGguf ? LoadGguf(path, options.packed)
                                        : LoadHf(path, options.packed);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": out of host memory loading the weights"));
  } catch (const std::length_error&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": out of host memory loading the weights"));
  } catch (const fs::filesystem_error& e) {  // a file system that fails under the loader
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", e.what()));
  }
}

}  // namespace lazyattn
