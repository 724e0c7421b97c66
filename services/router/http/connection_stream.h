// httplib::Stream over one accepted connection, plaintext or TLS, for the router's own connection
// loop (guarded_server.h). Besides cpp-httplib's per-operation read and write timeouts (each recv
// may wait read_timeout, so a client sending a byte at a time is never timed out), reads stop at
// a total deadline: the router sets it to the end of the header timeout while a request's line and
// headers arrive, then to the end of the body timeout while its body arrives, and clears it once
// the body is in. The TLS handshake (AcceptTls) takes a deadline the same way. Writes stop at a
// deadline of their own (set_write_deadline): the router gives a response that is not streamed
// one from its size (guarded_server.h, BoundResponseWrite), so a client reading a byte now and
// then (each write progressing within write_timeout) cannot hold a connection thread for ever.
// A streamed response has no size to go by: its writes instead share a budget of time spent
// waiting for the socket (set_write_wait_budget), which a client that reads as the tokens come
// never draws on, and one that reads just enough to stay inside write_timeout soon spends. The
// bytes sent earn waiting time at the minimum rate a non-streamed answer is given, so a stream
// carrying a lot per token (alternatives, an echoed prompt) to a client reading at that rate or
// faster is not cut either.
//
// Reads are also bounded in bytes where cpp-httplib buffers without a limit of its own: a
// request's line and headers (the library keeps every header line in a multimap, ~20 bytes of
// memory per byte sent, and grows a line until its '\n' before checking its length) stop at the
// head cap set by BeginRequest, and a line of a body (a chunk-size line, read a byte at a time)
// at kMaxBodyLineBytes. Past either, reads fail.
//
// And the bytes read are checked where the library is lenient: a request's line and headers
// (head_line_checker.h: bare LF, bare CR, a NUL in a value, a line without a colon, obs-fold,
// a '%' in the value of a header whose meaning the library's percent-decoding would change)
// and, once BeginChunkedBody is called, a chunked body's framing (chunked_body_checker.h). The
// read that breaks them fails, as every later one, except in the request line: the library
// would close a connection whose request line it could not read without an answer, so its bytes
// are read to the line's end, and the next read fails (the library then answers 400).
//
// One stream serves every request of a keep-alive connection, so bytes read ahead (a pipelined
// request) are kept for the next one. Not thread-safe: one connection thread uses it.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_CONNECTION_STREAM_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_CONNECTION_STREAM_H_

#include <httplib.h>
#include <openssl/ssl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "services/router/http/chunked_body_checker.h"
#include "services/router/http/head_line_checker.h"

namespace lazyattn::router {

using SteadyTime = std::chrono::steady_clock::time_point;
constexpr SteadyTime kNoDeadline = SteadyTime::max();

// The longest line of a body the stream lets the library read (a chunk-size line, its
// extensions included: hex digits need a few bytes, nobody sends kilobytes of extensions).
inline constexpr size_t kMaxBodyLineBytes = 4096;

// Waits up to `timeout`, and never past `deadline`, for `events` (POLLIN, POLLOUT) on `fd`; true
// when the socket is ready (or failed: the next read or write reports it).
bool WaitForSocket(int fd, short events, std::chrono::milliseconds timeout, SteadyTime deadline);

// How long a connection's waits may still take in all once its server has stopped (a shutdown's
// last event to a client that reads gets out well within it).
inline constexpr std::chrono::milliseconds kWaitAfterStop{1000};

// WaitForSocket that also gives up once `listener` (the server's listening socket, as cpp-httplib
// keeps it) is INVALID_SOCKET, the server having stopped: waits after the stop end kWaitAfterStop
// after `*stopped_at`, set by the first wait to see it (the default SteadyTime: not seen yet).
// A null `listener` waits as WaitForSocket.
bool WaitForSocketOrStop(int fd, short events, std::chrono::milliseconds timeout,
                         SteadyTime deadline, const std::atomic<socket_t>* listener,
                         SteadyTime* stopped_at);

class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(int fd, std::chrono::milliseconds read_timeout,
                   std::chrono::milliseconds write_timeout)
      : fd_(fd), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

  // Reads wait no later than `deadline` (kNoDeadline: only their own timeout) and fail after it.
  void set_deadline(SteadyTime deadline) { deadline_ = deadline; }
  // The same for writes: a write (or the wait before it) fails once `deadline` has passed.
  void set_write_deadline(SteadyTime deadline) { write_deadline_ = deadline; }
  // A request's writes may wait for the socket this long in all (zero: no such bound); past it
  // they fail. Not counted: the first kUncountedWait of each wait (a busy router's own
  // scheduling, never the client), and the time the bytes already sent earn at
  // `earned_bytes_per_s` (0: none), so a client reading at least that fast is never cut; at most
  // one budget is earned ahead of the waits. The time waited and earned starts again at each
  // BeginRequest.
  static constexpr std::chrono::milliseconds kUncountedWait{5};
  void set_write_wait_budget(std::chrono::milliseconds budget, int64_t earned_bytes_per_s = 0) {
    write_wait_budget_ = budget;
    earned_bytes_per_s_ = earned_bytes_per_s;
  }
  bool deadline_passed() const { return std::chrono::steady_clock::now() >= deadline_; }
  // The server's listening socket (WaitForSocketOrStop): once the server stops, every wait of
  // this stream gives up within kWaitAfterStop in all, so a client that stops reading, or
  // trickles its body, cannot hold the shutdown for its timeouts (tens of seconds). Null (the
  // default): the waits know nothing of a stop.
  void set_stop_signal(const std::atomic<socket_t>* listener) { listener_ = listener; }

