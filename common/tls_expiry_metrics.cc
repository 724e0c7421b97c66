#include "common/tls_expiry_metrics.h"

#include <prometheus/gauge.h>

#include "common/log.h"

namespace lazyattn {

TlsExpiryMetrics::~TlsExpiryMetrics() { subscriptions_.clear(); }

absl::Status TlsExpiryMetrics::Watch(const std::string& role, const TlsOptions& tls) {
  const bool plaintext = role == kTlsRoleClient ? tls.ca_file.empty() : tls.cert_file.empty();
  if (plaintext) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<TlsFileMirror>> mirror = TlsFileMirror::For(tls);
  if (!mirror.ok()) return mirror.status();
  mirrors_.push_back(*mirror);
  Watch(role, **mirror);
  return absl::OkStatus();
}

void TlsExpiryMetrics::Watch(const std::string& role, TlsFileMirror& mirror) {
  subscriptions_.push_back(
      mirror.Subscribe([this, role](const TlsFileContents& served) { Update(role, served); }));
}

void TlsExpiryMetrics::Update(const std::string& role, const TlsFileContents& served) {
  absl::MutexLock lock(&mu_);
  UpdateOne(role, "cert", served.cert);
  UpdateOne(role, "ca", served.ca);
}

void TlsExpiryMetrics::UpdateOne(const std::string& role, const char* file,
                                 const std::string& pem) {
  const auto key = std::make_pair(role, std::string(file));
  auto it = gauges_.find(key);
  absl::StatusOr<int64_t> not_after = absl::InvalidArgumentError("no file");
  if (!pem.empty()) {
    not_after = CertificateNotAfter(pem);
    // The mirror serves only certificates that parse: this is a notAfter OpenSSL cannot read
    // as a time. No series rather than a stale one.
    if (!not_after.ok()) {
      LogWarning("tls")
          .Str("role", role)
          .Str("file", file)
          .Str("error", std::string(not_after.status().message()))
          .Msg("certificate expiry not exported");
    }
  }
  if (!not_after.ok()) {
    if (it != gauges_.end()) {
      family_->Remove(it->second);
      gauges_.erase(it);
    }
    return;
  }
  if (it == gauges_.end()) {
    if (family_ == nullptr) {
      family_ = &prometheus::BuildGauge()
                     .Name(kTlsExpiryMetric)
                     .Help(
                         "When the TLS certificate served expires (its notAfter), Unix seconds; "
                         "role: server (listener) or client (dialling peers), file: cert (own "
                         "certificate) or ca (first certificate of the CA bundle)")
                     .Register(registry_);
    }
    it = gauges_.emplace(key, &family_->Add({{"role", role}, {"file", file}})).first;
  }
  it->second->Set(static_cast<double>(*not_after));
}

}  // namespace lazyattn
