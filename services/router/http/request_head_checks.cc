#include "services/router/http/request_head_checks.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/router/http/body_framing.h"
#include "services/router/http/completion_handler.h"
#include "services/router/http/guarded_server.h"
#include "services/router/http/http_auth.h"
#include "services/router/http/http_syntax.h"

namespace lazyattn::router {
namespace {

constexpr char kCompleteMethod[] = "/lazyattn.v1.Inference/Complete";
constexpr char kModelInfoMethod[] = "/lazyattn.v1.Inference/GetModelInfo";

// The gRPC method whose scope an HTTP endpoint needs; null for /health (open, like gRPC health)
// and for anything that is no endpoint (404 or 405 without a key check). Every route the library
// dispatches must be here: cpp-httplib serves HEAD with the GET handler, so HEAD /v1/models is
// the GET endpoint and needs its key (a HEAD missing here would skip the key and rate checks).
const char* MethodOf(const httplib::Request& req) {
  if (req.method == "POST" &&
      (req.path == "/v1/chat/completions" || req.path == "/v1/completions")) {
    // Complete's scope (generate) for both: streaming or not, it is the same permission.
    return kCompleteMethod;
  }
  if ((req.method == "GET" || req.method == "HEAD") &&
      (req.path == "/v1/models" || absl::StartsWith(req.path, "/v1/models/"))) {
    return kModelInfoMethod;  // the list, and one model of it
  }
  return nullptr;
}

// The methods an endpoint's path takes (its Allow header), null for a path that is no endpoint.
// /v1/models/ alone names no model: it is no endpoint.
const char* AllowedMethodsOf(const std::string& path) {
  if (path == "/v1/chat/completions" || path == "/v1/completions") return "POST";
  if (path == "/v1/models" || path == "/health" ||
      (absl::StartsWith(path, "/v1/models/") && path.size() > std::strlen("/v1/models/"))) {
    return "GET, HEAD";
  }
  return nullptr;
}

// The Allow header of a request for an endpoint by a method it does not take (a 405); null when
// the path is no endpoint or the method is one of its own.
const char* WrongMethodAllow(const httplib::Request& req) {
  const char* allowed = AllowedMethodsOf(req.path);
  if (allowed == nullptr) return nullptr;
  const bool own = std::string_view(allowed) == "POST"
                       ? req.method == "POST"
                       : req.method == "GET" || req.method == "HEAD";
  return own ? nullptr : allowed;
}

// A completion endpoint's path, whatever the method (a 405 there is one of its answers too).
bool IsCompletionPath(const std::string& path) {
  return path == "/v1/chat/completions" || path == "/v1/completions";
}

// Methods whose body cpp-httplib reads for any path (into memory, before its 404).
bool LibraryReadsBody(const httplib::Request& req) {
  return req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
         req.method == "DELETE" || req.method == "PRI";
}

std::vector<std::string> HeaderValues(const httplib::Request& req, const char* name) {
  std::vector<std::string> out;
  auto range = req.headers.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) out.push_back(it->second);
  return out;
}

// The request's Authorization header, whole. cpp-httplib's get_header_value goes through a C
// string, which a NUL in the value cut short: `Bearer <key>\0<anything>` was checked as
// `Bearer <key>`. Whole, such a value is no key's (401, as any wrong key). The header map's names
// compare case-insensitively; a request with several is refused before this is asked.
std::string AuthorizationOf(const httplib::Request& req) {
  const auto range = req.headers.equal_range("Authorization");
  return range.first == range.second ? std::string() : range.first->second;
}

// RFC 9110's token, what a field name is: cpp-httplib takes a name up to the colon as it comes,
// so `Transfer-Encoding : chunked` is stored under "Transfer-Encoding " and ignored here.
bool IsFieldName(std::string_view name) {
  if (name.empty()) return false;
  for (const char c : name) {
    if (!IsTokenChar(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// The request target's path as sent (cpp-httplib decodes it into `path` before routing) holds
// an encoded slash or backslash, %2F or %5C in any case, outside a model id: GET /v1/models/{id}
// takes an HF id (org/name) as one segment, which clients encode (encodeURIComponent,
// url.PathEscape), so only the endpoint's own part of that path is checked.
bool HasEncodedSlash(const std::string& target) {
  constexpr std::string_view kModelIdPrefix = "/v1/models/";
  std::string_view path = std::string_view(target).substr(0, target.find('?'));
  if (path.substr(0, kModelIdPrefix.size()) == kModelIdPrefix) path = kModelIdPrefix;
  for (size_t i = path.find('%'); i != std::string_view::npos && i + 2 < path.size();
       i = path.find('%', i + 1)) {
    const char low = absl::ascii_tolower(static_cast<unsigned char>(path[i + 2]));
    if ((path[i + 1] == '2' && low == 'f') || (path[i + 1] == '5' && low == 'c')) return true;
  }
  return false;
}

// Checks a completion request's body type and framing (body_framing.h). Refused: answers it
// unread with the check's status and returns that status. Accepted: sends nothing and returns 100
// (go on), the value an `Expect: 100-continue` handler gives.
int RefuseBadFraming(const httplib::Request& req, httplib::Response& res, int64_t max_body_bytes) {
  BodyFraming framing = CheckContentType(HeaderValues(req, "Content-Type"));
  if (framing.ok()) framing = CheckContentEncoding(HeaderValues(req, "Content-Encoding"));
  if (framing.ok()) {
    framing = CheckBodyFraming(HeaderValues(req, "Content-Length"),
                               HeaderValues(req, "Transfer-Encoding"),
                               /*body_required=*/true, max_body_bytes);
  }
  if (framing.ok()) return 100;
  RefuseUnread(req, res, max_body_bytes);
  SendError(res, framing.error_status, framing.message, framing.code);
  return framing.error_status;
}

}  // namespace

bool IsCompletion(const httplib::Request& req) { return MethodOf(req) == kCompleteMethod; }

bool CarriesBody(const httplib::Request& req) {
  if (req.has_header("Transfer-Encoding")) return true;
  auto range = req.headers.equal_range("Content-Length");
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second != "0") return true;
  }
  return false;
}

bool LibraryClosesAfterResponse(const httplib::Request& req) {
  return req.version == "HTTP/1.0" && req.get_header_value("Connection") != "Keep-Alive";
}

bool AsksToClose(const httplib::Request& req) {
  auto range = req.headers.equal_range("Connection");
  for (auto it = range.first; it != range.second; ++it) {
    for (absl::string_view option : absl::StrSplit(it->second, ',')) {
      if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(option), "close")) return true;
    }
  }
  return false;
}

