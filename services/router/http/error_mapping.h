// gRPC status -> HTTP status and OpenAI's error body, so HTTP clients get the same failures as the
// gRPC API in the shape OpenAI SDKs parse:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
//              "code": "invalid_argument"}}
//
//   INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE  400 invalid_request_error
//   UNAUTHENTICATED                                      401 authentication_error
//   PERMISSION_DENIED                                    403 permission_error
//   NOT_FOUND, UNIMPLEMENTED                             404 not_found_error
//   RESOURCE_EXHAUSTED                                   429 rate_limit_error (router busy, key
//                                                            limits, worker queues full)
//   UNAVAILABLE                                          503 service_unavailable_error
//   DEADLINE_EXCEEDED                                    504 timeout_error
//   CANCELLED                                            499 (the client went away)
//   anything else (INTERNAL, UNKNOWN, ABORTED, ...)      500 server_error
// 408, 411, 413, 415, 431 and 501 (a body too slow, without a length, too large, not JSON,
// headers too large, or a body in a coding other than chunked) are produced by the HTTP layer
// itself (ErrorBody, type invalid_request_error), as are the library's own 414 and 416.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_ERROR_MAPPING_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_ERROR_MAPPING_H_

#include <grpcpp/support/status.h>

#include <string>
#include <string_view>

namespace lazyattn::router {

int HttpStatusOf(grpc::StatusCode code);
// OpenAI's error `type` for an HTTP status.
const char* ErrorTypeOf(int http_status);

// The field a validation message names ("documents[2].text: empty document" ->
// "documents[2].text"); empty when the message does not start with a field name and ": ". Only
// for messages that begin with a field name or with words of the code (a message that begins
// with client text, such as a path, could name any "field").
std::string ParamOf(std::string_view message);

// The JSON error body; `code` is the gRPC status name in lower case ("invalid_argument") or, for
// errors of the HTTP layer, a word of their own ("body_too_large").
std::string ErrorBody(int http_status, std::string_view message, std::string_view code);
// ErrorBody for a gRPC status. A status that maps to 5xx gets a generic message (ClientMessageOf):
// the router's own failures may name worker addresses or internal errors, which stay in its log.
std::string ErrorBodyOf(const grpc::Status& status);
// The message an HTTP client sees for `status`: its own message below 500 (they name the
// request's field or the limit it hit), a fixed one per HTTP status from 500 on.
std::string ClientMessageOf(const grpc::Status& status);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_ERROR_MAPPING_H_
