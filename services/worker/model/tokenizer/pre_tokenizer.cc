#include "services/worker/model/tokenizer/pre_tokenizer.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/worker/model/tokenizer/unicode.h"

namespace lazyattn {
namespace {

// Debian's Abseil has its own absl::string_view (not std::string_view); convert explicitly.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Class of a code point for the regexes: letter, number, whitespace or "other" (the
// [^\s\p{L}\p{N}] class).
enum class Cls : uint8_t { kOther, kLetter, kNumber, kSpace };

inline Cls ClassOf(uint32_t cp) {
  const uint8_t f = CodepointFlags(cp);
  if (f & kCodepointLetter) return Cls::kLetter;
  if (f & kCodepointNumber) return Cls::kNumber;
  if (f & kCodepointWhitespace) return Cls::kSpace;
  return Cls::kOther;
}

inline uint32_t AsciiLower(uint32_t cp) { return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp; }

// Length of a contraction ('s 't 're 've 'm 'll 'd) starting at cps[pos] (which is an
// apostrophe), or 0. Only looks inside [pos, end).
size_t ContractionLength(const std::vector<uint32_t>& cps, size_t pos, size_t end,
                         bool ignore_case) {
  if (pos + 1 >= end) return 0;
  const auto fold = [&](uint32_t cp) { return ignore_case ? AsciiLower(cp) : cp; };
  const uint32_t c1 = fold(cps[pos + 1]);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= end) return 0;
  const uint32_t c2 = fold(cps[pos + 2]);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// Length of the whitespace run at cps[pos..end).
size_t WhitespaceRun(const std::vector<uint32_t>& cps, size_t pos, size_t end) {
  size_t n = 0;
  while (pos + n < end && ClassOf(cps[pos + n]) == Cls::kSpace) ++n;
  return n;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void SplitGpt2(const std::vector<uint32_t>& cps, size_t begin, size_t end,
               std::vector<CodepointSpan>* words) {
  size_t pos = begin;
  const auto emit = [&](size_t stop) {
    words->push_back({pos, stop});
    pos = stop;
  };
  while (pos < end) {
    const uint32_t cp = cps[pos];
    if (cp == '\'') {
      const size_t n = ContractionLength(cps, pos, end, /*ignore_case=*/false);
      if (n > 0) {
        emit(pos + n);
        continue;
      }
    }
    // Optional leading space before a letter, number or "other" run.
    size_t body = pos;
    if (cp == ' ') {
      if (pos + 1 < end) body = pos + 1;
    }
    const Cls cls = (cp == ' ' && body == pos) ? Cls::kSpace : ClassOf(cps[body]);
    if (cls != Cls::kSpace) {
      size_t stop = body + 1;
      while (stop < end && ClassOf(cps[stop]) == cls) ++stop;
      emit(stop);
      continue;
    }
    // \s+(?!\S) leaves the last whitespace for the next word when a non-space follows; \s+.
    const size_t n = WhitespaceRun(cps, pos, end);
    if (n > 1 && pos + n < end) {
      emit(pos + n - 1);
    } else {
      emit(pos + (n > 0 ? n : 1));
    }
  }
}

// SmolLM / StarCoder: each \p{N} alone, then GPT-2 on the runs in between.
void SplitSmolLM(const std::vector<uint32_t>& cps, size_t begin, size_t end,
                 std::vector<CodepointSpan>* words) {
  size_t run = begin;
  for (size_t pos = begin; pos < end; ++pos) {
    if (ClassOf(cps[pos]) == Cls::kNumber) {
      if (run < pos) SplitGpt2(cps, run, pos, words);
      words->push_back({pos, pos + 1});
      run = pos + 1;
    }
  }
  if (run < end) SplitGpt2(cps, run, end, words);
}

// Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void SplitLlama3(const std::vector<uint32_t>& cps, size_t begin, size_t end,
                 std::vector<CodepointSpan>* words) {
  size_t pos = begin;
  const auto emit = [&](size_t stop) {
    words->push_back({pos, stop});
    pos = stop;
  };
  const auto is_cr_lf = [](uint32_t c) { return c == '\r' || c == '\n'; };
  while (pos < end) {
    const uint32_t cp = cps[pos];
    const Cls cls = ClassOf(cp);
    if (cp == '\'') {
      const size_t n = ContractionLength(cps, pos, end, /*ignore_case=*/true);
      if (n > 0) {
        emit(pos + n);
        continue;
      }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!is_cr_lf(cp) && cls != Cls::kNumber) {
      if (cls == Cls::kLetter || (pos + 1 < end && ClassOf(cps[pos + 1]) == Cls::kLetter)) {
        size_t stop = pos + 1;
        while (stop < end && ClassOf(cps[stop]) == Cls::kLetter) ++stop;
        emit(stop);
        continue;
      }
    }
    // \p{N}{1,3}
    if (cls == Cls::kNumber) {
      size_t stop = pos + 1;
      while (stop < end && stop - pos < 3 && ClassOf(cps[stop]) == Cls::kNumber) ++stop;
      emit(stop);
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    {
      size_t body = pos;
      if (cp == ' ' && pos + 1 < end) body = pos + 1;
      if (!(cp == ' ' && body == pos) && ClassOf(cps[body]) == Cls::kOther) {
        size_t stop = body + 1;
        while (stop < end && ClassOf(cps[stop]) == Cls::kOther) ++stop;
        while (stop < end && is_cr_lf(cps[stop])) ++stop;
        emit(stop);
        continue;
      }
    }
    // \s*[\r\n]+ : through the last CR/LF of the whitespace run.
    const size_t n = WhitespaceRun(cps, pos, end);
    size_t last_cr_lf_end = 0;
    for (size_t k = 0; k < n; ++k) {
      if (is_cr_lf(cps[pos + k])) last_cr_lf_end = pos + k + 1;
    }
    if (last_cr_lf_end > 0) {
      emit(last_cr_lf_end);
    } else if (n > 1 && pos + n < end) {  // \s+(?!\S)
      emit(pos + n - 1);
    } else {  // \s+ (n == 0 cannot happen: every class is handled above)
      emit(pos + (n > 0 ? n : 1));
    }
  }
}

}  // namespace

absl::StatusOr<PreTokenizerType> PreTokenizerTypeFromName(std::string_view name) {
  if (name == "gpt2" || name == "gpt-2") return PreTokenizerType::kGpt2;
  if (name == "smollm" || name == "starcoder") return PreTokenizerType::kSmolLM;
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3") {
    return PreTokenizerType::kLlama3;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported pre-tokenizer \"", Sv(name),
      "\"; supported: gpt2 (gpt-2), smollm (starcoder), llama-bpe (llama3, llama-v3)"));
}

