// Loads a GGUF model for the CUDA backend without an fp32 host copy of its weights: the tensors
// are dequantized on the GPU as stored (CudaModelWeights::LoadGguf), the fingerprint is computed
// from the file (GgufModelFingerprint), and the tokenizer comes from the file's metadata
// (LoadTokenizerFor). The host holds the mapped file and the tokenizer only.
//
// The result equals what the host path gives for the same file: CudaModelWeights::Upload of
// LoadModel's weights (bit for bit), ModelFingerprint of those weights, and LoadModel's tokenizer.
// Safetensors directories have no such loader: they go through LoadModel and Upload.
#ifndef LAZYATTN_SERVICES_WORKER_CUDA_CUDA_MODEL_LOADER_H_
#define LAZYATTN_SERVICES_WORKER_CUDA_CUDA_MODEL_LOADER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/worker/cuda/cuda_model_weights.h"
#include "services/worker/model/tokenizer/tokenizer.h"

namespace lazyattn {

struct CudaLoadedModel {
  std::unique_ptr<CudaModelWeights> weights;  // on the device current at load; config() is the
                                              // model's configuration
  std::unique_ptr<Tokenizer> tokenizer;       // null when not asked for
  std::string fingerprint;                    // ModelFingerprint of the host loader's weights
};

// Loads the GGUF file `path` onto the current device; synchronous. `load_tokenizer` false skips
// the tokenizer (callers that feed token ids, like lazyattn-logits).
//
// Errors, never an abort: those of the host loader (LoadModel) for the same file, naming it --
// NotFound for a missing path, DataLoss or InvalidArgument for a truncated or corrupt file,
// InvalidArgument for a tensor of the wrong shape or a tokenizer with more tokens than the model
// has embeddings, Unimplemented for a tensor type the GPU cannot dequantize (the host cannot
// either: GgmlIsDequantizable) -- plus InvalidArgument for a path that is not a GGUF file, and
// ResourceExhausted (or a CUDA error) when the weights do not fit on the device.
absl::StatusOr<CudaLoadedModel> LoadGgufModelToGpu(const std::string& path,
                                                   bool load_tokenizer = true);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CUDA_CUDA_MODEL_LOADER_H_
