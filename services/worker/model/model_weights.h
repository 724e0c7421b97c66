// Weights of a llama-architecture model in the canonical layout, loaded from GGUF or HF
// safetensors: fp32, or (WeightLoadOptions::packed, the CPU backend's form) the matrices kept in
// the type the file stores them in.
//
// Canonical layout (what every backend consumes):
// - matrices row-major [out_features][in_features];
// - Q and K projection rows in the half-split RoPE layout (HF's): within a head, dimension i pairs
//   with i + head_dim/2. GGUF files of llama-arch models store Q/K rows permuted so that adjacent
//   rows pair; the GGUF loader undoes that permutation.
// - Q, K and V projections fused into one [q_size + 2 kv_size][hidden] matrix (Q rows, then K, then
//   V), gate and up fused into one [2 intermediate][hidden] matrix (gate rows, then up), so each is
//   one GEMM.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_MODEL_WEIGHTS_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_MODEL_WEIGHTS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/include/quant_linear.h"
#include "services/worker/model/model_config.h"

namespace lazyattn {

// A matrix in its stored type (quant_linear.h's layout): consecutive runs of rows, each run of one
// type, since a fused matrix's source tensors may differ (a Q4_1 file may keep V in Q8_0).
struct PackedPart {
  WeightType type = WeightType::kF32;
  int64_t rows = 0;
  std::vector<uint8_t> bytes;  // rows * WeightTypeRowBytes(type, cols)
};
struct PackedMatrix {
  int64_t cols = 0;
  std::vector<PackedPart> parts;

  bool empty() const { return parts.empty(); }
  int64_t rows() const;
  size_t bytes() const;
  // Part i as a kernel view.
  QuantMatrixView view(size_t i) const {
    return {parts[i].type, parts[i].bytes.data(), parts[i].rows, cols};
  }
  // Flat values [begin, end) of the row-major matrix, in fp32.
  std::vector<float> Values(int64_t begin, int64_t end) const;
  // Row `row` in fp32 into dst[cols].
  void RowValues(int64_t row, float* dst) const;
};

// With WeightLoadOptions::packed, every matrix slot (embedding, LM head, the four per-layer
// projections) is in its *_packed member and its fp32 vector is empty; otherwise the reverse.
struct LayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  std::vector<float> wqkv;       // [q_size + 2 kv_size][hidden]
  std::vector<float> wo;         // [hidden][q_size]
  std::vector<float> ffn_norm;   // [hidden]
  std::vector<float> w_gate_up;  // [2 intermediate][hidden]
  std::vector<float> w_down;     // [hidden][intermediate]
  PackedMatrix wqkv_packed, wo_packed, w_gate_up_packed, w_down_packed;
};

struct ModelWeights {
  ModelConfig config;
  std::vector<float> token_embedding;  // [vocab][hidden]
  std::vector<float> output_norm;      // [hidden]
  std::vector<float> lm_head;          // [vocab][hidden]; empty when tied to the embedding
  std::vector<LayerWeights> layers;
  PackedMatrix token_embedding_packed, lm_head_packed;

  const float* lm_head_data() const {
    return lm_head.empty() ? token_embedding.data() : lm_head.data();
  }
  const PackedMatrix& lm_head_packed_or_tied() const {
    return lm_head_packed.empty() ? token_embedding_packed : lm_head_packed;
  }
  // Whether the matrices are packed (LoadModelWeights with WeightLoadOptions::packed).
  bool packed() const { return !token_embedding_packed.empty(); }
};

struct WeightLoadOptions {
  // Keep every matrix in the type the file stores it in (F32, F16, BF16, Q8_0, Q4_0, Q4_1): what
  // the CPU backend multiplies directly, 4-8x smaller than fp32 for quantized files. The CUDA
  // upload and tests that read the fp32 vectors need packed == false.
  bool packed = false;
};

