// JsonField: typed, non-throwing access to a parsed JSON document (tokenizer.json,
// tokenizer_config.json) that remembers where each value sits, so that every error names the file
// and the key path ("/m/tokenizer_config.json: add_bos_token: expected a boolean, got a string
// ("true")").
//
// Contract:
// - A JsonField refers into a document it does not own: the nlohmann::json it was made from must
//   outlive it and every field taken from it.
// - Nothing here throws (nlohmann's get<T>() throws on a type mismatch, and its message names
//   neither the file nor the key). Every error is InvalidArgument "<file>: <path>: <what>".
// - A key that is absent and a key whose value is null are treated alike ("not set"), as Hugging
//   Face writes null for options left at their default.
// - Key paths: object members joined with '.', array elements as [i] ("added_tokens[3].special").
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_JSON_FIELD_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_JSON_FIELD_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace lazyattn {

class JsonField {
 public:
  // The whole document read from `file` (the name errors start with).
  JsonField(const nlohmann::json& root, std::string file);

  // Member `key` of an object; not set when this is not an object or has no such member.
  JsonField Get(absl::string_view key) const;
  // Element `index` of an array; not set when this is not an array or is shorter.
  JsonField At(size_t index) const;

  // False when absent or null.
  bool is_set() const { return value_ != nullptr && !value_->is_null(); }
  // The value itself (null when absent).
  const nlohmann::json& json() const;
  const std::string& path() const { return path_; }
  const std::string& file() const { return file_; }

  // Typed reads; errors name the path and what was found. The *Or forms return `fallback` when the
  // field is not set, the others fail with "missing".
  absl::StatusOr<bool> Bool() const;
  absl::StatusOr<bool> BoolOr(bool fallback) const;
  absl::StatusOr<std::string> String() const;
  absl::StatusOr<std::string> StringOr(std::string fallback) const;
  // OK when the value is set and of that kind.
  absl::Status ExpectObject() const;
  absl::Status ExpectArray() const;

  // InvalidArgument "<file>: <path>: <what>" ("<file>: <what>" at the root).
  absl::Status Error(absl::string_view what) const;
  // Error("expected <expected>, got <kind of the value> (<value>)").
  absl::Status TypeError(absl::string_view expected) const;

  // A value for an error message: scalars as written (cut at 64 bytes, invalid UTF-8 replaced),
  // containers by kind only (dumping one is recursive and could be huge).
  static std::string Shown(const nlohmann::json& value);
  // "a string", "an integer", "an object", "null", ...
  static absl::string_view KindOf(const nlohmann::json& value);
  // Kind and value: "a string ("true")", "an integer (7)", "an object", "null".
  static std::string Described(const nlohmann::json& value);

 private:
  JsonField(const nlohmann::json* value, std::string file, std::string path);

  const nlohmann::json* value_;  // nullptr when absent
  std::string file_;
  std::string path_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_JSON_FIELD_H_
