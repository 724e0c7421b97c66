#include "services/router/http/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
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
#include "services/router/http/certificate_reloader.h"
#include "services/router/http/completion_handler.h"
#include "services/router/http/guarded_server.h"
#include "services/router/http/http_auth.h"
#include "services/router/http/library_errors.h"
#include "services/router/http/openai_json.h"
#include "services/router/http/openai_models.h"
#include "services/router/server/api_key_auth.h"

namespace lazyattn::router {
namespace {

// cpp-httplib runs each connection as one task to its end (keep-alive included). This pool caps
// the tasks running (`threads`) and waiting (`max_queued`); a connection beyond both waits in a
// second queue, as bounded (`max_queued`), for one extra thread that answers each 503 at once,
// without reading its request (ShedConnectionsOnThisThread), so a slow client there delays no
// other. When that queue is full too, enqueue() blocks the accepting thread: cpp-httplib 0.11
// gives the pool no way to close a socket it will not serve (the socket is inside the task), so
// further connections wait in the kernel's accept backlog instead, holding no file descriptor of
// the process. The open sockets are thus at most threads + 2 * max_queued.
class BoundedPool final : public httplib::TaskQueue {
 public:
  // `stopping`: set when the server stops; an enqueue() waiting for room then queues anyway.
  BoundedPool(int threads, int max_queued, std::shared_ptr<const std::atomic<bool>> stopping)
      : max_queued_(static_cast<size_t>(max_queued)),
        pool_threads_(static_cast<size_t>(threads)),
        stopping_(std::move(stopping)) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(&jobs_, false); });
    workers_.emplace_back([this] { Run(&shed_jobs_, true); });
    // Serve only once every pool thread waits for work: a connection that came before would find
    // no idle thread and, with max_queued 0, be shed (seen on a loaded machine).
    std::unique_lock<std::mutex> lock(mu_);
    started_cv_.wait(lock, [&] { return idle_ == pool_threads_; });
  }
  ~BoundedPool() override = default;

  void enqueue(std::function<void()> fn) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (jobs_.size() < max_queued_ + idle_) {
        jobs_.push_back(std::move(fn));
      } else {
        // At least one connection may always wait to be shed (max_queued 0 included). Polls
        // `stopping_`, which Server::stop() does not signal here.
        while (!space_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] {
          return shutdown_ || stopping_->load() ||
                 shed_jobs_.size() < std::max<size_t>(1, max_queued_);
        })) {
        }
        shed_jobs_.push_back(std::move(fn));
      }
    }
    cv_.notify_all();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    cv_.notify_all();
    space_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  void Run(std::deque<std::function<void()>>* queue, bool shed) {
    if (shed) ShedConnectionsOnThisThread();
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!shed && ++idle_ == pool_threads_) started_cv_.notify_all();
        cv_.wait(lock, [&] { return shutdown_ || !queue->empty(); });
        if (!shed) --idle_;
        if (queue->empty()) return;  // shutting down with nothing left
        fn = std::move(queue->front());
        queue->pop_front();
      }
      if (shed) space_cv_.notify_all();
      fn();
    }
  }

  const size_t max_queued_;
  const size_t pool_threads_;  // not counting the shedding thread
  std::mutex mu_;
  std::condition_variable cv_;          // a job was queued, or shutdown
  std::condition_variable space_cv_;    // the shed queue has room, or stopping
  std::condition_variable started_cv_;  // every pool thread waits for work (the constructor's)
  std::deque<std::function<void()>> jobs_, shed_jobs_;
  size_t idle_ = 0;  // pool threads waiting for a job
  const std::shared_ptr<const std::atomic<bool>> stopping_;
  bool shutdown_ = false;
  std::vector<std::thread> workers_;
};

constexpr char kCompleteMethod[] = "/lazyattn.v1.Inference/Complete";
constexpr char kModelInfoMethod[] = "/lazyattn.v1.Inference/GetModelInfo";

