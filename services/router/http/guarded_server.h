// cpp-httplib servers (plaintext and TLS) that run each accepted connection in the router's own
// loop instead of the library's, for limits and checks cpp-httplib 0.11 does not have:
//
//  - a total deadline for a request's line and headers, `header_timeout` (the library's read
//    timeout is per recv, so a client sending one byte a second held a connection thread for
//    ever). A new connection must finish its TLS handshake and its first request's headers within
//    header_timeout of the connection thread taking it up; on a kept-alive connection each later
//    request has header_timeout from its first byte (the idle wait before it is
//    keep_alive_timeout, as in the library). Past the deadline the connection is closed without an
//    answer, as nginx does on client_header_timeout.
//  - a cap on the bytes of a request's line and headers, `max_header_bytes`, counted until the
//    handlers mark the headers received (the library stores every header line it reads, ~20 bytes
//    of memory per byte sent, and header_timeout bounds only the time). Past it reads fail: a
//    request line that long closes the connection without an answer, headers that long are
//    answered by the library's error path, where RequestHeadTooLarge() turns its 400 into 431.
//    A line of a chunked body (its chunk-size line) is capped as well (connection_stream.h).
//  - a total deadline for a request's body, `body_timeout`, from the end of its headers (each
//    read still waits at most the read timeout). A body read that fails past it is reported by
//    BodyTimedOut(), so that the handler answers 408 instead of 400.
//  - a total deadline for writing a response that is not streamed, set by BoundResponseWrite
//    from its size: write_timeout plus its bytes at `min_send_bytes_per_s`. The library's write
//    timeout only needs each write to progress, so a client that reads a byte at a time (or
//    opens a tiny TCP window) held a thread for as long as a large response took at its pace.
//    Streamed responses (a content provider) have no size to go by: their writes share the
//    write wait budget instead (connection_stream.h), past what their bytes earn at the same
//    rate.
//  - strict framing where the library is lenient (connection_stream.h): a request's line and
//    headers (a bare LF or CR, a NUL in a value, a header line without a colon or folded over
//    lines, a '%' in a framing or credential header's value, which the library would
//    percent-decode) and a chunked body's sizes, extensions and line ends are checked byte by byte
//    as the library reads them. A read that breaks them fails: the library answers 400, the
//    handlers name the problem (RequestHeadProblem, ChunkedBodyCheck), and the connection is
//    closed.
//  - a cap on the connections one client address holds at once (client_slots.h). The excess
//    connection is answered 503 at once without reading its request (plaintext), or closed before
//    the handshake (TLS), and holds no thread longer than that. Connections taken up by a thread
//    marked with ShedConnectionsOnThisThread (the pool's overflow thread) are refused the same way,
//    so a slow client among them delays none of the others.
//  - closing the connection after a response that says `Connection: close` (the library only adds
//    the header). A response to a request whose body was not read (refused before it, or over the
//    limit) is followed by a lingering close, as nginx's: the router stops sending, reads and
//    discards what the client still sends, up to the handler's budget and for at most 2 s, then
//    closes. A client that sends its whole body before reading the answer (Python's http.client
//    does) then sees the answer rather than a reset; one that goes on sending is cut off.
//
// Everything else (request parsing, routing, handlers, keep-alive count, the read and write
// timeouts of each operation) is the library's: the loop calls Server::process_request.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_GUARDED_SERVER_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_GUARDED_SERVER_H_

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "services/router/http/client_slots.h"
#include "services/router/http/connection_stream.h"

namespace lazyattn::router {

struct ConnectionLimits {
  std::chrono::milliseconds header_timeout{10000};
  size_t max_header_bytes = 64 << 10;  // the request line and headers; 0: no cap
  std::chrono::milliseconds body_timeout{30000};
  // The slowest a non-streamed response may be sent, after write_timeout's grace; 0: no total
  // write deadline.
  int64_t min_send_bytes_per_s = 64 << 10;
  // The time a response's writes may wait for the client in all, past what their bytes earn at
  // min_send_bytes_per_s (ConnectionStream's write wait budget); 0: no such bound.
  std::chrono::milliseconds write_wait_budget{120000};
  // Counts the connections served and caps them per address; must outlive the server.
  ClientSlots* slots = nullptr;
};

// For the handlers, on the thread that serves the request (no effect elsewhere):
// the request's line and headers are in; its header deadline no longer applies, and its body must
// be read within body_timeout from now.
void MarkHeadersReceived();
// The request's body is in; reads are no longer bounded by its deadline.
void MarkBodyReceived();
// Whether MarkHeadersReceived / MarkBodyReceived were called for the request this thread serves
// (both false as each request begins, and outside a handler). For the post-routing handler, which
// runs for every response: headers not marked means the library answered the request before the
// handlers saw it (414, 416, 400, 431), body not marked that a body may be left unread.
bool HeadersMarkedReceived();
bool BodyMarkedReceived();
// True when reading the request's line and headers failed for max_header_bytes (the library then
// answers 400, which the error handler turns into 431). False outside a handler.
bool RequestHeadTooLarge();
// What is wrong with the request's line and headers as read (head_line_checker.h: a bare LF or
// CR, a NUL in a header value, a header line without a colon, obs-fold, a '%' in a framing or
// credential header's value); empty when nothing is, and outside a handler. The read that found
// it failed, so the library answered 400.
std::string RequestHeadProblem();
// The body about to be read is chunked: its framing is checked as the library reads it
// (chunked_body_checker.h), and a read that breaks it fails.
void CheckChunkedBody();
// The request's chunked body as checked so far; null when CheckChunkedBody was not called for it,
// and outside a handler.
const ChunkedBodyChecker* ChunkedBodyCheck();
// True when the body's deadline has passed: a body read that failed failed for it. False outside
// a handler.
bool BodyTimedOut();
// The response about to be written, `bytes` long, is not streamed: it must be sent within the
// write timeout plus `bytes` at min_send_bytes_per_s from now, or the connection is closed (that
// bound replaces the write wait budget for it).
void BoundResponseWrite(size_t bytes);
// The connection closes after this response. `drain_bytes` > 0: that much of the request's body
// is still to come unread, and the close lingers (above) to drop at most that much.
void CloseConnectionAfterResponse(int64_t drain_bytes);
// True once CloseConnectionAfterResponse was called for the request this thread serves.
bool ClosesAfterResponse();

// The socket of the connection this thread serves a request of, -1 elsewhere (outside a
// handler, or a server that is not one of these). Open while the request's handler and its
// content provider run; for looking at (poll, MSG_PEEK), never for reading or writing.
int CurrentConnectionSocket();

// Every connection this thread takes up from now on is refused at once (above): for the thread
// that answers connections beyond the pool's queues.
void ShedConnectionsOnThisThread();

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(const ConnectionLimits& limits) : limits_(limits) {}

 private:
  bool process_and_close_socket(socket_t sock) override;

  const ConnectionLimits limits_;
};

class GuardedSslServer : public httplib::SSLServer {
 public:
  GuardedSslServer(const ConnectionLimits& limits, const std::string& cert_file,
                   const std::string& key_file)
      : httplib::SSLServer(cert_file.c_str(), key_file.c_str()), limits_(limits) {}

 private:
  bool process_and_close_socket(socket_t sock) override;

  const ConnectionLimits limits_;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_GUARDED_SERVER_H_