  // A request begins: from now until EndHead, the bytes read (its line and headers) may total at
  // most `max_head_bytes` (0: no cap); a read that would go past it fails, as every later one.
  void BeginRequest(size_t max_head_bytes);
  // The request's line and headers are in; what follows is its body.
  void EndHead() { in_head_ = false; }
  // True when reading the current request's head failed for the cap.
  bool head_too_large() const { return head_too_large_; }
  // What is wrong with the current request's head as read so far (head_line_checker.h); empty
  // when nothing is.
  const std::string& head_problem() const { return head_lines_.problem(); }
  // The body the library reads next is chunked: its framing is checked from here on.
  void BeginChunkedBody();
  // The current request's chunked body as checked so far; null unless BeginChunkedBody was
  // called for it.
  const ChunkedBodyChecker* chunked_body() const { return checking_chunked_ ? &chunked_ : nullptr; }

  // True when a byte of the next request is read ahead, or arrives within `timeout` (and before
  // the deadline).
  bool WaitForData(std::chrono::milliseconds timeout) const;

  bool is_readable() const override;
  bool is_writable() const override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return fd_; }

 protected:
  virtual bool HasReadAhead() const = 0;
  // Every wait of the stream for its socket: WaitForSocketOrStop with its stop signal.
  bool Wait(short events, std::chrono::milliseconds timeout, SteadyTime deadline) const;
  bool WaitReadable() const;  // read_timeout, bounded by the deadline
  // write_timeout, bounded by the write deadline and what is left of the write wait budget.
  bool WaitWritable() const;
  // The same wait for `events` (POLLOUT; POLLIN when a TLS write needs the client's record first).
  bool WaitDuringWrite(short events) const;
  // A write sent `n` bytes: they earn waiting time (set_write_wait_budget).
  void Sent(ssize_t n);
  // A read of `size` bytes returned `n` at `data`: counts them against the caps. `n`, or -1 when
  // they go past one (the bytes are then dropped: the request is refused).
  ssize_t Counted(const char* data, size_t size, ssize_t n);
  // True when a cap was passed or the bytes broke the grammar: every read fails from then on.
  bool reads_refused() const {
    return head_too_large_ || body_line_too_long_ || head_malformed_ || chunked_.failed();
  }

  const int fd_;
  const std::chrono::milliseconds read_timeout_;
  const std::chrono::milliseconds write_timeout_;
  SteadyTime deadline_ = kNoDeadline;
  SteadyTime write_deadline_ = kNoDeadline;
  std::chrono::milliseconds write_wait_budget_{0};
  int64_t earned_bytes_per_s_ = 0;
  // Time this request's writes waited for the socket past what they were allowed, and time the
  // bytes sent earned and no wait has used yet. WaitDuringWrite, const for is_writable, updates.
  mutable std::chrono::steady_clock::duration write_waited_{0};
  mutable std::chrono::steady_clock::duration write_earned_{0};

 private:
  const std::atomic<socket_t>* listener_ = nullptr;
  mutable SteadyTime stopped_at_{};  // when a wait first saw the server stopped
  size_t max_head_bytes_ = 0;
  size_t head_bytes_ = 0;
  bool in_head_ = false;
  bool head_too_large_ = false;
  size_t body_line_bytes_ = 0;  // single-byte reads since the last '\n' or larger read
  bool body_line_too_long_ = false;
  HeadLineChecker head_lines_;
  bool head_malformed_ = false;  // a head read failed for head_lines_
  ChunkedBodyChecker chunked_;
  bool checking_chunked_ = false;
};

// Plaintext: recv into a read-ahead buffer (cpp-httplib reads the request line and headers a byte
// at a time); send without blocking, waiting for the socket as WaitWritable allows.
class PlainStream final : public ConnectionStream {
 public:
  using ConnectionStream::ConnectionStream;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;

 private:
  bool HasReadAhead() const override { return begin_ < end_; }
  std::vector<char> buffer_ = std::vector<char>(16 * 1024);
  size_t begin_ = 0, end_ = 0;
};

// TLS on a non-blocking socket: every wait for the peer is a poll with its timeout (and the
// deadline), never a blocking recv inside OpenSSL. The SSL object must have been accepted by
// AcceptTls on the same fd; the stream does not own it.
class TlsStream final : public ConnectionStream {
 public:
  static constexpr size_t kTlsRecordBytes = 16 << 10;  // TLS's largest record
  TlsStream(int fd, SSL* ssl, std::chrono::milliseconds read_timeout,
            std::chrono::milliseconds write_timeout)
      : ConnectionStream(fd, read_timeout, write_timeout), ssl_(ssl) {}
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;

 private:
  bool HasReadAhead() const override { return SSL_pending(ssl_) > 0; }
  SSL* const ssl_;
};

// Sets `fd` non-blocking and runs the server side of the TLS handshake until `deadline` (each wait
// at most `timeout`). The new SSL (the caller frees it), or null when the handshake failed or did
// not finish in time.
SSL* AcceptTls(int fd, SSL_CTX* ctx, std::chrono::milliseconds timeout, SteadyTime deadline,
               const std::atomic<socket_t>* listener = nullptr);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_CONNECTION_STREAM_H_
