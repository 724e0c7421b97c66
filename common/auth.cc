#include "common/auth.h"

#include <grpc/grpc_security_constants.h>

#include <functional>
#include <iostream>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace lazyattn {
namespace {

constexpr std::string_view kScheme = "lazyattn://";
constexpr size_t kMaxNameLength = 128;

bool IsKnownRole(std::string_view role) {
  return role == kRoleWorker || role == kRoleRouter || role == kRoleClient || role == kRoleAdmin ||
         role == kRoleKvdir;
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

std::string FirstProperty(const grpc::AuthContext& context, const char* name) {
  for (const grpc::string_ref& v : context.FindPropertyValues(name)) {
    return std::string(v.data(), v.size());
  }
  return "";
}

}  // namespace

std::optional<PeerIdentity> ParseIdentityUri(std::string_view uri) {
  if (!uri.starts_with(kScheme)) return std::nullopt;
  uri.remove_prefix(kScheme.size());
  const size_t slash = uri.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  const std::string_view role = uri.substr(0, slash);
  const std::string_view name = uri.substr(slash + 1);
  if (!IsKnownRole(role) || name.empty() || name.size() > kMaxNameLength) return std::nullopt;
  for (char c : name) {
    if (!IsNameChar(c)) return std::nullopt;
  }
  return PeerIdentity{std::string(role), std::string(name)};
}

std::optional<PeerIdentity> PeerIdentityOf(const grpc::AuthContext& context) {
  // gRPC lists every SAN (DNS, IP, URI) under one property and only for a certificate that
  // verified against the server's roots; the URI form is the only one that can parse here.
  for (const grpc::string_ref& v : context.FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
    if (auto id = ParseIdentityUri(std::string_view(v.data(), v.size()))) return id;
  }
  return std::nullopt;
}

std::optional<PeerIdentity> AuthorizedPeerOf(const grpc::AuthContext& context) {
  PeerIdentity id{FirstProperty(context, kPeerRoleProperty),
                  FirstProperty(context, kPeerNameProperty)};
  if (id.role.empty()) return std::nullopt;
  return id;
}

namespace {

class ServerIdentityVerifier final : public grpc::experimental::ExternalCertificateVerifier {
 public:
  explicit ServerIdentityVerifier(PeerIdentity expected) : expected_(std::move(expected)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)> callback, grpc::Status* sync_status) override {
    grpc::Status host_status;
    const bool sync = hostname_.Verify(
        request,
        [this, request, callback = std::move(callback)](grpc::Status status) {
          callback(status.ok() ? CheckIdentity(*request) : status);
        },
        &host_status);
    if (!sync) return false;
    *sync_status = host_status.ok() ? CheckIdentity(*request) : host_status;
    return true;
  }

  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest* request) override {
    hostname_.Cancel(request);
  }

 private:
  grpc::Status CheckIdentity(
      const grpc::experimental::TlsCustomVerificationCheckRequest& request) const {
    const std::string scheme(kScheme);
    const std::string wanted =
        absl::StrCat(scheme, expected_.role, "/", expected_.name.empty() ? "*" : expected_.name);
    for (const grpc::string_ref& uri : request.uri_names()) {
      const std::optional<PeerIdentity> id =
          ParseIdentityUri(std::string_view(uri.data(), uri.size()));
      if (!id.has_value()) continue;
      if (id->role == expected_.role && (expected_.name.empty() || id->name == expected_.name)) {
        return grpc::Status::OK;
      }
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          absl::StrCat("the server's certificate is ", scheme, id->role, "/",
                                       id->name, ", not ", wanted));
    }
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat("the server's certificate carries no ", scheme, " identity; wanted ", wanted));
  }

  grpc::experimental::HostNameCertificateVerifier hostname_;
  const PeerIdentity expected_;
};

}  // namespace

std::shared_ptr<grpc::experimental::CertificateVerifier> MakeServerIdentityVerifier(
    PeerIdentity expected) {
  return grpc::experimental::ExternalCertificateVerifier::Create<ServerIdentityVerifier>(
      std::move(expected));
}

bool IsOpenMethod(std::string_view path) {
  return path.starts_with("/grpc.health.v1.Health/") ||
         path.starts_with("/grpc.reflection.");
}

std::string_view MethodPathOf(const grpc::AuthMetadataProcessor::InputMetadata& metadata) {
  auto it = metadata.find(":path");
  if (it == metadata.end()) return "";
  return std::string_view(it->second.data(), it->second.size());
}

RoleAuthorizer::RoleAuthorizer(std::vector<MethodRole> rules) : rules_(std::move(rules)) {}

grpc::Status RoleAuthorizer::Process(const InputMetadata& auth_metadata,
                                     grpc::AuthContext* context,
                                     OutputMetadata* /*consumed_auth_metadata*/,
                                     OutputMetadata* /*response_metadata*/) {
  const std::string_view path = MethodPathOf(auth_metadata);
  if (IsOpenMethod(path)) return grpc::Status::OK;
  const std::optional<PeerIdentity> peer = PeerIdentityOf(*context);
  if (!peer) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat(std::string(path), ": needs a client certificate with a lazyattn://ROLE/NAME "
                                           "URI signed by this cluster's CA (tools/gen-certs)"));
  }
  std::string_view wanted;
  for (const MethodRole& rule : rules_) {
    if (path.starts_with(rule.method_prefix)) {
      wanted = rule.role;
      break;
    }
  }
  if (wanted.empty()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(std::string(path), ": not callable on this server"));
  }
  if (peer->role != wanted) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(std::string(path), ": only ", std::string(wanted), " identities may call it; the peer is ",
                                     std::string(kScheme), peer->role, "/", peer->name));
  }
  context->AddProperty(kPeerRoleProperty, peer->role);
  context->AddProperty(kPeerNameProperty, peer->name);
  return grpc::Status::OK;
}

absl::Status CheckTransportSecurity(std::string_view process, std::string_view config_source,
                                    bool tls_configured, bool insecure) {
  if (tls_configured && insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(config_source), ": insecure: true together with server.tls: remove one of them"));
  }
  if (!tls_configured && !insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(config_source),
        ": server.tls: not configured; set server.tls.cert_file, key_file and ca_file "
        "(tools/gen-certs makes them), or insecure: true to run without TLS and authentication"));
  }
  if (insecure) {
    std::cerr << "\n"
              << "********************************************************************\n"
              << "** " << process << ": INSECURE MODE (insecure: true in " << config_source
              << ")\n"
              << "** No TLS and no authentication: anyone who can reach this port can\n"
              << "** call every method, read prompts and documents, and (kvdir) register\n"
              << "** as any worker. Use only on a trusted loopback or for tests.\n"
              << "********************************************************************\n\n";
  }
  return absl::OkStatus();
}

absl::Status CheckPeerCallSecurity(std::string_view config_source, std::string_view ca_field,
                                   bool calls_peers, bool ca_configured, bool insecure) {
  if (insecure || !calls_peers || ca_configured) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(config_source), ": ", std::string(ca_field),
      ": not configured; the calls to other cluster processes would be plaintext. Set it with "
      "the certificate and key beside it (tools/gen-certs makes them), or insecure: true"));
}

}  // namespace lazyattn
