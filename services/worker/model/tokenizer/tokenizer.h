// Byte-level BPE tokenizer (GPT-2 style, as used by SmolLM2 and Llama-3), matching llama.cpp's
// llama_tokenize / llama_detokenize token for token.
//
// Contract:
// - Create() validates the spec and fails with a Status (never aborts): UnimplementedError for a
//   model type other than "gpt2", InvalidArgumentError for an unknown pre-tokenizer, an empty or
//   duplicated vocabulary, a token_type array shorter than the vocabulary, or add_bos/add_eos
//   without the id. Special ids outside the vocabulary are treated as absent (as llama.cpp does).
// - A Tokenizer is immutable after Create(); all methods are const and thread-safe.
// - Encode() accepts any bytes. Text that is not valid UTF-8 is tokenized as llama.cpp does: each
//   offending byte stands for U+FFFD. Encode never adds BOS/EOS; EncodeWithSpecials() does.
// - Encode() cost is linear in the text (times log of the word length for BPE), plus one substring
//   scan of the text per special token when parsing special tokens.
// - Decode() returns the exact bytes of the tokens (the GPT-2 byte-level mapping inverted); unlike
//   llama.cpp it never "cleans up" spaces.
// - Round trip: for valid UTF-8 s and either parse_special, Decode(Encode(s)) is s with every byte
//   b for which ByteHasToken(b) is false removed, provided the vocabulary is closed under its merges
//   (merges_closed(): every merge's parts and result are tokens; true for SmolLM2, GPT-2, Llama-3).
//   A byte-level vocabulary normally has a token for each of the 256 bytes, but not always:
//   SmolLM2 has none for 0x04 0x06 0x13 0x14 0x16 0x1D 0xF1 0xF2 (bytes absent from its training
//   data; also none for C0 C1 F5..FF, which valid UTF-8 never holds and invalid input never
//   reaches, being U+FFFD by then). The model cannot see such a byte and the vocabulary has no
//   byte-fallback token to stand in for it, so it is dropped: HF tokenizers (BPE with no unk
//   token) and llama.cpp (llm_tokenizer_bpe's per-byte lookup of a symbol that is not a token)
//   drop it too, and Encode matches them id for id. So Decode(Encode(s)) == s exactly when no
//   byte of s lacks a token. Text that is not valid UTF-8 does not round-trip (U+FFFD, above).
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_TOKENIZER_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/worker/model/tokenizer/pre_tokenizer.h"
#include "services/worker/model/tokenizer/tokenizer_spec.h"

namespace lazyattn {

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Tokenizes `text` with no BOS/EOS added (llama_tokenize with add_special=false).
  // parse_special=true: occurrences of control, user-defined and unknown tokens in the text become
  //   those tokens (longest token text first, as llama.cpp partitions).
  // parse_special=false: the text is literal, except that user-defined tokens are still split out
  //   (llama.cpp and HF tokenizers do the same).
  std::vector<int32_t> Encode(std::string_view text, bool parse_special) const;

  // One piece of a text that EncodeParts tokenizes as a whole.
  struct TextPart {
    std::string_view text;
    bool parse_special = false;
  };
  // Tokenizes the concatenation of the parts' texts exactly as Encode tokenizes one text (words and
  // BPE merges run across part boundaries), except that a control or unknown token's text becomes
  // that token only where it lies wholly inside parts with parse_special (user-defined tokens are
  // split out everywhere, as in Encode). With one part, or all parts alike, the result equals
  // Encode(concatenation, parse_special). When `part_of_token` is not null it gets, per token, the
  // index of the part that holds the token's last byte (so a token that spans a boundary belongs
  // to the later part, and a part whose bytes all went into later tokens gets none).
  std::vector<int32_t> EncodeParts(absl::Span<const TextPart> parts,
                                   std::vector<size_t>* part_of_token = nullptr) const;

  // Encode() plus the model's own specials (llama_tokenize with add_special=true): BOS first when
  // add_bos() (unless the text already tokenized to a leading BOS, e.g. a chat template that
  // renders <|begin_of_text|>), EOS last when add_eos().
  std::vector<int32_t> EncodeWithSpecials(std::string_view text, bool parse_special) const;

  // Concatenated bytes of the tokens. With render_special=false, control and unknown tokens render
  // as nothing (llama.cpp's unparse_special=false). InvalidArgument for an id outside the
  // vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool render_special = true) const;

  // The bytes token `id` decodes to (control tokens as their text); empty for an invalid id.
  std::string_view TokenPiece(int32_t id) const;
  // The vocabulary entry of `id` (byte-level form for normal tokens); empty for an invalid id.
  std::string_view TokenText(int32_t id) const;
  // Exact lookup of a vocabulary entry (byte-level form for normal tokens).
  std::optional<int32_t> TokenId(std::string_view token_text) const;
  TokenType token_type(int32_t id) const;

