// POST /v1/chat/completions and /v1/completions: JSON -> GenerateRequest (openai_json.h) -> an
// HttpCall on the router's routing path -> one JSON response, or server-sent events.
//
// A streamed request is answered 200 only once its first token (or its end) is known, of any of
// its choices (OpenAI's `n`, choice_calls.h): a request refused by validation, admission or every
// worker gets its HTTP error status and JSON body, as a non-streamed one does. A failure after
// tokens were streamed is sent as a last event `data: {"error": {...}}` (OpenAI SDKs raise it) and
// the stream ends without [DONE].
//
// A client that closes its connection cancels the worker call within a wait slice (250 ms) while
// the worker is silent (prefill, a non-streamed request), or at the next write of a stream; the
// call ends CANCELLED ("cancelled by the client", as a gRPC client's cancellation), which counts
// against no worker.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_COMPLETION_HANDLER_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_COMPLETION_HANDLER_H_

#include <atomic>
#include <memory>
#include <string>
#include <string_view>

#include "services/router/http/http_auth.h"
#include "services/router/http/http_call.h"
#include "services/router/http/http_options.h"
#include "services/router/http/openai_json.h"
#include "services/router/server/key_limits.h"
#include "services/router/server/router_context.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lazyattn::router {

// `stopping`: set when the server's shutdown grace is over; a call still running then ends with
// 503, a stream with the error event "the router is shutting down" before its next token (or
// within 250 ms when none comes), and its worker call is cancelled, instead of holding the
// shutdown until its end or its deadline.
// `key_limiter`/`caller`: the API key's in-flight cap (null: no API keys) and its cache
// namespace. `live`: counts the
// request's HttpCall until it is destroyed (the shutdown waits for none).
// Every answer carries the request's id in X-Request-Id (HttpRequestId), the id of its access
// lines (one per choice) and of the worker's log.
void HandleCompletion(ApiKind kind, const httplib::Request& request, httplib::Response& response,
                      RouterContext* router, const HttpOptions& options,
                      std::shared_ptr<const std::atomic<bool>> stopping, KeyLimiter* key_limiter,
                      const ApiCaller& caller, std::shared_ptr<LiveCalls> live);

// The id a completion request is logged and answered under: its X-Request-Id when it has exactly
// one and that is valid (IsValidRequestId: 1-128 characters of [A-Za-z0-9._:-], as gRPC's
// x-request-id metadata), else a fresh one.
std::string HttpRequestId(const httplib::Request& request);

// An OpenAI JSON error response.
void SendError(httplib::Response& response, int http_status, std::string_view message,
               std::string_view code);
void SendGrpcError(httplib::Response& response, const grpc::Status& status);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_COMPLETION_HANDLER_H_
