#include "services/router/http/connection_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace lazyattn::router {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

void AddressOf(const sockaddr_storage& addr, std::string& ip, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
    port = ntohs(in.sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
    inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
    port = ntohs(in6.sin6_port);
  }
  ip = text;
}

// cpp-httplib's liveness test before each write: a peer that closed makes the socket readable
// with nothing to peek, so a stream to a client that went away stops at its next event.
bool PeerStillThere(int fd) {
  pollfd p{fd, POLLIN, 0};
  const int ready = poll(&p, 1, 0);
  if (ready == 0) return true;
  if (ready < 0) return errno == EINTR;
  char c;
  return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

}  // namespace

bool WaitForSocket(int fd, short events, milliseconds timeout, SteadyTime deadline) {
  const SteadyTime until = std::min(deadline, steady_clock::now() + timeout);
  while (true) {
    const auto left = std::chrono::ceil<milliseconds>(until - steady_clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, INT_MAX)));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
  }
}

bool WaitForSocketOrStop(int fd, short events, milliseconds timeout, SteadyTime deadline,
                         const std::atomic<socket_t>* listener, SteadyTime* stopped_at) {
  if (listener == nullptr) return WaitForSocket(fd, events, timeout, deadline);
  // In slices, so that a stop is seen within one.
  constexpr milliseconds kStopSlice{100};
  const SteadyTime until = std::min(deadline, steady_clock::now() + timeout);
  while (true) {
    SteadyTime end = until;
    if (listener->load() == INVALID_SOCKET) {
      if (*stopped_at == SteadyTime()) *stopped_at = steady_clock::now();
      end = std::min(end, *stopped_at + kWaitAfterStop);
    }
    if (steady_clock::now() >= end) return false;
    if (WaitForSocket(fd, events, kStopSlice, end)) return true;
  }
}

bool ConnectionStream::Wait(short events, milliseconds timeout, SteadyTime deadline) const {
  return WaitForSocketOrStop(fd_, events, timeout, deadline, listener_, &stopped_at_);
}

bool ConnectionStream::WaitForData(milliseconds timeout) const {
  return HasReadAhead() || Wait(POLLIN, timeout, deadline_);
}

bool ConnectionStream::WaitReadable() const { return Wait(POLLIN, read_timeout_, deadline_); }

bool ConnectionStream::WaitWritable() const { return WaitDuringWrite(POLLOUT); }

bool ConnectionStream::WaitDuringWrite(short events) const {
  const SteadyTime start = steady_clock::now();
  SteadyTime deadline = write_deadline_;
  if (write_wait_budget_.count() > 0) {
    const auto left = write_wait_budget_ - write_waited_;
    if (left <= steady_clock::duration::zero() && write_earned_ <= steady_clock::duration::zero()) {
      return false;
    }
    deadline = std::min(deadline, start + kUncountedWait + write_earned_ +
                                      std::max(left, steady_clock::duration::zero()));
  }
  const bool ready = Wait(events, write_timeout_, deadline);
  const auto over =
      std::max(steady_clock::duration::zero(), steady_clock::now() - start - kUncountedWait);
  const auto from_earned = std::min(over, write_earned_);
  write_earned_ -= from_earned;
  write_waited_ += over - from_earned;
  if (!ready && write_wait_budget_.count() > 0 && write_waited_ >= write_wait_budget_) {
    // Logged once: the write fails and the connection closes; cpp-httplib and the handler see
    // only a failed write, as of a client that hung up.
    std::string ip;
    int port = 0;
    get_remote_ip_and_port(ip, port);
    LogWarning("router")
        .Str("peer", absl::StrCat(ip, ":", port))
        .Int("write_wait_budget_ms", write_wait_budget_.count())
        .Int("earned_bytes_per_s", earned_bytes_per_s_)
        .Msg(
            "an HTTP client took too long to read its answer (http.write_wait_budget_ms); "
            "connection closed");
  }
  return ready;
}

void ConnectionStream::BeginRequest(size_t max_head_bytes) {
  max_head_bytes_ = max_head_bytes;
  head_bytes_ = 0;
  in_head_ = true;
  head_too_large_ = false;
  body_line_bytes_ = 0;
  body_line_too_long_ = false;
  head_lines_ = HeadLineChecker();
  head_malformed_ = false;
  chunked_ = ChunkedBodyChecker();
  checking_chunked_ = false;
  write_waited_ = steady_clock::duration::zero();
  write_earned_ = steady_clock::duration::zero();
}

void ConnectionStream::Sent(ssize_t n) {
  if (n <= 0 || earned_bytes_per_s_ <= 0 || write_wait_budget_.count() <= 0) return;
  // At most one budget ahead: bytes the kernel's buffers took (megabytes) earn time without the
  // client reading them, and a client that read fast for a long answer must not bank hours for
  // a stall at its end. (The cap also keeps the sum far from overflowing.)
  const double earned = static_cast<double>(n) / static_cast<double>(earned_bytes_per_s_);
  const auto cap = std::chrono::duration_cast<steady_clock::duration>(write_wait_budget_);
  write_earned_ = std::min(
      cap, write_earned_ +
               std::chrono::duration_cast<steady_clock::duration>(std::chrono::duration<double>(
                   std::min(earned, std::chrono::duration<double>(cap).count()))));
}

void ConnectionStream::BeginChunkedBody() {
  chunked_ = ChunkedBodyChecker();
  checking_chunked_ = true;
}

