#include "services/router/http/completion_handler.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "common/monotonic_time.h"
#include "services/router/http/choice_calls.h"
#include "services/router/http/client_connection.h"
#include "services/router/http/error_mapping.h"
#include "services/router/http/http_call.h"
#include "services/router/http/openai_logprobs.h"
#include "services/router/http/openai_models.h"
#include "services/router/http/openai_response_json.h"
#include "services/router/http/sse_writer.h"
#include "services/router/server/router_metrics.h"

namespace lazyattn::router {
namespace {

std::string NewId(ApiKind kind) {
  static absl::Mutex mu(absl::kConstInit);
  static absl::BitGen* gen = new absl::BitGen();  // one per process; never destroyed
  uint64_t a, b;
  {
    absl::MutexLock lock(&mu);
    a = absl::Uniform<uint64_t>(*gen);
    b = absl::Uniform<uint64_t>(*gen);
  }
  return absl::StrCat(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-",
                      absl::Hex(a, absl::kZeroPad16), absl::Hex(b, absl::kZeroPad16));
}

// How waiting for a call's next event ended.
enum class Step { kToken, kEnd, kDeadline, kStopping, kClientGone };

// Next() in slices, so that a server shutdown and a client that hung up are noticed while the
// worker is silent (prefill, a non-streamed call). The shutdown is also checked before each
// event: a stream whose tokens keep coming never waits a whole slice.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(250);

Step NextStep(ChoiceCalls& calls, int* choice, HttpCall::Event* e, absl::Time deadline,
              const std::atomic<bool>& stopping, const ClientConnection& client) {
  while (true) {
    if (stopping.load()) return Step::kStopping;
    const absl::Duration left = deadline - MonotonicNow();
    if (left <= absl::ZeroDuration()) return Step::kDeadline;
    switch (calls.Next(choice, e, std::min(left, kWaitSlice))) {
      case HttpCall::Event::kToken:
        return Step::kToken;
      case HttpCall::Event::kEnd:
        return Step::kEnd;
      case HttpCall::Event::kTimeout:
        break;
    }
    if (client.Gone()) return Step::kClientGone;
  }
}

// A call's end as the client sees it: a success without a result is the router's fault.
grpc::Status EndStatus(const HttpCall::Event& e) {
  if (e.status.ok() && !e.final.has_value()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "the call ended without a result");
  }
  return e.status;
}

// Fields the router accepts without reading (openai_fields.h) are logged once per name, at INFO:
// an operator learns which ones clients send without a line per request. At most kMaxLoggedFields
// names are remembered, so clients sending made-up names cannot grow the set without bound.
constexpr size_t kMaxLoggedFields = 256;

void LogUnknownFields(const std::vector<std::string>& fields) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* logged = new absl::flat_hash_set<std::string>();  // never destroyed
  for (const std::string& field : fields) {
    {
      absl::MutexLock lock(&mu);
      if (logged->size() >= kMaxLoggedFields || !logged->insert(field).second) continue;
    }
    LogInfo("router")
        .Str("api", "http")
        .Str("field", field)
        .Msg(
            "HTTP request field not used by the router; accepted and ignored (logged once "
            "per field name)");
  }
}

// A stream's error event carries a generic message from 500 on (ErrorBodyOf); the details here.
void LogStreamError(const grpc::Status& status) {
  if (HttpStatusOf(status.error_code()) < 500) return;
  LogWarning("router")
      .Str("api", "http")
      .Str("grpc_status", StatusCodeLabel(status.error_code()))
      .Msg(absl::StrCat("stream ended: ", status.error_message()));
}

// Why a call that was given up on ended. A client that hung up is counted as a gRPC client's
// cancellation is (CANCELLED, 499), not as a failure of the router or its worker.
grpc::Status StepFailure(Step step) {
  switch (step) {
    case Step::kStopping:
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the router is shutting down");
    case Step::kClientGone:
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client closed the connection");
    default:
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "deadline exceeded (http.request_timeout_ms)");
  }
}

// How the other choices of a request end when one of them failed (OpenAI's `n`).
grpc::Status SiblingFailed() {
  return grpc::Status(grpc::StatusCode::CANCELLED,
                      "given up: another choice of the request failed");
}

