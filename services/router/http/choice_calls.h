// The calls of one HTTP completion request: one HttpCall per choice (OpenAI's `n`), started
// together and waited on together.
//
//   ASSIGN_OR_RETURN(auto calls, ChoiceCalls::Start(router, ..., request, n, deadline, stream));
//   int i; HttpCall::Event e;
//   while (!calls->AllEnded()) {
//     if (calls->Next(&i, &e, slice) == HttpCall::Event::kToken) { write e.token as choice i;
//                                                                    calls->Consumed(i, ok); }
//   }
//
// Each choice is a request of its own on the routing path: admitted as one (the key's in-flight
// cap, the router's limit), routed, failed over and counted in the metrics as one. They carry the
// same documents, so they meet on the worker that holds them. A seeded request gives choice i the
// seed `seed + i` (wrapping), so its choices differ and the whole response is reproducible;
// unseeded ones each get a fresh seed from their worker. The choices' places are taken together
// or not at all (AdmitRequest over all their tickets) before any starts, so a refused request
// reaches no worker and never holds places that a concurrent request could have had; more
// choices than the router's in-flight limit or the key's cap is InvalidArgument (no retry could
// pass).
//
// Not thread-safe: one thread at a time (the handler, then the stream's writer).
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_CHOICE_CALLS_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_CHOICE_CALLS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lazyattn/v1/inference.pb.h"
#include "services/router/http/http_auth.h"
#include "services/router/http/http_call.h"

namespace lazyattn::router {

class ChoiceCalls {
 public:
  // Admits and starts `choices` (>= 1) calls of `request`, each with `deadline` (a MonotonicNow()
  // value) and the HTTP request's `request_id` (one access line per choice, all under it); the
  // first refusal otherwise (already counted in the router's metrics).
  static absl::StatusOr<std::unique_ptr<ChoiceCalls>> Start(
      RouterContext* router, KeyLimiter* key_limiter, const ApiCaller& caller,
      const lazyattn::v1::GenerateRequest& request, int choices, absl::Time deadline, bool stream,
      const std::string& request_id, std::shared_ptr<LiveCalls> live);
  // Cancels every call still running (CancelAll).
  ~ChoiceCalls();
  ChoiceCalls(const ChoiceCalls&) = delete;
  ChoiceCalls& operator=(const ChoiceCalls&) = delete;

  int size() const { return static_cast<int>(choices_.size()); }
  // Every choice's end has been returned by Next.
  bool AllEnded() const { return ended_ == size(); }

  // Waits at most `timeout` for an event of any choice that can have one: not ended, and not
  // holding a token Next returned that was not yet Consumed. Choices are polled round-robin, so
  // a fast one cannot starve the others. kTimeout when none came (also when no choice can have
  // one); otherwise the event's kind, with the choice's index in `*choice`.
  HttpCall::Event::Kind Next(int* choice, HttpCall::Event* event, absl::Duration timeout);
  // The token Next returned for `choice` was written to the client (ok) or could not be.
  void Consumed(int choice, bool ok);
  // Gives up on every choice still running: tokens taken and not consumed are released, and the
  // worker calls are cancelled, each ending as `why` (HttpCall::Cancel). Idempotent.
  void CancelAll(const grpc::Status& why = grpc::Status(grpc::StatusCode::CANCELLED,
                                                        "cancelled by the client"));

 private:
  struct Choice {
    std::shared_ptr<HttpCall> call;
    bool ended = false;    // Next returned its end
    bool holding = false;  // Next returned a token not yet Consumed
  };
  ChoiceCalls() : ready_(std::make_shared<ReadySignal>()) {}

  std::shared_ptr<ReadySignal> ready_;  // every call notifies it
  std::vector<Choice> choices_;
  int ended_ = 0;
  int next_poll_ = 0;  // where the next round-robin poll begins
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_CHOICE_CALLS_H_
