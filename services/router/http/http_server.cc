#include "services/router/http/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "nlohmann/json.hpp"
#include "services/router/http/body_framing.h"
#include "services/router/http/bounded_pool.h"
#include "services/router/http/certificate_reloader.h"
#include "services/router/http/chunked_body_checker.h"
#include "services/router/http/completion_handler.h"
#include "services/router/http/guarded_server.h"
#include "services/router/http/library_errors.h"
#include "services/router/http/openai_json.h"
#include "services/router/http/openai_models.h"
#include "services/router/http/request_head_checks.h"
#include "services/router/server/api_key_auth.h"

namespace lazyattn::router {
namespace {

// Who sent the request this thread serves: its API key's name and cache namespace (set by the
// pre-routing handler).
thread_local ApiCaller request_caller;

// Reads a completion request's body into `req.body`, counting: a chunked body (whose length
// cpp-httplib 0.11 neither knows nor limits) is cut off at `max_body_bytes` and refused 413, so
// the router buffers at most that much; its framing is checked as it is read (a read that breaks
// it fails: 400 naming what was wrong, chunked_body_checker.h). A body still arriving at
// http.body_timeout_ms after the headers (the stream's deadline, guarded_server.h) is refused
// 408. False after answering the request (413, 408 or 400).
bool ReadBody(const httplib::Request& req, httplib::Response& res,
              const httplib::ContentReader& read, const HttpOptions& options) {
  const int64_t max_body_bytes = options.max_body_bytes;
  // `req` is the library's own Request, which its routing holds non-const until the response is
  // written; the content-reader API only hands it over as const.
  std::string& body = const_cast<httplib::Request&>(req).body;
  if (req.has_header("Content-Length")) {  // checked against the limit before routing
    body.reserve(static_cast<size_t>(std::min<uint64_t>(
        req.get_header_value<uint64_t>("Content-Length"), static_cast<uint64_t>(max_body_bytes))));
  }
  // The library reads a body as chunked when its first Transfer-Encoding is "chunked" in any
  // case (the only one CheckBeforeBody lets through): checked byte by byte as it is read.
  const bool chunked = absl::EqualsIgnoreCase(req.get_header_value("Transfer-Encoding"), "chunked");
  if (chunked) CheckChunkedBody();
  bool too_large = false;
  const bool complete = read([&](const char* data, size_t size) {
    if (body.size() + size > static_cast<size_t>(max_body_bytes)) {
      too_large = true;
      return false;
    }
    body.append(data, size);
    return true;
  });
  if (complete) {
    MarkBodyReceived();
    return true;
  }
  RefuseUnread(req, res, max_body_bytes, static_cast<int64_t>(body.size()));
  std::string().swap(body);
  // An answer of the endpoint like any other: it says the id it is logged under.
  res.set_header("X-Request-Id", HttpRequestId(req));
  const ChunkedBodyChecker* framing = chunked ? ChunkedBodyCheck() : nullptr;
  if (too_large) {
    SendError(res, 413, BodyTooLargeMessage(max_body_bytes), "body_too_large");
  } else if (framing != nullptr && framing->failed()) {
    SendError(res, 400, absl::StrCat("body: malformed chunked encoding: ", framing->problem()),
              "invalid_argument");
  } else if (BodyTimedOut()) {
    SendError(res, 408,
              absl::StrCat("body: not received within http.body_timeout_ms (",
                           absl::ToInt64Milliseconds(options.body_timeout), " ms)"),
              "body_timeout");
  } else if (framing != nullptr && framing->has_trailer()) {
    SendError(res, 400,
              "body: trailer fields after the last chunk are not accepted (send the last chunk, "
              "then CRLF)",
              "invalid_argument");
  } else {
    SendError(res, 400,
              "body: incomplete or malformed (chunked encoding, trailer fields after the last "
              "chunk included, which are not accepted; Content-Encoding; or the connection "
              "ended)",
              "invalid_argument");
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(
    const HttpOptions& options, const TlsOptions& tls, RouterContext* router,
    std::shared_ptr<grpc::AuthMetadataProcessor> auth) {
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->slots_ = std::make_unique<ClientSlots>(EffectiveMaxConnectionsPerClient(options));
  ConnectionLimits limits;
  limits.header_timeout = absl::ToChronoMilliseconds(options.header_timeout);
  limits.body_timeout = absl::ToChronoMilliseconds(options.body_timeout);
  limits.max_header_bytes = static_cast<size_t>(options.max_header_bytes);
  limits.min_send_bytes_per_s = options.min_send_bytes_per_s;
  limits.write_wait_budget = absl::ToChronoMilliseconds(options.write_wait_budget);
  limits.slots = server->slots_.get();
  if (!tls.cert_file.empty()) {
    auto ssl = std::make_unique<GuardedSslServer>(limits, tls.cert_file, tls.key_file);
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat("http: cannot load the server certificate ",
                                                     tls.cert_file, " or its key ", tls.key_file,
                                                     " (server.tls)"));
    }
    // The files are watched from here on: a replaced pair serves new connections
    // (certificate_reloader.h), as the gRPC listeners' certificate provider does.
    auto reloader = CertificateReloader::Create(tls.cert_file, tls.key_file,
                                                absl::Seconds(tls.refresh_interval_s));
    if (!reloader.ok()) return reloader.status();
    (*reloader)->Install(ssl->ssl_context());
    server->reloader_ = std::move(*reloader);
    server->server_ = std::move(ssl);
    server->tls_ = true;
  } else {
    server->server_ = std::make_unique<GuardedServer>(limits);
  }
  httplib::Server& s = *server->server_;
  const int threads = options.threads;
  const int queued = options.max_queued_connections;
  std::shared_ptr<const std::atomic<bool>> pool_stopping = server->stopping_;
  s.new_task_queue = [threads, queued, pool_stopping] {
    return new BoundedPool(threads, queued, pool_stopping);
  };
  // Each SSE event is a small write: without TCP_NODELAY, Nagle's algorithm holds it until the
  // client's delayed ACK (measured: +10 ms to the first token, tokens delivered in bursts).
  s.set_tcp_nodelay(true);
  // The library's default socket options add SO_REUSEPORT, with which a second process given a
  // port in use binds it too and takes a share of its connections. SO_REUSEADDR alone still lets
  // a restarted router bind at once over connections left in TIME_WAIT.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  s.set_read_timeout(absl::ToChronoMilliseconds(options.read_timeout));
  s.set_write_timeout(absl::ToChronoMilliseconds(options.write_timeout));
  s.set_keep_alive_timeout(std::max<time_t>(1, absl::ToInt64Seconds(options.keep_alive_timeout)));
  s.set_keep_alive_max_count(static_cast<size_t>(options.keep_alive_max_count));

  const HttpOptions opts = options;
  grpc::AuthMetadataProcessor* processor = auth.get();
  // Keeps the processor alive as long as the handlers that use it.
  auto keep_auth = std::make_shared<std::shared_ptr<grpc::AuthMetadataProcessor>>(std::move(auth));

  // The per-key in-flight caps live in the router's API key processor (null without keys).
  auto* authorizer = dynamic_cast<ApiKeyAuthorizer*>(processor);
  KeyLimiter* key_limiter = authorizer != nullptr ? &authorizer->limiter() : nullptr;
  // The API key and the rest of CheckBeforeBody run here, after the headers and before the body
  // is read (cpp-httplib runs the pre-routing handler first). The key's name reaches the handler,
  // which runs next on this thread, in request_caller.
  std::shared_ptr<const std::atomic<bool>> draining = server->draining_;
  const int64_t max_body_bytes = options.max_body_bytes;
  s.set_pre_routing_handler([processor, keep_auth, draining, max_body_bytes](
                                const httplib::Request& req, httplib::Response& res) {
    // Each request begins with its headers unmarked (guarded_server.h): marked already, it was
    // checked by the `Expect: 100-continue` handler below, and reaches routing only if admitted
    // there. Checked twice, it would count twice against its key's rate.
    const bool checked_before_continue = HeadersMarkedReceived();
    MarkHeadersReceived();
    if (checked_before_continue) return httplib::Server::HandlerResponse::Unhandled;
    return CheckBeforeBody(processor, draining->load(), max_body_bytes, req, res, &request_caller);
  });
  // `Expect: 100-continue` is answered before the pre-routing handler runs: a request the router
  // would refuse before reading its body (no or a wrong API key, its framing, ...) is refused
  // here, with the same answer, instead of invited to send the body.
  s.set_expect_100_continue_handler([processor, keep_auth, draining, max_body_bytes](
                                        const httplib::Request& req, httplib::Response& res) {
    MarkHeadersReceived();
    const auto checked =
        CheckBeforeBody(processor, draining->load(), max_body_bytes, req, res, &request_caller);
    if (checked == httplib::Server::HandlerResponse::Handled) return res.status;
    // Only the completions read a body: another request's would be uploaded only to be dropped
    // (it is refused unread, and the connection closed). Not invited: a final answer instead of
    // 100, as RFC 9110 lets a server give.
    if (CarriesBody(req) && !IsCompletion(req)) {
      SendError(res, 400, "body: this endpoint reads none; send the request without one",
                "invalid_argument");
      return 400;
    }
    return 100;
  });
  // Runs for every response, before its head is written. A response that says `Connection:
  // close` closes the connection (the library only sends the header). And a connection whose
  // next bytes may be the rest of this request is closed, lest they be read as a next request
  // (CL.0 desync): the library answered before the handlers saw the request (414 for a long URI,
  // 416 for a Range it cannot parse, 400 for a malformed line or header, 431), reading none of
  // its body; or a handler answered without reading the body it announced (an exception, say;
  // the handlers' own refusals already close).
  s.set_post_routing_handler([max_body_bytes](const httplib::Request& req, httplib::Response& res) {
    // The library offers byte ranges on HEAD; the router serves none (pre-routing drops Range).
    if (req.method == "HEAD") {
      res.headers.erase("Accept-Ranges");
      res.set_header("Accept-Ranges", "none");
    }
    if (!HeadersMarkedReceived()) {
      // Its head may not have been read to its end either: drop at least kWireSlack more.
      CloseConnectionAfterResponse(std::max(UnreadBody(req, 0, max_body_bytes), kWireSlack));
    } else if (CarriesBody(req) && !BodyMarkedReceived()) {
      CloseConnectionAfterResponse(UnreadBody(req, 0, max_body_bytes));
    }
    // A whole body is sent at once, right after this: bound its time (a content provider's stream
    // is not, see guarded_server.h).
    if (!res.content_provider_) BoundResponseWrite(res.body.size());
    // A body without a length or chunks (an HTTP/1.0 stream) ends where the connection does; the
    // close lingers over what the client may still send, lest a reset cut the stream's end.
    const bool ends_at_close =
        res.content_provider_ && res.content_length_ == 0 && !res.is_chunked_content_provider_;
    if (ends_at_close) CloseConnectionAfterResponse(kWireSlack);
    if (!ClosesAfterResponse() && (res.get_header_value("Connection") == "close" ||
                                   LibraryClosesAfterResponse(req) || AsksToClose(req))) {
      CloseConnectionAfterResponse(0);
    }
    // The library adds Keep-Alive unless the request asked to close; a closing answer says only
    // `Connection: close`.
    if (ClosesAfterResponse()) {
      res.headers.erase("Connection");
      res.headers.erase("Keep-Alive");
      res.set_header("Connection", "close");
    }
  });
  // A handler that needs a key (checked by the pre-routing handler): runs `body(req, res,
  // key_name)`.
  auto authorized = [](auto body) {
    return [body](const httplib::Request& req, httplib::Response& res) {
      body(req, res, request_caller.key_name);
    };
  };
  std::shared_ptr<const std::atomic<bool>> stopping = server->stopping_;
  std::shared_ptr<LiveCalls> live = server->live_;
  // The completion endpoints read their body themselves (ReadBody), the key's name from the
  // pre-routing handler.
  auto completion = [router, opts, stopping, key_limiter, live](ApiKind kind) {
    return httplib::Server::HandlerWithContentReader(
        [router, opts, stopping, key_limiter, live, kind](
            const httplib::Request& req, httplib::Response& res,
            const httplib::ContentReader& content_reader) {
          if (!ReadBody(req, res, content_reader, opts)) return;
          HandleCompletion(kind, req, res, router, opts, stopping, key_limiter, request_caller,
                           live);
        });
  };
  for (auto [path, kind] : {std::pair{"/v1/chat/completions", ApiKind::kChat},
                            std::pair{"/v1/completions", ApiKind::kCompletion}}) {
    s.Post(path, completion(kind));
  }
  s.Get("/v1/models", authorized([router](const httplib::Request&, httplib::Response& res,
                                          const std::string& /*key_name*/) {
          std::vector<lazyattn::v1::ModelInfo> models;
          for (ModelGroup& g : router->registry().Models()) models.push_back(std::move(g.info));
          res.set_content(ModelsJson(models, absl::ToUnixSeconds(absl::Now())), "application/json");
        }));
  // The OpenAI SDK's models.retrieve: one model of the list above, by the id it is listed under.
  s.Get(R"(/v1/models/(.+))",
        authorized([router](const httplib::Request& req, httplib::Response& res,
                            const std::string& /*key_name*/) {
          const std::string wanted = req.matches[1].str();
          for (const ModelGroup& g : router->registry().Models()) {
            if (ListedModelId(g.info) == wanted) {
              res.set_content(ModelJson(g.info, absl::ToUnixSeconds(absl::Now())),
                              "application/json");
              return;
            }
          }
          // Quoted as any string the client sent (QuoteForMessage: cut on a character boundary).
          SendError(res, 404,
                    absl::StrCat("model: ", QuoteForMessage(nlohmann::json(wanted)),
                                 " is not served here (GET /v1/models lists those that are)"),
                    "model_not_found");
        }));
  // A load balancer's readiness check: 503 once the router drains (it refuses new requests
  // then) and while it knows no live worker. With every known worker ejected by health probing
  // it still routes (to all of them, as the selector's panic mode does), so it stays 200, marked
  // "degraded": were it 503, a probe glitch seen by every router at once would take them all
  // out of the balancer.
  s.Get("/health", [router, draining](const httplib::Request&, httplib::Response& res) {
    if (draining->load()) {
      res.status = 503;
      res.set_content(
          nlohmann::json{{"status", "shutting down"}, {"workers", 0}, {"admitted", 0}}.dump(),
          "application/json");
      return;
    }
    const int live = router->registry().LiveCount();
    const int admitted = router->AdmittedWorkers();
    res.status = live > 0 ? 200 : 503;
    const char* status = live == 0 ? "no live workers" : admitted == 0 ? "degraded" : "ok";
    res.set_content(
        nlohmann::json{{"status", status}, {"workers", live}, {"admitted", admitted}}.dump(),
        "application/json");
  });
  // Errors the library produces itself (unknown path 404, body over the limit 413, malformed
  // request 400, headers over the cap 431, URI too long 414, a Range it cannot parse 416) and
  // the pre-routing handler's (wrong method 405): OpenAI's error shape unless a handler wrote a
  // body.
  s.set_error_handler([opts](const httplib::Request& req, httplib::Response& res) {
    if (res.body.empty()) WriteUnhandledError(opts, req, res);
  });
  s.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        // The exception's text is for the router's log, not for the client.
        LogError("router").Str("api", "http").Msg(absl::StrCat("HTTP handler exception: ", what));
        SendError(res, 500, "internal error in the router", "internal");
      });