  bool IsValid(int32_t id) const { return id >= 0 && id < vocab_size(); }
  // Whether byte `b` has a token of its own in the byte-level alphabet (see the round trip above:
  // a byte without one is dropped by Encode).
  bool ByteHasToken(uint8_t b) const { return byte_symbol_[b] < vocab_size(); }
  // Whether every merge's two parts and its result are tokens (the round trip's precondition).
  bool merges_closed() const { return merges_closed_; }
  // A lower bound on the tokens Encode makes of `text` (either parse_special), in one pass over
  // its bytes, for refusing a prompt far past the context before tokenizing it. With closed
  // merges no byte that has a token of its own is dropped, and no token covers more bytes than
  // the longest token's text: so at least (such bytes) / (longest token) tokens, halved again
  // for safety. 0 when the merges are not closed (Encode may then drop bytes) or `text` is not
  // UTF-8 (Encode replaces such bytes).
  int64_t MinTokensFor(std::string_view text) const;
  // Control or unknown (rendered only when render_special).
  bool IsControl(int32_t id) const;
  // End of generation: eos, eot, eom and the tokens llama.cpp recognizes by name (<|im_end|>,
  // <|eot_id|>, <|endoftext|>, ...).
  bool IsEndOfGeneration(int32_t id) const { return eog_ids_.contains(id); }
  const absl::flat_hash_set<int32_t>& end_of_generation_ids() const { return eog_ids_; }

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t eot_id() const { return eot_id_; }
  int32_t eom_id() const { return eom_id_; }
  int32_t unk_id() const { return unk_id_; }
  int32_t pad_id() const { return pad_id_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  PreTokenizerType pre_tokenizer() const { return pre_; }
  const std::string& chat_template() const { return chat_template_; }

 private:
  // Token attribute bits (llama.cpp's llama_token_attr subset).
  enum Attr : uint8_t {
    kAttrUndefined = 0,
    kAttrUnknown = 1 << 0,
    kAttrUnused = 1 << 1,
    kAttrNormal = 1 << 2,
    kAttrControl = 1 << 3,
    kAttrUserDefined = 1 << 4,
    kAttrByte = 1 << 5,
  };
  struct Merge {
    int32_t rank;
    int32_t result;  // symbol id
  };
  struct Workspace;

  Tokenizer() = default;
  absl::Status Init(TokenizerSpec spec);
  // Symbol ids: vocabulary ids, or vocab_size() + k for strings that occur in merges or the byte
  // alphabet without being in the vocabulary.
  int32_t InternSymbol(const std::string& text);
  // `ends` (when not null) gets, per token, the end offset of its bytes in the text, plus `base`.
  void EncodeRaw(std::string_view text, size_t base, Workspace* ws, std::vector<int32_t>* out,
                 std::vector<size_t>* ends) const;
  void EncodeWord(Workspace* ws, std::vector<int32_t>* out, std::vector<size_t>* ends) const;
  void EmitSymbol(int32_t symbol, size_t end, std::vector<int32_t>* out,
                  std::vector<size_t>* ends) const;

  PreTokenizerType pre_ = PreTokenizerType::kGpt2;
  bool ignore_merges_ = false;
  bool merges_closed_ = true;
  std::vector<std::string> tokens_;
  std::vector<uint8_t> attrs_;
  std::vector<std::string> pieces_;  // decoded bytes per token
  size_t max_token_bytes_ = 1;       // the longest token text or piece (MinTokensFor)
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  // Virtual symbols (not in the vocabulary) and what llama.cpp emits for them.
  absl::flat_hash_map<std::string, int32_t> virtual_to_id_;
  std::vector<std::vector<int32_t>> virtual_fallback_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_symbol_{};
  std::array<std::string, 256> byte_chars_;  // GPT-2 bytes_to_unicode, UTF-8
  // Control / user-defined / unknown token ids, longest text first (ties by id).
  std::vector<int32_t> special_tokens_;
  absl::flat_hash_set<int32_t> eog_ids_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t eot_id_ = -1;
  int32_t eom_id_ = -1;
  int32_t unk_id_ = -1;
  int32_t pad_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  std::string chat_template_;
};

// Incremental detokenizer for streaming generation: feed one id at a time, get back only complete
// UTF-8. Bytes of a multi-byte character split across tokens are held back until the token that
// completes them arrives. Bytes that can never become valid UTF-8 are passed through as they are
// (or as U+FFFD with replace_invalid), so output is never stuck.
class StreamingDecoder {
 public:
  struct Options {
    bool render_special = true;    // as in Tokenizer::Decode
    bool replace_invalid = false;  // emit U+FFFD for each byte that can never be valid UTF-8
  };
  // `tokenizer` must outlive the decoder.
  explicit StreamingDecoder(const Tokenizer* tokenizer) : StreamingDecoder(tokenizer, Options{}) {}
  StreamingDecoder(const Tokenizer* tokenizer, Options options)
      : tokenizer_(tokenizer), options_(options) {}

  // Appends token `id`; returns the text completed by it (possibly empty). InvalidArgument (and no
  // state change) for an id outside the vocabulary.
  absl::StatusOr<std::string> Push(int32_t id);
  // Returns whatever is held back (an incomplete trailing sequence) and clears it.
  std::string Flush();
  void Reset() { pending_.clear(); }
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string TakeComplete(size_t n);
  const Tokenizer* tokenizer_;
  Options options_;
  std::string pending_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_TOKENIZER_H_