// The shutdown's own message, as the listener's refusal of new requests while it drains: the
// generic 503 text ("no worker could serve") would not tell the client to go elsewhere.
constexpr char kShuttingDown[] = "the router is shutting down; retry on another";

std::string StepErrorBody(Step step) {
  if (step == Step::kStopping) return ErrorBody(503, kShuttingDown, "unavailable");
  return ErrorBodyOf(StepFailure(step));
}

// The choice's "logprobs" for `tokens` in the form of `kind` (openai_logprobs.h); `alternatives`:
// the request asked for top_logprobs.
nlohmann::json LogprobsJson(ApiKind kind, std::span<const TokenLogprob> tokens, TextOffset* offset,
                            bool alternatives) {
  return kind == ApiKind::kChat ? ChatLogprobs(tokens)
                                : CompletionLogprobs(tokens, offset, alternatives);
}

// The 404 for a model no live worker serves. The router's own message (the gRPC API's) quotes the
// name to 64 bytes and points to GetModelInfo; the HTTP API quotes what a client sent as every
// message of its own does (QuoteForMessage: 32 bytes) and lists the ids GET /v1/models does.
std::string UnknownModelMessage(RouterContext* router, const std::string& model) {
  std::vector<std::string> ids;
  for (const ModelGroup& g : router->registry().Models()) ids.push_back(ListedModelId(g.info));
  return absl::StrCat("model: ", QuoteForMessage(nlohmann::json(model)),
                      " is not served by any live worker; served: ", absl::StrJoin(ids, ", "),
                      " (GET /v1/models lists them)");
}

// A response that is not streamed holds every log-probability entry of every choice until its
// end (HttpCall collects them; the JSON trees built from them take several times their size):
// n x max_tokens x (1 + alternatives) of them, bounded by http.max_logprob_entries. The message
// (param logprobs, or top_logprobs for chat's alternatives) when `request` is over the bound;
// empty otherwise. A max_tokens the validator refuses (negative, over limits.max_tokens) is
// left to it.
std::string LogprobBudgetError(const OpenAiRequest& request, int max_tokens_limit,
                               int64_t max_entries) {
  const lazyattn::v1::SamplingParams& sampling = request.request.sampling();
  if (request.stream || !sampling.logprobs()) return "";
  if (sampling.max_tokens() < 0 || sampling.max_tokens() > max_tokens_limit) return "";
  const bool own_max_tokens = sampling.max_tokens() > 0;
  const int64_t max_tokens = own_max_tokens ? sampling.max_tokens() : max_tokens_limit;
  const int64_t alternatives = std::max(0, sampling.top_logprobs());
  // At most 128 x 2^31 x 21: no overflow.
  const int64_t entries = int64_t{request.choices} * max_tokens * (1 + alternatives);
  if (entries <= max_entries) return "";
  // Completions count alternatives in `logprobs: k`; chat in top_logprobs beside logprobs: true.
  const bool chat = request.kind == ApiKind::kChat;
  const char* param = chat && alternatives > 0 ? "top_logprobs" : "logprobs";
  const char* alternatives_field = chat ? "top_logprobs" : "logprobs";
  return absl::StrCat(
      param, ": a response that is not streamed holds all its log probabilities until its end: n ",
      request.choices, " x ",
      own_max_tokens
          ? absl::StrCat(request.max_tokens_field, " ", max_tokens)
          : absl::StrCat("max_tokens ", max_tokens, " (limits.max_tokens, as none is set)"),
      " x (1 + ", alternatives_field, " ", alternatives, ") = ", entries,
      " entries, over the router's bound of ", max_entries,
      " (http.max_logprob_entries); lower n, ", request.max_tokens_field, " or ",
      alternatives_field,
      ", or set stream: true, which has no such bound (a stream sends each "
      "token's entries as it goes)");
}

