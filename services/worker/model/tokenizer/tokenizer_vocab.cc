// Building a Tokenizer from its spec: the vocabulary and token attributes (with the token names
// llama.cpp recognizes), the special ids, the byte alphabet, the merge table and every token's
// decoded bytes. Apart from the encoder and decoder (tokenizer.cc) because it runs once per model
// load and is mostly llama.cpp's compatibility rules, which the hot paths never read.
#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/worker/model/tokenizer/tokenizer.h"
#include "services/worker/model/tokenizer/tokenizer_internal.h"
#include "services/worker/model/tokenizer/unicode.h"

namespace lazyattn {
namespace {

using tokenizer_internal::PairKey;
using tokenizer_internal::Sv;

// Token texts llama.cpp (llama_vocab::impl::load) recognizes by name. All of them are forced to be
// control tokens; the end-of-generation ones stop generation.
constexpr std::string_view kEotNames[] = {
    "<|eot_id|>",         "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>",    "<EOT>",      "_<EOT>",  "[EOT]",         "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
};
constexpr std::string_view kEomNames[] = {"<|eom_id|>"};
constexpr std::string_view kEogNames[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
};
// Fill-in-the-middle tokens: control; pad/repo/file-separator also end generation.
constexpr std::string_view kFimOtherNames[] = {
    "<|fim_prefix|>", "<fim-prefix>",    "<fim_prefix>",    "<｜fim▁begin｜>", "<PRE>",
    "▁<PRE>",         "<|code_prefix|>", "<|prefix|>",      "<|fim_suffix|>",  "<fim-suffix>",
    "<fim_suffix>",   "<｜fim▁hole｜>",  "<SUF>",           "▁<SUF>",          "<|code_suffix|>",
    "<|suffix|>",     "<|fim_middle|>",  "<fim-middle>",    "<fim_middle>",    "<｜fim▁end｜>",
    "<MID>",          "▁<MID>",          "<|code_middle|>", "<|middle|>",
};
constexpr std::string_view kFimEogNames[] = {
    "<|fim_pad|>",  "<fim-pad>",     "<fim_pad>",  "<PAD>",  "[PAD]",       // pad
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",  // repo
    "<|file_sep|>",                                                         // file separator
};

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the others to U+0100 upwards.
std::array<uint32_t, 256> BytesToUnicode() {
  std::array<uint32_t, 256> map{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = direct[b] ? static_cast<uint32_t>(b) : next++;
  return map;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerSpec spec) {
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  absl::Status status = tokenizer->Init(std::move(spec));
  if (!status.ok()) return status;
  return tokenizer;
}

int32_t Tokenizer::InternSymbol(const std::string& text) {
  auto it = token_to_id_.find(text);
  if (it != token_to_id_.end()) return it->second;
  auto [vit, inserted] =
      virtual_to_id_.try_emplace(text, vocab_size() + static_cast<int32_t>(virtual_to_id_.size()));
  return vit->second;
}

absl::Status Tokenizer::Init(TokenizerSpec spec) {
  const std::string where = spec.source.empty() ? "tokenizer spec" : spec.source;
  if (spec.model != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat(where, ": tokenizer model \"", spec.model,
                     "\" is not supported (only \"gpt2\", byte-level BPE)"));
  }
  absl::StatusOr<PreTokenizerType> pre = PreTokenizerTypeFromName(spec.pre);
  if (!pre.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", pre.status().message()));
  }
  pre_ = *pre;
  // llama.cpp sets ignore_merges for the llama-bpe family: a word that is a token is not merged.
  ignore_merges_ = pre_ == PreTokenizerType::kLlama3;
  if (spec.tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": empty vocabulary"));
  }
  if (spec.tokens.size() > static_cast<size_t>(INT32_MAX / 2)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": vocabulary too large"));
  }
  if (!spec.token_types.empty() && spec.token_types.size() < spec.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", spec.token_types.size(), " token types for ", spec.tokens.size(), " tokens"));
  }

  const int32_t n = static_cast<int32_t>(spec.tokens.size());
  tokens_ = std::move(spec.tokens);
  token_to_id_.reserve(n);
  attrs_.assign(n, kAttrNormal);
  for (int32_t id = 0; id < n; ++id) {
    std::string& text = tokens_[id];
    if (text.empty()) text = absl::StrCat("[EMPTY_", id, "]");  // as llama.cpp
    auto [it, inserted] = token_to_id_.try_emplace(text, id);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate token \"", text,
                                                     "\" (ids ", it->second, " and ", id, ")"));
    }
    if (!spec.token_types.empty()) {
      switch (static_cast<TokenType>(spec.token_types[id])) {
        case TokenType::kUnknown:
          attrs_[id] = kAttrUnknown;
          break;
        case TokenType::kUnused:
          attrs_[id] = kAttrUnused;
          break;
        case TokenType::kNormal:
          attrs_[id] = kAttrNormal;
          break;
        case TokenType::kControl:
          attrs_[id] = kAttrControl;
          break;
        case TokenType::kUserDefined:
          attrs_[id] = kAttrUserDefined;
          break;
        case TokenType::kByte:
          attrs_[id] = kAttrByte;
          break;
        default:
          attrs_[id] = kAttrUndefined;
          break;
      }
    }
  }

  // Special ids: out of range means absent (llama.cpp warns and ignores them).
  const auto in_range = [n](int32_t id) { return id >= 0 && id < n ? id : -1; };
  bos_id_ = in_range(spec.bos_id);
  eos_id_ = in_range(spec.eos_id);
  unk_id_ = in_range(spec.unk_id);
  pad_id_ = in_range(spec.pad_id);
  eot_id_ = in_range(spec.eot_id);
  eom_id_ = in_range(spec.eom_id);
  add_bos_ = spec.add_bos;
  add_eos_ = spec.add_eos;
  if (add_bos_ && bos_id_ < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": add_bos is set but there is no valid BOS token id"));
  }
  if (add_eos_ && eos_id_ < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": add_eos is set but there is no valid EOS token id"));
  }
  chat_template_ = std::move(spec.chat_template);

  // Tokens recognized by name (llama.cpp's workaround for converters that lose the metadata).
  const auto find = [this](std::string_view text) -> int32_t {
    auto it = token_to_id_.find(Sv(text));
    return it == token_to_id_.end() ? -1 : it->second;
  };
  const auto force_control = [this](int32_t id) {
    attrs_[id] = static_cast<uint8_t>(attrs_[id] | kAttrControl);
  };
  if (eot_id_ < 0) {
    for (std::string_view name : kEotNames) {
      if ((eot_id_ = find(name)) >= 0) break;
    }
  }
  if (eom_id_ < 0) {
    for (std::string_view name : kEomNames) {
      if ((eom_id_ = find(name)) >= 0) break;
    }
  }
  for (std::string_view name : kFimOtherNames) {
    if (int32_t id = find(name); id >= 0) force_control(id);
  }
  for (std::string_view name : kFimEogNames) {
    if (int32_t id = find(name); id >= 0) {
      force_control(id);
      eog_ids_.insert(id);
    }
  }
  for (std::string_view name : kEogNames) {
    if (int32_t id = find(name); id >= 0) {
      force_control(id);
      eog_ids_.insert(id);
    }
  }
  for (int32_t id : {eos_id_, eot_id_, eom_id_}) {
    if (id >= 0) eog_ids_.insert(id);
  }
  if (eot_id_ >= 0) force_control(eot_id_);
  if (eom_id_ >= 0) force_control(eom_id_);

  // Byte alphabet and merges.
  const std::array<uint32_t, 256> byte_to_cp = BytesToUnicode();
  std::array<int16_t, 512> cp_to_byte;
  cp_to_byte.fill(-1);
  for (int b = 0; b < 256; ++b) {
    byte_chars_[b].clear();
    AppendUtf8(byte_to_cp[b], &byte_chars_[b]);
    cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    byte_symbol_[b] = InternSymbol(byte_chars_[b]);
  }
  merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    if (left.empty() || right.empty()) continue;
    const int32_t l = InternSymbol(left);
    const int32_t r = InternSymbol(right);
    const int32_t result = InternSymbol(left + right);
    if (l >= n || r >= n || result >= n) merges_closed_ = false;
    merges_.try_emplace(PairKey(l, r), Merge{static_cast<int32_t>(rank), result});
  }
  // A merge result that is not a token is emitted the way llama.cpp does: one lookup per byte of
  // its byte-level text, keeping the bytes that happen to be tokens.
  virtual_fallback_.assign(virtual_to_id_.size(), {});
  for (const auto& [text, id] : virtual_to_id_) {
    std::vector<int32_t>& ids = virtual_fallback_[id - n];
    for (char c : text) {
      if (int32_t t = find(std::string_view(&c, 1)); t >= 0) ids.push_back(t);
    }
  }

  // Decoded bytes of every token.
  pieces_.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    const uint8_t attr = attrs_[id];
    const std::string& text = tokens_[id];
    std::string& piece = pieces_[id];
    if (attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
      piece = text;
    } else if (attr & kAttrNormal) {
      size_t pos = 0;
      while (pos < text.size()) {
        const uint32_t cp = DecodeUtf8Lenient(text, &pos);
        if (cp < cp_to_byte.size() && cp_to_byte[cp] >= 0) {
          piece.push_back(static_cast<char>(cp_to_byte[cp]));
        } else {
          AppendUtf8(cp, &piece);  // not a byte-level character: keep it as is
        }
      }
    } else if (attr & kAttrByte) {
      // <0xXX>
      unsigned value = 0;
      bool ok = text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>';
      for (size_t i = 3; ok && i < 5; ++i) {
        const char c = text[i];
        const int digit = (c >= '0' && c <= '9')   ? c - '0'
                          : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                          : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                                   : -1;
        ok = digit >= 0;
        value = value * 16 + static_cast<unsigned>(digit);
      }
      piece = ok ? std::string(1, static_cast<char>(value)) : text;
    }
    // Unused / undefined tokens decode to nothing, as in llama.cpp.
  }

  for (int32_t id = 0; id < n; ++id) {
    max_token_bytes_ = std::max({max_token_bytes_, pieces_[id].size(), tokens_[id].size()});
  }

  // Special tokens for partitioning: longest first (llama.cpp sorts by length only; ties by id
  // here so that the order is deterministic).
  for (int32_t id = 0; id < n; ++id) {
    if (attrs_[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      special_tokens_.push_back(id);
    }
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(),
                   [this](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
  return absl::OkStatus();
}

}  // namespace lazyattn
