#include "services/router/http/guarded_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/router/http/error_mapping.h"

namespace lazyattn::router {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// What the handlers tell the loop about the request this thread serves.
struct ConnectionState {
  ConnectionStream* stream = nullptr;
  milliseconds body_timeout{0};
  milliseconds write_timeout{0};
  int64_t min_send_bytes_per_s = 0;
  bool close = false;           // close after this response
  int64_t drain = 0;            // ... lingering to drop this much of an unread body
  bool headers_marked = false;  // MarkHeadersReceived ran for this request
  bool body_marked = false;     // MarkBodyReceived ran for this request
};
thread_local ConnectionState* current_connection = nullptr;
thread_local bool shed_thread = false;

// A kept-alive connection's idle wait polls in slices this long, so that a stopped server ends
// its idle connections soon instead of after keep_alive_timeout.
constexpr milliseconds kIdleSlice{100};
// The lingering close's bound in time (its bound in bytes is the handler's).
constexpr milliseconds kLingerTime{2000};

milliseconds Millis(time_t sec, time_t usec) {
  return milliseconds(static_cast<int64_t>(sec) * 1000 + static_cast<int64_t>(usec) / 1000);
}

std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in&>(addr).sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6&>(addr).sin6_addr, text, sizeof(text));
  }
  return text;
}

struct LoopParams {
  const std::atomic<socket_t>* listener;  // INVALID_SOCKET once the server stops
  size_t keep_alive_max_count;
  milliseconds keep_alive_timeout;
  milliseconds header_timeout;
  milliseconds body_timeout;
  size_t max_header_bytes;
  milliseconds write_timeout;
  int64_t min_send_bytes_per_s;
  milliseconds write_wait_budget;
};

using ProcessRequest =
    std::function<bool(httplib::Stream&, bool close_connection, bool& connection_closed)>;

// Waits for the first byte of the next request: up to `idle`, not past the stream's deadline.
bool AwaitRequest(const LoopParams& p, const ConnectionStream& stream, milliseconds idle) {
  const SteadyTime end = steady_clock::now() + idle;
  while (p.listener->load() != INVALID_SOCKET) {
    const auto left = std::chrono::ceil<milliseconds>(end - steady_clock::now());
    if (left.count() <= 0) return false;
    if (stream.WaitForData(std::min(kIdleSlice, left))) return true;
    if (stream.deadline_passed()) return false;
  }
  return false;
}

// The keep-alive loop of cpp-httplib's process_server_socket_core, with the header deadline and
// the handlers' close request. Returns the last request's result; `drain` as ConnectionState's.
bool ServeRequests(const LoopParams& p, ConnectionStream& stream, SteadyTime first_deadline,
                   const ProcessRequest& process, int64_t* drain) {
  ConnectionState state;
  state.stream = &stream;
  state.body_timeout = p.body_timeout;
  state.write_timeout = p.write_timeout;
  state.min_send_bytes_per_s = p.min_send_bytes_per_s;
  current_connection = &state;
  bool ret = false;
  bool first = true;
  for (size_t left = p.keep_alive_max_count; left > 0; --left) {
    // The first request's time runs from when the connection was taken up (its TLS handshake
    // included); a later one's from its first byte.
    stream.set_deadline(first ? first_deadline : kNoDeadline);
    stream.set_write_deadline(kNoDeadline);
    // BoundResponseWrite may lift it; the bytes sent earn time at the rate it would give.
    stream.set_write_wait_budget(p.write_wait_budget, p.min_send_bytes_per_s);
    if (!AwaitRequest(p, stream, p.keep_alive_timeout)) break;
    if (!first) stream.set_deadline(steady_clock::now() + p.header_timeout);
    first = false;
    stream.BeginRequest(p.max_header_bytes);
    state.headers_marked = false;
    state.body_marked = false;
    bool connection_closed = false;
    ret = process(stream, left == 1, connection_closed);
    if (!ret || connection_closed || state.close) break;
  }
  current_connection = nullptr;
  *drain = state.drain;
  return ret;
}