// What a streamed response needs after the handler returned (the provider runs later).
struct StreamState {
  std::unique_ptr<ChoiceCalls> calls;  // cancelled when the state goes (CancelAll)
  // The events taken before the response began, by choice: a token (held, not yet consumed)
  // or an end; none for a choice that had none yet.
  std::vector<std::optional<HttpCall::Event>> firsts;
  ResponseMeta meta;
  bool include_usage = false;
  bool logprobs = false;                    // the request asked for them
  bool alternatives = false;                // and for top_logprobs
  std::vector<TextOffset> offsets;          // completions' text_offset per choice, across chunks
  std::vector<lazyattn::v1::Final> finals;  // each choice's end, for the usage
  absl::Time deadline;
  std::shared_ptr<const std::atomic<bool>> stopping;
  ClientConnection client;
  // cpp-httplib drops a provider it will not call again (the server stopped, the client went
  // away): the calls go with it, so none is left holding its worker stream.
};

// One event of choice `i`: a token's chunk, or its finish chunk. False when the client is gone.
bool WriteEvent(StreamState& s, SseWriter& out, int i, const HttpCall::Event& e, Step step) {
  if (step == Step::kEnd) {
    s.finals[i] = *e.final;
    out.Event(FinishChunkJson(s.meta, i, *e.final, s.include_usage));
    return out.ok();
  }
  // With log probabilities every real token has a chunk, also one whose text is held back.
  const std::optional<TokenLogprob> entry = s.logprobs ? LogprobOf(e.token) : std::nullopt;
  if (entry.has_value()) {
    const nlohmann::json logprobs =
        LogprobsJson(s.meta.kind, {&*entry, 1}, &s.offsets[i], s.alternatives);
    out.Event(TextChunkJson(s.meta, i, e.token.text(), s.include_usage, &logprobs));
  } else if (!e.token.text().empty()) {
    out.Event(TextChunkJson(s.meta, i, e.token.text(), s.include_usage));
  }
  s.calls->Consumed(i, out.ok());
  return out.ok();
}

// Writes the whole stream in one provider call: the calls block on their tokens anyway, and a
// provider that returns without writing would be called again at once (a busy loop).
bool WriteStream(StreamState& s, httplib::DataSink& sink) {
  SseWriter out([&sink](const char* data, size_t size) { return sink.write(data, size); });
  const int n = s.calls->size();
  if (s.meta.kind == ApiKind::kChat) {
    for (int i = 0; i < n; ++i) out.Event(RoleChunkJson(s.meta, i, s.include_usage));
  }
  if (!s.meta.echo.empty()) {  // a completion's echo: the prompt, before each choice's tokens
    for (int i = 0; i < n; ++i) out.Event(TextChunkJson(s.meta, i, s.meta.echo, s.include_usage));
  }
  Step step = Step::kToken;
  // The events taken before the response began, in choice order. The shutdown is checked
  // before every token, the first ones included (it may have begun while the response's head
  // was written).
  for (int i = 0; i < n; ++i) {
    if (!s.firsts[i].has_value()) continue;
    const HttpCall::Event& e = *s.firsts[i];
    const Step kind = e.final.has_value() ? Step::kEnd : Step::kToken;
    if (kind == Step::kToken && s.stopping->load()) {
      step = Step::kStopping;
      break;
    }
    if (!WriteEvent(s, out, i, e, kind)) return false;  // the client is gone
  }
  s.firsts.clear();
  HttpCall::Event e;
  while (step != Step::kStopping && !s.calls->AllEnded()) {
    int i = 0;
    step = NextStep(*s.calls, &i, &e, s.deadline, *s.stopping, s.client);
    if (step != Step::kToken && step != Step::kEnd) break;
    if (step == Step::kEnd && !EndStatus(e).ok()) {
      // A choice failed after the stream began: the others are given up on too.
      s.calls->CancelAll(SiblingFailed());
      const grpc::Status status = EndStatus(e);
      LogStreamError(status);
      out.Event(ErrorBodyOf(status));
      sink.done();
      return true;
    }
    // Before every token: a stream whose tokens keep coming never waits a whole slice.
    if (step == Step::kToken && s.stopping->load()) {
      step = Step::kStopping;
      break;
    }
    if (!WriteEvent(s, out, i, e, step)) return false;  // the calls cancel their worker streams
  }
  if (!s.calls->AllEnded()) {
    // Not written: released so that the calls can end, which also cancels their worker calls.
    s.calls->CancelAll(StepFailure(step));
    if (step == Step::kClientGone) return false;  // nobody left to tell
    out.Event(StepErrorBody(step));
    sink.done();
    // A stream cut by the shutdown closes its connection too (cpp-httplib closes one whose
    // provider failed, after the body's end was written): a keep-alive client would otherwise
    // hold the shutdown for up to http.keep_alive_timeout_ms.
    return step != Step::kStopping;
  }
  if (s.include_usage) out.Event(UsageChunkJson(s.meta, s.finals));
  out.Done();
  sink.done();
  return out.ok();
}

}  // namespace

