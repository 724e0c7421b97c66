// The HTTPS listener's server certificate, re-read when its files change, so a rotated certificate
// is served without a restart (the gRPC listeners get the same from gRPC's
// FileWatcherCertificateProvider, at the same server.tls.refresh_interval_s).
//
// A watcher thread compares the two files' identity (device, inode, size, modification time)
// every refresh interval and, when either changed, loads the pair off the accept path. The TLS
// context's certificate callback (SSL_CTX_set_cert_cb) then gives every new handshake the pair
// loaded last; connections already open keep the certificate they were made with. A pair that
// cannot be loaded (unreadable, not PEM, key not matching the certificate, as between the two
// renames of a rotation) is logged once per change and the previous pair is kept.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_CERTIFICATE_RELOADER_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_CERTIFICATE_RELOADER_H_

#include <openssl/ssl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/file_stamp.h"

namespace lazyattn::router {

class CertificateReloader {
 public:
  // Loads the pair now (InvalidArgument naming the file and OpenSSL's reason when it cannot) and,
  // when `refresh` is positive, starts watching the files at that interval.
  static absl::StatusOr<std::unique_ptr<CertificateReloader>> Create(std::string cert_file,
                                                                     std::string key_file,
                                                                     absl::Duration refresh);
  // Stops the watcher. Handshakes on a context given to Install() must have ended.
  ~CertificateReloader();

  // Every handshake on `ctx` from now on presents the current pair. `ctx` must not be in use
  // yet (set before the listener accepts) and must not outlive this object.
  void Install(SSL_CTX* ctx);

  // Re-reads the files if their identity changed since the last attempt (the watcher calls it);
  // true when a new pair was loaded and is now served.
  bool CheckNow();

  // Pairs loaded since Create (the first one not counted).
  int64_t reloads() const;

 private:
  struct Pair;
  CertificateReloader(std::string cert_file, std::string key_file);
  static absl::StatusOr<std::shared_ptr<const Pair>> Load(const std::string& cert_file,
                                                          const std::string& key_file);
  static int OnCertificate(SSL* ssl, void* arg);
  std::shared_ptr<const Pair> Current() const;
  void Watch(absl::Duration refresh);

  const std::string cert_file_;
  const std::string key_file_;

  // Lock order: check_mu_ before mu_. check_mu_ serializes the loads (done outside mu_, which
  // every handshake takes for a moment).
  absl::Mutex check_mu_;
  // The files as they were at the last load attempt, successful or not.
  FileStamp cert_stamp_ ABSL_GUARDED_BY(check_mu_);
  FileStamp key_stamp_ ABSL_GUARDED_BY(check_mu_);
  mutable absl::Mutex mu_;
  std::shared_ptr<const Pair> current_ ABSL_GUARDED_BY(mu_);
  int64_t reloads_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_CERTIFICATE_RELOADER_H_
