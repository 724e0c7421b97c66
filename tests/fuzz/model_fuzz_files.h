// Test-only: the model readers open paths (they memory-map the file, and an HF model is a
// directory), so the model fuzz targets write each input to files in one scratch directory made
// once per process under $TMPDIR and removed at exit. Every input rewrites or removes every file it
// uses, so nothing carries from one input to the next.
#ifndef LAZYATTN_TESTS_FUZZ_MODEL_FUZZ_FILES_H_
#define LAZYATTN_TESTS_FUZZ_MODEL_FUZZ_FILES_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

namespace lazyattn::fuzz {

// The scratch directory (created on first use; aborts if it cannot be: the target is useless).
inline const std::string& ScratchDir() {
  static const std::string* const dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "lazyattn-fuzz-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return new std::string(tmpl);
  }();
  return *dir;
}

// Writes `bytes` to ScratchDir()/name and returns the path.
inline std::string WriteScratch(const std::string& name, std::string_view bytes) {
  const std::string path = ScratchDir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
  return path;
}

inline void RemoveScratch(const std::string& name) {
  std::error_code ec;
  std::filesystem::remove(ScratchDir() + "/" + name, ec);
}

}  // namespace lazyattn::fuzz

#endif  // LAZYATTN_TESTS_FUZZ_MODEL_FUZZ_FILES_H_