std::string HttpRequestId(const httplib::Request& request) {
  // Whole values (get_header_value would stop at a NUL, which IsValidRequestId refuses).
  const auto range = request.headers.equal_range("X-Request-Id");
  if (range.first == range.second || std::next(range.first) != range.second) {
    return NewRequestId();
  }
  return AdoptRequestId(range.first->second);
}

void SendError(httplib::Response& response, int http_status, std::string_view message,
               std::string_view code) {
  response.status = http_status;
  response.set_content(ErrorBody(http_status, message, code), "application/json");
}

void SendGrpcError(httplib::Response& response, const grpc::Status& status) {
  response.status = HttpStatusOf(status.error_code());
  if (response.status >= 500) {
    // The client gets a generic message (ErrorBodyOf); the details stay here.
    LogWarning("router")
        .Str("api", "http")
        .Int("http_status", response.status)
        .Str("grpc_status", StatusCodeLabel(status.error_code()))
        .Msg(status.error_message());
  }
  response.set_content(ErrorBodyOf(status), "application/json");
}

void HandleCompletion(ApiKind kind, const httplib::Request& request, httplib::Response& response,
                      RouterContext* router, const HttpOptions& options,
                      std::shared_ptr<const std::atomic<bool>> stopping, KeyLimiter* key_limiter,
                      const ApiCaller& caller, std::shared_ptr<LiveCalls> live) {
  // Every answer of the endpoint says which id its access lines and the worker's log carry.
  const std::string request_id = HttpRequestId(request);
  response.set_header("X-Request-Id", request_id);
  auto parsed = ParseOpenAiRequest(kind, request.body);
  if (!parsed.ok()) {
    router->metrics().CountRequest(grpc::StatusCode::INVALID_ARGUMENT);
    SendError(response, 400, std::string(parsed.status().message()), "invalid_argument");
    return;
  }
  LogUnknownFields(parsed->unknown_fields);
  // The call chooses its model again when it begins (model_choice.h); choosing here names the
  // model in the response and refuses an unknown one as OpenAI does (404 model_not_found).
  const auto model = router->registry().ResolveModel(parsed->model);
  if (!model.ok()) {
    const grpc::Status status = ToGrpcStatus(model.status());
    router->metrics().CountRequest(status.error_code());
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      SendError(response, 404, UnknownModelMessage(router, parsed->model), "model_not_found");
    } else {
      SendGrpcError(response, status);
    }
    return;
  }
  std::string model_name = parsed->model;
  if (model_name.empty() && model->has_value()) model_name = (*model)->id;
  ResponseMeta meta{kind, NewId(kind), absl::ToUnixSeconds(absl::Now()), std::move(model_name)};
  const absl::Time deadline = MonotonicNow() + options.request_timeout;
  if (const std::string error = LogprobBudgetError(*parsed, router->options().limits.max_tokens,
                                                   options.max_logprob_entries);
      !error.empty()) {
    router->metrics().CountRequest(grpc::StatusCode::INVALID_ARGUMENT);
    SendError(response, 400, error, "invalid_argument");
    return;
  }
  if (parsed->echo) {
    // Each choice repeats the prompt: n copies of it may take what one body may (a 4 MiB prompt
    // with n 128 would otherwise make a 512 MiB answer of a 4 MiB request).
    const std::string& prompt = parsed->request.question();
    if (static_cast<int64_t>(prompt.size()) * parsed->choices > options.max_body_bytes) {
      router->metrics().CountRequest(grpc::StatusCode::INVALID_ARGUMENT);
      SendError(response, 400,
                absl::StrCat("echo: n ", parsed->choices, " copies of the prompt's ", prompt.size(),
                             " bytes exceed http.max_body_bytes (", options.max_body_bytes,
                             "); lower n or leave echo out"),
                "invalid_argument");
      return;
    }
    meta.echo = prompt;
  }
  const bool logprobs = parsed->request.sampling().logprobs();
  const bool alternatives = parsed->request.sampling().top_logprobs() > 0;
  auto started = ChoiceCalls::Start(router, key_limiter, caller, parsed->request, parsed->choices,
                                    deadline, parsed->stream, request_id, std::move(live));
  if (!started.ok()) {
    grpc::Status status = ToGrpcStatus(started.status());
    SendGrpcError(response, grpc::Status(status.error_code(),
                                         ToHttpFieldNames(*parsed, status.error_message())));
    return;
  }
  std::unique_ptr<ChoiceCalls> calls = std::move(*started);
  const int n = calls->size();
  const ClientConnection client = ClientConnection::OfThisThread();
  // Not streaming: every choice's end. Streaming: the first event of any choice (a token, or an
  // end), so that a request no worker serves is still refused with its HTTP status; the other
  // choices' first tokens are not waited for, as a choice holding its first token unread would
  // hold its worker's stream (whose buffer is bounded) while a slow sibling starts.
  std::vector<std::optional<HttpCall::Event>> firsts(n);
  for (int missing = n; missing > 0 && (!parsed->stream || missing == n); --missing) {
    int i = 0;
    HttpCall::Event e;
    const Step got = NextStep(*calls, &i, &e, deadline, *stopping, client);
    if (got != Step::kToken && got != Step::kEnd) {
      calls->CancelAll(StepFailure(got));
      if (got == Step::kStopping) {
        response.set_header("Connection", "close");
        SendError(response, 503, kShuttingDown, "unavailable");
      } else {
        SendGrpcError(response, StepFailure(got));
      }
      return;
    }
    if (got == Step::kEnd && !EndStatus(e).ok()) {
      calls->CancelAll(SiblingFailed());
      const grpc::Status status = EndStatus(e);
      SendGrpcError(response, grpc::Status(status.error_code(),
                                           ToHttpFieldNames(*parsed, status.error_message())));
      return;
    }
    firsts[i] = std::move(e);
  }
  if (!parsed->stream) {
    // Not streaming: every first event is its choice's end. Each choice's logprobs are built
    // into the response as it is written, and its entries freed then: the response holds one
    // JSON tree per choice, not a second copy beside it.
    std::vector<ChoiceResult> results(n);
    for (int i = 0; i < n; ++i) {
      results[i].final = &*firsts[i]->final;
      if (!logprobs) continue;
      results[i].make_logprobs = [kind, alternatives, tokens = &firsts[i]->logprobs] {
        TextOffset offset;
        nlohmann::json json = LogprobsJson(kind, *tokens, &offset, alternatives);
        std::vector<TokenLogprob>().swap(*tokens);
        return json;
      };
    }
    response.set_content(CompletionJson(meta, results), "application/json");
    return;
  }
  // Streaming, and a first token (or a successful end) is known: commit to 200.
  auto state = std::make_shared<StreamState>();
  state->calls = std::move(calls);
  state->firsts = std::move(firsts);
  state->meta = std::move(meta);
  state->include_usage = parsed->include_usage;
  state->logprobs = logprobs;
  state->alternatives = alternatives;
  state->offsets.resize(n);
  state->finals.resize(n);
  state->deadline = deadline;
  state->stopping = std::move(stopping);
  state->client = client;
  response.set_header("Cache-Control", "no-cache");
  response.set_header("X-Accel-Buffering", "no");
  auto write = [state](size_t, httplib::DataSink& sink) { return WriteStream(*state, sink); };
  auto release = [state](bool success) {
    // The connection failed (or the shutdown cut it before the stream began): the tokens taken
    // and not written are released, and the worker calls cancelled.
    if (!success) {
      state->calls->CancelAll(
          StepFailure(state->stopping->load() ? Step::kStopping : Step::kClientGone));
    }
  };
  if (request.version == "HTTP/1.0") {
    // HTTP/1.0 has no chunked encoding: the stream ends where the connection closes (the
    // post-routing handler closes it after a body without a length).
    response.set_content_provider("text/event-stream", std::move(write), std::move(release));
  } else {
    response.set_chunked_content_provider("text/event-stream", std::move(write),
                                          std::move(release));
  }
}

}  // namespace lazyattn::router
