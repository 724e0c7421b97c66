// Who is calling, and may they: peer identities from X.509 certificates (mutual TLS) and an
// authorization processor that gRPC runs before any handler.
//
// Internal processes carry a certificate whose subject alternative name holds one URI
// `lazyattn://ROLE/NAME` (tools/gen-certs makes them), e.g. lazyattn://worker/worker-0. The role
// and name come from that certificate, never from a request field. kvdir's (lazyattn://kvdir/kvdir)
// is checked by its clients (KvdirClientTls), since no server admits the kvdir role as a caller.
// RoleAuthorizer maps each method to the one role allowed to call it; anything not listed is
// refused (default deny), and the gRPC health and reflection services stay open so probes need no
// certificate.
//
//   ServerOptions o;
//   o.tls = {...};  // with ca_file: client certificates requested and verified
//   o.auth_processor = std::make_shared<RoleAuthorizer>(std::vector<MethodRole>{
//       {"/lazyattn.v1.KvDirectory/Publish", kRoleWorker}});
#ifndef LAZYATTN_COMMON_AUTH_H_
#define LAZYATTN_COMMON_AUTH_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/tls_certificate_verifier.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace lazyattn {

inline constexpr std::string_view kRoleWorker = "worker";
inline constexpr std::string_view kRoleRouter = "router";
inline constexpr std::string_view kRoleClient = "client";
inline constexpr std::string_view kRoleAdmin = "admin";
inline constexpr std::string_view kRoleKvdir = "kvdir";

// AuthContext properties RoleAuthorizer adds once a call is allowed (handlers read them).
inline constexpr char kPeerRoleProperty[] = "lazyattn_peer_role";
inline constexpr char kPeerNameProperty[] = "lazyattn_peer_name";

struct PeerIdentity {
  std::string role;  // one of the kRole* values
  std::string name;  // 1..128 of [A-Za-z0-9._-]
};

// `lazyattn://ROLE/NAME` with a known role and a well-formed name; nullopt otherwise.
std::optional<PeerIdentity> ParseIdentityUri(std::string_view uri);

// The first lazyattn:// SAN URI of the verified peer certificate in `context`; nullopt without a
// client certificate or without such a URI.
std::optional<PeerIdentity> PeerIdentityOf(const grpc::AuthContext& context);

// The identity RoleAuthorizer recorded for this call; nullopt when the server runs without an
// authorizer (insecure) or the method was open.
std::optional<PeerIdentity> AuthorizedPeerOf(const grpc::AuthContext& context);

// For TLS clients (MakeChannel with TlsOptions::server_identity): gRPC's host-name check of the
// server's certificate, then its lazyattn:// identity (the first such URI, as PeerIdentityOf
// reads it) against `expected`: the role must match, and the name too unless expected.name is
// empty. So a router sends a request (its prompt and documents) only to a peer whose
// certificate is that worker's, not to any certificate of the CA that names the host (every
// tools/gen-certs certificate names the same hosts: a router's or another worker's would pass
// the host-name check alone). A mismatch fails the handshake: the call ends UNAVAILABLE.
std::shared_ptr<grpc::experimental::CertificateVerifier> MakeServerIdentityVerifier(
    PeerIdentity expected);

struct MethodRole {
  std::string method_prefix;  // a full method ("/pkg.Service/Method") or a service ("/pkg.Service/")
  std::string_view role;
};

// Runs in gRPC's server auth filter for every call on a TLS server: open methods (health,
// reflection) pass; otherwise UNAUTHENTICATED without a lazyattn:// certificate identity and
// PERMISSION_DENIED when no rule admits the peer's role. Non-blocking: it reads only the context.
class RoleAuthorizer : public grpc::AuthMetadataProcessor {
 public:
  explicit RoleAuthorizer(std::vector<MethodRole> rules);

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const std::vector<MethodRole> rules_;
};

// True for the services every server keeps open to anyone who reaches it (probes, tooling).
bool IsOpenMethod(std::string_view path);

// The ":path" of a call in an AuthMetadataProcessor's input ("" if absent).
std::string_view MethodPathOf(const grpc::AuthMetadataProcessor::InputMetadata& metadata);

// The one place a process decides between TLS and plaintext: InvalidArgument naming the keys when
// neither TLS nor `insecure: true` is configured, or both are; with insecure, prints a loud
// warning to stderr saying what is turned off. `process` names the binary in messages.
absl::Status CheckTransportSecurity(std::string_view process, std::string_view config_source,
                                    bool tls_configured, bool insecure);

// The other half of that decision, for the calls a process makes: unless `insecure`, a process
// that calls peers (`calls_peers`) must have a CA to check them with (`ca_configured`), or
// InvalidArgument naming `ca_field`. Without one its calls went out in plaintext, silently,
// carrying what its own TLS protected (a router's prompts and documents).
absl::Status CheckPeerCallSecurity(std::string_view config_source, std::string_view ca_field,
                                   bool calls_peers, bool ca_configured, bool insecure);

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_AUTH_H_
