#include "common/grpc_util.h"

#include <grpc/grpc_security_constants.h>
#include <grpc/support/time.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/malformed_request.h"
#include "common/monotonic_time.h"
#include "common/tls_files.h"

namespace lazyattn {
namespace {

// Decides reflection per server. Linking gRPC's reflection library registers its plugin for every
// ServerBuilder of the process (a static initializer calls InitProtoReflectionServerBuilderPlugin),
// so the option removes that plugin and adds one back only where reflection is configured.
class ReflectionOption final : public grpc::ServerBuilderOption {
 public:
  explicit ReflectionOption(bool enabled) : enabled_(enabled) {}
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    const std::string name = grpc::reflection::ProtoServerReflectionPlugin().name();
    std::erase_if(*plugins, [&](const auto& p) { return p->name() == name; });
    if (enabled_) plugins->push_back(std::make_unique<grpc::reflection::ProtoServerReflectionPlugin>());
  }

 private:
  const bool enabled_;
};

// Watches the key, certificate and CA files of `tls` (TlsOptions says how to replace them)
// through their mirror (tls_files.h), which only a set that passes ReadTlsFiles updates: gRPC
// aborts on an empty certificate or key it reads. The files' error when they do not pass now.
absl::StatusOr<std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider>> WatchFiles(
    const TlsOptions& tls) {
  absl::StatusOr<std::shared_ptr<TlsFileMirror>> mirror = TlsFileMirror::For(tls);
  if (!mirror.ok()) return mirror.status();
  const TlsOptions& watched = (*mirror)->watched();
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      watched.key_file, watched.cert_file, watched.ca_file,
      static_cast<unsigned int>(watched.refresh_interval_s));
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

gpr_timespec GrpcMonotonicDeadline(absl::Time monotonic) {
  if (monotonic == absl::InfiniteFuture()) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  // Measured from both clocks' now rather than converted through their epochs: gRPC's
  // monotonic clock need not start where std::chrono::steady_clock does.
  const absl::Duration left = std::max(monotonic - MonotonicNow(), absl::ZeroDuration());
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_nanos(absl::ToInt64Nanoseconds(left), GPR_TIMESPAN));
}

bool HasChannelArgument(const grpc::ChannelArguments& args, const char* key) {
  const grpc_channel_args c = args.c_channel_args();
  for (size_t i = 0; i < c.num_args; ++i) {
    if (std::strcmp(c.args[i].key, key) == 0) return true;
  }
  return false;
}

void KeepCallbackQueueAlive() {
  // gRPC 1.51 on POSIX serves the callback API of every channel from one process-global
  // completion queue, counted by the channels that used it: when the last of them is destroyed
  // gRPC shuts the queue down and deletes it, and a channel made meanwhile races that teardown
  // (an abort in grpc_cq_internal_unref, "assertion failed: prior > 0"; seen in 1 of ~200 test
  // processes that create and destroy routers, and possible in a router that loses every worker).
  // One channel that made a callback call and is never destroyed keeps the count above zero.
  // Its objects live for the whole process, reachable from this static pointer (so
  // LeakSanitizer counts them as held, not leaked).
  struct Anchor {
    std::unique_ptr<grpc::GenericStub> stub;
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
  };
  static Anchor* const anchor = [] {
    auto* a = new Anchor;
    a->stub = std::make_unique<grpc::GenericStub>(
        grpc::CreateChannel("127.0.0.1:9", grpc::InsecureChannelCredentials()));
    a->context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1));
    grpc::Slice empty(std::string{});
    a->request = grpc::ByteBuffer(&empty, 1);  // an empty message, still a valid one
    a->stub->UnaryCall(&a->context, "/lazyattn.internal.Anchor/Keep", grpc::StubOptions(),
                       &a->request, &a->response, [](grpc::Status) {});
    return a;
  }();
  (void)anchor;
}

