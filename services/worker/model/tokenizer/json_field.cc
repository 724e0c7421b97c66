#include "services/worker/model/tokenizer/json_field.h"

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lazyattn {
namespace {

using Json = nlohmann::json;

const Json& NullJson() {
  static const Json* const kNull = new Json(nullptr);
  return *kNull;
}

}  // namespace

JsonField::JsonField(const Json& root, std::string file) : value_(&root), file_(std::move(file)) {}

JsonField::JsonField(const Json* value, std::string file, std::string path)
    : value_(value), file_(std::move(file)), path_(std::move(path)) {}

const Json& JsonField::json() const { return value_ != nullptr ? *value_ : NullJson(); }

JsonField JsonField::Get(absl::string_view key) const {
  const Json* child = nullptr;
  if (value_ != nullptr && value_->is_object()) {
    auto it = value_->find(std::string_view(key.data(), key.size()));
    if (it != value_->end()) child = &*it;
  }
  return JsonField(child, file_, path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key));
}

JsonField JsonField::At(size_t index) const {
  const Json* child = nullptr;
  if (value_ != nullptr && value_->is_array() && index < value_->size()) {
    child = &(*value_)[index];
  }
  return JsonField(child, file_, absl::StrCat(path_, "[", index, "]"));
}

absl::StatusOr<bool> JsonField::Bool() const {
  if (!is_set()) return Error("missing");
  if (!value_->is_boolean()) return TypeError("a boolean");
  return value_->get<bool>();
}

absl::StatusOr<bool> JsonField::BoolOr(bool fallback) const {
  if (!is_set()) return fallback;
  return Bool();
}

absl::StatusOr<std::string> JsonField::String() const {
  if (!is_set()) return Error("missing");
  if (!value_->is_string()) return TypeError("a string");
  return value_->get<std::string>();
}

absl::StatusOr<std::string> JsonField::StringOr(std::string fallback) const {
  if (!is_set()) return fallback;
  return String();
}

absl::Status JsonField::ExpectObject() const {
  if (!is_set()) return Error("missing");
  return value_->is_object() ? absl::OkStatus() : TypeError("an object");
}

absl::Status JsonField::ExpectArray() const {
  if (!is_set()) return Error("missing");
  return value_->is_array() ? absl::OkStatus() : TypeError("an array");
}

absl::Status JsonField::Error(absl::string_view what) const {
  if (path_.empty()) return absl::InvalidArgumentError(absl::StrCat(file_, ": ", what));
  return absl::InvalidArgumentError(absl::StrCat(file_, ": ", path_, ": ", what));
}

absl::Status JsonField::TypeError(absl::string_view expected) const {
  return Error(absl::StrCat("expected ", expected, ", got ", Described(json())));
}

std::string JsonField::Described(const Json& value) {
  std::string s(KindOf(value));
  if (value.is_primitive() && !value.is_null()) absl::StrAppend(&s, " (", Shown(value), ")");
  return s;
}

std::string JsonField::Shown(const Json& value) {
  if (value.is_structured()) return std::string(KindOf(value));
  std::string s = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 64) s = s.substr(0, 64) + "...";
  return s;
}

absl::string_view JsonField::KindOf(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

}  // namespace lazyattn
