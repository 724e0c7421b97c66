// GGUF bytes through everything a worker does with a .gguf model before serving it: the reader
// (GgufFile::Open), the config (GgufModelConfig, bounds of model_config.h), the tokenizer
// (TokenizerSpecFromGguf, Tokenizer::Create, a short Encode/Decode), the tensor check, the
// fingerprint read straight from the file, and the fp32 weights (LoadModelWeights).
//
// Input: the whole input is the .gguf file. Besides "no crash", the target asserts the property
// that keeps allocation bounded: a config whose tensors passed CheckGgufWeights describes at most
// 4 parameters per byte of the file (the densest supported type, Q4_0, holds 1.8), so the fp32
// weights cannot be larger than a small multiple of the input. Inputs are capped at 1 MiB.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "services/worker/model/gguf_file.h"
#include "services/worker/model/model_config.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/model_weights.h"
#include "services/worker/model/tokenizer/tokenizer.h"
#include "services/worker/model/tokenizer/tokenizer_spec.h"
#include "tests/fuzz/model_fuzz_files.h"

namespace {

constexpr size_t kMaxInput = 1 << 20;

void Tokenize(const lazyattn::GgufFile& file) {
  absl::StatusOr<lazyattn::TokenizerSpec> spec = lazyattn::TokenizerSpecFromGguf(file);
  if (!spec.ok()) return;
  absl::StatusOr<std::unique_ptr<lazyattn::Tokenizer>> tokenizer =
      lazyattn::Tokenizer::Create(*std::move(spec));
  if (!tokenizer.ok()) return;
  const std::vector<int32_t> ids =
      (*tokenizer)->Encode("Hello, world! 12345 <|im_start|>user\n\xff\xfe", true);
  (void)(*tokenizer)->Decode(ids);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  const std::string path = lazyattn::fuzz::WriteScratch(
      "model.gguf", std::string_view(reinterpret_cast<const char*>(data), size));
  absl::StatusOr<std::unique_ptr<lazyattn::GgufFile>> file = lazyattn::GgufFile::Open(path);
  if (!file.ok()) return 0;
  Tokenize(**file);
  absl::StatusOr<lazyattn::ModelConfig> config = lazyattn::GgufModelConfig(**file);
  if (!config.ok()) return 0;
  if (!lazyattn::CheckGgufWeights(**file, *config).ok()) return 0;
  if (config->num_parameters() > 4 * static_cast<int64_t>(size)) {
    std::fprintf(stderr, "gguf_fuzz: %lld parameters passed the tensor check in a %zu-byte file\n",
                 static_cast<long long>(config->num_parameters()), size);
    std::abort();
  }
  (void)lazyattn::GgufModelFingerprint(**file);
  (void)lazyattn::LoadModelWeights(path);
  return 0;
}