absl::Status CheckAddressPort(const std::string& address, bool listening) {
  absl::string_view rest = address;
  // Schemes gRPC resolves by name or address carry HOST:PORT after them; local sockets and
  // vsock have no TCP port to check.
  for (absl::string_view local : {"unix:", "unix-abstract:", "vsock:"}) {
    if (rest.substr(0, local.size()) == local) return absl::OkStatus();
  }
  for (absl::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (rest.substr(0, scheme.size()) == scheme) {
      // A list of addresses, each checked (gRPC balances over them).
      rest.remove_prefix(scheme.size());
      for (absl::string_view one : absl::StrSplit(rest, ',')) {
        absl::Status s = CheckAddressPort(std::string(one), listening);
        if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(address, ": ", s.message()));
      }
      return absl::OkStatus();
    }
  }
  if (rest.substr(0, 4) == "dns:") rest.remove_prefix(4);
  if (const size_t slash = rest.rfind('/'); slash != absl::string_view::npos) {
    rest.remove_prefix(slash + 1);  // dns://SERVER/HOST:PORT, dns:///HOST:PORT
  }
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(address, ": ", why));
  };
  absl::string_view port;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return refuse("an IPv6 address without its ']'");
    if (rest.substr(close + 1, 1) != ":")
      return refuse("expected [IPV6]:PORT, the port is missing");
    port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) return refuse("expected HOST:PORT, the port is missing");
    if (rest.find(':') != colon) return refuse("an IPv6 address needs brackets: [IPV6]:PORT");
    port = rest.substr(colon + 1);
  }
  const int lowest = listening ? 0 : 1;
  int number = -1;  // five digits at most: no overflow, no sign or blank as SimpleAtoi takes
  if (!port.empty() && port.size() <= 5 &&
      std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    number = std::stoi(std::string(port));
  }
  if (number < lowest || number > 65535) {
    return refuse(absl::StrCat("the port must be a number from ", lowest, " to 65535, got \"",
                               port.substr(0, 16), "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<BuiltServer> StartGrpcServer(const ServerOptions& options,
                                            const std::vector<grpc::Service*>& services) {
  KeepCallbackQueueAlive();
  // gRPC would take port 99999 modulo 65536 (34463) and an address without a port as 443.
  if (absl::Status s = CheckAddressPort(options.listen_address, /*listening=*/true); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot listen on ", s.message()));
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<ReflectionOption>(options.reflection));
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options.tls.cert_file.empty()) {
    // A start checks the files on disk, whether or not a mirror of them exists already.
    if (absl::Status s = CheckTlsFiles(options.tls, "server.tls."); !s.ok()) return s;
    auto files = WatchFiles(options.tls);
    if (!files.ok()) return files.status();
    grpc::experimental::TlsServerCredentialsOptions tls(*files);
    tls.watch_identity_key_cert_pairs();
    if (options.tls.ca_file.empty()) {
      tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    } else {
      tls.watch_root_certs();
      tls.set_cert_request_type(options.auth_processor != nullptr
                                    ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
                                    : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    }
    creds = grpc::experimental::TlsServerCredentials(tls);
    if (options.auth_processor != nullptr) creds->SetAuthMetadataProcessor(options.auth_processor);
  }
  BuiltServer built;
  builder.AddListeningPort(options.listen_address, creds, &built.port);
  // Bounds the memory gRPC's transport holds for the calls' messages as they arrive. Without it
  // anyone who reaches the port (health is open to every peer, without a certificate or key)
  // could announce messages of max_message_bytes, send all but their last bytes and stall: 20
  // such calls held 650 MB of a router. Over the quota gRPC reads less and cancels streams
  // (RESOURCE_EXHAUSTED) until it is back under it.
  static_assert(kTransportMemoryPerMessage >= 4, "room for a few whole messages");
  grpc::ResourceQuota quota(absl::StrCat("lazyattn-server ", options.listen_address));
  quota.Resize(static_cast<size_t>(kTransportMemoryPerMessage) *
               static_cast<size_t>(std::max(options.max_message_bytes, 1 << 20)));
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // gRPC binds with SO_REUSEPORT by default: a second process given a port in use started and
  // took a share of its connections (two kvdirs splitting the workers, a stale worker answering
  // for another). Off, the second bind fails and the process exits naming the address.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             options.min_ping_interval_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, options.max_connection_age_ms);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                             options.max_connection_age_grace_ms);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeMalformedRequestInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  built.server = builder.BuildAndStart();
  if (built.server == nullptr || built.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen_address));
  }
  if (auto* health = built.server->GetHealthCheckService()) health->SetServingStatus(true);
  return built;
}

