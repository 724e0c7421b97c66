// Unicode helpers for the tokenizer: lenient UTF-8 decoding and the code point classes that the
// pre-tokenizers need.
//
// Contract:
// - Classification follows llama.cpp (src/unicode-data.cpp): letter = general category L*,
//   number = N*, whitespace = the Unicode White_Space property (25 code points, the \s of Rust,
//   Oniguruma and Python's `regex`). Code points above U+10FFFF are in no class.
// - DecodeUtf8Lenient never fails: it decodes like llama.cpp's unicode_cpts_from_utf8, where every
//   byte that does not start a well-formed sequence becomes U+FFFD and consumes one byte. Like
//   llama.cpp it checks only the lead byte and the continuation bytes (overlong forms and
//   surrogates decode to their value); a 4-byte form above U+10FFFF counts as invalid.
// - Everything here is thread-safe and allocation-free except where a vector is returned.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_UNICODE_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lazyattn {

inline constexpr uint32_t kReplacementCharacter = 0xFFFD;

// Bit flags of CodepointFlags().
inline constexpr uint8_t kCodepointLetter = 1;
inline constexpr uint8_t kCodepointNumber = 2;
inline constexpr uint8_t kCodepointWhitespace = 4;

// The class bits of `cp` (0 for anything that is none of letter, number, whitespace).
uint8_t CodepointFlags(uint32_t cp);

inline bool IsLetter(uint32_t cp) { return (CodepointFlags(cp) & kCodepointLetter) != 0; }
inline bool IsNumber(uint32_t cp) { return (CodepointFlags(cp) & kCodepointNumber) != 0; }
inline bool IsWhitespace(uint32_t cp) { return (CodepointFlags(cp) & kCodepointWhitespace) != 0; }

// The Unicode version the tables were generated from (e.g. "15.1.0").
const char* UnicodeTablesVersion();

// Decodes the code point at `*pos` (which must be < text.size()) and advances `*pos` past it.
uint32_t DecodeUtf8Lenient(std::string_view text, size_t* pos);

// Decodes all of `text`; invalid bytes become U+FFFD (see above).
std::vector<uint32_t> DecodeUtf8Lenient(std::string_view text);

// Appends the UTF-8 encoding of `cp` (which must be <= U+10FFFF; larger values append U+FFFD).
void AppendUtf8(uint32_t cp, std::string* out);

// Length of the longest prefix of `bytes` that does not end inside an incomplete-but-so-far-valid
// UTF-8 sequence: bytes.size() minus the length of a trailing truncated sequence (0..3 bytes).
// Bytes that can never become valid (stray continuation bytes, 0xC0/0xC1/0xF5..0xFF) are not held
// back.
size_t Utf8CompletePrefixLength(std::string_view bytes);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_UNICODE_H_
