#include "services/worker/cuda/cuda_model_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "services/worker/cuda/gguf_dequantize.h"
#include "services/worker/cuda/weight_fill.h"
#include "services/worker/model/ggml_type.h"
#include "services/worker/model/gguf_file.h"

namespace lazyattn {
namespace {

constexpr int64_t kAlignElements = 128;  // 256 bytes: what cuBLASLt and 16-byte loads want

int64_t AlignUp(int64_t n) { return (n + kAlignElements - 1) / kAlignElements * kAlignElements; }

// A weight finite in fp32 whose bf16 rounding is not (FirstNonFiniteAsBf16): refused as the
// loaders refuse NaN and Inf, since one Inf weight makes every logit NaN.
absl::Status Bf16OverflowError(absl::string_view tensor, int64_t index, float value) {
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor ", tensor, " has a value at element ", index, " (", value,
      ") that is not finite in bfloat16, which this backend keeps weights in (largest 3.3895e38)"));
}

// Every tensor of the model in allocation order, as (pointer slot, element count).
struct TensorSlot {
  __nv_bfloat16** ptr;
  int64_t elements;
};

}  // namespace

CudaModelWeights::~CudaModelWeights() {
  if (memory_ != nullptr) cudaFree(memory_);
}

absl::StatusOr<std::unique_ptr<CudaModelWeights>> CudaModelWeights::Allocate(
    const ModelConfig& c) {
  RETURN_IF_ERROR(ValidateModelConfig(c));
  auto w = std::unique_ptr<CudaModelWeights>(new CudaModelWeights());
  w->config_ = c;
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_size(), KV = c.kv_size();
  std::vector<__nv_bfloat16*> layer_ptrs(6 * static_cast<size_t>(c.num_layers));
  std::vector<TensorSlot> slots = {{&w->token_embedding_, c.vocab_size * H},
                                   {&w->output_norm_, H}};
  if (!c.tie_word_embeddings) slots.push_back({&w->lm_head_, c.vocab_size * H});
  for (int l = 0; l < c.num_layers; ++l) {
    __nv_bfloat16** p = &layer_ptrs[6 * static_cast<size_t>(l)];
    slots.insert(slots.end(), {{p + 0, H}, {p + 1, (Q + 2 * KV) * H}, {p + 2, H * Q},
                               {p + 3, H}, {p + 4, 2 * I * H}, {p + 5, H * I}});
  }
  int64_t elements = 0;
  for (const TensorSlot& s : slots) elements += AlignUp(s.elements);
  w->bytes_ = elements * static_cast<int64_t>(sizeof(__nv_bfloat16));
  if (cudaMalloc(&w->memory_, w->bytes_) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    w->memory_ = nullptr;
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", w->bytes_ >> 20, " MiB of GPU memory for the weights of ", c.name));
  }
  auto* base = static_cast<__nv_bfloat16*>(w->memory_);
  int64_t at = 0;
  for (const TensorSlot& s : slots) {
    *s.ptr = base + at;
    at += AlignUp(s.elements);
  }
  if (c.tie_word_embeddings) w->lm_head_ = w->token_embedding_;
  w->layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    __nv_bfloat16** p = &layer_ptrs[6 * static_cast<size_t>(l)];
    w->layers_[l] = {p[0], p[1], p[2], p[3], p[4], p[5]};
  }
  return w;
}

