// The TLS files of a process (TlsOptions): checked before gRPC sees them, and mirrored so that a
// broken version written later never reaches gRPC.
//
// gRPC's FileWatcherCertificateProvider re-reads the key, certificate and CA files every refresh
// interval and hands whatever it read to the next handshakes: an empty certificate or key (a file
// truncated while it is rewritten in place, as `cat new.crt > old.crt` does) aborts the process
// in an assertion, and a key that is not the certificate's fails every handshake until the next
// good read. So StartGrpcServer and MakeChannel (grpc_util.h) never give gRPC the operator's
// files: they give it a TlsFileMirror's copies, which are replaced only by a set of files that
// passed CheckTlsFiles as a whole.
//
//   ASSIGN_OR_RETURN(auto mirror, TlsFileMirror::For(tls));   // checks tls's files first
//   ... FileWatcherCertificateProvider(mirror->watched().key_file, ...) ...
#ifndef LAZYATTN_COMMON_TLS_FILES_H_
#define LAZYATTN_COMMON_TLS_FILES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"

namespace lazyattn {

// The PEM texts of a TlsOptions's files ("" where the option names none), each read once.
struct TlsFileContents {
  std::string cert, key, ca;
  bool operator==(const TlsFileContents&) const = default;
};

// Reads `tls`'s files and checks them: each named file a regular file of at most 16 MiB
// (ReadStampedFile: a FIFO is not waited on) holding its PEM block, the certificate parsing, not
// expired and valid from at most an hour ahead of this machine's clock, the key its own and not
// encrypted (no passphrase is ever asked for), the CA's first certificate
// parsing; tls.refresh_interval_s >= 1. InvalidArgument naming the field and the file
// (`tls.cert_file: PATH is empty`) otherwise; `prefix` is where the caller's config keeps the
// fields (the router's client_tls: "client_tls.").
absl::StatusOr<TlsFileContents> ReadTlsFiles(const TlsOptions& tls,
                                             absl::string_view prefix = "tls.");
inline absl::Status CheckTlsFiles(const TlsOptions& tls, absl::string_view prefix = "tls.") {
  return ReadTlsFiles(tls, prefix).status();
}

// The notAfter of the first certificate in `pem` (a certificate file or a CA bundle), in Unix
// seconds (UTC). InvalidArgument when no certificate parses (an empty or garbage text) or its
// notAfter is not a valid time.
absl::StatusOr<int64_t> CertificateNotAfter(absl::string_view pem);

// A private copy of one set of TLS files (mode 0700 folder under $TMPDIR or /tmp), refreshed from
// the operator's files every tls.refresh_interval_s: a set that passes ReadTlsFiles and differs
// from the copy replaces it (each file written beside and renamed over); one that does not is
// logged (a warning, once per distinct error) and the copy keeps serving. Thread-safe. Mirrors
// live as long as the process (a channel cannot hold one), their folders removed at exit.
//
// The folder is named `lazyattn-tls-<pid>-<pid namespace inode>-<boot id>-XXXXXX` (the boot id's
// first 8 hex digits). A process killed outright (SIGKILL, OOM) leaves its folder, so the first
// mirror a process makes under a parent folder also removes the folders there that are real
// directories of this user (never a symbolic link, nor another user's) and record a pid of this
// pid namespace and this boot that no process has. The boot keeps a TMPDIR shared between
// machines or kernels safe: a pid names a process of one kernel only.
class TlsFileMirror {
 public:
  // The mirror of `tls`'s files: one per distinct set of paths and interval in the process,
  // shared by every server and channel that uses them, returned as it is once made (files caught
  // mid-rotation then do not stop a router dialling a new worker). The ReadTlsFiles error when
  // the files do not pass at the first call; Internal when no private folder can be made.
  static absl::StatusOr<std::shared_ptr<TlsFileMirror>> For(const TlsOptions& tls);
  // A mirror of its own, outside that registry (tests): its folder goes with it.
  static absl::StatusOr<std::unique_ptr<TlsFileMirror>> Create(const TlsOptions& tls);
  ~TlsFileMirror();
  TlsFileMirror(const TlsFileMirror&) = delete;
  TlsFileMirror& operator=(const TlsFileMirror&) = delete;

  // `tls` with its file paths replaced by the copies', and refresh_interval_s at most 10: gRPC
  // re-reads the copies that often, so a good set copied is served within the operator's
  // interval plus that.
  const TlsOptions& watched() const { return watched_; }
  // Checks the operator's files now, as the next interval would; their error, OK when the copy
  // is (now) theirs. For tests.
  absl::Status RefreshNow();

  // Told the files the copy holds (a set that passed ReadTlsFiles): at Subscribe, then each time
  // a new set replaces them. Called with the mirror's lock held, on the refresh thread or
  // RefreshNow's caller: it must be quick and must not call the mirror.
  using Listener = std::function<void(const TlsFileContents& served)>;
  // A listener's registration: destroying it unsubscribes (waiting for a call in progress), after
  // which the listener is never called again. Destroy it before the mirror.
  class Subscription {
   public:
    ~Subscription();
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;

   private:
    friend class TlsFileMirror;
    Subscription(TlsFileMirror* mirror, uint64_t id) : mirror_(mirror), id_(id) {}
    TlsFileMirror* const mirror_;
    const uint64_t id_;
  };
  // Calls `listener` with the files served now, before returning, and with every set that
  // replaces them until the subscription is destroyed.
  [[nodiscard]] std::unique_ptr<Subscription> Subscribe(Listener listener);

 private:
  TlsFileMirror(const TlsOptions& source, std::string dir);
  absl::Status Publish(const TlsFileContents& contents) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();

  const TlsOptions source_;
  const std::string dir_;
  TlsOptions watched_;
  absl::Mutex mu_;
  TlsFileContents published_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);  // the refusal last logged
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Listener> listeners_ ABSL_GUARDED_BY(mu_);
  uint64_t next_listener_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_TLS_FILES_H_