// Which on-disk format `path` names: a `.gguf` file, or an HF model directory (config.json and
// *.safetensors; the path may also name the config.json itself). NotFound for a missing path;
// InvalidArgument, with the system's reason, for one that cannot be looked at (a symbolic-link
// loop, no search permission on a folder) and for an unknown format.
enum class ModelFormat { kGguf, kHfSafetensors };
absl::StatusOr<ModelFormat> DetectModelFormat(const std::string& path);

// Loads and dequantizes every tensor. Every tensor's shape and type is checked against the config
// before any weight memory is allocated, so what is allocated is bounded by the file's size.
// A NaN or Inf weight (in a block type, a non-finite scale) is InvalidArgument naming the file,
// the tensor and the first bad element's index in the file and its value; it is found in the
// pass that copies or converts the weights (FindNonFinite). An HF folder's shards are those of
// SafetensorsShards (model.safetensors.index.json followed when present).
// Errors name the file and the tensor or key (InvalidArgument / DataLoss / NotFound /
// Unimplemented for a malformed or unsupported file; ResourceExhausted, never std::bad_alloc, when
// a well-formed model does not fit in memory).
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(
    const std::string& path, const WeightLoadOptions& options = {});

// The GGUF Q/K row permutation's inverse, exposed for tests: `rows` = n_heads * head_dim rows of
// `cols` values, permuted as llama.cpp's converter does, are rewritten in half-split order.
void UnpermuteGgufRopeRows(float* rows, int n_heads, int head_dim, int64_t cols);
// The same on rows of `row_bytes` bytes each (packed rows move whole).
void UnpermuteGgufRopeRowBytes(uint8_t* rows, int n_heads, int head_dim, size_t row_bytes);

// The destination tensors of ModelWeights' layout (per layer from kAttnNorm on).
enum class WeightSlot { kTokenEmbedding, kOutputNorm, kLmHead, kAttnNorm, kWqkv, kWo, kFfnNorm,
                        kGateUp, kDown };

// Elements of `slot` in ModelWeights' layout (0 for kLmHead when the embedding is tied).
int64_t WeightSlotElements(const ModelConfig& config, WeightSlot slot);

// The packed form of `slot` (null for the norm slots, which are always fp32).
PackedMatrix* WeightSlotPacked(ModelWeights& weights, WeightSlot slot, int layer);
const PackedMatrix* WeightSlotPacked(const ModelWeights& weights, WeightSlot slot, int layer);

// The host tensor of `slot` (of `layer` for per-layer slots).
std::vector<float>& WeightSlotVector(ModelWeights& weights, WeightSlot slot, int layer);
const std::vector<float>& WeightSlotVector(const ModelWeights& weights, WeightSlot slot,
                                           int layer);

// Where one tensor of a GGUF file lands: its name and row-major shape in the file, the slot (and
// layer, -1 for model-level slots) and the first element it fills there. `rope_heads` > 0: its
// rows come in llama.cpp's interleaved RoPE order, `rope_heads` heads of head_dim rows, and are
// put back in half-split order (UnpermuteGgufRopeRows). Every loader of GGUF files (the host's,
// and the GPU's in services/worker/cuda) places tensors by this one list.
struct WeightPlacement {
  std::string name;
  std::vector<int64_t> shape;
  WeightSlot slot;
  int layer = -1;
  int64_t offset = 0;
  int rope_heads = 0;
};
std::vector<WeightPlacement> GgufWeightPlacements(const ModelConfig& config);

class GgufFile;
// The config of a GGUF model, Llama-3 RoPE frequency factors (rope_freqs.weight) included; the
// factors must be finite and positive.
absl::StatusOr<ModelConfig> GgufModelConfig(const GgufFile& file);

// Every tensor GgufWeightPlacements(config) names is in `file` with that shape and a type
// DequantizeToF32 converts: what a loader checks before it allocates the weights. Touches no
// tensor data. NotFound / InvalidArgument / Unimplemented naming the file and the tensor.
absl::Status CheckGgufWeights(const GgufFile& file, const ModelConfig& config);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_MODEL_WEIGHTS_H_
