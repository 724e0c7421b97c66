#include "services/router/server/api_key_auth.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/document_key.h"
#include "common/file_stamp.h"
#include "common/log.h"
#include "common/monotonic_time.h"
#include "common/status_macros.h"
#include "common/yaml_config.h"

namespace lazyattn::router {
namespace {

bool IsKeyName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

bool IsSha256Hex(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The scope a method needs; empty for a method the Inference API does not have.
std::string_view ScopeFor(std::string_view path) {
  if (path == "/lazyattn.v1.Inference/Prefetch") return kScopeAdmin;
  if (path.starts_with("/lazyattn.v1.Inference/")) return kScopeGenerate;
  return "";
}

// The key in `authorization: Bearer <key>`; empty when absent or of another scheme.
std::string_view BearerToken(const grpc::AuthMetadataProcessor::InputMetadata& metadata) {
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  std::string_view v(it->second.data(), it->second.size());
  constexpr std::string_view kBearer = "bearer ";
  if (v.size() <= kBearer.size()) return "";
  for (size_t i = 0; i < kBearer.size(); ++i) {
    if (absl::ascii_tolower(static_cast<unsigned char>(v[i])) != kBearer[i]) return "";
  }
  v.remove_prefix(kBearer.size());
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  return v;
}

// An entry's optional `limits` map (key_limits.h); `where` names the entry.
absl::Status ParseLimits(const YAML::Node& node, const std::string& where, KeyLimits* limits) {
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".limits: expected a map"));
  }
  bool burst_set = false;
  for (const auto& field : node) {
    const std::string f = field.first.as<std::string>();
    const std::string at = absl::StrCat(where, ".limits.", f);
    if (f != "requests_per_second" && f != "burst" && f != "max_in_flight") {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ": unknown limit (expected requests_per_second, burst or max_in_flight)"));
    }
    // Decoded here, not with as<>(): a value YAML cannot convert (a word, 2^63 as max_in_flight)
    // is then refused naming this field, not with the entry's generic "bad conversion".
    double v = 0;
    if (!field.second.IsScalar() || !YAML::convert<double>::decode(field.second, v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": expected a number, got \"",
                       field.second.IsScalar() ? field.second.Scalar().substr(0, 64) : "", "\""));
    }
    if (f == "max_in_flight") {
      if (!(v >= 1 && v <= 1'000'000) || v != std::floor(v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            at, ": must be a whole number in [1, 1000000], got ", field.second.Scalar()));
      }
      limits->max_in_flight = static_cast<int>(v);
      continue;
    }
    // 1e6/s is far beyond what a router serves; the bound keeps the bucket arithmetic exact.
    if (!(v > 0 && v <= 1e6) || (f == "burst" && v < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ": must be in ", f == "burst" ? "[1" : "(0", ", 1e6], got ", field.second.Scalar()));
    }
    if (f == "burst") {
      limits->burst = v;
      burst_set = true;
    } else {
      limits->requests_per_second = v;
    }
  }
  if (burst_set && limits->requests_per_second <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".limits.burst: needs requests_per_second"));
  }
  if (!burst_set) limits->burst = std::max(1.0, limits->requests_per_second);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ApiKeyTable> ParseApiKeys(const std::string& yaml_text, const std::string& source) {
  // One document, each key once, no alias bomb (yaml_config.h): a repeated `sha256` in an entry
  // silently kept the last and a second `---` document was ignored.
  // (Not const: a const node's operator[] of a missing key is an invalid node that throws.)
  ASSIGN_OR_RETURN(YAML::Node root, LoadOneYamlDocument(yaml_text, source));
  const YAML::Node keys = root.IsMap() ? root["keys"] : YAML::Node();
  if (!keys.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": keys: expected a list of keys"));
  }
  for (const auto& entry : root) {
    if (entry.first.Scalar() != "keys") {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ",
                                                     entry.first.Scalar().substr(0, 64),
                                                     ": unknown key (the file holds keys: only)"));
    }
  }
  ApiKeyTable table;
  absl::flat_hash_map<std::string, int> names;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string where = absl::StrCat(source, ": keys[", i, "]");
    const YAML::Node k = keys[i];
    if (!k.IsMap()) return absl::InvalidArgumentError(absl::StrCat(where, ": expected a map"));
    ApiKey key;
    std::string hash;
    try {
      for (const auto& field : k) {
        const std::string f = field.first.as<std::string>();
        if (f == "name") {
          key.name = field.second.as<std::string>();
        } else if (f == "sha256") {
          hash = absl::AsciiStrToLower(field.second.as<std::string>());
        } else if (f == "scopes") {
          if (!field.second.IsSequence()) {
            return absl::InvalidArgumentError(absl::StrCat(where, ".scopes: expected a list"));
          }
          for (const auto& s : field.second) {
            const std::string scope = s.as<std::string>();
            if (scope == kScopeGenerate) {
              key.generate = true;
            } else if (scope == kScopeAdmin) {
              key.admin = true;
            } else {
              return absl::InvalidArgumentError(absl::StrCat(
                  where, ".scopes: unknown scope \"", scope, "\" (expected generate or admin)"));
            }
          }
        } else if (f == "limits") {
          if (absl::Status s = ParseLimits(field.second, where, &key.limits); !s.ok()) return s;
        } else if (f == "cache_namespace") {
          key.cache_namespace = field.second.as<std::string>();
          if (!IsKeyName(key.cache_namespace)) {
            return absl::InvalidArgumentError(
                absl::StrCat(where, ".cache_namespace: expected 1 to 64 of [A-Za-z0-9._-], got \"",
                             key.cache_namespace.substr(0, 80), "\""));
          }
        } else {
          return absl::InvalidArgumentError(absl::StrCat(where, ": unknown field ", f));
        }
      }
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", e.what()));
    }
    if (!IsKeyName(key.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".name: expected 1 to 64 of [A-Za-z0-9._-], got \"",
                       key.name.substr(0, 80), "\""));
    }
    // Each key its own scope unless the file groups keys into one.
    if (key.cache_namespace.empty()) key.cache_namespace = key.name;
    if (!IsSha256Hex(hash)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".sha256: expected 64 hex digits (SHA-256 of the key)"));
    }
    // A key with no scope (the list empty or left out) can call nothing: a mistake, not a way to
    // revoke a key (delete its entry).
    if (!key.generate && !key.admin) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".scopes: none for key \"", key.name,
                                                     "\"; give generate, admin or both"));
    }
    if (!names.emplace(key.name, static_cast<int>(i)).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".name: duplicate \"", key.name, "\""));
    }
    if (!table.emplace(hash, key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".sha256: the same key as another entry"));
    }
  }
  return table;
}

