#include "common/yaml_config.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace lazyattn {

absl::Status YamlConfig::LoadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return LoadString(ss.str(), path);
}

absl::Status YamlConfig::LoadString(const std::string& yaml, const std::string& source) {
  source_ = source;
  try {
    root_ = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
  if (!root_.IsNull() && !root_.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the top level must be a map"));
  }
  return absl::OkStatus();
}

absl::StatusOr<YAML::Node> YamlConfig::Find(const std::string& path) const {
  read_.insert(path);
  YAML::Node node = YAML::Clone(root_);
  std::string walked;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    walked = walked.empty() ? std::string(part) : absl::StrCat(walked, ".", part);
    read_.insert(walked);
    if (!node.IsDefined() || node.IsNull()) return YAML::Node(YAML::NodeType::Null);
    if (!node.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(source_, ": ", prefix_, walked,
                                                     ": expected a map"));
    }
    node = node[std::string(part)];
  }
  if (!node.IsDefined()) return YAML::Node(YAML::NodeType::Null);
  return node;
}

bool YamlConfig::Has(const std::string& path) const {
  auto n = Find(path);
  return n.ok() && !n->IsNull();
}

namespace {

template <typename T>
absl::StatusOr<T> Scalar(const YAML::Node& n, const std::string& where, const char* type) {
  if (!n.IsScalar()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected ", type));
  }
  T value;
  if (!YAML::convert<T>::decode(n, value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected ", type, ", got \"", n.Scalar(), "\""));
  }
  return value;
}

}  // namespace

#define LAZYATTN_YAML_GETTER(Name, T, type_name)                                          \
  absl::StatusOr<T> YamlConfig::Name(const std::string& path, const T& fallback) const {  \
    auto n = Find(path);                                                                  \
    if (!n.ok()) return n.status();                                                       \
    if (n->IsNull()) return fallback;                                                     \
    return Scalar<T>(*n, absl::StrCat(source_, ": ", prefix_, path), type_name);          \
  }
LAZYATTN_YAML_GETTER(String, std::string, "a string")
LAZYATTN_YAML_GETTER(Int, int64_t, "an integer")
LAZYATTN_YAML_GETTER(Double, double, "a number")
LAZYATTN_YAML_GETTER(Bool, bool, "true or false")
#undef LAZYATTN_YAML_GETTER

absl::StatusOr<int64_t> YamlConfig::IntIn(const std::string& path, int64_t fallback, int64_t lo,
                                          int64_t hi) const {
  absl::StatusOr<int64_t> v = Int(path, fallback);
  if (!v.ok()) return v;
  if (*v < lo || *v > hi) {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", prefix_, path, ": must be in [",
                                                   lo, ", ", hi, "], got ", *v));
  }
  return v;
}

absl::StatusOr<std::vector<std::string>> YamlConfig::StringList(const std::string& path) const {
  auto n = Find(path);
  if (!n.ok()) return n.status();
  std::vector<std::string> out;
  if (n->IsNull()) return out;
  const std::string where = absl::StrCat(source_, ": ", prefix_, path);
  if (!n->IsSequence()) return absl::InvalidArgumentError(absl::StrCat(where, ": expected a list"));
  for (size_t i = 0; i < n->size(); ++i) {
    auto s = Scalar<std::string>((*n)[i], absl::StrCat(where, "[", i, "]"), "a string");
    if (!s.ok()) return s.status();
    out.push_back(*s);
  }
  return out;
}

absl::StatusOr<std::vector<YamlConfig>> YamlConfig::List(const std::string& path) const {
  auto n = Find(path);
  if (!n.ok()) return n.status();
  std::vector<YamlConfig> out;
  if (n->IsNull()) return out;
  if (!n->IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", prefix_, path, ": expected a list"));
  }
  for (size_t i = 0; i < n->size(); ++i) {
    YamlConfig child;
    child.root_ = (*n)[i];
    child.source_ = source_;
    child.prefix_ = absl::StrCat(prefix_, path, "[", i, "].");
    if (!child.root_.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(source_, ": ", child.prefix_.substr(0, child.prefix_.size() - 1), ": expected a map"));
    }
    out.push_back(child);
  }
  return out;
}

void YamlConfig::CollectUnread(const YAML::Node& node, const std::string& prefix,
                               std::vector<std::string>* out) const {
  if (!node.IsMap()) return;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const std::string path = prefix.empty() ? key : absl::StrCat(prefix, ".", key);
    if (!read_.count(path)) {
      out->push_back(prefix_ + path);
      continue;
    }
    // A map that was read as a whole (a section) has its own keys checked; a list is the caller's.
    if (kv.second.IsMap()) CollectUnread(kv.second, path, out);
  }
}

absl::Status YamlConfig::Finish() const {
  std::vector<std::string> unread;
  CollectUnread(root_, "", &unread);
  if (unread.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(source_, ": unknown key",
                                                 unread.size() > 1 ? "s " : " ",
                                                 absl::StrJoin(unread, ", ")));
}

}  // namespace lazyattn