TlsOptions KvdirClientTls(TlsOptions tls) {
  tls.server_identity = PeerIdentity{std::string(kRoleKvdir), ""};
  return tls;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& address, const TlsOptions& tls, int max_message_bytes,
    std::shared_ptr<grpc::CallCredentials> call_credentials, grpc::ChannelArguments args) {
  KeepCallbackQueueAlive();
  if (absl::Status s = CheckAddressPort(address, /*listening=*/false); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot dial ", s.message()));
  }
  if (call_credentials != nullptr && tls.ca_file.empty()) {
    return absl::InvalidArgumentError("call credentials need TLS (tls.ca_file)");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!tls.ca_file.empty()) {
    auto files = WatchFiles(tls);
    if (!files.ok()) return files.status();
    grpc::experimental::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(*files);
    options.watch_root_certs();
    if (!tls.cert_file.empty()) options.watch_identity_key_cert_pairs();
    // The server's certificate must name the host dialled, as with SslCredentials, and carry
    // the identity asked for, if any.
    if (tls.server_identity.has_value()) {
      options.set_certificate_verifier(MakeServerIdentityVerifier(*tls.server_identity));
    } else {
      options.set_certificate_verifier(
          std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
    }
    creds = grpc::experimental::TlsCredentials(options);
    if (call_credentials != nullptr) {
      creds = grpc::CompositeChannelCredentials(creds, call_credentials);
    }
  }
  return grpc::CreateCustomChannel(address, creds,
                                   ClientChannelArguments(std::move(args), max_message_bytes));
}

grpc::ChannelArguments ClientChannelArguments(grpc::ChannelArguments args, int max_message_bytes) {
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  if (!HasChannelArgument(args, GRPC_ARG_KEEPALIVE_TIME_MS)) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  }
  // Idle channels too (a router's channel to a worker between requests, a worker's to kvdir
  // between heartbeats), and with no cap on pings between data frames (gRPC stops at 2).
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  if (!HasChannelArgument(args, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS)) {
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  }
  return args;
}

std::string PeerCertificateSerial(const grpc::AuthContext& context) {
  const std::vector<grpc::string_ref> pems =
      context.FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pems.empty()) return "";
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pems[0].data(), static_cast<int>(pems[0].size())), &BIO_free);
  if (bio == nullptr) return "";
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), &X509_free);
  if (cert == nullptr) return "";
  std::unique_ptr<BIGNUM, decltype(&BN_free)> serial(
      ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert.get()), nullptr), &BN_free);
  if (serial == nullptr) return "";
  std::unique_ptr<char, void (*)(char*)> hex(BN_bn2hex(serial.get()),
                                             [](char* p) { OPENSSL_free(p); });
  return hex != nullptr ? std::string(hex.get()) : "";
}

namespace {

// The two messages of grpc.health.v1 in protobuf wire format, written here so the check needs no
// generated code: HealthCheckRequest {string service = 1}, HealthCheckResponse {ServingStatus
// status = 1} (SERVING = 1).
void AppendVarint(uint64_t v, std::string& out) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

bool ReadVarint(std::string_view& in, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const auto byte = static_cast<uint8_t>(in.front());
    in.remove_prefix(1);
    v |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// The status field of a HealthCheckResponse (0, UNKNOWN, when absent); nullopt if malformed.
std::optional<uint64_t> ServingStatusOf(std::string_view in) {
  uint64_t status = 0;
  while (!in.empty()) {
    uint64_t tag = 0, value = 0;
    if (!ReadVarint(in, tag)) return std::nullopt;
    switch (tag & 7) {
      case 0:  // varint
        if (!ReadVarint(in, value)) return std::nullopt;
        if (tag >> 3 == 1) status = value;
        break;
      case 2:  // length-delimited: skipped
        if (!ReadVarint(in, value) || value > in.size()) return std::nullopt;
        in.remove_prefix(value);
        break;
      default:
        return std::nullopt;
    }
  }
  return status;
}

}  // namespace

absl::StatusOr<bool> CheckGrpcHealth(const std::shared_ptr<grpc::Channel>& channel,
                                     const std::string& service, absl::Duration timeout) {
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0a);  // field 1, length-delimited
    AppendVarint(service.size(), request);
    request += service;
  }
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1), response_buffer;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request_buffer,
                 &response_buffer, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return FromGrpcStatus(status);
  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok()) {
    return absl::InternalError("grpc.health.v1 response: unreadable");
  }
  std::string response;
  for (const grpc::Slice& s : slices) {
    response.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  const std::optional<uint64_t> serving = ServingStatusOf(response);
  if (!serving) return absl::InternalError("grpc.health.v1 response: malformed");
  return *serving == 1;
}

}  // namespace lazyattn
