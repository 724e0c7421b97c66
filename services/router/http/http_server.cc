#include "services/router/http/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <iostream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/router/http/completion_handler.h"
#include "services/router/http/http_auth.h"
#include "services/router/http/openai_json.h"
#include "services/router/server/api_key_auth.h"
#include "nlohmann/json.hpp"

namespace lazyattn::router {
namespace {

// Set on the thread that answers connections beyond the pool's queue: their requests get 503.
thread_local bool shed_connection = false;

// cpp-httplib runs each connection as one task to its end (keep-alive included). This pool caps
// the tasks running (`threads`) and waiting (`max_queued`); a connection beyond both runs on one
// extra thread that answers every request 503 at once, so it is closed quickly instead of
// holding a socket in an unbounded queue.
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(int threads, int max_queued) : max_queued_(static_cast<size_t>(max_queued)) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Run(&jobs_, false); });
    workers_.emplace_back([this] { Run(&shed_jobs_, true); });
  }
  ~BoundedPool() override = default;

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto* queue = jobs_.size() < max_queued_ + idle_ ? &jobs_ : &shed_jobs_;
      queue->push_back(std::move(fn));
    }
    cv_.notify_all();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  void Run(std::deque<std::function<void()>>* queue, bool shed) {
    shed_connection = shed;
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!shed) ++idle_;
        cv_.wait(lock, [&] { return shutdown_ || !queue->empty(); });
        if (!shed) --idle_;
        if (queue->empty()) return;  // shutting down with nothing left
        fn = std::move(queue->front());
        queue->pop_front();
      }
      fn();
    }
  }

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_, shed_jobs_;
  size_t idle_ = 0;  // pool threads waiting for a job
  bool shutdown_ = false;
  std::vector<std::thread> workers_;
};

constexpr char kCompleteMethod[] = "/lazyattn.v1.Inference/Complete";
constexpr char kModelInfoMethod[] = "/lazyattn.v1.Inference/GetModelInfo";

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(
    const HttpOptions& options, const TlsOptions& tls, RouterContext* router,
    std::shared_ptr<grpc::AuthMetadataProcessor> auth) {
  std::unique_ptr<HttpServer> server(new HttpServer());
  if (!tls.cert_file.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(tls.cert_file.c_str(), tls.key_file.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "http: cannot load the server certificate ", tls.cert_file, " or its key ",
          tls.key_file, " (server.tls)"));
    }
    server->server_ = std::move(ssl);
    server->tls_ = true;
  } else {
    server->server_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& s = *server->server_;
  const int threads = options.threads;
  const int queued = options.max_queued_connections;
  s.new_task_queue = [threads, queued] { return new BoundedPool(threads, queued); };
  // Each SSE event is a small write: without TCP_NODELAY, Nagle's algorithm holds it until the
  // client's delayed ACK (measured: +10 ms to the first token, tokens delivered in bursts).
  s.set_tcp_nodelay(true);
  s.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  s.set_read_timeout(absl::ToChronoMilliseconds(options.read_timeout));
  s.set_write_timeout(absl::ToChronoMilliseconds(options.write_timeout));
  s.set_keep_alive_timeout(
      std::max<time_t>(1, absl::ToInt64Seconds(options.keep_alive_timeout)));
  s.set_keep_alive_max_count(static_cast<size_t>(options.keep_alive_max_count));

  const HttpOptions opts = options;
  grpc::AuthMetadataProcessor* processor = auth.get();
  // Keeps the processor alive as long as the handlers that use it.
  auto keep_auth = std::make_shared<std::shared_ptr<grpc::AuthMetadataProcessor>>(std::move(auth));

  s.set_pre_routing_handler([](const httplib::Request&, httplib::Response& res) {
    if (!shed_connection) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Connection", "close");
    SendError(res, 503, "router busy: too many HTTP connections (http.threads, "
                        "http.max_queued_connections); retry later", "unavailable");
    return httplib::Server::HandlerResponse::Handled;
  });
  // The per-key in-flight caps live in the router's API key processor (null without keys).
  auto* authorizer = dynamic_cast<ApiKeyAuthorizer*>(processor);
  KeyLimiter* key_limiter = authorizer != nullptr ? &authorizer->limiter() : nullptr;
  // A handler that needs a key: checks it, then runs `body(req, res, key_name)`.
  auto authorized = [processor, keep_auth](const char* method, auto body) {
    return [processor, keep_auth, method, body](const httplib::Request& req,
                                                httplib::Response& res) {
      std::string key_name;
      grpc::Status s =
          CheckApiKey(processor, req.get_header_value("Authorization"), method, &key_name);
      if (!s.ok()) {
        if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
          res.set_header("WWW-Authenticate", "Bearer");
        }
        SendGrpcError(res, s);
        return;
      }
      body(req, res, key_name);
    };
  };
  std::shared_ptr<const std::atomic<bool>> stopping = server->stopping_;
  auto completion = [router, opts, stopping, key_limiter](ApiKind kind) {
    return [router, opts, stopping, key_limiter, kind](const httplib::Request& req,
                                                       httplib::Response& res,
                                                       const std::string& key_name) {
      HandleCompletion(kind, req, res, router, opts, stopping, key_limiter, key_name);
    };
  };
  for (auto [path, kind] : {std::pair{"/v1/chat/completions", ApiKind::kChat},
                            std::pair{"/v1/completions", ApiKind::kCompletion}}) {
    auto handle = completion(kind);
    // Complete's scope (generate) for both: streaming or not, it is the same permission.
    s.Post(path, authorized(kCompleteMethod, handle));
  }
  s.Get("/v1/models", authorized(kModelInfoMethod, [router](const httplib::Request&,
                                                            httplib::Response& res,
                                                            const std::string& /*key_name*/) {
          const auto model = router->registry().Model();
          res.set_content(ModelsJson(model.has_value() ? &*model : nullptr,
                                     absl::ToUnixSeconds(absl::Now())),
                          "application/json");
        }));
  s.Get("/health", [router](const httplib::Request&, httplib::Response& res) {
    const int live = router->registry().LiveCount();
    res.status = live > 0 ? 200 : 503;
    res.set_content(nlohmann::json{{"status", live > 0 ? "ok" : "no live workers"},
                                   {"workers", live}}.dump(),
                    "application/json");
  });
  // Errors the library produces itself (unknown path 404, wrong method 405, body over the limit
  // 413, malformed request 400): OpenAI's error shape unless a handler wrote a body.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message;
    const char* code = "error";
    switch (res.status) {
      case 404:
        message = absl::StrCat(req.path, ": no such endpoint (POST /v1/chat/completions, POST "
                                         "/v1/completions, GET /v1/models, GET /health)");
        code = "not_found";
        break;
      case 413:
        message = "body: larger than http.max_body_bytes";
        code = "body_too_large";
        break;
      default:
        message = absl::StrCat("HTTP status ", res.status, " for ", req.method, " ", req.path);
        break;
    }
    SendError(res, res.status, message, code);
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                             std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    SendError(res, 500, absl::StrCat("internal error: ", what), "internal");
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

void HttpServer::Shutdown() {
  stopping_->store(true);
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace lazyattn::router
