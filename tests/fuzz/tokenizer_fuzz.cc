// Fuzzed bytes through the byte-level BPE tokenizer: Encode, EncodeParts, Decode and the streaming
// decoder on the tiny model's vocabulary (tests/data/tiny, always present) or SmolLM2's (when
// models/SmolLM2-135M-Instruct.Q4_1.gguf is there; else the tiny one again). Besides not crashing
// or hanging, it checks the contracts tokenizer.h states:
//   - every id is in the vocabulary, and Decode(Encode(s)) is s without the bytes that have no
//     token (ByteHasToken) whenever s is valid UTF-8 and the vocabulary is closed under its merges;
//   - EncodeParts over any cut of the text, all parts alike, equals Encode of the whole; its
//     part_of_token never decreases and never names an empty part;
//   - the streaming decoder gives Decode's bytes; Decode rejects an id outside the vocabulary.
//
// Framing: byte 0 flags (bit 0 SmolLM2, bit 1 parse_special, bit 2 parts differ in parse_special),
// byte 1 the number of cuts (mod 8), two bytes per cut, the rest is the text (at most 2 KiB).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "services/worker/model/gguf_file.h"
#include "services/worker/model/tokenizer/tokenizer.h"
#include "services/worker/model/tokenizer/tokenizer_spec.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using lazyattn::Tokenizer;

constexpr size_t kMaxText = 2048;

// Loaded once and never changed (a Tokenizer is immutable), so nothing leaks between inputs.
const Tokenizer* Load(const char* path) {
  if (!std::filesystem::exists(path)) return nullptr;
  auto gguf = lazyattn::GgufFile::Open(path);
  if (!gguf.ok()) return nullptr;
  auto spec = lazyattn::TokenizerSpecFromGguf(**gguf);
  if (!spec.ok()) return nullptr;
  auto tok = Tokenizer::Create(*std::move(spec));
  return tok.ok() ? tok->release() : nullptr;
}

const Tokenizer* Tiny() {
  static const Tokenizer* const t = Load("tests/data/tiny/tiny-llama/tiny-llama-f32.gguf");
  return t;
}
const Tokenizer* SmolLM2() {
  static const Tokenizer* const t = Load("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  return t;
}

void Check(bool ok) {
  if (!ok) std::abort();
}

// RFC 3629, written here so that the oracle shares no code with the tokenizer.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n;
    uint32_t cp;
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      n = 1, cp = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      n = 2, cp = b & 0x0F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      n = 3, cp = b & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // cut short
    for (size_t k = 1; k <= n; ++k) {
      const auto c = static_cast<uint8_t>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min = n == 1 ? 0x80 : n == 2 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lazyattn::fuzz::FuzzInput in(data, size);
  const uint8_t flags = in.Byte();
  const Tokenizer* tok = (flags & 1) && SmolLM2() != nullptr ? SmolLM2() : Tiny();
  Check(tok != nullptr);  // the tiny model is committed: its absence is a broken checkout
  const bool special = (flags & 2) != 0;
  const bool mixed = (flags & 4) != 0;
  std::vector<size_t> cuts(in.Byte() % 8);
  for (size_t& c : cuts) c = in.Range(0, 65535);
  const std::string text = in.Bytes(kMaxText);
  for (size_t& c : cuts) c %= text.size() + 1;
  std::sort(cuts.begin(), cuts.end());

  const std::vector<int32_t> ids = tok->Encode(text, special);
  for (int32_t id : ids) Check(tok->IsValid(id));
  const absl::StatusOr<std::string> decoded = tok->Decode(ids);
  Check(decoded.ok());
  if (IsValidUtf8(text) && tok->merges_closed()) {
    std::string expected;
    for (char c : text) {
      if (tok->ByteHasToken(static_cast<uint8_t>(c))) expected.push_back(c);
    }
    Check(*decoded == expected);
  }

  lazyattn::StreamingDecoder stream(tok);
  std::string streamed;
  for (int32_t id : ids) {
    absl::StatusOr<std::string> piece = stream.Push(id);
    Check(piece.ok());
    streamed += *piece;
  }
  streamed += stream.Flush();
  Check(streamed == *decoded);

  std::vector<Tokenizer::TextPart> parts;
  size_t begin = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t end = i < cuts.size() ? cuts[i] : text.size();
    const bool part_special = mixed ? ((flags >> (3 + i % 5)) & 1) != 0 : special;
    parts.push_back({std::string_view(text).substr(begin, end - begin), part_special});
    begin = end;
  }
  std::vector<size_t> owner;
  const std::vector<int32_t> joined = tok->EncodeParts(parts, &owner);
  Check(owner.size() == joined.size());
  for (size_t i = 0; i < owner.size(); ++i) {
    Check(owner[i] < parts.size() && !parts[owner[i]].text.empty());
    Check(i == 0 || owner[i - 1] <= owner[i]);
    Check(tok->IsValid(joined[i]));
  }
  if (!mixed) Check(joined == ids);

  // Arbitrary ids, some outside the vocabulary: Decode fails exactly when one is.
  std::vector<int32_t> raw;
  bool any_invalid = false;
  for (size_t i = 0; i + 1 < text.size() && raw.size() < 256; i += 2) {
    const int32_t v = (static_cast<uint8_t>(text[i]) << 8 | static_cast<uint8_t>(text[i + 1]));
    raw.push_back(v % (tok->vocab_size() + 8) - 4);
    any_invalid = any_invalid || !tok->IsValid(raw.back());
  }
  Check(tok->Decode(raw).ok() != any_invalid);
  return 0;
}
