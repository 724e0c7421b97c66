#include "services/worker/model/tokenizer/tokenizer_spec.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/mapped_file.h"
#include "services/worker/model/tokenizer/json_field.h"
#include "services/worker/model/tokenizer/pre_tokenizer.h"

namespace lazyattn {
namespace {

using Json = nlohmann::json;

// The Llama-3 split regex as it appears in tokenizer.json (model.pre_tokenizer).
constexpr std::string_view kLlama3Regex =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)re"
    R"re( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// The llama-bpe family: llama.cpp turns add_bos and ignore_merges on by default for it
// (llama_vocab::impl::load).
bool IsLlamaBpeFamily(std::string_view pre) {
  absl::StatusOr<PreTokenizerType> type = PreTokenizerTypeFromName(pre);
  return type.ok() && *type == PreTokenizerType::kLlama3;
}

// "a b" -> (a, b), splitting at the first space after the first byte (llama.cpp's rule, which
// lets a merge's left part start with a space).
bool SplitMerge(std::string_view merge, std::pair<std::string, std::string>* out) {
  const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string_view::npos;
  if (space == std::string_view::npos) return false;
  out->first.assign(merge.substr(0, space));
  out->second.assign(merge.substr(space + 1));
  return true;
}

int32_t ToTokenId(int64_t value) {
  return (value >= 0 && value <= INT32_MAX) ? static_cast<int32_t>(value) : -1;
}

// Optional integer key: -1 when absent.
absl::StatusOr<int32_t> OptionalId(const GgufFile& gguf, std::string_view key) {
  if (!gguf.Has(key)) return -1;
  ASSIGN_OR_RETURN(int64_t value, gguf.GetInt(key));
  return ToTokenId(value);
}

// The whole file, refused when larger than kMaxTokenizerJsonBytes (read one byte past the limit at
// most, never the whole of a huge file).
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  RETURN_IF_ERROR(RefuseIfNotRegularFile(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string text;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > static_cast<uintmax_t>(kMaxTokenizerJsonBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", size, " bytes, more than the ",
                                                   kMaxTokenizerJsonBytes,
                                                   " a tokenizer file may have"));
  }
  char buf[1 << 16];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (static_cast<int64_t>(text.size()) > kMaxTokenizerJsonBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": more than the ",
                                                     kMaxTokenizerJsonBytes,
                                                     " bytes a tokenizer file may have"));
    }
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return text;
}

std::string IdExpected() { return absl::StrCat("an integer id in [0, ", kMaxTokenizerVocab, ")"); }

// A token id: an integer in [0, kMaxTokenizerVocab), checked before it is converted (a float or a
// huge value would otherwise wrap or be undefined); -1 when it is not one.
int64_t TokenIdOrMinusOne(const Json& v) {
  const bool ok = (v.is_number_unsigned() &&
                   v.get<uint64_t>() < static_cast<uint64_t>(kMaxTokenizerVocab)) ||
                  (v.is_number_integer() && v.get<int64_t>() >= 0 &&
                   v.get<int64_t>() < kMaxTokenizerVocab);
  return ok ? v.get<int64_t>() : -1;
}

absl::StatusOr<int64_t> TokenIdOf(const JsonField& field) {
  if (!field.is_set()) return field.Error("missing");
  const int64_t id = TokenIdOrMinusOne(field.json());
  if (id < 0) return field.TypeError(IdExpected());
  return id;
}

