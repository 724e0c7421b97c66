#include "common/yaml_config.h"

#include <sys/stat.h>

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_stamp.h"
#include "common/status_macros.h"

namespace lazyattn {

namespace {

// Far larger than any configuration; a bound so that /dev/zero is refused, not read for ever.
constexpr int64_t kMaxConfigBytes = 16 << 20;

// Every map of `node`, at any depth, has each key once: yaml-cpp keeps both of a repeated key and
// every lookup finds the first, so `lease_ms: 3000` then `lease_ms: 0` would silently start with
// 3000. Keys must be scalars (a map or list as a key names no setting).
// `visits` is what the walk may still visit: yaml-cpp shares an anchored node among its aliases,
// so the tree a walk sees can be exponentially larger than the text (see LoadOneYamlDocument).
absl::Status CheckKeysOnce(const YAML::Node& node, const std::string& path,
                           const std::string& source, int64_t* visits) {
  if (--*visits < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", path.empty() ? "" : path + ": ",
        "more YAML nodes than the text could hold without aliases repeating them (*name "
        "expands its &name's node each time)"));
  }
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      absl::Status s = CheckKeysOnce(node[i], absl::StrCat(path, "[", i, "]"), source, visits);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (!node.IsMap()) return absl::OkStatus();
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const std::string where = path.empty() ? "" : path + ".";
    if (!kv.first.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": ", where, "(line ", kv.first.Mark().line + 1, "): keys must be strings"));
    }
    const std::string key = where + kv.first.Scalar();
    if (!seen.insert(kv.first.Scalar()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": ", key, ": given twice (again on line ", kv.first.Mark().line + 1, ")"));
    }
    absl::Status s = CheckKeysOnce(kv.second, key, source, visits);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The first map key holding a '.', and the path of the map it is in ("" at the top level); an
// empty key when none. A config's keys are addressed by dotted paths (Find), so
// `metrics.bearer_token_file: F` at the top level would be read as nothing, and, its path marked
// read, not reported unknown either: the setting silently lost.
struct DottedKey {
  std::string where;
  std::string key;
};
DottedKey FirstDottedKey(const YAML::Node& node, const std::string& where) {
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      DottedKey found = FirstDottedKey(node[i], absl::StrCat(where, "[", i, "]"));
      if (!found.key.empty()) return found;
    }
    return {};
  }
  if (!node.IsMap()) return {};
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    if (absl::StrContains(key, '.')) return {where, key};
    DottedKey found =
        FirstDottedKey(kv.second, where.empty() ? key : absl::StrCat(where, ".", key));
    if (!found.key.empty()) return found;
  }
  return {};
}

}  // namespace

absl::StatusOr<YAML::Node> LoadOneYamlDocument(const std::string& yaml, const std::string& source) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not YAML: ", e.what()));
  }
  if (documents.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", documents.size(),
                     " YAML documents (separated by ---); the file must hold one"));
  }
  YAML::Node root = documents.empty() ? YAML::Node() : documents.front();
  // Without aliases a node takes at least a byte of text; 16 a byte and 10,000 more leave room
  // for anchors reused as defaults, while a chain of aliases (594 bytes expanding to 10^12
  // nodes, which this walk and every later one would spin on for hours) is refused at once.
  int64_t visits = 16 * static_cast<int64_t>(yaml.size()) + 10000;
  RETURN_IF_ERROR(CheckKeysOnce(root, "", source, &visits));
  return root;
}

absl::Status YamlConfig::LoadFile(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  }
  // A regular file of bounded size (ReadStampedFile): a directory read as an empty config, a FIFO
  // blocked start-up and its stop signals, /dev/zero was read until memory ran out.
  absl::StatusOr<StampedText> read = ReadStampedFile(path, kMaxConfigBytes);
  if (!read.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config file: ", read.status().message()));
  }
  return LoadString(read->text, path);
}

absl::Status YamlConfig::LoadString(const std::string& yaml, const std::string& source) {
  source_ = source;
  ASSIGN_OR_RETURN(root_, LoadOneYamlDocument(yaml, source));
  if (!root_.IsNull() && !root_.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the top level must be a map"));
  }
  if (const DottedKey dotted = FirstDottedKey(root_, ""); !dotted.key.empty()) {
    // The docs name keys by their dotted paths; a file nests them.
    const size_t dot = dotted.key.find('.');
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", dotted.where.empty() ? "" : absl::StrCat(dotted.where, ": "), "key \"",
        dotted.key, "\": a key may not contain '.'; nest the parts as maps (write ",
        dotted.key.substr(0, dot), ": {", dotted.key.substr(dot + 1), ": ...})"));
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

// Integers are decimal, as YAML 1.2's core schema writes them ([-+]?[0-9]+): yaml-cpp reads a
// leading 0 as octal (`lease_ms: 010` was 8, `0100` 64) and 0x as hex.
template <>
absl::StatusOr<int64_t> Scalar<int64_t>(const YAML::Node& n, const std::string& where,
                                        const char* type) {
  if (!n.IsScalar()) return absl::InvalidArgumentError(absl::StrCat(where, ": expected ", type));
  const std::string& text = n.Scalar();
  size_t i = text.empty() || (text[0] != '-' && text[0] != '+') ? 0 : 1;
  const bool negative = i == 1 && text[0] == '-';
  if (i == text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected ", type, ", got \"", text, "\""));
  }
  uint64_t magnitude = 0;
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c < '0' || c > '9') {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected ", type, ", got \"", text, "\""));
    }
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (magnitude > (limit - digit) / 10) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", text, " is out of the range of a 64-bit integer"));
    }
    magnitude = magnitude * 10 + digit;
  }
  return negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
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