int64_t UnreadBody(const httplib::Request& req, int64_t already_read, int64_t max_body_bytes) {
  if (!CarriesBody(req)) return 0;
  int64_t announced = 0;
  if (!req.has_header("Transfer-Encoding") && req.get_header_value_count("Content-Length") == 1 &&
      ParseContentLength(req.get_header_value("Content-Length"), &announced)) {
    return std::max<int64_t>(0, std::min(announced, INT64_MAX - kWireSlack) - already_read) +
           kWireSlack;
  }
  return max_body_bytes + kWireSlack;
}

void RefuseUnread(const httplib::Request& req, httplib::Response& res, int64_t max_body_bytes,
                  int64_t already_read) {
  res.set_header("Connection", "close");
  CloseConnectionAfterResponse(UnreadBody(req, already_read, max_body_bytes));
}

httplib::Server::HandlerResponse CheckBeforeBody(grpc::AuthMetadataProcessor* processor,
                                                 bool draining, int64_t max_body_bytes,
                                                 const httplib::Request& req,
                                                 httplib::Response& res, ApiCaller* caller) {
  *caller = ApiCaller();
  // Range is not served: a range of a completion is a slice of broken JSON (or of a stream that
  // has no length), and no client of this API asks for one. Dropped, the whole response goes
  // out as 200, as RFC 9110 lets a server ignore Range. `req` is the library's own Request,
  // non-const in its routing (as in ReadBody).
  const_cast<httplib::Request&>(req).ranges.clear();
  // Every answer of a completion endpoint says the id it is logged under (completion_handler.h),
  // the refusals made here included.
  auto handled = [&req, &res] {
    if (IsCompletionPath(req.path)) res.set_header("X-Request-Id", HttpRequestId(req));
    return httplib::Server::HandlerResponse::Handled;
  };
  // A header name that is no token (whitespace before the colon, a control byte): what it carries
  // is ignored here, while a proxy in front that trims the name honours it, so the two read one
  // request two ways: `Transfer-Encoding : chunked` beside a Content-Length framed the body
  // differently on each side (a smuggled second request), `Authorization : Bearer <other key>`
  // beside the checked one was a second credential. RFC 9112 section 5.1: answered 400, and the
  // connection closed, its body unread.
  for (const auto& [name, value] : req.headers) {
    if (!IsFieldName(name)) {
      RefuseUnread(req, res, max_body_bytes);
      SendError(res, 400,
                absl::StrCat("header ", QuoteBytes(name, 64),
                             ": not a valid field name (RFC 9110: a token, with no whitespace "
                             "before the colon)"),
                "invalid_argument");
      return handled();
    }
  }
  // RFC 9112 section 3.2: an HTTP/1.1 request without a Host header, or with more than one, is
  // answered 400 (h11, and so vLLM's server, does the same); a proxy in front that picks another
  // Host than the one the router saw would read the request otherwise.
  if (req.version == "HTTP/1.1" && req.get_header_value_count("Host") != 1) {
    RefuseUnread(req, res, max_body_bytes);
    SendError(res, 400,
              req.has_header("Host") ? "Host: given more than once"
                                     : "Host: required in an HTTP/1.1 request",
              "invalid_argument");
    return handled();
  }
  // `/v1/chat%2Fcompletions` was routed as /v1/chat/completions, while a proxy in front with
  // rules per path (allowed endpoints, per-path auth or limits) matches the path as sent: an
  // encoded slash or backslash is refused, as Envoy's path_with_escaped_slashes_action
  // REJECT_REQUEST does.
  if (HasEncodedSlash(req.target)) {
    RefuseUnread(req, res, max_body_bytes);
    const std::string_view target = req.target;
    SendError(res, 400,
              absl::StrCat(req.method.substr(0, 16), " ",
                           QuoteBytes(target.substr(0, target.find('?')), 64),
                           ": an encoded slash or backslash (%2F, %5C) in the path is not "
                           "accepted; send the path with / as it is"),
              "invalid_argument");
    return handled();
  }
  // An endpoint asked with another method: 405, whatever the method (the library answers TRACE
  // and the like 400 and anything else on a known path 404), its body unread.
  if (const char* allow = WrongMethodAllow(req)) {
    if (CarriesBody(req) || LibraryReadsBody(req)) RefuseUnread(req, res, max_body_bytes);
    res.status = 405;  // the error handler writes the body
    res.set_header("Allow", allow);
    return handled();
  }
  const char* method = MethodOf(req);
  if (method == nullptr) {
    if (LibraryReadsBody(req)) {
      RefuseUnread(req, res, max_body_bytes);
      res.status = 404;  // the error handler writes the body
      return handled();
    }
    // GET and the like: the library ignores a body, which must not be read as a next request.
    if (CarriesBody(req)) RefuseUnread(req, res, max_body_bytes);
    return httplib::Server::HandlerResponse::Unhandled;  // open or 404
  }
  if (CarriesBody(req) && !IsCompletion(req)) RefuseUnread(req, res, max_body_bytes);
  if (draining) {
    RefuseUnread(req, res, max_body_bytes);
    SendError(res, 503, "the router is shutting down; retry on another", "unavailable");
    return handled();
  }
  // Two credentials: a proxy in front that keeps the last one, or adds its own, would authorize
  // another key than the one checked here.
  if (req.get_header_value_count("Authorization") > 1) {
    RefuseUnread(req, res, max_body_bytes);
    SendError(res, 400, "Authorization: given more than once", "invalid_argument");
    return handled();
  }
  grpc::Status s = CheckApiKey(processor, AuthorizationOf(req), method, caller);
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      res.set_header("WWW-Authenticate", "Bearer");
    }
    RefuseUnread(req, res, max_body_bytes);
    SendGrpcError(res, s);
    return handled();
  }
  if (IsCompletion(req) && RefuseBadFraming(req, res, max_body_bytes) != 100) {
    return handled();
  }
  return httplib::Server::HandlerResponse::Unhandled;
}

}  // namespace lazyattn::router
