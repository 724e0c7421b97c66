#include "services/router/http/error_mapping.h"

#include "absl/strings/ascii.h"
#include "nlohmann/json.hpp"
#include "services/router/server/router_metrics.h"

namespace lazyattn::router {

int HttpStatusOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::UNIMPLEMENTED:
      return 404;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    case grpc::StatusCode::CANCELLED:
      return 499;
    default:
      return 500;
  }
}

const char* ErrorTypeOf(int http_status) {
  switch (http_status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 405:  // an endpoint asked with another method
    case 408:  // the body did not arrive within http.body_timeout_ms: the client's fault
    case 411:  // no Content-Length (body_framing.h)
    case 413:
    case 414:  // URI too long (the library's own answer)
    case 415:  // a Content-Type other than JSON
    case 416:  // a Range the library could not parse (its own answer)
    case 431:  // request line and headers over http.max_header_bytes
    case 501:  // a Transfer-Encoding other than chunked: the request's fault, not the server's
      return "invalid_request_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    case 504:
      return "timeout_error";
    default:
      return "server_error";
  }
}

std::string ParamOf(std::string_view message) {
  // Field names as the validators write them: identifiers, dots and [index], then ": " (the
  // separator every "<field>: <what>" message has). Not a URL's scheme ("https://..."), which a
  // message quoting client text may begin with.
  size_t i = 0;
  while (i < message.size()) {
    const char c = message[i];
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '[' &&
        c != ']') {
      break;
    }
    ++i;
  }
  if (i == 0 || message.substr(i, 2) != ": ") return "";
  return std::string(message.substr(0, i));
}

std::string ErrorBody(int http_status, std::string_view message, std::string_view code) {
  const std::string param = ParamOf(message);
  nlohmann::json error = {
      {"message", std::string(message)},
      {"type", ErrorTypeOf(http_status)},
      {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
      {"code", std::string(code)},
  };
  // Messages may quote client bytes that are not UTF-8: replace them rather than throw.
  return nlohmann::json{{"error", std::move(error)}}.dump(-1, ' ', false,
                                                          nlohmann::json::error_handler_t::replace);
}

std::string ClientMessageOf(const grpc::Status& status) {
  switch (HttpStatusOf(status.error_code())) {
    case 503:
      return "service unavailable: no worker could serve the request now; retry later";
    case 504:
      return "deadline exceeded: the request did not finish in time (http.request_timeout_ms)";
    default:
      if (HttpStatusOf(status.error_code()) >= 500) return "internal error in the router";
      return status.error_message();
  }
}

std::string ErrorBodyOf(const grpc::Status& status) {
  return ErrorBody(HttpStatusOf(status.error_code()), ClientMessageOf(status),
                   StatusCodeLabel(status.error_code()));
}

}  // namespace lazyattn::router