  const size_t colon = options.listen.rfind(':');
  std::string host = options.listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  try {
    port = std::stoi(options.listen.substr(colon + 1));
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat("http.listen: bad port in \"", options.listen, "\""));
  }
  if (port == 0) {
    server->port_ = s.bind_to_any_port(host);
  } else if (s.bind_to_port(host, port)) {
    server->port_ = port;
  } else {
    server->port_ = -1;
  }
  if (server->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("http.listen: cannot bind ", options.listen));
  }
  server->thread_ = std::thread([srv = server->server_.get()] { srv->listen_after_bind(); });
  // cpp-httplib's stop() does nothing until its listen loop has marked itself running: a Shutdown
  // right after Create would then wait for ever on a loop no one stops.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!server->server_->is_running() && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return server;
}

HttpServer::~HttpServer() { Shutdown(); }

void HttpServer::Shutdown(absl::Duration grace) {
  if (!thread_.joinable()) return;  // never started, or already shut down
  // cpp-httplib's stop() also ends every stream at its next chunk, so the listener stays open
  // during the grace: new requests get 503 (draining_) and the calls in flight run on.
  draining_->store(true);
  live_->WaitForZero(grace);
  // Whatever still waits on a worker ends now (within 250 ms: NextStep's slice).
  stopping_->store(true);
  if (server_ != nullptr) server_->stop();
  thread_.join();
  // A cancelled call ends when its worker call does: wait for the cancellations, then for ever,
  // as a call left running would use the RouterContext after the caller destroys it.
  if (!live_->WaitForZero(absl::Seconds(5))) {
    LogWarning("router")
        .Str("api", "http")
        .Int("live_calls", live_->count())
        .Msg("HTTP shutdown: calls still ending after cancellation; waiting");
    live_->WaitForZero(absl::InfiniteDuration());
  }
}

}  // namespace lazyattn::router
