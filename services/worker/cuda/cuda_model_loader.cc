#include "services/worker/cuda/cuda_model_loader.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/model_weights.h"

namespace lazyattn {

absl::StatusOr<CudaLoadedModel> LoadGgufModelToGpu(const std::string& path, bool load_tokenizer) {
  // The host loader's check first, so a missing or unknown path fails with its message.
  ASSIGN_OR_RETURN(const ModelFormat format, DetectModelFormat(path));
  if (format != ModelFormat::kGguf) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a GGUF file (the CUDA loader reads GGUF only)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  ASSIGN_OR_RETURN(const ModelConfig config, GgufModelConfig(*file));
  CudaLoadedModel m;
  // Before the weights: a bad tokenizer fails in milliseconds, not after seconds of upload.
  if (load_tokenizer) {
    ASSIGN_OR_RETURN(m.tokenizer, LoadTokenizerFor(path, config));
  }
  ASSIGN_OR_RETURN(m.weights, CudaModelWeights::LoadGguf(path));
  // After them: LoadGguf has checked every tensor's shape and type, which GgufModelFingerprint
  // relies on when it reads rows out of the file.
  ASSIGN_OR_RETURN(m.fingerprint, GgufModelFingerprint(*file));
  return m;
}

}  // namespace lazyattn
