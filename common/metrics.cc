#include "common/metrics.h"

#include <CivetServer.h>
#include <civetweb.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <prometheus/exposer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file_stamp.h"
#include "common/grpc_util.h"
#include "common/process_metrics.h"

namespace lazyattn {
namespace {

// The token of each endpoint of this process, by listening port. civetweb's callbacks carry no
// pointer of ours (prometheus-cpp passes none), and a request names the port it came in on. A
// port not (yet) in the map is refused: between the exposer's start and the registration of its
// port, nothing is served without the check.
std::mutex guards_mu;
std::map<int, std::string>& Guards() {
  static auto* guards = new std::map<int, std::string>();
  return *guards;
}

void Reply(mg_connection* conn, int code, const char* reason, const char* extra,
           const char* body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n%s"
            "Connection: close\r\n\r\n%s",
            code, reason, strlen(body), extra, body);
}

// begin_request runs before civetweb looks for a handler: 0 lets the exposer answer.
int CheckRequest(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  std::string token;
  bool known;
  {
    std::lock_guard<std::mutex> lock(guards_mu);
    auto it = Guards().find(info->server_port);
    known = it != Guards().end();
    if (known) token = it->second;
  }
  if (!known) {
    Reply(conn, 503, "Service Unavailable", "", "starting\n");
    return 503;
  }
  if (strcmp(info->request_method, "GET") != 0 && strcmp(info->request_method, "HEAD") != 0) {
    Reply(conn, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n", "GET only\n");
    return 405;
  }
  if (!token.empty()) {
    const char* header = mg_get_header(conn, "Authorization");
    const std::string expected = "Bearer " + token;
    const bool ok = header != nullptr && strlen(header) == expected.size() &&
                    CRYPTO_memcmp(header, expected.data(), expected.size()) == 0;
    if (!ok) {
      Reply(conn, 401, "Unauthorized", "WWW-Authenticate: Bearer realm=\"metrics\"\r\n",
            "a bearer token is required (metrics.bearer_token_file)\n");
      return 401;
    }
  }
  if (strcmp(info->local_uri, "/metrics") != 0) {
    Reply(conn, 404, "Not Found", "", "not found: this server has /metrics only\n");
    return 404;
  }
  return 0;
}

// civetweb's listening_ports syntax wants a numeric address; "host:port" is resolved here so
// that names work and a bad address fails before civetweb logs to stderr.
struct ListenAddress {
  std::string civetweb;  // listening_ports syntax
  std::string wake;      // a numeric address that reaches the listener
};

absl::StatusOr<ListenAddress> ListeningPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError("expected HOST:PORT");
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  for (char c : port) {
    if (c < '0' || c > '9') return absl::InvalidArgumentError("the port is not a number");
  }
  if (host.empty()) return ListenAddress{port, "127.0.0.1"};  // every address
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(gai_strerror(rc));
  }
  char numeric[NI_MAXHOST] = {};
  const int family = found->ai_family;
  const int rc = getnameinfo(found->ai_addr, found->ai_addrlen, numeric, sizeof(numeric),
                             nullptr, 0, NI_NUMERICHOST);
  freeaddrinfo(found);
  if (rc != 0) return absl::InvalidArgumentError(gai_strerror(rc));
  std::string wake = numeric;
  if (wake == "0.0.0.0") wake = "127.0.0.1";
  if (wake == "::") wake = "::1";
  return family == AF_INET6 ? ListenAddress{absl::StrCat("[", numeric, "]:", port), wake}
                            : ListenAddress{absl::StrCat(numeric, ":", port), wake};
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry,
    const MetricsEndpointOptions& options) {
  auto fail = [&](absl::string_view why) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", address, ": ", why));
  };
  // civetweb would bind port 99999 as 34463 (the port modulo 65536): refused as configuration.
  if (absl::Status s = CheckAddressPort(address, /*listening=*/true); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics: cannot listen on ", s.message()));
  }
  absl::StatusOr<ListenAddress> listening = ListeningPort(address);
  if (!listening.ok()) return fail(listening.status().message());
  static const CivetCallbacks callbacks = [] {
    CivetCallbacks c;
    c.begin_request = CheckRequest;
    // civetweb's own error log would go to stderr with no structure; failures reach the caller
    // as the exposer's exception instead.
    c.log_message = [](const mg_connection*, const char*) { return 1; };
    return c;
  }();
  auto endpoint = std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint());
  try {
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", listening->civetweb, "num_threads",
                                 std::to_string(kThreads), "request_timeout_ms",
                                 std::to_string(kRequestTimeoutMs)},
        &callbacks);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) return fail("no listening port");
  endpoint->port_ = ports[0];
  endpoint->wake_host_ = listening->wake;
  endpoint->registry_ = std::move(registry);
  endpoint->process_ = std::make_shared<ProcessCollector>();
  endpoint->build_info_ = BuildInfoRegistry();
  endpoint->exposer_->RegisterCollectable(endpoint->registry_);
  endpoint->exposer_->RegisterCollectable(endpoint->process_);
  endpoint->exposer_->RegisterCollectable(endpoint->build_info_);
  {
    std::lock_guard<std::mutex> lock(guards_mu);
    Guards()[endpoint->port_] = options.bearer_token;
  }
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  // civetweb's accept loop polls with a 2 s quantum and sees the stop flag only when the poll
  // returns: a connection to the listener wakes it, so shutdown takes milliseconds, not 2 s.
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] {
    while (!stopped.load()) {
      addrinfo hints = {};
      hints.ai_socktype = SOCK_STREAM;
      hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
      addrinfo* found = nullptr;
      if (getaddrinfo(wake_host_.c_str(), std::to_string(port_).c_str(), &hints, &found) == 0) {
        const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0) {
          connect(fd, found->ai_addr, found->ai_addrlen);
          close(fd);
        }
        freeaddrinfo(found);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  exposer_.reset();  // joins civetweb's threads: no request is in CheckRequest after this
  stopped.store(true);
  waker.join();
  if (port_ != 0) {
    std::lock_guard<std::mutex> lock(guards_mu);
    Guards().erase(port_);
  }
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
    const std::string& address, const std::string& bearer_token_file,
    std::shared_ptr<prometheus::Registry> registry) {
  if (address.empty()) return std::unique_ptr<MetricsEndpoint>();
  MetricsEndpointOptions options;
  if (!bearer_token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadBearerTokenFile("metrics.bearer_token_file", bearer_token_file);
    if (!token.ok()) return token.status();
    options.bearer_token = *std::move(token);
  }
  return MetricsEndpoint::Start(address, std::move(registry), options);
}

absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& key, const std::string& path) {
  // A regular file of at most 64 KiB: a FIFO would block start-up (and its stop signals) until
  // written to, /dev/zero would be read until memory ran out.
  absl::StatusOr<StampedText> read = ReadStampedFile(path, 64 << 10);
  if (!read.ok())
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", read.status().message()));
  std::string token(absl::StripAsciiWhitespace(read->text));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(key, ": ", path, " is empty"));
  if (token.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", path, " holds more than one line"));
  }
  return token;
}

}  // namespace lazyattn
