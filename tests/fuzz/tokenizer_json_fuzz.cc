// tokenizer.json text (and optionally tokenizer_config.json) through TokenizerSpecFromTokenizerJson
// and Tokenizer::Create, then one Encode (with and without special tokens) and Decode of a fixed
// string when a tokenizer results.
//
// Framing: the input up to its first NUL byte is tokenizer.json; what follows that byte, when there
// is one, is the tokenizer_config.json beside it (no NUL: no tokenizer_config.json). Inputs are
// capped at 1 MiB.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "services/worker/model/tokenizer/tokenizer.h"
#include "services/worker/model/tokenizer/tokenizer_spec.h"
#include "tests/fuzz/model_fuzz_files.h"

namespace {

constexpr size_t kMaxInput = 1 << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string path = lazyattn::fuzz::WriteScratch("tokenizer.json", in.substr(0, nul));
  if (nul == std::string_view::npos) {
    lazyattn::fuzz::RemoveScratch("tokenizer_config.json");
  } else {
    lazyattn::fuzz::WriteScratch("tokenizer_config.json", in.substr(nul + 1));
  }
  absl::StatusOr<lazyattn::TokenizerSpec> spec = lazyattn::TokenizerSpecFromTokenizerJson(path);
  if (!spec.ok()) return 0;
  absl::StatusOr<std::unique_ptr<lazyattn::Tokenizer>> tokenizer =
      lazyattn::Tokenizer::Create(*std::move(spec));
  if (!tokenizer.ok()) return 0;
  constexpr std::string_view kText = "Hello, world! 12345 <|im_start|>user\n caf\xc3\xa9 \xff";
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = (*tokenizer)->EncodeWithSpecials(kText, special);
    (void)(*tokenizer)->Decode(ids);
  }
  return 0;
}
