// When the certificates a process presents and trusts expire, on its /metrics:
//
//   lazyattn_tls_certificate_expiry_timestamp_seconds{role, file}   notAfter, Unix seconds (UTC)
//
//   role  "server": the TLS of the process's listener (server.tls of each of the three);
//         "client": the TLS it dials its peers with (router client_tls, worker kvdir.tls).
//   file  "cert":   its own certificate (cert_file);
//         "ca":     the first certificate of its CA bundle (ca_file).
//
// An expired certificate fails every handshake, and only the peer's log says why; this gauge lets
// an alert (deploy/prometheus, LazyattnTlsCertificateExpiresSoon) warn days before. The values
// are those of the files gRPC is given, the TlsFileMirror's copy (tls_files.h): a rotated
// certificate shows once the mirror has taken it up, and a broken file never shows. A role
// without files (plaintext, `insecure: true`) exports no series.
//
//   TlsExpiryMetrics tls_metrics(*registry);
//   RETURN_IF_ERROR(tls_metrics.Watch("server", options.tls));
#ifndef LAZYATTN_COMMON_TLS_EXPIRY_METRICS_H_
#define LAZYATTN_COMMON_TLS_EXPIRY_METRICS_H_

#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "common/tls_files.h"

namespace lazyattn {

inline constexpr char kTlsExpiryMetric[] = "lazyattn_tls_certificate_expiry_timestamp_seconds";
inline constexpr char kTlsRoleServer[] = "server";
inline constexpr char kTlsRoleClient[] = "client";

// Watch from one thread (at start-up); the mirrors set the gauges from their own threads.
// `registry` must outlive this object; the family is added to it at the first Watch of a role
// with files.
class TlsExpiryMetrics {
 public:
  explicit TlsExpiryMetrics(prometheus::Registry& registry) : registry_(registry) {}
  ~TlsExpiryMetrics();  // unsubscribes: no gauge is set after it returns
  TlsExpiryMetrics(const TlsExpiryMetrics&) = delete;
  TlsExpiryMetrics& operator=(const TlsExpiryMetrics&) = delete;

  // Exports `role`'s series (kTlsRoleServer or kTlsRoleClient) for `tls`'s files as its mirror
  // (TlsFileMirror::For, the one gRPC reads) serves them, following each set it takes up. OK and
  // nothing exported where gRPC runs plaintext (grpc_util.h): a server without cert_file, a
  // client without ca_file. The mirror's error (ReadTlsFiles) when it cannot be made. Watch a
  // role once.
  absl::Status Watch(const std::string& role, const TlsOptions& tls);
  // The same for a given mirror (tests: TlsFileMirror::Create), which must outlive this object.
  void Watch(const std::string& role, TlsFileMirror& mirror);

 private:
  // Sets (or, for a file not configured or not parsing, removes) `role`'s two series.
  void Update(const std::string& role, const TlsFileContents& served);
  void UpdateOne(const std::string& role, const char* file, const std::string& pem)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  prometheus::Registry& registry_;
  // Lock order: a mirror's lock (listeners run under it), then mu_.
  absl::Mutex mu_;
  prometheus::Family<prometheus::Gauge>* family_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::pair<std::string, std::string>, prometheus::Gauge*> gauges_ ABSL_GUARDED_BY(mu_);
  // Subscriptions before the mirrors they refer to: destroyed first.
  std::vector<std::shared_ptr<TlsFileMirror>> mirrors_;  // For's mirrors, kept alive
  std::vector<std::unique_ptr<TlsFileMirror::Subscription>> subscriptions_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_TLS_EXPIRY_METRICS_H_
