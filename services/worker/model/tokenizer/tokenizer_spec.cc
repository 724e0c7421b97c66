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

// A JSON value for an error message: scalars as written (cut at 64 bytes; invalid UTF-8
// replaced rather than thrown on), containers by kind only (dumping one is recursive and could be
// huge).
std::string Shown(const Json& v) {
  if (v.is_structured()) return v.is_array() ? "an array" : "an object";
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 64) s = s.substr(0, 64) + "...";
  return s;
}

// A token id from tokenizer.json: an integer in [0, kMaxTokenizerVocab), checked before it is
// converted (a float or a huge value would otherwise wrap or be undefined).
absl::StatusOr<int64_t> TokenIdOf(const Json& v, const std::string& path, absl::string_view what) {
  const bool ok = (v.is_number_unsigned() &&
                   v.get<uint64_t>() < static_cast<uint64_t>(kMaxTokenizerVocab)) ||
                  (v.is_number_integer() && v.get<int64_t>() >= 0 &&
                   v.get<int64_t>() < kMaxTokenizerVocab);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what, " id ", Shown(v),
                                                   ": must be an integer in [0, ",
                                                   kMaxTokenizerVocab, ")"));
  }
  return v.get<int64_t>();
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

std::string TypeOf(const Json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) {
    return j["type"].get<std::string>();
  }
  return j.is_null() ? "null" : "?";
}

bool BoolOr(const Json& j, const char* key, bool fallback) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return fallback;
  return j[key].get<bool>();
}

bool IsPlainByteLevel(const Json& j, bool use_regex) {
  return TypeOf(j) == "ByteLevel" && !BoolOr(j, "add_prefix_space", false) &&
         BoolOr(j, "use_regex", true) == use_regex;
}

// Recognizes the pre-tokenizer from the structure of tokenizer.json's "pre_tokenizer".
absl::StatusOr<std::string> DetectPreTokenizer(const Json& pre, const std::string& path) {
  std::vector<Json> parts;
  if (TypeOf(pre) == "Sequence" && pre.contains("pretokenizers") &&
      pre["pretokenizers"].is_array()) {
    for (const Json& p : pre["pretokenizers"]) parts.push_back(p);
  } else if (!pre.is_null()) {
    parts.push_back(pre);
  }
  if (parts.size() == 2 && TypeOf(parts[0]) == "Digits" &&
      BoolOr(parts[0], "individual_digits", false) && IsPlainByteLevel(parts[1], true)) {
    return std::string("smollm");
  }
  if (parts.size() == 2 && TypeOf(parts[0]) == "Split" && IsPlainByteLevel(parts[1], false)) {
    const Json& split = parts[0];
    const bool regex_ok = split.contains("pattern") && split["pattern"].is_object() &&
                          split["pattern"].contains("Regex") &&
                          split["pattern"]["Regex"].is_string() &&
                          split["pattern"]["Regex"].get<std::string>() == kLlama3Regex;
    const bool isolated =
        split.value("behavior", std::string()) == "Isolated" && !BoolOr(split, "invert", false);
    if (regex_ok && isolated) return std::string("llama-bpe");
  }
  if (parts.size() == 1 && IsPlainByteLevel(parts[0], true)) return std::string("gpt2");

  std::vector<std::string> names;
  for (const Json& p : parts) names.push_back(TypeOf(p));
  return absl::UnimplementedError(absl::StrCat(
      path, ": unsupported pre_tokenizer ", TypeOf(pre), "[", absl::StrJoin(names, ", "),
      "]; supported: Sequence[Digits(individual_digits), ByteLevel] (smollm), "
      "Sequence[Split(Llama-3 regex), ByteLevel(use_regex=false)] (llama-bpe), ByteLevel (gpt2)"));
}

// A special-token entry of tokenizer_config.json: "text" or {"content": "text", ...}.
std::string TokenContent(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return "";
}

