// API keys for the public Inference API, checked by gRPC's server auth filter before any handler.
//
// Clients send `authorization: Bearer <key>` metadata (grpc::AccessTokenCredentials does). The
// router keeps only the SHA-256 (hex) of each key, in a YAML file with a name and scopes per key:
//
//   keys:
//     - name: demo              # [A-Za-z0-9._-]{1,64}; the `key` label of the metrics below
//       sha256: 9f86d08...      # 64 hex digits: SHA-256 of the key's bytes (tools/gen-certs)
//       scopes: [generate]      # generate: Generate, Complete, GetModelInfo; admin: Prefetch
//       limits: {requests_per_second: 5, burst: 10, max_in_flight: 4}   # optional (key_limits.h)
//       cache_namespace: acme   # optional, [A-Za-z0-9._-]{1,64}; default: the key's name
//
// Cache namespaces: the router sends each worker call the key's namespace, and cached KV is
// shared only among requests of one namespace (and one cache_salt; common/document_key.h), so
// one key's clients can neither hit nor time what another key's sent. Keys of one tenant (a
// rotation's old and new key, several services of one application) share their cache by naming
// one namespace.
// The file is re-read when its modification time or size changes (checked at most once per
// reload interval, on the next call), so keys are added and revoked without a restart; a file
// that fails to parse is reported on stderr and the keys loaded before it stay in force.
// Answers: no or malformed key UNAUTHENTICATED, unknown key UNAUTHENTICATED, missing scope
// PERMISSION_DENIED, over a per-key limit RESOURCE_EXHAUSTED naming the key's name; gRPC health
// and reflection stay open. Keys are never logged or stored.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_API_KEY_AUTH_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_API_KEY_AUTH_H_

#include <grpcpp/security/auth_metadata_processor.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/file_stamp.h"
#include "services/router/server/key_limits.h"

namespace lazyattn::router {

inline constexpr char kScopeGenerate[] = "generate";
inline constexpr char kScopeAdmin[] = "admin";
// The AuthContext properties naming the key a call was admitted with, and its cache namespace.
inline constexpr char kApiKeyNameProperty[] = "lazyattn_api_key";
inline constexpr char kCacheNamespaceProperty[] = "lazyattn_cache_namespace";

struct ApiKey {
  std::string name;
  bool generate = false;
  bool admin = false;
  KeyLimits limits;  // none unless the entry has `limits`
  std::string cache_namespace;  // `cache_namespace`, or the name when absent
};

// sha256 hex (lower case) -> key. InvalidArgument naming `source` and the entry (keys[i].field)
// for a malformed file, a duplicate name or hash, an unknown scope or a bad limit.
using ApiKeyTable = absl::flat_hash_map<std::string, ApiKey>;
absl::StatusOr<ApiKeyTable> ParseApiKeys(const std::string& yaml_text, const std::string& source);

class ApiKeyAuthorizer : public grpc::AuthMetadataProcessor {
 public:
  // Loads `keys_file` once (its errors are returned: a router does not start without keys).
  static absl::StatusOr<std::shared_ptr<ApiKeyAuthorizer>> Create(
      const std::string& keys_file, absl::Duration reload_interval, prometheus::Registry& registry);

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

  // Re-reads the file if it changed since the last load. False when a changed file could not be
  // loaded (the previous keys stay). Process calls it once a reload interval, and only when no
  // reload is under way: the call that finds the file changed reads it, and calls meanwhile go on
  // with the previous keys (a 15 MB file took seconds to parse, and every authenticated call
  // waited for it).
  bool ReloadIfChanged();

  // The per-key limits of the loaded file (the in-flight cap is applied by the handlers).
  KeyLimiter& limiter() { return limiter_; }

 private:
  ApiKeyAuthorizer(std::string keys_file, absl::Duration reload_interval,
                   prometheus::Registry& registry);
  absl::Status Load();  // under reload_mu_
  bool ReloadIfChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mu_);
  grpc::Status Refuse(grpc::StatusCode code, const char* reason, std::string message);

  const std::string keys_file_;
  const absl::Duration reload_interval_;
  prometheus::Family<prometheus::Counter>& requests_family_;
  prometheus::Family<prometheus::Counter>& refused_family_;
  KeyLimiter limiter_;

  // Lock order: reload_mu_ before mu_. check_mu_ is taken alone, by every call.
  absl::Mutex check_mu_;
  absl::Time next_check_ ABSL_GUARDED_BY(check_mu_) = absl::InfinitePast();
  absl::Mutex reload_mu_;  // held while the file is read and parsed
  FileStamp file_stamp_ ABSL_GUARDED_BY(reload_mu_);

  absl::Mutex mu_;
  std::shared_ptr<const ApiKeyTable> keys_ ABSL_GUARDED_BY(mu_);
  // Children cached per key name and refusal reason (never created per request).
  absl::flat_hash_map<std::string, prometheus::Counter*> requests_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Counter*> refused_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_API_KEY_AUTH_H_