// The API key's name for the request this thread serves (set by the pre-routing handler).
thread_local std::string request_key_name;

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

bool IsCompletion(const httplib::Request& req) { return MethodOf(req) == kCompleteMethod; }

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

// The library closes the connection after answering an HTTP/1.0 request that did not ask to keep
// it, without saying so in the answer.
bool LibraryClosesAfterResponse(const httplib::Request& req) {
  return req.version == "HTTP/1.0" && req.get_header_value("Connection") != "Keep-Alive";
}

// Methods whose body cpp-httplib reads for any path (into memory, before its 404).
bool LibraryReadsBody(const httplib::Request& req) {
  return req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
         req.method == "DELETE" || req.method == "PRI";
}

// The request announces a body: refusing it leaves bytes unread on the connection.
// Every Content-Length counts: a second one (`0`, then `42`) would be a body to a front proxy
// that reads the last.
bool CarriesBody(const httplib::Request& req) {
  if (req.has_header("Transfer-Encoding")) return true;
  auto range = req.headers.equal_range("Content-Length");
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second != "0") return true;
  }
  return false;
}

std::vector<std::string> HeaderValues(const httplib::Request& req, const char* name) {
  std::vector<std::string> out;
  auto range = req.headers.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) out.push_back(it->second);
  return out;
}

// How much of an unread body to drop before closing (guarded_server.h): a client that announced
// its length sends all of it before it reads the answer, so all of it; of a chunked body or an
// unusable length, as much as the limit once more (a client sending more is cut off). Plus slack
// for what the wire adds to the body (TLS records, chunk framing).
constexpr int64_t kWireSlack = 64 << 10;
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

// Answers `req` without reading (the rest of) its body, and closes the connection after the
// response (the body left on it would otherwise be read as the next request).
void RefuseUnread(const httplib::Request& req, httplib::Response& res, int64_t max_body_bytes,
                  int64_t already_read = 0) {
  res.set_header("Connection", "close");
  CloseConnectionAfterResponse(UnreadBody(req, already_read, max_body_bytes));
}

// Checks a completion request's body type and framing (body_framing.h). Refused: answers it
// unread with the check's status and returns that status. Accepted: sends nothing and returns 100
// (go on), the value an `Expect: 100-continue` handler gives.
int RefuseBadFraming(const httplib::Request& req, httplib::Response& res, int64_t max_body_bytes) {
  BodyFraming framing = CheckContentType(HeaderValues(req, "Content-Type"));
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

// Reads a completion request's body into `req.body`, counting: a chunked body (whose length
// cpp-httplib 0.11 neither knows nor limits) is cut off at `max_body_bytes` and refused 413, so
// the router buffers at most that much. A body still arriving at http.body_timeout_ms after the
// headers (the stream's deadline, guarded_server.h) is refused 408. False after answering the
// request (413, 408 or 400).
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
  if (too_large) {
    SendError(res, 413, BodyTooLargeMessage(max_body_bytes), "body_too_large");
  } else if (BodyTimedOut()) {
    SendError(res, 408,
              absl::StrCat("body: not received within http.body_timeout_ms (",
                           absl::ToInt64Milliseconds(options.body_timeout), " ms)"),
              "body_timeout");
  } else {
    SendError(res, 400,
              "body: incomplete or malformed (chunked encoding, Content-Encoding, or the "
              "connection ended)",
              "invalid_argument");
  }
  return false;
}

// The request's Authorization header, whole. cpp-httplib's get_header_value goes through a C
// string, which a NUL in the value cut short: `Bearer <key>\0<anything>` was checked as
// `Bearer <key>`. Whole, such a value is no key's (401, as any wrong key). The first of several,
// as get_header_value has it; the header map's names compare case-insensitively.
std::string AuthorizationOf(const httplib::Request& req) {
  const auto range = req.headers.equal_range("Authorization");
  return range.first == range.second ? std::string() : range.first->second;
}

