// Loads everything a worker needs from one model path: the fp32 weights and the tokenizer
// (GGUF metadata, or tokenizer.json beside an HF config.json).
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_MODEL_LOADER_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_MODEL_LOADER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/worker/model/model_weights.h"
#include "services/worker/model/tokenizer/tokenizer.h"

namespace lazyattn {

struct LoadedModel {
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;
};

// Errors name the file and what is wrong in it (see LoadModelWeights and the tokenizer adapters).
// The tokenizer's vocabulary must not exceed the model's (a smaller one is allowed: models pad
// their embedding matrices).
// `options`: as LoadModelWeights (packed: the CPU backend's form).
absl::StatusOr<LoadedModel> LoadModel(const std::string& path,
                                      const WeightLoadOptions& options = {});

// The tokenizer of a .gguf file or of the tokenizer.json beside an HF config.json. Errors name the
// file and the key; std::bad_alloc never escapes (ResourceExhausted).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_path);

// LoadTokenizer, checked against the model LoadModel would pair it with: InvalidArgument naming
// `model_path` when the tokenizer has more tokens than `config` has embeddings. For loaders that
// build the weights some other way (CudaModelWeights::LoadGguf).
// True for the errors LoadModel and its parts return when the model's files are wrong: absent or
// unreadable (NotFound, PermissionDenied, FailedPrecondition), malformed or out of bounds
// (InvalidArgument, DataLoss, OutOfRange), or describing something unsupported (Unimplemented).
// The front ends exit 2 for these (a bad --model / model.path), 1 for the rest (ResourceExhausted:
// a well-formed model that does not fit; Internal).
bool IsModelFileError(const absl::Status& status);

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFor(const std::string& model_path,
                                                            const ModelConfig& config);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_MODEL_LOADER_H_
