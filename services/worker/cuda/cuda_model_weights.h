// A model's weights in GPU memory: bf16, in the canonical layout of model_weights.h (fused QKV
// and gate|up matrices, half-split Q/K rows), in one device allocation.
//
// Three sources: the fp32 weights a loader produced (GGUF of any supported type, safetensors),
// converted to bf16 on the GPU; a GGUF file's tensors as stored, dequantized on the GPU; or
// random weights of a given shape generated on the GPU from a seed, so 8B-sized benchmarks need
// neither a download nor 32 GB of host memory.
#ifndef LAZYATTN_SERVICES_WORKER_CUDA_CUDA_MODEL_WEIGHTS_H_
#define LAZYATTN_SERVICES_WORKER_CUDA_CUDA_MODEL_WEIGHTS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/model/model_config.h"
#include "services/worker/model/model_weights.h"

namespace lazyattn {

struct CudaLayerWeights {
  const __nv_bfloat16* attn_norm = nullptr;  // [hidden]
  const __nv_bfloat16* wqkv = nullptr;       // [q_size + 2 kv_size][hidden]
  const __nv_bfloat16* wo = nullptr;         // [hidden][q_size]
  const __nv_bfloat16* ffn_norm = nullptr;   // [hidden]
  const __nv_bfloat16* w_gate_up = nullptr;  // [2 intermediate][hidden]
  const __nv_bfloat16* w_down = nullptr;     // [hidden][intermediate]
};

class CudaModelWeights {
 public:
  // Converts and uploads `host` to the current device; synchronous. Both loaders refuse a weight
  // that is not finite once rounded to bf16 (FirstNonFiniteAsBf16: fp32 values past 3.39e38 as
  // well as NaN and Inf) with InvalidArgument naming the tensor, the element and its value.
  static absl::StatusOr<std::unique_ptr<CudaModelWeights>> Upload(const ModelWeights& host);
  // Reads a GGUF file's tensors as stored (quantized or not) and dequantizes them to bf16 on the
  // current device (DequantizeGgufToBf16), one tensor at a time through a staging buffer: the
  // host holds the mapped file only, never an fp32 copy (4 bytes a parameter). The same bf16
  // values as Upload(*LoadModelWeights(path)); errors name the file and the tensor as
  // LoadModelWeights does. Synchronous.
  static absl::StatusOr<std::unique_ptr<CudaModelWeights>> LoadGguf(const std::string& path);
  // Normal(0, stddev) matrices and embedding, norm weights Normal(1, 0.1), deterministic in
  // `seed` (each tensor has its own counter stream); synchronous. The config must pass
  // ValidateModelConfig.
  static absl::StatusOr<std::unique_ptr<CudaModelWeights>> Random(const ModelConfig& config,
                                                                  uint64_t seed,
                                                                  float stddev = 0.02f);
  ~CudaModelWeights();
  CudaModelWeights(const CudaModelWeights&) = delete;
  CudaModelWeights& operator=(const CudaModelWeights&) = delete;

  const ModelConfig& config() const { return config_; }
  int64_t bytes() const { return bytes_; }
  const __nv_bfloat16* token_embedding() const { return token_embedding_; }  // [vocab][hidden]
  const __nv_bfloat16* output_norm() const { return output_norm_; }
  const __nv_bfloat16* lm_head() const { return lm_head_; }  // the embedding when tied
  const CudaLayerWeights& layer(int l) const { return layers_[l]; }

 private:
  CudaModelWeights() = default;
  // Lays out every tensor in one allocation; the pointers above point into it.
  static absl::StatusOr<std::unique_ptr<CudaModelWeights>> Allocate(const ModelConfig& config);
  // The device tensor of `slot` (of `layer` for per-layer slots), writable.
  __nv_bfloat16* Slot(WeightSlot slot, int layer);

  ModelConfig config_;
  void* memory_ = nullptr;
  int64_t bytes_ = 0;
  __nv_bfloat16* token_embedding_ = nullptr;
  __nv_bfloat16* output_norm_ = nullptr;
  __nv_bfloat16* lm_head_ = nullptr;
  std::vector<CudaLayerWeights> layers_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CUDA_CUDA_MODEL_WEIGHTS_H_
