#include "services/router/http/certificate_reloader.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_stamp.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace lazyattn::router {

// One certificate chain and its key, as loaded from the files; immutable once built. A handshake
// that took it shares the references (SSL_use_cert_and_key takes its own).
struct CertificateReloader::Pair {
  X509* leaf = nullptr;
  STACK_OF(X509) * chain = nullptr;  // intermediates after the leaf, possibly empty
  EVP_PKEY* key = nullptr;
  ~Pair() {
    X509_free(leaf);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
  }
};

namespace {

// OpenSSL's last queued error as text (the queue is cleared).
std::string OpenSslError() {
  std::string out;
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    out = buf;
  }
  return out.empty() ? "no detail" : out;
}

struct BioCloser {
  void operator()(BIO* b) const { BIO_free(b); }
};

// The text of a PEM file, the setting `field` naming it in errors. Read through ReadStampedFile,
// not fopen: a file replaced by a FIFO blocked the watcher in open() for good, and the router's
// shutdown with it (its destructor joins the watcher).
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* field) {
  absl::StatusOr<StampedText> read = ReadStampedFile(path);
  if (!read.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", read.status().message()));
  }
  return std::move(read->text);
}

// A read-only BIO over `text`, which must outlive it.
BIO* MemoryBio(const std::string& text) {
  return BIO_new_mem_buf(text.data(), static_cast<int>(text.size()));
}

}  // namespace

CertificateReloader::CertificateReloader(std::string cert_file, std::string key_file)
    : cert_file_(std::move(cert_file)), key_file_(std::move(key_file)) {}

absl::StatusOr<std::unique_ptr<CertificateReloader>> CertificateReloader::Create(
    std::string cert_file, std::string key_file, absl::Duration refresh) {
  std::unique_ptr<CertificateReloader> r(
      new CertificateReloader(std::move(cert_file), std::move(key_file)));
  {
    absl::MutexLock check(&r->check_mu_);
    r->cert_stamp_ = StampOf(r->cert_file_);
    r->key_stamp_ = StampOf(r->key_file_);
    absl::StatusOr<std::shared_ptr<const Pair>> pair = Load(r->cert_file_, r->key_file_);
    if (!pair.ok()) return pair.status();
    absl::MutexLock lock(&r->mu_);
    r->current_ = std::move(*pair);
  }
  if (refresh > absl::ZeroDuration()) {
    r->watcher_ = std::thread([raw = r.get(), refresh] { raw->Watch(refresh); });
  }
  return r;
}

CertificateReloader::~CertificateReloader() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
}

absl::StatusOr<std::shared_ptr<const CertificateReloader::Pair>> CertificateReloader::Load(
    const std::string& cert_file, const std::string& key_file) {
  ERR_clear_error();
  auto pair = std::make_shared<Pair>();
  ASSIGN_OR_RETURN(const std::string cert_text, ReadPem(cert_file, "server.tls.cert_file"));
  std::unique_ptr<BIO, BioCloser> cert(MemoryBio(cert_text));
  pair->leaf = PEM_read_bio_X509(cert.get(), nullptr, nullptr, nullptr);
  if (pair->leaf == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("server.tls.cert_file: no PEM certificate in ",
                                                   cert_file, ": ", OpenSslError()));
  }
  pair->chain = sk_X509_new_null();
  while (X509* extra = PEM_read_bio_X509(cert.get(), nullptr, nullptr, nullptr)) {
    sk_X509_push(pair->chain, extra);
  }
  ERR_clear_error();  // the end of the file reads as an error
  ASSIGN_OR_RETURN(std::string key_text, ReadPem(key_file, "server.tls.key_file"));
  std::unique_ptr<BIO, BioCloser> key(MemoryBio(key_text));
  pair->key = PEM_read_bio_PrivateKey(key.get(), nullptr, nullptr, nullptr);
  // The key's text is a secret: not left in freed memory.
  OPENSSL_cleanse(key_text.data(), key_text.size());
  if (pair->key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("server.tls.key_file: no PEM private key in ",
                                                   key_file, ": ", OpenSslError()));
  }
  if (X509_check_private_key(pair->leaf, pair->key) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server.tls.key_file: ", key_file, " is not the key of ", cert_file, ": ", OpenSslError()));
  }
  return std::shared_ptr<const Pair>(std::move(pair));
}

void CertificateReloader::Install(SSL_CTX* ctx) {
  SSL_CTX_set_cert_cb(ctx, &CertificateReloader::OnCertificate, this);
}

int CertificateReloader::OnCertificate(SSL* ssl, void* arg) {
  const std::shared_ptr<const Pair> pair = static_cast<CertificateReloader*>(arg)->Current();
  // Cleared first: a new key of another type would otherwise sit beside the old certificate,
  // and the handshake could pick either.
  SSL_certs_clear(ssl);
  return SSL_use_cert_and_key(ssl, pair->leaf, pair->key, pair->chain, 1) == 1 ? 1 : 0;
}

std::shared_ptr<const CertificateReloader::Pair> CertificateReloader::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

bool CertificateReloader::CheckNow() {
  absl::MutexLock check(&check_mu_);
  const FileStamp cert = StampOf(cert_file_);
  const FileStamp key = StampOf(key_file_);
  if (cert == cert_stamp_ && key == key_stamp_) return false;
  cert_stamp_ = cert;
  key_stamp_ = key;
  absl::StatusOr<std::shared_ptr<const Pair>> pair = Load(cert_file_, key_file_);
  if (!pair.ok()) {
    // Logged once per change of the files; the next change is tried again.
    LogWarning("router")
        .Str("api", "http")
        .Str("error", std::string(pair.status().message()))
        .Msg("HTTPS certificate not reloaded; the previous one is still served");
    return false;
  }
  {
    absl::MutexLock lock(&mu_);
    current_ = std::move(*pair);
    ++reloads_;
  }
  LogInfo("router")
      .Str("api", "http")
      .Str("cert_file", cert_file_)
      .Msg("HTTPS certificate reloaded");
  return true;
}

int64_t CertificateReloader::reloads() const {
  absl::MutexLock lock(&mu_);
  return reloads_;
}

void CertificateReloader::Watch(absl::Duration refresh) {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), refresh)) return;
    }
    CheckNow();
  }
}

}  // namespace lazyattn::router
