#include "common/metrics.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"

namespace lazyattn {
namespace {

// "host:port" or "[v6]:port"; an empty host listens on every address.
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return !port->empty();
}

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the scraper went away
    done += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry) {
  auto fail = [&](const std::string& why) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", address, ": ", why));
  };
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) return fail("expected HOST:PORT");
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints,
                                 &found);
      rc != 0) {
    return fail(gai_strerror(rc));
  }
  auto endpoint = std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint());
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr && endpoint->listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      endpoint->listen_fd_ = fd;
    } else {
      last_error = strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (endpoint->listen_fd_ < 0) return fail(last_error);
  sockaddr_storage bound = {};
  socklen_t len = sizeof(bound);
  getsockname(endpoint->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  endpoint->port_ = ntohs(bound.ss_family == AF_INET6
                              ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(endpoint->wake_fd_, O_CLOEXEC) != 0) return fail(strerror(errno));
  endpoint->registry_ = std::move(registry);
  endpoint->thread_ = std::thread([e = endpoint.get()] { e->Serve(); });
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (thread_.joinable()) {
    const char b = 0;
    [[maybe_unused]] ssize_t n = write(wake_fd_[1], &b, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_fd_[0], wake_fd_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void MetricsEndpoint::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    Answer(connection);
    close(connection);
  }
}

// One request per connection: read the request head (2 s at most), answer, close.
void MetricsEndpoint::Answer(int connection) {
  std::string request;
  char buffer[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
    pollfd p = {connection, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) return;
    const ssize_t n = recv(connection, buffer, sizeof(buffer), 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  const bool get = request.rfind("GET ", 0) == 0;
  const size_t path_end = request.find(' ', 4);
  std::string path = get && path_end != std::string::npos ? request.substr(4, path_end - 4) : "";
  path = path.substr(0, path.find('?'));
  if (!get || path != "/metrics") {
    const std::string body = get ? "not found: this server has /metrics only\n" : "GET only\n";
    WriteAll(connection, absl::StrCat("HTTP/1.1 ", get ? "404 Not Found" : "405 Method Not Allowed",
                                      "\r\nContent-Type: text/plain\r\nContent-Length: ",
                                      body.size(), "\r\nConnection: close\r\n\r\n", body));
    return;
  }
  const std::string body = prometheus::TextSerializer().Serialize(registry_->Collect());
  WriteAll(connection,
           absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; "
                        "charset=utf-8\r\nContent-Length: ",
                        body.size(), "\r\nConnection: close\r\n\r\n", body));
}

}  // namespace lazyattn