ApiKeyAuthorizer::ApiKeyAuthorizer(std::string keys_file, absl::Duration reload_interval,
                                   prometheus::Registry& registry)
    : keys_file_(std::move(keys_file)),
      reload_interval_(reload_interval),
      requests_family_(
          prometheus::BuildCounter()
              .Name("lazyattn_router_api_key_requests_total")
              .Help("Calls authenticated (scope and request rate passed), by the name of the API "
                    "key they carried; a call its key's max_in_flight then refuses "
                    "is counted here too")
              .Register(registry)),
      refused_family_(prometheus::BuildCounter()
                          .Name("lazyattn_router_auth_refused_total")
                          .Help("Calls refused before any handler, by reason (missing_key, "
                                "unknown_key, missing_scope, unknown_method)")
                          .Register(registry)),
      limiter_(registry) {
  for (const char* reason : {"missing_key", "unknown_key", "missing_scope", "unknown_method"}) {
    refused_[reason] = &refused_family_.Add({{"reason", reason}});
  }
}

absl::StatusOr<std::shared_ptr<ApiKeyAuthorizer>> ApiKeyAuthorizer::Create(
    const std::string& keys_file, absl::Duration reload_interval,
    prometheus::Registry& registry) {
  std::shared_ptr<ApiKeyAuthorizer> auth(
      new ApiKeyAuthorizer(keys_file, reload_interval, registry));
  {
    absl::MutexLock lock(&auth->reload_mu_);
    if (absl::Status s = auth->Load(); !s.ok()) return s;
  }
  absl::MutexLock lock(&auth->check_mu_);
  auth->next_check_ = MonotonicNow() + reload_interval;
  return auth;
}

absl::Status ApiKeyAuthorizer::Load() {
  // One version of the file, whole, and its stamp: a key file rewritten in place while it is
  // read must not load as a shorter list (its missing keys refused until the next reload).
  absl::StatusOr<StampedText> file = ReadStampedFile(keys_file_);
  if (!file.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth.api_keys_file: ", file.status().message()));
  }
  auto table = ParseApiKeys(file->text, keys_file_);
  // The file's stamp is recorded even when it fails to parse, so a broken file is reported
  // once, not on every call until it is fixed.
  file_stamp_ = file->stamp;
  if (!table.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth.api_keys_file: ", table.status().message()));
  }
  auto keys = std::make_shared<const ApiKeyTable>(std::move(*table));
  absl::flat_hash_map<std::string, KeyLimits> limits;
  for (const auto& [hash, key] : *keys) limits.emplace(key.name, key.limits);
  limiter_.Configure(limits);
  absl::MutexLock lock(&mu_);
  for (const auto& [hash, key] : *keys) {
    if (!requests_.contains(key.name)) {
      requests_[key.name] = &requests_family_.Add({{"key", key.name}});
    }
  }
  keys_ = std::move(keys);
  return absl::OkStatus();
}

