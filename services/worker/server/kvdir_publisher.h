// The worker's side of KvDirectory.Publish: tells kvdir which documents this worker holds.
//
// Protocol (proto/lazyattn/v1/kvdir.proto): on each connection the worker sends Hello{status,
// epoch}, then DocEvent STORED/EVICTED for every document cache change, a Heartbeat{load} every
// lease/3, and a Snapshot{entries, load} whenever kvdir sends a SnapshotRequest (kvdir asks after
// every Hello) or when events had to be dropped. Every message carries `seq`, 1 for the Hello of
// a connection and +1 per message after it. A LeaseGrant from kvdir sets the lease, kept within
// kvdir's own bounds (50 ms to 1 h). A message from kvdir that does not parse ends the stream as
// kvdir's end does; a call still open 2 s later is cancelled, and the publisher reconnects. When
// the stream fails the publisher reconnects with exponential backoff (min_backoff doubling up to
// max_backoff) and a new Hello. The backoff is reset only after a stream kvdir accepted: one that
// stayed up at least max_backoff after its Hello (kvdir refuses a worker at its Hello or its
// snapshot, at once). A refusal (RESOURCE_EXHAUSTED: limits.max_workers or
// limits.max_entries_per_worker; PERMISSION_DENIED; INVALID_ARGUMENT; ALREADY_EXISTS: another
// live worker holds this worker id) will not change within a second: the next try waits
// max_backoff, so a refused worker re-sends its snapshot at most once per max_backoff, and it is
// logged once per distinct refusal, not once per retry. ALREADY_EXISTS is logged as an error
// naming the holder's address (kvdir's trailing metadata): the worker keeps retrying, and takes
// the id over once the other worker disconnects or its lease passes, but until then it is not
// published and gets no requests.
//
// Threading: OnCacheEvent is called on the engine thread and only appends to a bounded queue;
// one publisher thread owns the stream and does all writes, and one reader thread per connection
// blocks in Read. When the queue is full, or while kvdir is unreachable, events are dropped and a
// snapshot replaces them (CacheSnapshot versions say which queued events a snapshot covers).
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_KVDIR_PUBLISHER_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_KVDIR_PUBLISHER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "lazyattn/v1/kvdir.grpc.pb.h"
#include "services/worker/engine/cache_events.h"

namespace lazyattn {

struct KvdirPublisherOptions {
  std::string address;  // kvdir host:port
  TlsOptions tls;       // client side: ca_file (and cert/key for mTLS); empty: plaintext
  int max_message_bytes = 64 << 20;
  absl::Duration lease = absl::Seconds(3);  // until kvdir grants one; heartbeats every lease/3
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  int max_queued_events = 4096;
  uint64_t epoch = 0;  // 0: a random one (it must change when the worker restarts)
  // A stream that lived this long and then ended UNAVAILABLE is logged at INFO, not WARNING:
  // kvdir closes every connection after about an hour (its connection age, so certificates are
  // checked again; common/grpc_util.h), and that is routine. Whether the reconnect works is
  // what warns ("cannot reach kvdir").
  absl::Duration routine_stream_age = absl::Minutes(30);
};

// What the publisher reports, read on the publisher thread.
struct PublisherSource {
  std::function<v1::WorkerStatus()> status;  // for Hello
  std::function<v1::WorkerLoad()> load;      // for Heartbeat and Snapshot
  std::function<CacheSnapshot()> snapshot;   // every cached document
};

class KvdirPublisher {
 public:
  // InvalidArgument naming the option for a bad value or an unreadable TLS file. Starts the thread;
  // a kvdir that is down is not an error (the publisher keeps trying).
  static absl::StatusOr<std::unique_ptr<KvdirPublisher>> Create(
      const KvdirPublisherOptions& options, PublisherSource source);
  ~KvdirPublisher();  // Stop()
  KvdirPublisher(const KvdirPublisher&) = delete;
  KvdirPublisher& operator=(const KvdirPublisher&) = delete;

  // Never blocks on the network; safe from any thread (the engine's cache listener).
  void OnCacheEvent(const CacheEvent& event);
  // Half-closes the stream (kvdir sees a clean end), waits briefly for kvdir to close it, then
  // stops. Idempotent.
  void Stop();

  struct Stats {
    bool connected = false;
    int64_t connections = 0;     // streams whose Hello was written
    int64_t refusals = 0;        // streams kvdir refused (see the header comment)
    int64_t events_sent = 0;
    int64_t events_dropped = 0;
    int64_t snapshots_sent = 0;
    int64_t heartbeats_sent = 0;
  };
  Stats stats() const;
  uint64_t epoch() const { return options_.epoch; }

 private:
  KvdirPublisher(const KvdirPublisherOptions& options, PublisherSource source,
                 std::shared_ptr<grpc::Channel> channel);
  // How a connection ended.
  struct StreamEnd {
    bool hello_sent = false;
    bool accepted = false;  // up at least max_backoff after its Hello, and not refused
    bool refused = false;   // kvdir refused this worker (a status that retrying will not change)
  };
  void Run();
  // One connection: returns when the stream failed or Stop() was called.
  StreamEnd RunStream();
  void ReadLoop(grpc::ClientReaderWriter<v1::WorkerMessage, v1::DirectoryMessage>* stream);

  const KvdirPublisherOptions options_;
  const PublisherSource source_;
  std::unique_ptr<v1::KvDirectory::Stub> stub_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* call_ ABSL_GUARDED_BY(mu_) = nullptr;  // the live stream's context
  bool connected_ ABSL_GUARDED_BY(mu_) = false;  // accepting events into the queue
  bool stream_ended_ ABSL_GUARDED_BY(mu_) = false;  // the reader saw the stream end
  std::deque<CacheEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool snapshot_wanted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration lease_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  bool reported_unreachable_ = false;  // publisher thread only: log one line per outage
  std::string last_refusal_;           // publisher thread only: the refusal logged last
  std::thread thread_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_KVDIR_PUBLISHER_H_
