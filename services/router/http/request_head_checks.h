// What the HTTP listener decides from a request's line and headers, before reading its body:
// which endpoint (and so which API key scope) it asks for, whether its method fits the path, the
// router draining, the API key, a completion's body framing (body_framing.h), and whether a body
// is left unread on the connection (which must then close: the rest of the body would be read as
// the next request). An unauthenticated client thus never makes the router buffer a body, and a
// body over the limit (by its Content-Length) or of an ambiguous length is refused at once, unread.
//
// The functions that close a connection do so through guarded_server.h's per-thread marks, so
// they take effect only on a thread serving that request (anywhere else they only set headers).
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_REQUEST_HEAD_CHECKS_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_REQUEST_HEAD_CHECKS_H_

#include <grpcpp/security/auth_metadata_processor.h>
#include <httplib.h>

#include <cstdint>
#include <string>

#include "services/router/http/http_auth.h"

namespace lazyattn::router {

// What the wire adds to a body (TLS records, chunk framing): the slack on every drop budget.
inline constexpr int64_t kWireSlack = 64 << 10;

// A completion endpoint (POST /v1/chat/completions or /v1/completions): the only ones that read a
// body.
bool IsCompletion(const httplib::Request& req);

// The request announces a body: refusing it leaves bytes unread on the connection. Every
// Content-Length counts: a second one (`0`, then `42`) would be a body to a front proxy that reads
// the last.
bool CarriesBody(const httplib::Request& req);

// The library closes the connection after answering an HTTP/1.0 request that did not ask to keep
// it, without saying so in the answer.
bool LibraryClosesAfterResponse(const httplib::Request& req);

// Whether the request asked to close its connection: `close` among the comma-separated options of
// any Connection header, in any case (RFC 9110 7.6.1). The library honours only a header that is
// exactly `close`, so `Connection: keep-alive, close` kept the connection open.
bool AsksToClose(const httplib::Request& req);

// How much of an unread body to drop before closing (guarded_server.h), `already_read` of it
// read: a client that announced its length sends all of it before it reads the answer, so all of
// it; of a chunked body or an unusable length, as much as the limit once more (a client sending
// more is cut off). Plus kWireSlack. 0 when the request carries no body.
int64_t UnreadBody(const httplib::Request& req, int64_t already_read, int64_t max_body_bytes);

// Answers `req` without reading (the rest of) its body: `Connection: close`, and the connection
// closes after the response, lingering over what UnreadBody says is still to come.
void RefuseUnread(const httplib::Request& req, httplib::Response& res, int64_t max_body_bytes,
                  int64_t already_read = 0);

// Everything checked of a request after its headers and before its body, in this order: a header
// name that is no token (400), Host missing or given twice in HTTP/1.1 (400), a path with an
// encoded slash or backslash, %2F or %5C in any case, outside the model id of /v1/models/{id}
// (400: a proxy in front would match another path than the one routed), an endpoint asked with a
// method it does not take (405 with Allow), a path that is no endpoint (a body the library would
// read is refused unread with 404; otherwise left to routing: /health or 404), the router draining
// (503), Authorization given more than once (400), the API key for the endpoint's gRPC method
// (`processor`, null for none: 401 with WWW-Authenticate, 403, 429), a completion's Content-Type,
// Content-Encoding and framing (415, 411, 400, 413). A body no endpoint reads is never read. Range
// headers are dropped (RFC 9110 lets a server ignore them; a range of a completion is a slice of
// broken JSON). Handled: `res` answers the request (an empty body of a 404 or 405 is the error
// handler's to write). Unhandled: routing goes on, with the key's name and cache namespace in
// `caller` (cleared first; empty for an open endpoint or a processor that names none).
httplib::Server::HandlerResponse CheckBeforeBody(grpc::AuthMetadataProcessor* processor,
                                                 bool draining, int64_t max_body_bytes,
                                                 const httplib::Request& req,
                                                 httplib::Response& res, ApiCaller* caller);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_REQUEST_HEAD_CHECKS_H_
