#include "common/server_certificate_role.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/tls_files.h"

namespace lazyattn {
namespace {

// The lazyattn:// identity of the first certificate in `pem`: its first subject alternative
// name URI that ParseIdentityUri takes, as MakeServerIdentityVerifier reads a server's; nullopt
// without one (or when no certificate parses).
std::optional<PeerIdentity> IdentityOf(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      bio != nullptr ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr,
      &X509_free);
  std::optional<PeerIdentity> found;
  if (cert != nullptr) {
    std::unique_ptr<GENERAL_NAMES, decltype(&GENERAL_NAMES_free)> names(
        static_cast<GENERAL_NAMES*>(
            X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr)),
        &GENERAL_NAMES_free);
    for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names.get()); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
      if (name->type != GEN_URI) continue;
      const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
      found = ParseIdentityUri(std::string_view(reinterpret_cast<const char*>(uri->data),
                                                static_cast<size_t>(uri->length)));
      if (found.has_value()) break;
    }
  }
  ERR_clear_error();
  return found;
}

}  // namespace

absl::Status CheckCertificateRole(const std::string& cert_pem, std::string_view role,
                                  const std::string& cert_file, absl::string_view prefix) {
  const std::optional<PeerIdentity> id = IdentityOf(cert_pem);
  if (id.has_value() && id->role == role) return absl::OkStatus();
  const std::string wanted(role);
  const std::string found =
      id.has_value()
          ? absl::StrCat("is lazyattn://", id->role, "/", id->name, " (role ", id->role, ")")
          : std::string("carries no lazyattn:// identity (no role)");
  return absl::InvalidArgumentError(
      absl::StrCat(prefix, "cert_file: ", cert_file, ": the certificate ", found,
                   ", but this server serves as role ", wanted,
                   ": its clients accept only a certificate with lazyattn://", wanted,
                   "/NAME (tools/gen-certs cert ", wanted, " NAME)"));
}

absl::Status CheckServerCertificateRole(const TlsOptions& tls, std::string_view role,
                                        absl::string_view prefix) {
  if (tls.cert_file.empty()) return absl::OkStatus();
  TlsOptions own = tls;
  own.own_role = std::string(role);
  return ReadTlsFiles(own, prefix).status();
}

}  // namespace lazyattn
