// gRPC plumbing shared by the three servers and their clients: status conversion, server options
// (listen address, message limits, optional TLS) and the standard services every server exposes
// (grpc.health.v1; server reflection only when configured).
#ifndef LAZYATTN_COMMON_GRPC_UTIL_H_
#define LAZYATTN_COMMON_GRPC_UTIL_H_

#include <grpc/support/time.h>
#include <grpcpp/grpcpp.h>

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth.h"

namespace lazyattn {

// Same code, same message (the two enums share their numbering).
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// `monotonic` (a MonotonicNow() value, common/monotonic_time.h) as a deadline on gRPC's monotonic
// clock, for grpc::Alarm::Set and ClientContext::set_deadline: the wait it ends does not move
// when the wall clock is stepped. InfiniteFuture is gRPC's infinite deadline.
gpr_timespec GrpcMonotonicDeadline(absl::Time monotonic);

// The files are watched (gRPC's FileWatcherCertificateProvider): a certificate, key or CA replaced
// on disk is used for every handshake after the next refresh, without a restart; connections
// already open keep the certificate they were made with. Replace the key and certificate
// together (write both elsewhere, then rename each over the old one, right after each other): a
// refresh between the two renames would read a mismatched pair.
struct TlsOptions {
  std::string cert_file;     // PEM; empty: plaintext
  std::string key_file;      // PEM, servers (and clients with a certificate)
  std::string ca_file;       // PEM; servers: require client certificates signed by it (mTLS)
  int refresh_interval_s = 60;  // how often the files are re-read; >= 1
  // Clients (MakeChannel) only: the lazyattn:// identity the server's certificate must carry
  // besides naming the host dialled (MakeServerIdentityVerifier: the role, and the name unless
  // empty). Unset: any certificate of the CA that names the host. Ignored without ca_file.
  std::optional<PeerIdentity> server_identity;
  // Servers only: the role (a kRole* value of auth.h) the lazyattn:// identity of their own
  // certificate must carry, checked whenever the files are read, at start and at every reload
  // (tls_files.h): clients accept a kvdir or a worker only through its role's certificate. Empty:
  // not checked (the router's fronts, whose clients use API keys).
  std::string own_role;
};

// Keepalive of every channel MakeChannel makes: an HTTP/2 ping every kKeepaliveTimeMs, idle
// connections too, and a connection whose ping is not answered within kKeepaliveTimeoutMs is
// closed (its calls end UNAVAILABLE) and dialled again. Without it a peer that vanished without
// closing its sockets (its node powered off, a partition, a replacement pod behind the same
// Service address) holds the channel until TCP gives up, about 15 minutes. Servers accept pings
// kMinPingIntervalMs apart (ServerOptions::min_ping_interval_ms's default).
inline constexpr int kMinPingIntervalMs = 5000;
inline constexpr int kKeepaliveTimeMs = 10000;
inline constexpr int kKeepaliveTimeoutMs = 10000;
static_assert(kMinPingIntervalMs < kKeepaliveTimeMs, "servers must accept the cluster's pings");
// Longest wait between two connection attempts of a MakeChannel channel whose peer is down
// (gRPC's own default grows to 120 s): a kvdir or a worker that comes back after a minute's
// outage is reached within seconds, not minutes later.
inline constexpr int kMaxReconnectBackoffMs = 5000;
// Keepalive of every server StartGrpcServer starts, towards its clients: a ping every
// kServerKeepaliveTimeMs, and a connection whose ping is not answered within kKeepaliveTimeoutMs
// is closed, ending its calls (gRPC's default waits 2 hours to ping). A client that vanished
// (power loss, a partition, a pod gone) no longer holds a router's admission slot, or a worker's
// request, for the 15 minutes of TCP retries. Every gRPC client answers pings.
inline constexpr int kServerKeepaliveTimeMs = 30000;
// How long a server keeps a connection (gRPC adds up to 10 % jitter): then it sends GOAWAY and
// the client opens a new connection, with a new handshake, for its next calls. A peer's
// certificate and identity are checked at the handshake only, so without an age a connection
// made with a certificate that was since rotated, expired or dropped from the CA file served
// new calls from its holder for as long as it stayed open. Calls already open finish on the old
// connection: by default they have no grace limit (a generation may outlast any fixed one, and
// its cut would read as its worker's crash); kvdir sets kPublishConnectionGraceMs, so that a
// Publish stream, which lives as long as its worker, is checked again too.
inline constexpr int kMaxConnectionAgeMs = 3600 * 1000;
inline constexpr int kNoConnectionGraceLimit = std::numeric_limits<int>::max();  // gRPC's "none"
// kvdir's grace: a Publish stream cut there reconnects at once and resends its snapshot; its
// lease and entries stay meanwhile.
inline constexpr int kPublishConnectionGraceMs = 15 * 60 * 1000;

// Every server's gRPC transport memory is bounded at this many times its max_message_bytes (a
// gRPC resource quota; StartGrpcServer): room for many whole messages at once, and a bound on
// what peers can make it hold with messages they start and never finish.
inline constexpr int kTransportMemoryPerMessage = 8;

struct ServerOptions {
  std::string listen_address = "127.0.0.1:0";  // port 0: the OS picks (see BuiltServer::port)
  int max_message_bytes = 64 << 20;
  TlsOptions tls;
  // Decides every call from the peer's certificate identity and metadata (common/auth.h); only
  // used with TLS (a plaintext server has no peer identity to check). With a processor and
  // tls.ca_file, client certificates are requested and verified but not required at the handshake,
  // so gRPC health probes without one still connect; the processor refuses everything else.
  std::shared_ptr<grpc::AuthMetadataProcessor> auth_processor;
  // Serve grpc.reflection (`server.reflection: true`): the schema of every service, for grpcurl
  // and similar tools. Off by default; when on it is open to anyone, like health.
  bool reflection = false;
  // Keepalive pings accepted this often, also on idle connections (gRPC's default, 5 minutes,
  // would answer the cluster's own channels' pings, kKeepaliveTimeMs apart, with GOAWAY). More
  // frequent pings count as strikes against the connection, as gRPC does by default.
  int min_ping_interval_ms = kMinPingIntervalMs;
  // The server's own pings to its clients (see kServerKeepaliveTimeMs).
  int keepalive_time_ms = kServerKeepaliveTimeMs;
  int keepalive_timeout_ms = kKeepaliveTimeoutMs;
  // See kMaxConnectionAgeMs.
  int max_connection_age_ms = kMaxConnectionAgeMs;
  int max_connection_age_grace_ms = kNoConnectionGraceLimit;
};

struct BuiltServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port
};

