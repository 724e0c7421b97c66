// An HF model directory (config.json + one model.safetensors shard) through the readers a worker
// uses: ModelConfigFromHfJson (bounds of model_config.h), SafetensorsFile::Open and ReadAsF32 of
// every convertible tensor, and LoadModelWeights on the directory.
//
// Framing: bytes 0-1 are N, a little-endian uint16; the next N bytes (fewer if the input ends) are
// config.json, the rest is model.safetensors. Seeds keep config.json whole and cut the tensors
// down. Besides "no crash", the target asserts that weights which loaded describe at most one
// parameter per byte of the file (F16/BF16 hold 0.5), i.e. nothing sized by the config alone was
// allocated. Inputs are capped at 1 MiB.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "services/worker/model/model_config.h"
#include "services/worker/model/model_weights.h"
#include "services/worker/model/safetensors_file.h"
#include "tests/fuzz/model_fuzz_files.h"

namespace {

constexpr size_t kMaxInput = 1 << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t n = size >= 2 ? (data[0] | (size_t{data[1]} << 8)) : 0;
  const std::string_view config = in.substr(std::min<size_t>(2, size)).substr(0, n);
  const std::string_view tensors = in.substr(std::min(size, 2 + config.size()));
  const std::string config_path = lazyattn::fuzz::WriteScratch("config.json", config);
  const std::string shard_path = lazyattn::fuzz::WriteScratch("model.safetensors", tensors);

  (void)lazyattn::ModelConfigFromHfJson(config_path);
  absl::StatusOr<std::unique_ptr<lazyattn::SafetensorsFile>> file =
      lazyattn::SafetensorsFile::Open(shard_path);
  if (file.ok()) {
    std::vector<float> dst;
    for (const lazyattn::SafetensorsTensor& t : (*file)->tensors()) {
      if (!t.supported) continue;
      dst.resize(static_cast<size_t>(t.num_elements));  // <= num_bytes / 2: checked by Open
      (void)(*file)->ReadAsF32(t, dst.data());
    }
  }
  absl::StatusOr<std::unique_ptr<lazyattn::ModelWeights>> weights =
      lazyattn::LoadModelWeights(lazyattn::fuzz::ScratchDir());
  if (weights.ok() && (*weights)->config.num_parameters() > static_cast<int64_t>(tensors.size())) {
    std::fprintf(stderr, "safetensors_fuzz: %lld parameters loaded from a %zu-byte shard\n",
                 static_cast<long long>((*weights)->config.num_parameters()), tensors.size());
    std::abort();
  }
  return 0;
}
