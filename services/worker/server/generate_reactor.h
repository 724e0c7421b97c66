// One Worker.Generate call (gRPC callback API): validates (the router's limits and UTF-8, via the
// shared validator) and converts the request on gRPC's thread, which is cheap, then queues it on
// the PrepPool, whose threads tokenize and hash its documents and submit it to the engine; streams
// each generated token as a TokenChunk, then a Final with usage and timing. A full PrepPool queue
// answers RESOURCE_EXHAUSTED at once. While the request waits for preparation, cancellation takes
// it out of the queue and a deadline that passes ends it without tokenizing.
//
// The engine thread never waits for the client: its callbacks append to a per-call queue and start
// a write only when none is in flight. When a client falls more than
// ServiceContext::max_buffered_tokens chunks behind, its request is cancelled and the call ends
// with RESOURCE_EXHAUSTED. Client cancellation (and the gRPC deadline, which gRPC turns into a
// cancellation) cancels the engine request, which frees its KV blocks; the engine also gets the
// deadline itself.
//
// A text-only chunk with token_id -1 may come last: text the engine held back (an incomplete UTF-8
// sequence or a possible stop string) and released when generation ended.
//
// Lifetime: the reactor deletes itself when gRPC has called OnDone and the engine has called
// on_done (two references). Threading: gRPC reactions and engine callbacks run on different
// threads; shared state is under mu_, and gRPC operations (StartWrite, Finish) are started outside
// it. Lock order: mu_, then RequestTracker's lock and the engine's submission lock. PrepPool calls
// (through prep_: Submit, Cancel) are made without mu_: Cancel runs the task, which takes mu_.
//
// Every call this reactor ends carries the trailer of common/worker_call_trailer.h, so the router
// tells this worker's own statuses from a connection lost mid-call. With
// testing.abort_on_prompt_marker set, a request containing it aborts the process in Prepare (a
// query of death, for fault-injection tests).
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_GENERATE_REACTOR_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_GENERATE_REACTOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "absl/status/status.h"
#include "lazyattn/v1/inference.pb.h"
#include "services/worker/engine/request.h"
#include "services/worker/server/prep_ticket.h"
#include "services/worker/server/service_context.h"

namespace lazyattn {

class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  // Validates and submits at once; an invalid request finishes with INVALID_ARGUMENT.
  GenerateReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                  const v1::GenerateRequest& request);

  void OnSendInitialMetadataDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // The PrepPool's task: tokenizes and submits (status OK, on a pool thread), or ends the call
  // with the pool's Cancelled / Unavailable. Holds a reference of its own throughout: the one it
  // runs under is handed to the engine at SubmitPrepared, and a short request can end, and its
  // call be done, before SubmitPrepared has returned on this thread.
  void Prepare(const absl::Status& status);
  void PrepareAndSubmit(const absl::Status& status);
  void OnToken(int32_t id, std::string_view text);                     // engine thread
  // A PrefillProgress event (throttled): the prefill moved, or (`queued`) the request waits
  // while the engine works through the requests ahead of it.
  void OnPrefillProgress(int64_t prompt_tokens_ready, bool queued);            // engine thread
  void OnEngineDone(const absl::Status& status, const RequestResult& result);  // engine thread
  // Starts the next write, or Finish once the queue is empty and the end is known.
  void Pump();
  // Ends the call with `status` after the write in flight (queued chunks are dropped).
  void AbortLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels the engine request, or marks it to be cancelled once submitted; returns true while
  // the request may still wait for preparation: the caller then calls prep_.Cancel() after
  // unlocking.
  [[nodiscard]] bool CancelEngineLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unref();
  // The request's log line, once it ended (`counted`: the status its metrics counted; `ttft_ms`:
  // ttft_ms_ then, negative when no token came).
  void LogEnd(grpc::StatusCode counted, const absl::Status& status, const RequestResult& result,
              double ttft_ms) const;

  const ServiceContext ctx_;
  grpc::CallbackServerContext* const call_;  // for the trailing metadata before Finish
  const absl::Time arrival_;
  const absl::Time deadline_;
  // The router's x-request-id (common/log.h), on every log line about this request.
  const std::string request_id_;
  std::atomic<int> refs_{1};  // gRPC's; preparation's (then the engine's) is added on queueing
  // The headers went out (the router's proof that the call reached this process; see
  // testing.abort_on_prompt_marker).
  std::atomic<bool> headers_sent_{false};
  EngineRequest request_;     // converted; handed to the pool thread, then to the engine
  PrepTicket prep_;           // its place in the PrepPool

  std::mutex mu_;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse in_flight_ ABSL_GUARDED_BY(mu_);  // the message being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_wanted_ ABSL_GUARDED_BY(mu_) = false;  // after the queue drains
  bool finished_ ABSL_GUARDED_BY(mu_) = false;       // Finish called
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  // The request ends before any work was done for it (handed_back.h): the call says so.
  bool handed_back_ ABSL_GUARDED_BY(mu_) = false;
  bool submitted_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t engine_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool engine_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_engine_ ABSL_GUARDED_BY(mu_) = false;  // wanted before the id was known
  bool client_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool overflowed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_token_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  double ttft_ms_ ABSL_GUARDED_BY(mu_) = -1;
  // The router asked for PrefillProgress events (kPrefillProgressKey); the last one sent.
  const bool progress_wanted_;
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Engine thread only: the log-probability on_logprob gave for the token OnToken streams next.
  std::optional<float> pending_logprob_;
  std::vector<TopLogprob> pending_top_;  // its alternatives (SamplingParams::top_logprobs)
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_GENERATE_REACTOR_H_
