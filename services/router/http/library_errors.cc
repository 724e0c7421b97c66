#include "services/router/http/library_errors.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "services/router/http/body_framing.h"
#include "services/router/http/completion_handler.h"
#include "services/router/http/guarded_server.h"

namespace lazyattn::router {

void WriteUnhandledError(const HttpOptions& options, const httplib::Request& req,
                         httplib::Response& res) {
  // The library answers 400 to headers it could not read; they were too many bytes.
  if (res.status == 400 && RequestHeadTooLarge()) res.status = 431;
  std::string message;
  const char* code = "error";
  switch (res.status) {
    case 405:
      message = absl::StrCat(req.method.substr(0, 16), " ", req.path.substr(0, 64),
                             ": method not allowed (Allow: ", res.get_header_value("Allow"), ")");
      code = "method_not_allowed";
      break;
    case 414:
      // The library refused the request line before parsing it: there is no path to quote.
      message = absl::StrCat("the request line is longer than ", CPPHTTPLIB_REQUEST_URI_MAX_LENGTH,
                             " bytes");
      code = "uri_too_long";
      break;
    case 404:
      // Begins with the method, as the 405's: a message that began with the client's path would
      // give the error a `param` of whatever the path began with (ParamOf).
      message = absl::StrCat(req.method.substr(0, 16), " ", req.path.substr(0, 64),
                             ": no such endpoint (POST /v1/chat/completions, POST "
                             "/v1/completions, GET /v1/models, GET /v1/models/{id}, GET "
                             "/health)");
      code = "not_found";
      break;
    case 413:
      message = BodyTooLargeMessage(options.max_body_bytes);
      code = "body_too_large";
      break;
    case 431:
      message = absl::StrCat(
          "headers: the request line and headers are larger than http.max_header_bytes (",
          options.max_header_bytes, " bytes)");
      code = "headers_too_large";
      break;
    case 400:
      // The library's own 400: what it read did not parse (the request line of HTTP/0.9 or 2.0,
      // a bare LF, a header line it could not split). It may have read no method or path to
      // quote. (A body that does not parse is the completion handler's 400, naming `body`.)
      // A header line over the library's line limit is one it could not split: said, since a
      // long bearer token or cookie is the likely cause and nothing else would tell the client.
      // What the router's own reading found wrong is said as such (head_line_checker.h).
      if (const std::string problem = RequestHeadProblem(); !problem.empty()) {
        message = absl::StrCat("the request does not parse as HTTP/1.1: ", problem);
      } else {
        message = absl::StrCat(
            "the request does not parse as HTTP/1.1: its request line (method, target, HTTP/1.0 "
            "or HTTP/1.1, one space apart, CRLF) or a header line (each at most ",
            CPPHTTPLIB_HEADER_MAX_LENGTH, " bytes)");
      }
      code = "invalid_argument";
      break;
    case 416:
      // The library refuses a Range it cannot parse before the router sees the request; one that
      // parses is ignored (request_head_checks.h).
      message = "Range: does not parse (the router serves no ranges; send none)";
      code = "range_not_satisfiable";
      break;
    default:
      message = absl::StrCat("HTTP status ", res.status, " for ", req.method.substr(0, 16), " ",
                             req.path.substr(0, 64));
      break;
  }
  SendError(res, res.status, message, code);
}

}  // namespace lazyattn::router
