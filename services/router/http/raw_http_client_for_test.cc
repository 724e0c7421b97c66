#include "services/router/http/raw_http_client_for_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace lazyattn::router::testing {

int Connect(int port, const std::string& source) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (!source.empty()) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    inet_pton(AF_INET, source.c_str(), &from.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
      close(fd);
      return -1;
    }
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::string ReadHead(int fd) {
  std::string out;
  char c;
  while (out.find("\r\n\r\n") == std::string::npos && read(fd, &c, 1) == 1) out.push_back(c);
  return out;
}

std::string ReadAll(int fd, bool* closed) {
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (closed != nullptr) *closed = n == 0 || errno != EAGAIN;
    return out;
  }
}

std::string ReadResponse(int fd) {
  std::string out = ReadHead(fd);
  const size_t at = out.find("Content-Length: ");
  if (at == std::string::npos) return out;
  size_t left = std::strtoul(out.c_str() + at + 16, nullptr, 10);
  char buf[4096];
  while (left > 0) {
    const ssize_t n = read(fd, buf, std::min(left, sizeof(buf)));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    left -= static_cast<size_t>(n);
  }
  return out;
}

int CountResponses(const std::string& reply) {
  int n = 0;
  for (size_t at = reply.find("HTTP/1.1 "); at != std::string::npos;
       at = reply.find("HTTP/1.1 ", at + 1)) {
    if (at + 9 < reply.size() && reply[at + 9] >= '1' && reply[at + 9] <= '5') ++n;
  }
  return n;
}

}  // namespace lazyattn::router::testing
