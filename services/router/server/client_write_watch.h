// Cuts gRPC calls whose clients stopped reading, or read too slowly. A client that keeps its
// connection alive (it answers keepalive pings) but never reads fills the stream's flow-control
// window, and the router's next write to it never completes: the request would hold its
// admission slot, and its worker's, until the client's deadline, which may be none. Each
// streaming call, and each unary Complete (its answer is its one write), registers a Stream
// here, and the call is cancelled (the client gets CANCELLED, if it ever reads again; the
// worker's request is cancelled through the call's usual path) when
//   - one write has not completed within `timeout` (the client stopped reading), or
//   - its writes have waited on the client for more than `wait_budget` in all (a client that
//     takes a message just before each timeout, and so holds its slot for as long as it likes).
// A client that reads as fast as tokens come never makes a write wait: a token is tens of bytes
// against a window of 64 KiB or more. Each write may be given an allowance (its bytes' time at a
// minimum rate, inference_service.cc) before it counts as waiting. The first kUncountedWait of each
// write's wait is not counted: a busy router's own scheduling of the completion can take that long,
// and over a long answer (32K tokens) it would add up to a cut (write_waits.h keeps the account).
//
// The hot path is two atomic stores and two clock reads per write. One thread sweeps the
// registered streams every quarter of the shorter limit (at most every second), so a call is cut
// between its limit and 1.25 x its limit.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_CLIENT_WRITE_WATCH_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_CLIENT_WRITE_WATCH_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/router/server/write_waits.h"

namespace lazyattn::router {

class ClientWriteWatch {
 public:
  struct Limits {
    absl::Duration timeout;      // of one write; zero: none
    absl::Duration wait_budget;  // of a call's writes together; zero: none
  };
  // At least one limit > 0; `on_cut` runs for each call cancelled (metrics). Starts the sweeping
  // thread.
  ClientWriteWatch(Limits limits, std::function<void()> on_cut);
  ~ClientWriteWatch();  // stops the thread; every Stream must be closed before

  class Stream;
  // Registers a call. The returned handle must be closed (Stream::Close) before `context` goes
  // away (in the reactor's OnDone at the latest). `before_cut`, if set, runs on the sweeping
  // thread just before the call is cancelled, with the config key of the limit it passed (so the
  // call can say the router cut it, not its client); never after Close returned.
  std::shared_ptr<Stream> Watch(grpc::CallbackServerContext* context, std::string request_id,
                                std::function<void(const char* limit)> before_cut = nullptr);

 private:
  void Sweep();
  void Loop();

  const Limits limits_;
  const std::function<void()> on_cut_;
  absl::Mutex mu_;
  absl::flat_hash_map<Stream*, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;
};

class ClientWriteWatch::Stream {
 public:
  // A write to the client started / completed (its reactor's OnWriteDone); one write at a time.
  // A write given an `allowance` (a large answer's time to be sent at a minimum rate) starts
  // waiting on the client only once the allowance is over. Lock-free.
  void WriteStarted(absl::Duration allowance = absl::ZeroDuration());
  void WriteDone();
  // From now on the context is never touched. Blocks while a cancellation of this stream is under
  // way on the sweeping thread (unless called from inside it). Idempotent.
  void Close();

 private:
  friend class ClientWriteWatch;
  Stream(ClientWriteWatch* watch, grpc::CallbackServerContext* context, std::string request_id,
         std::function<void(const char*)> before_cut)
      : watch_(watch),
        request_id_(std::move(request_id)),
        before_cut_(std::move(before_cut)),
        context_(context) {}

  ClientWriteWatch* const watch_;
  const std::string request_id_;  // for the log line of a cut
  const std::function<void(const char*)> before_cut_;
  // Recursive: cancelling the call may run the reactor's reactions, Close among them, on the
  // sweeping thread while it holds this lock.
  std::recursive_mutex mu_;
  grpc::CallbackServerContext* context_;  // guarded by mu_; null once closed
  bool cut_ = false;                      // guarded by mu_: cancelled once, never again
  // Which limit the call has passed at `now_ns`: nullptr if none, else the config key's name.
  const char* Overdue(const Limits& limits, int64_t now_ns) const;

  WriteWaits waits_;  // steady-clock nanoseconds
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_CLIENT_WRITE_WATCH_H_