// Stops sending, then reads and drops what the client still sends (at most `max_bytes`, at most
// kLingerTime), so that the response already sent is not lost to a reset (a close with unread
// data sends RST, and the client may discard the response before reading it).
void LingeringClose(int fd, int64_t max_bytes) {
  shutdown(fd, SHUT_WR);
  const SteadyTime deadline = steady_clock::now() + kLingerTime;
  char buf[16 * 1024];
  int64_t dropped = 0;
  while (dropped < max_bytes && WaitForSocket(fd, POLLIN, kLingerTime, deadline)) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(sizeof(buf), max_bytes - dropped));
    const ssize_t n = recv(fd, buf, want, MSG_DONTWAIT);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      break;
    }
    dropped += n;
  }
}

constexpr char kShedMessage[] =
    "router busy: too many HTTP connections (http.threads, http.max_queued_connections); retry "
    "later";

std::string OverCapMessage(int cap) {
  return absl::StrCat("too many connections from this address (http.max_connections_per_client ",
                      cap, "); retry later");
}

// A connection refused before its request, plaintext: 503 without reading the request (the
// response is small enough for the socket buffer, so the send never waits), then closed.
void RefuseBusyPlain(int fd, const std::string& message) {
  const std::string body = ErrorBody(503, message, "unavailable");
  const std::string response = absl::StrCat(
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
      "Content-Length: ",
      body.size(), "\r\nConnection: close\r\nRetry-After: 1\r\n\r\n", body);
  (void)!send(fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  shutdown(fd, SHUT_WR);
  // Drops what already arrived, so that the close itself does not reset the connection.
  char buf[4096];
  while (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

void CloseSocket(int fd) {
  shutdown(fd, SHUT_RDWR);
  close(fd);
}

}  // namespace

void ShedConnectionsOnThisThread() { shed_thread = true; }

int CurrentConnectionSocket() {
  return current_connection != nullptr ? current_connection->stream->socket() : -1;
}

void MarkHeadersReceived() {
  if (current_connection == nullptr) return;
  current_connection->headers_marked = true;
  current_connection->stream->EndHead();
  current_connection->stream->set_deadline(steady_clock::now() + current_connection->body_timeout);
}

void MarkBodyReceived() {
  if (current_connection == nullptr) return;
  current_connection->body_marked = true;
  current_connection->stream->set_deadline(kNoDeadline);
}

bool HeadersMarkedReceived() {
  return current_connection != nullptr && current_connection->headers_marked;
}

bool BodyMarkedReceived() {
  return current_connection != nullptr && current_connection->body_marked;
}

bool RequestHeadTooLarge() {
  return current_connection != nullptr && current_connection->stream->head_too_large();
}

std::string RequestHeadProblem() {
  return current_connection != nullptr ? current_connection->stream->head_problem() : "";
}

void CheckChunkedBody() {
  if (current_connection != nullptr) current_connection->stream->BeginChunkedBody();
}

const ChunkedBodyChecker* ChunkedBodyCheck() {
  return current_connection != nullptr ? current_connection->stream->chunked_body() : nullptr;
}

bool BodyTimedOut() {
  return current_connection != nullptr && current_connection->stream->deadline_passed();
}

void BoundResponseWrite(size_t bytes) {
  if (current_connection == nullptr) return;
  // Not streamed: bounded by the deadline from its size, not the wait budget, which would cut a
  // large answer sent at the minimum rate short of its deadline.
  current_connection->stream->set_write_wait_budget(milliseconds(0));
  if (current_connection->min_send_bytes_per_s <= 0) return;
  // The head is not counted: a few hundred bytes, inside the grace.
  const auto at_min_rate = std::chrono::duration_cast<milliseconds>(std::chrono::duration<double>(
      static_cast<double>(bytes) / static_cast<double>(current_connection->min_send_bytes_per_s)));
  current_connection->stream->set_write_deadline(steady_clock::now() +
                                                 current_connection->write_timeout + at_min_rate);
}

void CloseConnectionAfterResponse(int64_t drain_bytes) {
  if (current_connection == nullptr) return;
  current_connection->close = true;
  current_connection->drain = std::max(current_connection->drain, drain_bytes);
}

bool ClosesAfterResponse() { return current_connection != nullptr && current_connection->close; }

bool GuardedServer::process_and_close_socket(socket_t sock) {
  const SteadyTime start = steady_clock::now();
  bool ret = false;
  if (shed_thread) {
    RefuseBusyPlain(sock, kShedMessage);
  } else if (auto slot = limits_.slots->TryAcquire(PeerAddress(sock)); slot == nullptr) {
    RefuseBusyPlain(sock, OverCapMessage(limits_.slots->max_per_client()));
  } else {
    PlainStream stream(sock, Millis(read_timeout_sec_, read_timeout_usec_),
                       Millis(write_timeout_sec_, write_timeout_usec_));
    stream.set_stop_signal(&svr_sock_);
    const LoopParams params{&svr_sock_,
                            keep_alive_max_count_,
                            Millis(keep_alive_timeout_sec_, 0),
                            limits_.header_timeout,
                            limits_.body_timeout,
                            limits_.max_header_bytes,
                            Millis(write_timeout_sec_, write_timeout_usec_),
                            limits_.min_send_bytes_per_s,
                            limits_.write_wait_budget};
    int64_t drain = 0;
    ret = ServeRequests(
        params, stream, start + limits_.header_timeout,
        [this](httplib::Stream& strm, bool close_connection, bool& connection_closed) {
          return process_request(strm, close_connection, connection_closed, nullptr);
        },
        &drain);
    if (drain > 0) LingeringClose(sock, drain);
  }
  CloseSocket(sock);
  return ret;
}

bool GuardedSslServer::process_and_close_socket(socket_t sock) {
  const SteadyTime start = steady_clock::now();
  bool ret = false;
  // Shed or over the cap: closed before the handshake (an answer would need one, which the client
  // could stretch to the header timeout).
  if (shed_thread) {
    // closed below
  } else if (auto slot = limits_.slots->TryAcquire(PeerAddress(sock)); slot != nullptr) {
    const milliseconds read_timeout = Millis(read_timeout_sec_, read_timeout_usec_);
    SSL* ssl =
        AcceptTls(sock, ssl_context(), read_timeout, start + limits_.header_timeout, &svr_sock_);
    if (ssl != nullptr) {
      TlsStream stream(sock, ssl, read_timeout, Millis(write_timeout_sec_, write_timeout_usec_));
      stream.set_stop_signal(&svr_sock_);
      const LoopParams params{&svr_sock_,
                              keep_alive_max_count_,
                              Millis(keep_alive_timeout_sec_, 0),
                              limits_.header_timeout,
                              limits_.body_timeout,
                              limits_.max_header_bytes,
                              Millis(write_timeout_sec_, write_timeout_usec_),
                              limits_.min_send_bytes_per_s,
                              limits_.write_wait_budget};
      int64_t drain = 0;
      ret = ServeRequests(
          params, stream, start + limits_.header_timeout,
          [this, ssl](httplib::Stream& strm, bool close_connection, bool& connection_closed) {
            return process_request(strm, close_connection, connection_closed,
                                   [ssl](httplib::Request& req) { req.ssl = ssl; });
          },
          &drain);
      // As cpp-httplib: close_notify only when the connection seemed healthy.
      if (ret) SSL_shutdown(ssl);
      if (drain > 0) LingeringClose(sock, drain);
      SSL_free(ssl);
    }
  }
  CloseSocket(sock);
  return ret;
}

}  // namespace lazyattn::router
