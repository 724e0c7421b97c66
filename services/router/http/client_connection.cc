#include "services/router/http/client_connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace lazyattn::router {
namespace {

// Whether a socket address is the request's numeric host and port. Compared as binary
// addresses, so that any numeric spelling of the host (getnameinfo's, inet_ntop's, with or without
// an IPv6 zone) matches.
bool SameAddress(const sockaddr_storage& addr, const std::string& ip, int port) {
  const std::string host = ip.substr(0, ip.find('%'));  // an IPv6 zone names no other address
  if (addr.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(addr);
    in_addr want{};
    return ntohs(a.sin_port) == port && inet_pton(AF_INET, host.c_str(), &want) == 1 &&
           want.s_addr == a.sin_addr.s_addr;
  }
  if (addr.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(addr);
    in6_addr want{};
    return ntohs(a.sin6_port) == port && inet_pton(AF_INET6, host.c_str(), &want) == 1 &&
           std::memcmp(&want, &a.sin6_addr, sizeof(want)) == 0;
  }
  return false;
}

// The descriptor is a TCP socket with the request's two ends. Within one process a connection's
// two ends identify it; the client end of a loopback connection made by this process has them
// the other way round.
bool IsRequestSocket(int fd, const httplib::Request& request) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      !SameAddress(addr, request.local_addr, request.local_port)) {
    return false;
  }
  len = sizeof(addr);
  return getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
         SameAddress(addr, request.remote_addr, request.remote_port);
}

int FindRequestSocket(const httplib::Request& request) {
  // cpp-httplib serves each connection, all its keep-alive requests, on one thread.
  thread_local int last = -1;
  if (last >= 0 && IsRequestSocket(last, request)) return last;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  const int own = dirfd(dir);
  int found = -1;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    if (IsRequestSocket(static_cast<int>(fd), request)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  if (found >= 0) last = found;
  return found;
}

}  // namespace

ClientConnection ClientConnection::Of(const httplib::Request& request) {
  if (request.ssl != nullptr) return ClientConnection(SSL_get_fd(request.ssl));
  if (request.remote_port < 0 || request.local_port < 0) return ClientConnection();
  return ClientConnection(FindRequestSocket(request));
}

bool ClientConnection::Gone() const {
  if (fd_ < 0) return false;
  // POLLRDHUP: the peer's FIN, reported even when unread bytes come before it (over TLS the
  // client's close_notify record does), which a peek alone would not see.
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
  if ((p.revents & POLLIN) == 0) return false;
  char c;
  const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;  // EOF
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace lazyattn::router