// Symbols (code points) of a token in byte-level form: one per byte of the text it stands for.
size_t SymbolCount(std::string_view token) {
  return static_cast<size_t>(std::count_if(token.begin(), token.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

// The id of the token `content`; -1 when there is none or `content` is empty.
int32_t IdOfToken(const TokenizerSpec& spec, const std::string& content) {
  if (content.empty()) return -1;
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    if (spec.tokens[i] == content) return static_cast<int32_t>(i);
  }
  return -1;
}

// The convert script's does_token_look_special().
bool LooksSpecial(std::string_view t) {
  const auto wrapped = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.substr(0, open.size()) == open &&
           t.substr(t.size() - close.size()) == close;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrapped("<|", "|>") ||
         wrapped("<｜", "｜>") || wrapped("<unused", ">");
}

std::string TypeOf(const JsonField& j) {
  if (!j.is_set()) return "null";
  const Json& type = j.Get("type").json();
  return type.is_string() ? type.get<std::string>() : "?";
}

absl::StatusOr<bool> IsPlainByteLevel(const JsonField& j, bool use_regex) {
  if (TypeOf(j) != "ByteLevel") return false;
  ASSIGN_OR_RETURN(const bool add_prefix_space, j.Get("add_prefix_space").BoolOr(false));
  ASSIGN_OR_RETURN(const bool regex, j.Get("use_regex").BoolOr(true));
  return !add_prefix_space && regex == use_regex;
}

// Recognizes the pre-tokenizer from the structure of tokenizer.json's "pre_tokenizer".
absl::StatusOr<std::string> DetectPreTokenizer(const JsonField& pre) {
  std::vector<JsonField> parts;
  if (TypeOf(pre) == "Sequence") {
    const JsonField list = pre.Get("pretokenizers");
    RETURN_IF_ERROR(list.ExpectArray());
    for (size_t i = 0; i < list.json().size(); ++i) parts.push_back(list.At(i));
  } else if (pre.is_set()) {
    parts.push_back(pre);
  }
  if (parts.size() == 2 && TypeOf(parts[0]) == "Digits") {
    ASSIGN_OR_RETURN(const bool individual, parts[0].Get("individual_digits").BoolOr(false));
    ASSIGN_OR_RETURN(const bool byte_level, IsPlainByteLevel(parts[1], true));
    if (individual && byte_level) return std::string("smollm");
  }
  if (parts.size() == 2 && TypeOf(parts[0]) == "Split") {
    const JsonField& split = parts[0];
    ASSIGN_OR_RETURN(const bool byte_level, IsPlainByteLevel(parts[1], false));
    const Json& regex = split.Get("pattern").Get("Regex").json();
    const bool regex_ok = regex.is_string() && regex.get<std::string>() == kLlama3Regex;
    ASSIGN_OR_RETURN(const std::string behavior, split.Get("behavior").StringOr(""));
    ASSIGN_OR_RETURN(const bool invert, split.Get("invert").BoolOr(false));
    if (byte_level && regex_ok && behavior == "Isolated" && !invert) {
      return std::string("llama-bpe");
    }
  }
  if (parts.size() == 1) {
    ASSIGN_OR_RETURN(const bool byte_level, IsPlainByteLevel(parts[0], true));
    if (byte_level) return std::string("gpt2");
  }

  std::vector<std::string> names;
  for (const JsonField& p : parts) names.push_back(TypeOf(p));
  return absl::UnimplementedError(absl::StrCat(
      pre.file(), ": unsupported pre_tokenizer ", TypeOf(pre), "[", absl::StrJoin(names, ", "),
      "]; supported: Sequence[Digits(individual_digits), ByteLevel] (smollm), "
      "Sequence[Split(Llama-3 regex), ByteLevel(use_regex=false)] (llama-bpe), ByteLevel (gpt2)"));
}

// One entry of the vocabulary being assembled, by id.
struct VocabEntry {
  std::string text;  // as it goes into TokenizerSpec::tokens
  TokenType type = TokenType::kNormal;
  std::string raw;    // as written in the file, for comparisons and messages
  std::string where;  // "model.vocab" or "added_tokens[3]"
};
using VocabById = std::map<int64_t, VocabEntry>;

// Merges: "a b" strings or [a, b] pairs, as Hugging Face tokenizers reads them.
absl::Status ReadMerges(const JsonField& model, const VocabById& by_id, TokenizerSpec* spec) {
  // Hugging Face tokenizers refuses a BPE model without merges ("Missing vocab/merges") and reads
  // them only from a list; without them every prompt would be split into single bytes, unlike the
  // model's own tokenizer.
  const JsonField merges = model.Get("merges");
  if (!merges.is_set()) {
    return merges.Error("missing (a BPE model needs its merges, as the list of \"a b\" rules)");
  }
  RETURN_IF_ERROR(merges.ExpectArray());
  const Json& list = merges.json();
  if (static_cast<int64_t>(list.size()) > kMaxTokenizerMerges) {
    return merges.Error(
        absl::StrCat(list.size(), " entries, more than the ", kMaxTokenizerMerges, " allowed"));
  }
  if (list.empty()) {
    // An explicitly empty list is legitimate for a vocabulary of single symbols only (a byte- or
    // character-level BPE, which Hugging Face loads too): nothing is ever merged. A token of
    // several symbols in model.vocab, though, can only come from a merge, so with no merges it is
    // unreachable and the list was lost (e.g. by a converter). Added tokens are matched whole and
    // need no merges.
    // Special tokens listed only in model.vocab ("<unk>", "[PAD]", "<|endoftext|>") are not
    // merge products either.
    const auto bracketed = [](std::string_view t) {
      return t.size() >= 3 &&
             ((t.front() == '<' && t.back() == '>') || (t.front() == '[' && t.back() == ']'));
    };
    for (const auto& [id, entry] : by_id) {
      if (entry.type == TokenType::kNormal && SymbolCount(entry.text) > 1 &&
          !LooksSpecial(entry.text) && !bracketed(entry.text)) {
        return merges.Error(absl::StrCat(
            "empty, but model.vocab has tokens of several symbols that only merges can produce "
            "(e.g. ",
            JsonField::Shown(Json(entry.raw)), ", id ", id, ")"));
      }
    }
  }
  spec->merges.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& m = list[i];
    std::pair<std::string, std::string> merge;
    if (m.is_string()) {
      if (!SplitMerge(m.get_ref<const std::string&>(), &merge)) {
        return merges.At(i).Error(
            absl::StrCat("malformed merge ", JsonField::Shown(m), " (expected \"a b\")"));
      }
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merge = {m[0].get<std::string>(), m[1].get<std::string>()};
    } else {
      return merges.At(i).TypeError("a merge, \"a b\" or [\"a\", \"b\"]");
    }
    spec->merges.push_back(std::move(merge));
  }
  return absl::OkStatus();
}

// model.vocab and added_tokens, by id. Two different strings with one id are refused: one of them
// would silently disappear (Hugging Face itself gives an added token whose id is taken another id,
// so the file's ids would not be the model's either).
absl::StatusOr<VocabById> ReadVocab(const JsonField& root, const JsonField& model) {
  const JsonField vocab = model.Get("vocab");
  RETURN_IF_ERROR(vocab.ExpectObject());
  VocabById by_id;
  for (auto it = vocab.json().begin(); it != vocab.json().end(); ++it) {
    const int64_t id = TokenIdOrMinusOne(it.value());
    if (id < 0) {
      return vocab.Error(absl::StrCat(JsonField::Shown(Json(it.key())), ": expected ", IdExpected(),
                                      ", got ", JsonField::Described(it.value())));
    }
    auto [at, inserted] =
        by_id.try_emplace(id, VocabEntry{it.key(), TokenType::kNormal, it.key(), "model.vocab"});
    if (!inserted) {
      return vocab.Error(absl::StrCat(JsonField::Shown(Json(at->second.raw)), " and ",
                                      JsonField::Shown(Json(it.key())), " both have id ", id));
    }
  }
  const JsonField added_tokens = root.Get("added_tokens");
  if (!added_tokens.is_set()) return by_id;
  RETURN_IF_ERROR(added_tokens.ExpectArray());
  for (size_t i = 0; i < added_tokens.json().size(); ++i) {
    const JsonField added = added_tokens.At(i);
    RETURN_IF_ERROR(added.ExpectObject());
    ASSIGN_OR_RETURN(const int64_t id, TokenIdOf(added.Get("id")));
    ASSIGN_OR_RETURN(const std::string raw, added.Get("content").String());
    ASSIGN_OR_RETURN(const bool special, added.Get("special").BoolOr(false));
    std::string content = raw;
    TokenType type = TokenType::kControl;
    if (!special && !LooksSpecial(content)) {
      type = TokenType::kUserDefined;
      // The converter pre-normalizes user-defined spaces ("▁" -> " ").
      for (size_t p = content.find("\xE2\x96\x81"); p != std::string::npos;
           p = content.find("\xE2\x96\x81", p + 1)) {
        content.replace(p, 3, " ");
      }
    }
    // The same token in model.vocab and added_tokens (the usual case for special tokens) is one
    // token: the added entry gives its type.
    auto it = by_id.find(id);
    if (it != by_id.end() && it->second.raw != raw) {
      return added.Error(absl::StrCat(JsonField::Shown(Json(raw)), " and ",
                                      JsonField::Shown(Json(it->second.raw)), " (",
                                      it->second.where, ") both have id ", id));
    }
    by_id[id] = VocabEntry{std::move(content), type, raw, added.path()};
  }
  return by_id;
}

// The BOS that post_processor puts first (Llama-3's TemplateProcessing starts with
// <|begin_of_text|>); empty when none.
absl::StatusOr<std::string> PostProcessorBos(const JsonField& root) {
  const JsonField post = root.Get("post_processor");
  std::vector<JsonField> processors;
  if (TypeOf(post) == "Sequence") {
    const JsonField list = post.Get("processors");
    RETURN_IF_ERROR(list.ExpectArray());
    for (size_t i = 0; i < list.json().size(); ++i) processors.push_back(list.At(i));
  } else if (post.is_set()) {
    processors.push_back(post);
  }
  std::string bos;
  for (const JsonField& p : processors) {
    if (TypeOf(p) != "TemplateProcessing") continue;
    const JsonField single = p.Get("single");
    if (!single.is_set()) continue;
    RETURN_IF_ERROR(single.ExpectArray());
    const JsonField first = single.At(0);
    if (!first.json().is_object() || !first.json().contains("SpecialToken")) continue;
    const JsonField special = first.Get("SpecialToken");
    RETURN_IF_ERROR(special.ExpectObject());
    ASSIGN_OR_RETURN(bos, special.Get("id").String());
  }
  return bos;
}

// Parses `text` as the JSON object of the file `path`.
absl::StatusOr<Json> ParseObject(const std::string& text, const std::string& path) {
  Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return root;
}

absl::StatusOr<TokenizerSpec> ParseTokenizerJson(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  ASSIGN_OR_RETURN(const Json root_json, ParseObject(text, path));
  const JsonField root(root_json, path);
  TokenizerSpec spec;
  spec.source = path;
  const JsonField model = root.Get("model");
  RETURN_IF_ERROR(model.ExpectObject());
  const std::string model_type = TypeOf(model);
  if (model_type != "BPE") {
    return absl::UnimplementedError(absl::StrCat(path, ": tokenizer model type \"", model_type,
                                                 "\" is not supported (only \"BPE\")"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
    const Json& option = model.Get(key).json();
    if (!option.is_null() && !(option.is_string() && option.get<std::string>().empty())) {
      return absl::UnimplementedError(
          absl::StrCat(path, ": BPE option model.", key, " is not supported"));
    }
  }
  if (root.Get("normalizer").is_set()) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": normalizer ", TypeOf(root.Get("normalizer")), " is not supported"));
  }
  spec.model = "gpt2";
  ASSIGN_OR_RETURN(spec.pre, DetectPreTokenizer(root.Get("pre_tokenizer")));
  ASSIGN_OR_RETURN(const bool ignore_merges,
                   model.Get("ignore_merges").BoolOr(IsLlamaBpeFamily(spec.pre)));
  if (ignore_merges != IsLlamaBpeFamily(spec.pre)) {
    return absl::UnimplementedError(absl::StrCat(path, ": model.ignore_merges=", ignore_merges,
                                                 " is not supported with pre-tokenizer ",
                                                 spec.pre));
  }

  ASSIGN_OR_RETURN(VocabById by_id, ReadVocab(root, model));
  if (by_id.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty vocabulary"));
  const int64_t n = by_id.rbegin()->first + 1;
  spec.tokens.resize(n);
  spec.token_types.assign(n, static_cast<int32_t>(TokenType::kUnused));
  for (int64_t id = 0; id < n; ++id) spec.tokens[id] = absl::StrCat("[PAD", id, "]");
  RETURN_IF_ERROR(ReadMerges(model, by_id, &spec));
  for (auto& [id, entry] : by_id) {
    spec.tokens[id] = std::move(entry.text);
    spec.token_types[id] = static_cast<int32_t>(entry.type);
  }

  ASSIGN_OR_RETURN(const std::string post_bos, PostProcessorBos(root));
  spec.add_bos = IsLlamaBpeFamily(spec.pre) || !post_bos.empty();
  if (!post_bos.empty()) spec.bos_id = IdOfToken(spec, post_bos);
  return spec;
}

// tokenizer_config.json: special tokens, add_bos_token/add_eos_token and chat_template, over what
// tokenizer.json said.
absl::Status ParseTokenizerConfig(const std::string& path, TokenizerSpec* spec) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  ASSIGN_OR_RETURN(const Json config_json, ParseObject(text, path));
  const JsonField config(config_json, path);
  // A special token is "text" or {"content": "text", ...} (an AddedToken).
  const auto special_id = [&](const char* key) -> absl::StatusOr<int32_t> {
    const JsonField token = config.Get(key);
    if (!token.is_set()) return -1;
    if (token.json().is_string()) return IdOfToken(*spec, token.json().get<std::string>());
    if (!token.json().is_object()) {
      return token.TypeError("a string or an object with a \"content\" string");
    }
    ASSIGN_OR_RETURN(const std::string content, token.Get("content").String());
    return IdOfToken(*spec, content);
  };
  ASSIGN_OR_RETURN(const int32_t bos_id, special_id("bos_token"));
  ASSIGN_OR_RETURN(const int32_t eos_id, special_id("eos_token"));
  ASSIGN_OR_RETURN(const int32_t unk_id, special_id("unk_token"));
  ASSIGN_OR_RETURN(const int32_t pad_id, special_id("pad_token"));
  if (bos_id >= 0) spec->bos_id = bos_id;
  if (eos_id >= 0) spec->eos_id = eos_id;
  if (unk_id >= 0) spec->unk_id = unk_id;
  if (pad_id >= 0) spec->pad_id = pad_id;
  ASSIGN_OR_RETURN(spec->add_bos, config.Get("add_bos_token").BoolOr(spec->add_bos));
  ASSIGN_OR_RETURN(spec->add_eos, config.Get("add_eos_token").BoolOr(spec->add_eos));

  const JsonField chat_template = config.Get("chat_template");
  if (!chat_template.is_set()) return absl::OkStatus();
  if (chat_template.json().is_string()) {
    spec->chat_template = chat_template.json().get<std::string>();
    return absl::OkStatus();
  }
  if (!chat_template.json().is_array()) {
    return chat_template.TypeError("a string or an array of {\"name\": ..., \"template\": ...}");
  }
  // [{"name": ..., "template": ...}]: the one named "default", else the first (transformers
  // requires both keys in every entry).
  for (size_t i = 0; i < chat_template.json().size(); ++i) {
    const JsonField entry = chat_template.At(i);
    RETURN_IF_ERROR(entry.ExpectObject());
    ASSIGN_OR_RETURN(const std::string name, entry.Get("name").StringOr(""));
    ASSIGN_OR_RETURN(std::string text_of_entry, entry.Get("template").String());
    if (spec->chat_template.empty() || name == "default") {
      spec->chat_template = std::move(text_of_entry);
    }
  }
  return absl::OkStatus();
}

