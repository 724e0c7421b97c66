#include "services/router/http/client_connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "services/router/http/guarded_server.h"

namespace lazyattn::router {

ClientConnection ClientConnection::OfThisThread() {
  return ClientConnection(CurrentConnectionSocket());
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
