// Fingerprints that make document keys model-specific: KV computed by one model (or tokenizer) is
// never served for another. Both are hex SHA-256 strings.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_MODEL_FINGERPRINT_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_MODEL_FINGERPRINT_H_

#include <string>

#include "absl/status/statusor.h"
#include "services/worker/model/model_weights.h"
#include "services/worker/model/tokenizer/tokenizer.h"

namespace lazyattn {

// Over the configuration and a sample of every weight tensor (its first and last 4,096 values):
// cheap on 16 GB of weights, and any two checkpoints we could serve differ there.
std::string ModelFingerprint(const ModelWeights& weights);

// ModelFingerprint of the weights LoadModelWeights would read from a GGUF file, computed from the
// file without them: only the rows that hold the sampled values are dequantized. For loaders that
// never hold fp32 weights on the host (CudaModelWeights::LoadGguf). Checks the tensors first
// (CheckGgufWeights), so any file is safe to pass.
absl::StatusOr<std::string> GgufModelFingerprint(const GgufFile& file);

// Over the vocabulary (every token's text and type), the pre-tokenizer and the special ids.
std::string TokenizerFingerprint(const Tokenizer& tokenizer);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_MODEL_FINGERPRINT_H_