ssize_t ConnectionStream::Counted(const char* data, size_t size, ssize_t n) {
  if (n <= 0) return n;
  if (in_head_) {
    head_bytes_ += static_cast<size_t>(n);
    if (max_head_bytes_ > 0 && head_bytes_ > max_head_bytes_) {
      head_too_large_ = true;
      return -1;
    }
    // A problem in the request line fails the first read after it (the class comment says why).
    if (head_lines_.failed() && !head_lines_.in_request_line()) {
      head_malformed_ = true;
      return -1;
    }
    for (ssize_t i = 0; i < n; ++i) head_lines_.Feed(data[i]);
    if (head_lines_.failed() && !head_lines_.failed_in_request_line()) {
      head_malformed_ = true;
      return -1;
    }
    return n;
  }
  if (checking_chunked_ && !chunked_.Feed(data, static_cast<size_t>(n))) return -1;
  // cpp-httplib reads a line a byte at a time and data in reads of up to 4 KiB, so a run of
  // one-byte reads without '\n' is a line in the making. A data read asks for one byte only for
  // the last byte of a chunk (or of the body), which a line ending follows; the run is then at
  // most one longer than the line. The size asked, not returned, tells them apart: a trickled
  // body comes a byte at a time too.
  if (size == 1 && data[0] != '\n') {
    if (++body_line_bytes_ > kMaxBodyLineBytes) {
      body_line_too_long_ = true;
      return -1;
    }
  } else {
    body_line_bytes_ = 0;
  }
  return n;
}

bool ConnectionStream::is_readable() const { return HasReadAhead() || WaitReadable(); }

bool ConnectionStream::is_writable() const { return WaitWritable() && PeerStillThere(fd_); }

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) AddressOf(addr, ip, port);
}

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) AddressOf(addr, ip, port);
}

ssize_t PlainStream::read(char* ptr, size_t size) {
  if (reads_refused()) return -1;
  while (begin_ == end_) {
    if (!WaitReadable()) return -1;
    const ssize_t n = recv(fd_, buffer_.data(), buffer_.size(), MSG_DONTWAIT);
    if (n > 0) {
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    } else if (n == 0) {
      return 0;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return -1;
    }
  }
  const size_t n = std::min(size, end_ - begin_);
  std::memcpy(ptr, buffer_.data() + begin_, n);
  begin_ += n;
  return Counted(ptr, size, static_cast<ssize_t>(n));
}

ssize_t PlainStream::write(const char* ptr, size_t size) {
  if (!is_writable()) return -1;
  // Never a blocking send: one would wait up to the socket's SO_SNDTIMEO (write_timeout) per call
  // whatever the write deadline says. A partial send returns its count; the library writes the
  // rest, each time after is_writable.
  while (true) {
    const ssize_t n = send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      Sent(n);
      return n;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    if (!WaitWritable()) return -1;
  }
}

ssize_t TlsStream::read(char* ptr, size_t size) {
  if (reads_refused()) return -1;
  const int len = static_cast<int>(std::min<size_t>(size, INT_MAX));
  while (true) {
    ERR_clear_error();
    const int n = SSL_read(ssl_, ptr, len);
    if (n > 0) return Counted(ptr, size, n);
    switch (SSL_get_error(ssl_, n)) {
      case SSL_ERROR_WANT_READ:
        if (!WaitReadable()) return -1;
        break;
      case SSL_ERROR_WANT_WRITE:  // a read's wait: its timeout and deadline, not the write's
        if (!Wait(POLLOUT, read_timeout_, deadline_)) return -1;
        break;
      case SSL_ERROR_ZERO_RETURN:
        return 0;  // close_notify
      default:
        return -1;
    }
  }
}

ssize_t TlsStream::write(const char* ptr, size_t size) {
  if (!is_writable()) return -1;
  // One TLS record a call (the library writes the rest, as after a partial send): SSL_write
  // returns only once all it was given is out, so a megabyte event (an echoed prompt) would earn
  // its waiting time only after its last wait (set_write_wait_budget).
  const int len = static_cast<int>(std::min<size_t>(size, kTlsRecordBytes));
  while (true) {
    // Retried with the same arguments, as OpenSSL requires after WANT_*.
    ERR_clear_error();
    const int n = SSL_write(ssl_, ptr, len);
    if (n > 0) {
      Sent(n);
      return n;
    }
    switch (SSL_get_error(ssl_, n)) {
      case SSL_ERROR_WANT_WRITE:
        if (!WaitWritable()) return -1;
        break;
      case SSL_ERROR_WANT_READ:  // a TLS record from the client first: the write waits on it
        if (!WaitDuringWrite(POLLIN)) return -1;
        break;
      default:
        return -1;
    }
  }
}

SSL* AcceptTls(int fd, SSL_CTX* ctx, milliseconds timeout, SteadyTime deadline,
               const std::atomic<socket_t>* listener) {
  SteadyTime stopped_at{};
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return nullptr;
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr) return nullptr;
  if (SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return nullptr;
  }
  while (true) {
    ERR_clear_error();
    const int r = SSL_accept(ssl);
    if (r == 1) return ssl;
    bool waited = false;
    switch (SSL_get_error(ssl, r)) {
      case SSL_ERROR_WANT_READ:
        waited = WaitForSocketOrStop(fd, POLLIN, timeout, deadline, listener, &stopped_at);
        break;
      case SSL_ERROR_WANT_WRITE:
        waited = WaitForSocketOrStop(fd, POLLOUT, timeout, deadline, listener, &stopped_at);
        break;
      default:
        break;
    }
    if (!waited) {
      ERR_clear_error();
      SSL_free(ssl);
      return nullptr;
    }
  }
}

}  // namespace lazyattn::router