// Keeps gRPC's process-global callback completion queue alive until exit (see grpc_util.cc for
// the race it avoids). StartGrpcServer and MakeChannel call it; call it before creating channels
// with grpc::CreateChannel directly. Idempotent and thread-safe.
void KeepCallbackQueueAlive();

// Whether `address` (a gRPC listen or dial target) has a TCP port gRPC will use as written:
// HOST:PORT, [IPV6]:PORT, after a dns:, ipv4: or ipv6: scheme (dns://SERVER/ too), a port of
// 1 to 65535 (0 too when `listening`: the OS picks). gRPC takes 99999 modulo 65536 and a missing
// port as 443. unix:, unix-abstract: and vsock: targets pass unchecked. InvalidArgument quoting
// the address otherwise. StartGrpcServer and MakeChannel check this first.
absl::Status CheckAddressPort(const std::string& address, bool listening);

// Registers `services`, turns on the health service (SERVING for "" and each service name) and,
// with options.reflection, server reflection; applies limits and TLS (files watched, see
// TlsOptions), binds and starts. Unavailable naming the address if binding fails;
// InvalidArgument naming the file if a TLS file cannot be used (tls_files.h, CheckTlsFiles).
absl::StatusOr<BuiltServer> StartGrpcServer(const ServerOptions& options,
                                            const std::vector<grpc::Service*>& services);

// The exit status of a service whose server could not be created (docs/router.md, "Exit status"):
// 2 for InvalidArgument, a configuration error (a key's value, a TLS, key or token file it names
// that is missing or malformed, an address that does not parse), 1 for anything else (an address
// that cannot be bound).
inline int ExitStatusForStartFailure(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// A channel to `address` with the same limits and (client side) TLS. Every client channel of
// every program is made here, so all of them watch their files (TlsOptions): a client
// certificate replaced on disk is presented on the channel's next connection, no restart needed.
// `call_credentials` (e.g. grpc::AccessTokenCredentials for an API key) are attached to every
// call; they need TLS (InvalidArgument without tls.ca_file, as gRPC would not send them in
// plaintext). `args`: further channel arguments (e.g. reconnect backoff); the message limits are
// set over them, and the keepalive above unless `args` sets GRPC_ARG_KEEPALIVE_TIME_MS itself.
// InvalidArgument naming the file (`tls.ca_file: cannot read ...`) if a TLS file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& address, const TlsOptions& tls, int max_message_bytes = 64 << 20,
    std::shared_ptr<grpc::CallCredentials> call_credentials = nullptr,
    grpc::ChannelArguments args = {});
// `tls` for a channel to kvdir: the server's certificate must also carry kvdir's identity
// (lazyattn://kvdir/NAME, any name). Every certificate tools/gen-certs makes names the same
// hosts, so without it a worker's or a router's certificate could serve as the directory: hand
// routers a worker list of its choosing and take every worker's document announcements.
TlsOptions KvdirClientTls(TlsOptions tls);
// The arguments MakeChannel creates its channel with: `args` plus the message limits, and the
// keepalive and reconnect backoff above where `args` does not set them.
grpc::ChannelArguments ClientChannelArguments(grpc::ChannelArguments args, int max_message_bytes);
// Whether `args` sets `key` (a GRPC_ARG_* name).
bool HasChannelArgument(const grpc::ChannelArguments& args, const char* key);

// The serial number (upper-case hex, as `openssl x509 -serial` prints it) of the verified
// certificate the peer presented on this connection; "" without one. For logs: it shows which
// certificate a peer used (after a rotation, the new one).
std::string PeerCertificateSerial(const grpc::AuthContext& context);

// grpc.health.v1.Health/Check of `service` ("" = the whole server) over `channel`: true when the
// server answers SERVING, false for NOT_SERVING or UNKNOWN. The call's own error otherwise
// (DeadlineExceeded or Unavailable when nothing answers in `timeout`, NotFound for a service the
// server does not know). For health probes that have no gRPC health client (docker compose).
absl::StatusOr<bool> CheckGrpcHealth(const std::shared_ptr<grpc::Channel>& channel,
                                     const std::string& service, absl::Duration timeout);

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_GRPC_UTIL_H_