std::string_view PreTokenizerTypeName(PreTokenizerType type) {
  switch (type) {
    case PreTokenizerType::kGpt2:
      return "gpt2";
    case PreTokenizerType::kSmolLM:
      return "smollm";
    case PreTokenizerType::kLlama3:
      return "llama-bpe";
  }
  return "unknown";
}

void SplitWords(PreTokenizerType type, const std::vector<uint32_t>& cps,
                std::vector<CodepointSpan>* words) {
  switch (type) {
    case PreTokenizerType::kGpt2:
      SplitGpt2(cps, 0, cps.size(), words);
      return;
    case PreTokenizerType::kSmolLM:
      SplitSmolLM(cps, 0, cps.size(), words);
      return;
    case PreTokenizerType::kLlama3:
      SplitLlama3(cps, 0, cps.size(), words);
      return;
  }
}

std::vector<std::string> PreTokenize(PreTokenizerType type, std::string_view text) {
  const std::vector<uint32_t> cps = DecodeUtf8Lenient(text);
  std::vector<CodepointSpan> spans;
  SplitWords(type, cps, &spans);
  std::vector<std::string> words;
  words.reserve(spans.size());
  for (const CodepointSpan& s : spans) {
    std::string w;
    for (size_t i = s.begin; i < s.end; ++i) AppendUtf8(cps[i], &w);
    words.push_back(std::move(w));
  }
  return words;
}

}  // namespace lazyattn
