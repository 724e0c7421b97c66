// Pre-tokenizers: split text into the "words" that byte-level BPE then encodes one at a time.
//
// Hand-written matchers, equivalent to the regexes llama.cpp uses (src/llama-vocab.cpp and the
// custom splitters in src/unicode.cpp), with llama.cpp's code point classes (unicode.h):
//
//   kGpt2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kSmolLM first every \p{N} code point becomes a piece of its own, then kGpt2 runs on each
//           piece (HF: Sequence[Digits(individual_digits), ByteLevel]). Also StarCoder's.
//   kLlama3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//           The (?i:) applies to ASCII letters only, as in llama.cpp.
//
// Contract: the words partition the input exactly (concatenated they give back the decoded code
// points), none is empty, and splitting is linear in the input length. Input bytes that are not
// valid UTF-8 are decoded as U+FFFD first (see DecodeUtf8Lenient), as llama.cpp does.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_PRE_TOKENIZER_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_PRE_TOKENIZER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lazyattn {

enum class PreTokenizerType {
  kGpt2,
  kSmolLM,
  kLlama3,
};

// Maps a GGUF `tokenizer.ggml.pre` value to a pre-tokenizer. Accepted: "gpt2"/"gpt-2" (kGpt2),
// "smollm"/"starcoder" (kSmolLM), "llama-bpe"/"llama3"/"llama-v3" (kLlama3). Anything else,
// including llama.cpp's "default" (a different multi-regex split), is InvalidArgument naming the
// value and the supported ones.
absl::StatusOr<PreTokenizerType> PreTokenizerTypeFromName(std::string_view name);

// Canonical name: "gpt2", "smollm" or "llama-bpe".
std::string_view PreTokenizerTypeName(PreTokenizerType type);

// Half-open range [begin, end) of code point indices.
struct CodepointSpan {
  size_t begin;
  size_t end;
};

// Appends the words of cps[0, cps.size()) to *words.
void SplitWords(PreTokenizerType type, const std::vector<uint32_t>& cps,
                std::vector<CodepointSpan>* words);

// Convenience for tests and tools: the words of `text` as UTF-8 strings.
std::vector<std::string> PreTokenize(PreTokenizerType type, std::string_view text);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_PRE_TOKENIZER_H_