// nlohmann::json throws on some misuses; every read above goes through JsonField, so this is a
// last guard that keeps an exception from escaping, naming the file being read.
template <typename Fn>
auto NoThrow(const std::string& path, Fn fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed JSON: ", e.what()));
  }
}

}  // namespace

absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& gguf) {
  TokenizerSpec spec;
  spec.source = gguf.path();
  ASSIGN_OR_RETURN(spec.model, gguf.GetString("tokenizer.ggml.model"));
  if (spec.model != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat(gguf.path(), ": tokenizer.ggml.model \"", spec.model,
                     "\" is not supported (only \"gpt2\", byte-level BPE)"));
  }
  if (!gguf.Has("tokenizer.ggml.pre")) {
    return absl::InvalidArgumentError(
        absl::StrCat(gguf.path(),
                     ": tokenizer.ggml.pre is missing (llama.cpp would fall back to "
                     "its lossy 'default' pre-tokenizer); regenerate the GGUF"));
  }
  ASSIGN_OR_RETURN(spec.pre, gguf.GetString("tokenizer.ggml.pre"));
  ASSIGN_OR_RETURN(spec.tokens, gguf.GetStringArray("tokenizer.ggml.tokens"));
  if (static_cast<int64_t>(spec.tokens.size()) > kMaxTokenizerVocab) {
    return absl::InvalidArgumentError(absl::StrCat(gguf.path(), ": tokenizer.ggml.tokens has ",
                                                   spec.tokens.size(), " tokens, more than ",
                                                   kMaxTokenizerVocab));
  }
  if (gguf.Has("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(std::vector<int64_t> types, gguf.GetIntArray("tokenizer.ggml.token_type"));
    spec.token_types.reserve(types.size());
    for (int64_t t : types) {
      spec.token_types.push_back(t >= INT32_MIN && t <= INT32_MAX ? static_cast<int32_t>(t) : 0);
    }
  }
  ASSIGN_OR_RETURN(std::vector<std::string> merges, gguf.GetStringArray("tokenizer.ggml.merges"));
  if (static_cast<int64_t>(merges.size()) > kMaxTokenizerMerges) {
    return absl::InvalidArgumentError(absl::StrCat(gguf.path(), ": tokenizer.ggml.merges has ",
                                                   merges.size(), " entries, more than ",
                                                   kMaxTokenizerMerges));
  }
  spec.merges.reserve(merges.size());
  for (const std::string& m : merges) {
    std::pair<std::string, std::string> merge;
    // llama.cpp keeps a malformed merge as ("", ""), which never matches; so do we.
    if (!SplitMerge(m, &merge)) merge = {"", ""};
    spec.merges.push_back(std::move(merge));
  }
  ASSIGN_OR_RETURN(spec.bos_id, OptionalId(gguf, "tokenizer.ggml.bos_token_id"));
  ASSIGN_OR_RETURN(spec.eos_id, OptionalId(gguf, "tokenizer.ggml.eos_token_id"));
  ASSIGN_OR_RETURN(spec.unk_id, OptionalId(gguf, "tokenizer.ggml.unknown_token_id"));
  ASSIGN_OR_RETURN(spec.pad_id, OptionalId(gguf, "tokenizer.ggml.padding_token_id"));
  ASSIGN_OR_RETURN(spec.eot_id, OptionalId(gguf, "tokenizer.ggml.eot_token_id"));
  ASSIGN_OR_RETURN(spec.eom_id, OptionalId(gguf, "tokenizer.ggml.eom_token_id"));
  spec.add_bos = IsLlamaBpeFamily(spec.pre);
  if (gguf.Has("tokenizer.ggml.add_bos_token")) {
    ASSIGN_OR_RETURN(spec.add_bos, gguf.GetBool("tokenizer.ggml.add_bos_token"));
  }
  if (gguf.Has("tokenizer.ggml.add_eos_token")) {
    ASSIGN_OR_RETURN(spec.add_eos, gguf.GetBool("tokenizer.ggml.add_eos_token"));
  }
  if (gguf.Has("tokenizer.chat_template")) {
    ASSIGN_OR_RETURN(spec.chat_template, gguf.GetString("tokenizer.chat_template"));
  }
  return spec;
}

absl::StatusOr<TokenizerSpec> TokenizerSpecFromTokenizerJson(const std::string& path) {
  ASSIGN_OR_RETURN(TokenizerSpec spec, NoThrow(path, [&] { return ParseTokenizerJson(path); }));
  const std::string config_path =
      (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    RETURN_IF_ERROR(NoThrow(config_path, [&] { return ParseTokenizerConfig(config_path, &spec); }));
  }
  return spec;
}

}  // namespace lazyattn