// What is checked of a request after its headers and before its body: the method and path, the
// router draining, the API key, and a completion's body framing (body_framing.h), so that an
// unauthenticated client never makes the router buffer a body, and a body over the limit (by its
// Content-Length) or of an ambiguous length is refused at once, unread. Only the completion
// endpoints read a body; any other request that would make the library read one gets its 404
// unread. Handled: `res` answers the request (the error handler writes the body of a 404 or 405
// left empty). Unhandled: routing goes on, with the key's name in request_key_name.
httplib::Server::HandlerResponse CheckBeforeBody(grpc::AuthMetadataProcessor* processor,
                                                 bool draining, int64_t max_body_bytes,
                                                 const httplib::Request& req,
                                                 httplib::Response& res) {
  request_key_name.clear();
  // Range is not served: a range of a completion is a slice of broken JSON (or of a stream that
  // has no length), and no client of this API asks for one. Dropped, the whole response goes
  // out as 200, as RFC 9110 lets a server ignore Range. `req` is the library's own Request,
  // non-const in its routing (as in ReadBody).
  const_cast<httplib::Request&>(req).ranges.clear();
  // An endpoint asked with another method: 405, whatever the method (the library answers TRACE
  // and the like 400 and anything else on a known path 404), its body unread.
  if (const char* allow = WrongMethodAllow(req)) {
    if (CarriesBody(req) || LibraryReadsBody(req)) RefuseUnread(req, res, max_body_bytes);
    res.status = 405;  // the error handler writes the body
    res.set_header("Allow", allow);
    return httplib::Server::HandlerResponse::Handled;
  }
  const char* method = MethodOf(req);
  if (method == nullptr) {
    if (LibraryReadsBody(req)) {
      RefuseUnread(req, res, max_body_bytes);
      res.status = 404;  // the error handler writes the body
      return httplib::Server::HandlerResponse::Handled;
    }
    // GET and the like: the library ignores a body, which must not be read as a next request.
    if (CarriesBody(req)) RefuseUnread(req, res, max_body_bytes);
    return httplib::Server::HandlerResponse::Unhandled;  // open or 404
  }
  if (CarriesBody(req) && !IsCompletion(req)) RefuseUnread(req, res, max_body_bytes);
  if (draining) {
    RefuseUnread(req, res, max_body_bytes);
    SendError(res, 503, "the router is shutting down; retry on another", "unavailable");
    return httplib::Server::HandlerResponse::Handled;
  }
  grpc::Status s = CheckApiKey(processor, AuthorizationOf(req), method, &request_key_name);
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      res.set_header("WWW-Authenticate", "Bearer");
    }
    RefuseUnread(req, res, max_body_bytes);
    SendGrpcError(res, s);
    return httplib::Server::HandlerResponse::Handled;
  }
  if (IsCompletion(req) && RefuseBadFraming(req, res, max_body_bytes) != 100) {
    return httplib::Server::HandlerResponse::Handled;
  }
  return httplib::Server::HandlerResponse::Unhandled;
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
  // which runs next on this thread, in request_key_name.
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
    return CheckBeforeBody(processor, draining->load(), max_body_bytes, req, res);
  });
  // `Expect: 100-continue` is answered before the pre-routing handler runs: a request the router
  // would refuse before reading its body (no or a wrong API key, its framing, ...) is refused
  // here, with the same answer, instead of invited to send the body.
  s.set_expect_100_continue_handler([processor, keep_auth, draining, max_body_bytes](
                                        const httplib::Request& req, httplib::Response& res) {
    MarkHeadersReceived();
    const auto checked = CheckBeforeBody(processor, draining->load(), max_body_bytes, req, res);
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
    if (!ClosesAfterResponse() &&
        (res.get_header_value("Connection") == "close" || LibraryClosesAfterResponse(req))) {
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
      body(req, res, request_key_name);
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
          HandleCompletion(kind, req, res, router, opts, stopping, key_limiter, request_key_name,
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
