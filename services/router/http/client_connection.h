// Whether the HTTP client of a request is still connected, asked from the handler's thread while
// it waits on a worker: a client that hung up is otherwise noticed only by a failed write, which a
// non-streamed request (or a stream still in prefill) makes only at its end, so its worker would
// generate the whole answer for nobody.
//
// cpp-httplib 0.11 hands a handler neither its Stream nor its socket (newer versions have
// Request::is_connection_closed); the router's own connection loop (guarded_server.h) knows the
// socket of the connection each thread serves. The socket is only looked at (poll, MSG_PEEK),
// never read, so the library's own reads see every byte.
//
// Lifetime: the descriptor belongs to cpp-httplib, open while the request's handler and its
// content provider run on the connection's thread; use the object only from there.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_CLIENT_CONNECTION_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_CLIENT_CONNECTION_H_

namespace lazyattn::router {

class ClientConnection {
 public:
  // Not found (e.g. a request built by hand): Gone() is always false.
  ClientConnection() = default;
  explicit ClientConnection(int fd) : fd_(fd) {}

  // The connection of the request this thread serves (GuardedServer's; none elsewhere).
  static ClientConnection OfThisThread();

  bool found() const { return fd_ >= 0; }
  // True once the client closed its side of the connection (FIN: EOF, even after unread bytes
  // such as a TLS close_notify) or it was reset. Never blocks. A client that only shuts down its
  // sending side while still reading counts as gone: HTTP/1.1 clients do not do that mid-request.
  bool Gone() const;

 private:
  int fd_ = -1;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_CLIENT_CONNECTION_H_