absl::StatusOr<std::unique_ptr<CudaModelWeights>> CudaModelWeights::Upload(
    const ModelWeights& host) {
  ASSIGN_OR_RETURN(auto w, Allocate(host.config));
  // fp32 goes up in slices through one device staging buffer and is rounded on the GPU.
  constexpr int64_t kStageElements = int64_t{16} << 20;
  float* stage = nullptr;
  RETURN_IF_CUDA_ERROR(cudaMalloc(reinterpret_cast<void**>(&stage), kStageElements * sizeof(float)));
  auto upload = [&](const std::vector<float>& src, const __nv_bfloat16* dst,
                    absl::string_view name) -> absl::Status {
    for (int64_t at = 0; at < static_cast<int64_t>(src.size()); at += kStageElements) {
      const int64_t n = std::min<int64_t>(kStageElements, static_cast<int64_t>(src.size()) - at);
      if (const int64_t i = FirstNonFiniteAsBf16(src.data() + at, n); i >= 0) {
        return Bf16OverflowError(name, at + i, src[at + i]);
      }
      RETURN_IF_CUDA_ERROR(cudaMemcpy(stage, src.data() + at, n * sizeof(float),
                                      cudaMemcpyHostToDevice));
      RETURN_IF_ERROR(ConvertF32ToBf16(stage, n, const_cast<__nv_bfloat16*>(dst) + at, nullptr));
    }
    return absl::OkStatus();
  };
  absl::Status status = [&]() -> absl::Status {
    RETURN_IF_ERROR(upload(host.token_embedding, w->token_embedding_, "token_embedding"));
    RETURN_IF_ERROR(upload(host.output_norm, w->output_norm_, "output_norm"));
    if (!host.config.tie_word_embeddings) {
      RETURN_IF_ERROR(upload(host.lm_head, w->lm_head_, "lm_head"));
    }
    for (int l = 0; l < host.config.num_layers; ++l) {
      const LayerWeights& L = host.layers[l];
      const CudaLayerWeights& D = w->layers_[l];
      const std::string layer = absl::StrCat("layers.", l, ".");
      RETURN_IF_ERROR(upload(L.attn_norm, D.attn_norm, layer + "attn_norm"));
      RETURN_IF_ERROR(upload(L.wqkv, D.wqkv, layer + "wqkv"));
      RETURN_IF_ERROR(upload(L.wo, D.wo, layer + "wo"));
      RETURN_IF_ERROR(upload(L.ffn_norm, D.ffn_norm, layer + "ffn_norm"));
      RETURN_IF_ERROR(upload(L.w_gate_up, D.w_gate_up, layer + "w_gate_up"));
      RETURN_IF_ERROR(upload(L.w_down, D.w_down, layer + "w_down"));
    }
    RETURN_IF_CUDA_ERROR(cudaDeviceSynchronize());
    return absl::OkStatus();
  }();
  cudaFree(stage);
  if (!status.ok()) return status;
  return w;
}

absl::StatusOr<std::unique_ptr<CudaModelWeights>> CudaModelWeights::LoadGguf(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  ASSIGN_OR_RETURN(const ModelConfig config, GgufModelConfig(*file));
  const std::vector<WeightPlacement> placements = GgufWeightPlacements(config);
  // Every tensor checked before any upload, and the staging buffer sized to the largest.
  std::vector<const GgufTensorInfo*> tensors;
  size_t staging_bytes = 0;
  for (const WeightPlacement& p : placements) {
    ASSIGN_OR_RETURN(const GgufTensorInfo* t, file->FindTensor(p.name));
    const std::vector<int64_t> row_major(t->dims.rbegin(), t->dims.rend());
    if (row_major != p.shape) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", p.name, " has shape [",
                                                     absl::StrJoin(row_major, ", "),
                                                     "], expected [",
                                                     absl::StrJoin(p.shape, ", "), "]"));
    }
    if (!GgmlIsDequantizable(t->type)) {
      return absl::UnimplementedError(absl::StrCat(path, ": tensor ", p.name,
                                                   ": dequantizing ggml type ",
                                                   std::string(GgmlTypeName(t->type)),
                                                   " is not supported"));
    }
    ASSIGN_OR_RETURN(const size_t bytes, GgmlRowBytes(t->type, t->num_elements));
    // As the host loader refuses them (model_weights.h): one NaN or Inf weight makes every
    // logit NaN, and every request would end at once with no tokens.
    if (const std::optional<NonFiniteElement> bad =
            FindNonFinite(t->type, t->data, t->num_elements)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", p.name, " has a non-finite value at element ", bad->index, " (",
          std::isnan(bad->value) ? "nan"
          : bad->value > 0       ? "inf"
                                 : "-inf",
          "); model weights must be finite"));
    }
    // Of the types this path converts, only fp32 reaches past bf16's range (the block types'
    // values are fp16 scales times small integers).
    if (t->type == GgmlType::kF32) {
      if (const int64_t i = FirstNonFiniteAsBf16(t->data, t->num_elements); i >= 0) {
        float value;
        std::memcpy(&value, static_cast<const uint8_t*>(t->data) + 4 * i, sizeof(value));
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": ", Bf16OverflowError(p.name, i, value).message()));
      }
    }
    staging_bytes = std::max(staging_bytes, bytes);
    tensors.push_back(t);
  }
  ASSIGN_OR_RETURN(auto w, Allocate(config));
  void* staging = nullptr;
  RETURN_IF_CUDA_ERROR(cudaMalloc(&staging, std::max<size_t>(staging_bytes, 16)));
  absl::Status status = [&]() -> absl::Status {
    for (size_t i = 0; i < placements.size(); ++i) {
      const WeightPlacement& p = placements[i];
      const GgufTensorInfo& t = *tensors[i];
      ASSIGN_OR_RETURN(const size_t bytes, GgmlRowBytes(t.type, t.num_elements));
      // Synchronous on the legacy stream: the previous tensor's kernel has read the staging
      // buffer before it is overwritten.
      RETURN_IF_CUDA_ERROR(cudaMemcpy(staging, t.data, bytes, cudaMemcpyHostToDevice));
      const int64_t cols = p.shape.back(), rows = t.num_elements / cols;
      absl::Status s = DequantizeGgufToBf16(static_cast<uint32_t>(t.type), staging, rows, cols,
                                            p.rope_heads > 0 ? config.head_dim : 0,
                                            w->Slot(p.slot, p.layer) + p.offset, nullptr);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat(path, ": tensor ", p.name, ": ", s.message()));
      }
    }
    RETURN_IF_CUDA_ERROR(cudaDeviceSynchronize());
    return absl::OkStatus();
  }();
  cudaFree(staging);
  if (!status.ok()) return status;
  return w;
}