bool ApiKeyAuthorizer::ReloadIfChanged() {
  absl::MutexLock lock(&reload_mu_);
  return ReloadIfChangedLocked();
}

bool ApiKeyAuthorizer::ReloadIfChangedLocked() {
  // A file renamed over the path is a new version even with the old one's size and time.
  if (StampOf(keys_file_) == file_stamp_) return true;
  const absl::Status s = Load();
  if (!s.ok()) {
    LogWarning("router")
        .Str("error", std::string(s.message()))
        .Msg("API keys not reloaded, the previous keys stay");
    return false;
  }
  size_t count = 0;
  {
    absl::MutexLock keys_lock(&mu_);
    count = keys_->size();
  }
  LogInfo("router")
      .Int("keys", static_cast<int64_t>(count))
      .Str("file", keys_file_)
      .Msg("API keys reloaded");
  return true;
}

grpc::Status ApiKeyAuthorizer::Refuse(grpc::StatusCode code, const char* reason,
                                      std::string message) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = refused_.find(reason); it != refused_.end()) it->second->Increment();
  }
  return grpc::Status(code, std::move(message));
}

grpc::Status ApiKeyAuthorizer::Process(const InputMetadata& auth_metadata,
                                       grpc::AuthContext* context,
                                       OutputMetadata* consumed_auth_metadata,
                                       OutputMetadata* /*response_metadata*/) {
  const std::string_view path = MethodPathOf(auth_metadata);
  if (IsOpenMethod(path)) return grpc::Status::OK;
  const std::string_view scope = ScopeFor(path);
  if (scope.empty()) {
    return Refuse(grpc::StatusCode::UNIMPLEMENTED, "unknown_method",
                  absl::StrCat(std::string(path), ": no such method"));
  }
  {
    bool due = false;
    {
      absl::MutexLock lock(&check_mu_);
      const absl::Time now = MonotonicNow();
      if (now >= next_check_) {
        next_check_ = now + reload_interval_;
        due = true;
      }
    }
    // Never waits for a reload under way (ReloadIfChanged): the keys loaded serve meanwhile.
    if (due && reload_mu_.TryLock()) {
      ReloadIfChangedLocked();
      reload_mu_.Unlock();
    }
  }
  const std::string_view token = BearerToken(auth_metadata);
  if (token.empty()) {
    // Said apart: a client that sent `Basic ...` or a bare `Bearer` is told what is wrong with
    // what it sent, not that it sent nothing. (gRPC metadata or an HTTP header: the same words.)
    const bool sent = auth_metadata.find("authorization") != auth_metadata.end();
    return Refuse(grpc::StatusCode::UNAUTHENTICATED, "missing_key",
                  absl::StrCat(sent ? "authorization: not of the form `Bearer <API key>`"
                                    : "authorization: missing",
                               "; send `authorization: Bearer <API key>` (lazyattn client: "
                               "--api-key or LAZYATTN_API_KEY)"));
  }
  const std::string hash = Sha256Hex(token);
  std::shared_ptr<const ApiKeyTable> keys;
  {
    absl::MutexLock lock(&mu_);
    keys = keys_;
  }
  const auto it = keys->find(hash);
  if (it == keys->end()) {
    // The key itself is never echoed: it may be a real key pasted in the wrong place.
    return Refuse(grpc::StatusCode::UNAUTHENTICATED, "unknown_key",
                  "authorization: unknown or revoked API key");
  }
  const ApiKey& key = it->second;
  const bool allowed = scope == kScopeAdmin ? key.admin : key.generate;
  if (!allowed) {
    return Refuse(grpc::StatusCode::PERMISSION_DENIED, "missing_scope",
                  absl::StrCat(std::string(path), ": API key \"", key.name,
                               "\" lacks the scope \"", std::string(scope), "\""));
  }
  if (grpc::Status s = limiter_.TakeToken(key.name, MonotonicNow()); !s.ok()) return s;
  // Consumed: the key does not reach handlers (nor anything they might forward or log).
  const auto header = auth_metadata.find("authorization");
  consumed_auth_metadata->insert(
      {"authorization", std::string(header->second.data(), header->second.size())});
  context->AddProperty(kApiKeyNameProperty, key.name);
  context->AddProperty(kCacheNamespaceProperty, key.cache_namespace);
  {
    absl::MutexLock lock(&mu_);
    if (auto c = requests_.find(key.name); c != requests_.end()) c->second->Increment();
  }
  return grpc::Status::OK;
}

}  // namespace lazyattn::router
