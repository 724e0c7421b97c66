// TokenizerSpec: everything needed to build a Tokenizer, as plain data, and the adapters that
// read it from a GGUF file or from a Hugging Face tokenizer.json.
//
// Contract:
// - The adapters only read and reshape; validation of the content (model type, pre-tokenizer,
//   ids in range, duplicates...) happens in Tokenizer::Create so that hand-built specs get the same
//   checks. The adapters fail (never abort) with InvalidArgument / NotFound / Unimplemented when a
//   required key is missing, has the wrong type, or describes something we do not support, and the
//   message names the file and the key.
// - Sizes are bounded before anything is sized by them: at most kMaxTokenizerVocab tokens (every
//   token id below it), kMaxTokenizerMerges merges, a tokenizer.json or tokenizer_config.json of
//   at most kMaxTokenizerJsonBytes; GGUF arrays are already bounded by the file (gguf_file.h).
//   Past a bound: InvalidArgument naming the file and the key.
// - Token ids are int32_t; -1 means "none".
// - Errors from tokenizer.json / tokenizer_config.json name the file they come from and the key
//   path ("tokenizer.json: added_tokens[3].special: expected a boolean, got a string ("yes")").
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_TOKENIZER_SPEC_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_TOKENIZER_SPEC_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace lazyattn {

class GgufFile;

// Equal to kMaxVocabSize (model_config.h), which the model loader checks.
inline constexpr int64_t kMaxTokenizerVocab = int64_t{1} << 21;
inline constexpr int64_t kMaxTokenizerMerges = int64_t{1} << 22;
// The largest tokenizer.json we know of (Gemma's, 256K tokens) is about 34 MB.
inline constexpr int64_t kMaxTokenizerJsonBytes = int64_t{256} << 20;

// GGUF token types (tokenizer.ggml.token_type), as llama.cpp defines them.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct TokenizerSpec {
  // tokenizer.ggml.model. Only "gpt2" (byte-level BPE) is supported.
  std::string model = "gpt2";
  // tokenizer.ggml.pre: "smollm", "llama-bpe", "gpt2", ... (see pre_tokenizer.h).
  std::string pre;
  // Vocabulary, indexed by id. Normal tokens are in GPT-2 byte-level form ("Ġthe"); control and
  // user-defined tokens are their literal text ("<|im_start|>").
  std::vector<std::string> tokens;
  // One TokenType value per token; empty means all kNormal.
  std::vector<int32_t> token_types;
  // BPE merges in rank order (index = rank), as (left, right) in byte-level form.
  std::vector<std::pair<std::string, std::string>> merges;

  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  int32_t eot_id = -1;  // end of turn (<|eot_id|>, <|im_end|>); auto-detected by text when -1
  int32_t eom_id = -1;  // end of message (<|eom_id|>); auto-detected by text when -1
  bool add_bos = false;
  bool add_eos = false;

  // Jinja chat template from the model (tokenizer.chat_template), empty when absent.
  std::string chat_template;
  // Where the spec came from, for error messages ("model.gguf", ".../tokenizer.json").
  std::string source;
};

// Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,*_token_id,add_bos_token,
// add_eos_token} and tokenizer.chat_template. Defaults follow llama.cpp: add_bos is true for the
// llama-bpe family and false otherwise unless tokenizer.ggml.add_bos_token says so.
absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& gguf);

// Reads a Hugging Face tokenizer.json (model.type "BPE" with a ByteLevel pre-tokenizer) and, when
// it exists, the tokenizer_config.json next to it (bos/eos tokens, add_bos_token/add_eos_token,
// chat_template). model.merges is required, as Hugging Face requires it: a list of "a b" strings
// or [a, b] pairs; an empty list only when no model.vocab token (added tokens aside) has more
// than one symbol. Two
// different tokens with one id (in model.vocab, or an added token on another token's id) are
// refused: one of them would be lost. (A GGUF vocabulary is indexed by id, so it cannot have this;
// the same text at two ids is refused by Tokenizer::Create.) Added tokens become control tokens
// when marked special (or when they look special: <|...|>), user-defined tokens otherwise, as
// llama.cpp's converter does. The pre-tokenizer is recognized from its structure:
//   Sequence[Digits(individual_digits), ByteLevel(use_regex)]            -> "smollm"
//   Sequence[Split(<Llama-3 regex>), ByteLevel(use_regex=false)]          -> "llama-bpe"
//   ByteLevel(use_regex)                                                  -> "gpt2"
// anything else is Unimplemented naming what was found.
absl::StatusOr<TokenizerSpec> TokenizerSpecFromTokenizerJson(const std::string& path);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_TOKENIZER_SPEC_H_