absl::StatusOr<TokenizerSpec> ParseTokenizerJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  const Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  TokenizerSpec spec;
  spec.source = path;
  if (!root.contains("model") || !root["model"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": missing \"model\""));
  }
  const Json& model = root["model"];
  const std::string model_type = TypeOf(model);
  if (model_type != "BPE") {
    return absl::UnimplementedError(absl::StrCat(path, ": tokenizer model type \"", model_type,
                                                 "\" is not supported (only \"BPE\")"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty())) {
      return absl::UnimplementedError(
          absl::StrCat(path, ": BPE option model.", key, " is not supported"));
    }
  }
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": normalizer ", TypeOf(root["normalizer"]), " is not supported"));
  }
  spec.model = "gpt2";
  ASSIGN_OR_RETURN(
      spec.pre, DetectPreTokenizer(
                    root.contains("pre_tokenizer") ? root["pre_tokenizer"] : Json(nullptr), path));
  const bool ignore_merges = BoolOr(model, "ignore_merges", IsLlamaBpeFamily(spec.pre));
  if (ignore_merges != IsLlamaBpeFamily(spec.pre)) {
    return absl::UnimplementedError(absl::StrCat(path, ": model.ignore_merges=", ignore_merges,
                                                 " is not supported with pre-tokenizer ",
                                                 spec.pre));
  }

  // Vocabulary and added tokens.
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": missing model.vocab"));
  }
  std::map<int64_t, std::pair<std::string, TokenType>> by_id;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    ASSIGN_OR_RETURN(const int64_t id,
                     TokenIdOf(it.value(), path, absl::StrCat("model.vocab \"", it.key(), "\"")));
    by_id[id] = {it.key(), TokenType::kNormal};
  }
  if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
    for (const Json& added : root["added_tokens"]) {
      if (!added.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": added_tokens entry ", Shown(added), " is not an object"));
      }
      ASSIGN_OR_RETURN(const int64_t id, TokenIdOf(added.at("id"), path, "added_tokens"));
      std::string content = added.at("content").get<std::string>();
      const bool special = BoolOr(added, "special", false);
      TokenType type = TokenType::kControl;
      if (!special && !LooksSpecial(content)) {
        type = TokenType::kUserDefined;
        // The converter pre-normalizes user-defined spaces ("▁" -> " ").
        for (size_t p = content.find("\xE2\x96\x81"); p != std::string::npos;
             p = content.find("\xE2\x96\x81", p + 1)) {
          content.replace(p, 3, " ");
        }
      }
      by_id[id] = {std::move(content), type};
    }
  }
  if (by_id.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty vocabulary"));
  const int64_t n = by_id.rbegin()->first + 1;
  spec.tokens.resize(n);
  spec.token_types.assign(n, static_cast<int32_t>(TokenType::kUnused));
  for (int64_t id = 0; id < n; ++id) spec.tokens[id] = absl::StrCat("[PAD", id, "]");
  for (auto& [id, entry] : by_id) {
    spec.tokens[id] = std::move(entry.first);
    spec.token_types[id] = static_cast<int32_t>(entry.second);
  }

  // Merges: "a b" strings or [a, b] pairs.
  if (model.contains("merges") && model["merges"].is_array()) {
    if (static_cast<int64_t>(model["merges"].size()) > kMaxTokenizerMerges) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": model.merges has ",
                                                     model["merges"].size(), " entries, more than ",
                                                     kMaxTokenizerMerges));
    }
    for (const Json& m : model["merges"]) {
      std::pair<std::string, std::string> merge;
      if (m.is_string()) {
        if (!SplitMerge(m.get<std::string>(), &merge)) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": malformed merge \"", m.get<std::string>(), "\""));
        }
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merge = {m[0].get<std::string>(), m[1].get<std::string>()};
      } else {
        return absl::InvalidArgumentError(absl::StrCat(path, ": malformed merge ", Shown(m)));
      }
      spec.merges.push_back(std::move(merge));
    }
  }

  // BOS from the post-processor (Llama-3's TemplateProcessing starts with <|begin_of_text|>).
  std::string post_bos;
  if (root.contains("post_processor")) {
    std::vector<Json> processors = {root["post_processor"]};
    if (TypeOf(processors[0]) == "Sequence" && processors[0].contains("processors") &&
        processors[0]["processors"].is_array()) {
      processors.assign(processors[0]["processors"].begin(), processors[0]["processors"].end());
    }
    for (const Json& p : processors) {
      if (TypeOf(p) != "TemplateProcessing") continue;
      const Json single = p.value("single", Json::array());
      if (single.is_array() && !single.empty() && single[0].is_object() &&
          single[0].contains("SpecialToken")) {
        post_bos = single[0]["SpecialToken"].value("id", std::string());
      }
    }
  }
  spec.add_bos = IsLlamaBpeFamily(spec.pre) || !post_bos.empty();

  const auto id_of = [&spec](const std::string& content) -> int32_t {
    if (content.empty()) return -1;
    for (size_t i = 0; i < spec.tokens.size(); ++i) {
      if (spec.tokens[i] == content) return static_cast<int32_t>(i);
    }
    return -1;
  };
  if (!post_bos.empty()) spec.bos_id = id_of(post_bos);

  // tokenizer_config.json next to it.
  const std::filesystem::path config_path =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    ASSIGN_OR_RETURN(std::string config_text, ReadFile(config_path.string()));
    const Json config = Json::parse(config_text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path.string(), ": not a JSON object"));
    }
    const auto special_id = [&](const char* key) -> int32_t {
      return config.contains(key) ? id_of(TokenContent(config[key])) : -1;
    };
    if (int32_t id = special_id("bos_token"); id >= 0) spec.bos_id = id;
    if (int32_t id = special_id("eos_token"); id >= 0) spec.eos_id = id;
    if (int32_t id = special_id("unk_token"); id >= 0) spec.unk_id = id;
    if (int32_t id = special_id("pad_token"); id >= 0) spec.pad_id = id;
    spec.add_bos = BoolOr(config, "add_bos_token", spec.add_bos);
    spec.add_eos = BoolOr(config, "add_eos_token", spec.add_eos);
    if (config.contains("chat_template")) {
      const Json& t = config["chat_template"];
      if (t.is_string()) {
        spec.chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // [{"name": ..., "template": ...}], prefer "default"
        for (const Json& entry : t) {
          if (!entry.is_object() || !entry.contains("template")) continue;
          if (spec.chat_template.empty() || entry.value("name", std::string()) == "default") {
            spec.chat_template = entry["template"].get<std::string>();
          }
        }
      }
    }
  }
  return spec;
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
  // nlohmann::json throws on type mismatches (e.g. a vocab id that is a string); turn that into a
  // Status instead of letting it escape.
  try {
    return ParseTokenizerJson(path);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": malformed tokenizer JSON: ", e.what()));
  }
}

}  // namespace lazyattn
