// Test-only: the GGUF files the tests carry (tests/data/tiny: F32, F16, Q8_0 and Q4_0 tensors,
// tied and untied, Llama-3 RoPE factors), then SmolLM2's Q4_1 when tools/fetch-model (or, on the
// GPU machine, tests/gpu/run.sh) has put it in models/. Paths relative to the repository root.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TEST_GGUF_FILES_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TEST_GGUF_FILES_H_

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace lazyattn::testing {

inline std::vector<std::string> TestGgufFiles() {
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& dir : std::filesystem::directory_iterator("tests/data/tiny", ec)) {
    if (!dir.is_directory()) continue;
    for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
      if (f.path().extension() == ".gguf") paths.push_back(f.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  if (std::filesystem::exists("models/SmolLM2-135M-Instruct.Q4_1.gguf")) {
    paths.push_back("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  }
  return paths;
}

}  // namespace lazyattn::testing

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TEST_GGUF_FILES_H_