__nv_bfloat16* CudaModelWeights::Slot(WeightSlot slot, int layer) {
  auto mut = [](const __nv_bfloat16* p) { return const_cast<__nv_bfloat16*>(p); };
  switch (slot) {
    case WeightSlot::kTokenEmbedding: return token_embedding_;
    case WeightSlot::kOutputNorm: return output_norm_;
    case WeightSlot::kLmHead: return lm_head_;
    case WeightSlot::kAttnNorm: return mut(layers_[layer].attn_norm);
    case WeightSlot::kWqkv: return mut(layers_[layer].wqkv);
    case WeightSlot::kWo: return mut(layers_[layer].wo);
    case WeightSlot::kFfnNorm: return mut(layers_[layer].ffn_norm);
    case WeightSlot::kGateUp: return mut(layers_[layer].w_gate_up);
    case WeightSlot::kDown: return mut(layers_[layer].w_down);
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<CudaModelWeights>> CudaModelWeights::Random(const ModelConfig& c,
                                                                          uint64_t seed,
                                                                          float stddev) {
  ASSIGN_OR_RETURN(auto w, Allocate(c));
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_size(), KV = c.kv_size();
  uint64_t stream_id = 0;
  auto fill = [&](const __nv_bfloat16* p, int64_t n, float mean, float sd) {
    return FillNormalBf16(const_cast<__nv_bfloat16*>(p), n, seed, stream_id++, mean, sd, nullptr);
  };
  RETURN_IF_ERROR(fill(w->token_embedding_, c.vocab_size * H, 0, stddev));
  RETURN_IF_ERROR(fill(w->output_norm_, H, 1, 0.1f));
  if (!c.tie_word_embeddings) RETURN_IF_ERROR(fill(w->lm_head_, c.vocab_size * H, 0, stddev));
  for (const CudaLayerWeights& D : w->layers_) {
    RETURN_IF_ERROR(fill(D.attn_norm, H, 1, 0.1f));
    RETURN_IF_ERROR(fill(D.wqkv, (Q + 2 * KV) * H, 0, stddev));
    RETURN_IF_ERROR(fill(D.wo, H * Q, 0, stddev));
    RETURN_IF_ERROR(fill(D.ffn_norm, H, 1, 0.1f));
    RETURN_IF_ERROR(fill(D.w_gate_up, 2 * I * H, 0, stddev));
    RETURN_IF_ERROR(fill(D.w_down, H * I, 0, stddev));
  }
  RETURN_IF_CUDA_ERROR(cudaDeviceSynchronize());
  return w;
}

}  // namespace lazyattn
