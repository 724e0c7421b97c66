// The lazyattn-kvdir server: the KvDirectory gRPC service over a DirectoryIndex, a lease sweeper
// thread and the /metrics endpoint. The sweeper calls DirectoryIndex::Sweep: after a stall of the
// directory itself (its previous sweep more than half a lease ago) it expires nobody, extends
// every lease by one lease and logs one warning with the stall's length.
//
//   KvdirOptions options;
//   options.listen_address = "127.0.0.1:0";
//   ASSIGN_OR_RETURN(auto server, KvdirServer::Create(options));
//   ... server->port() ...
//   server.reset();  // or Shutdown(): stops the sweeper, ends open streams, stops serving
#ifndef LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_SERVER_H_
#define LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_SERVER_H_

#include <prometheus/registry.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/tls_expiry_metrics.h"
#include "services/kvdir/index/directory_index.h"
#include "services/kvdir/server/kvdir_metrics.h"
#include "services/kvdir/server/kvdir_service.h"
#include "services/kvdir/server/slow_work_pool.h"

namespace lazyattn::kvdir {

// The least default rate of limits.max_publish_entries_per_s: a worker storing and evicting
// documents fast in mode block (up to 64 entries a document, an event each) stays far below it.
inline constexpr int64_t kMinDefaultPublishEntriesPerS = 262'144;

struct KvdirOptions {
  // Socket. Port 0 picks a free port (see KvdirServer::port / metrics_port).
  std::string listen_address = "127.0.0.1:7100";
  std::string metrics_address = "127.0.0.1:9100";  // empty: no /metrics endpoint
  // Non-empty: /metrics requires "Authorization: Bearer <the file's token>" (read at start).
  std::string metrics_bearer_token_file;
  LogOptions log;  // log.level, log.format (applied by main)
  // TLS (empty cert_file: plaintext). With ca_file: mutual TLS and authorization by certificate
  // identity: Publish only from lazyattn://worker/ID certificates, each bound to its own ID;
  // Lookup and ListWorkers only from lazyattn://router/ certificates; health open to all.
  TlsOptions tls;
  // Plaintext without authorization accepted by main (it refuses to start without TLS otherwise).
  bool insecure = false;
  // Serve grpc.reflection (server.reflection); off by default.
  bool reflection = false;
  // Bounds on what workers may make the directory hold (a worker certificate is not a licence
  // to exhaust its memory). Over one, the Publish stream ends with the status below, the refusal
  // is counted in lazyattn_kvdir_limit_refusals_total{limit} and logged.
  struct Limits {
    int max_keys_per_lookup = 1024;    // more: INVALID_ARGUMENT naming `keys`
    // Both directions; bounds a snapshot's bytes (~40 an entry: 16 MiB holds a snapshot at
    // max_entries_per_worker's default) and each open stream's receive buffer.
    int max_message_bytes = 16 << 20;
    // A new worker's hello when this many are registered: RESOURCE_EXHAUSTED.
    int64_t max_workers = 1024;
    // (document, offset) entries per worker; a larger snapshot, or an event past it:
    // RESOURCE_EXHAUSTED, and the worker's entries are dropped.
    int64_t max_entries_per_worker = 262'144;
    // (document, offset) entries of all workers together (~150 bytes of memory each: 2M is
    // ~300 MiB); a snapshot or an event past it: RESOURCE_EXHAUSTED, and that worker's entries
    // are dropped.
    int64_t max_entries = 2'097'152;
    // hello.status.worker_id: 1..this many of [A-Za-z0-9._:[]-] (a host:port, a pod name, a
    // certificate name); otherwise INVALID_ARGUMENT.
    int max_worker_id_length = 255;
    // Open Publish streams, hello or not: a new one beyond is RESOURCE_EXHAUSTED before any read.
    int64_t max_publish_streams = 4096;
    // Open Publish streams per worker certificate (mutual TLS): a worker needs one, and one more
    // while a reconnect overlaps a stream not yet given up.
    int max_streams_per_certificate = 4;
    // A stream that has not said hello this long after it opened is cancelled.
    int64_t hello_timeout_ms = 10'000;
    // Directory entries the streams of one worker certificate may store, remove or replace a
    // second, in bursts of four times that (PublishStreamLimits); 0: no bound; -1: a full
    // snapshot a second (max_entries_per_worker), and never less than
    // kMinDefaultPublishEntriesPerS, since events come with a worker's traffic, not its cache's
    // size. Otherwise at least max_entries_per_worker.
    int64_t max_publish_entries_per_s = -1;
  } limits;
  // A worker stays live this long after its last message (heartbeats renew it).
  int64_t lease_ms = 3000;
  // Threads for snapshots and hellos (slow_work_pool.h); 0: half the host's cores, 1 to 4. Not
  // in the YAML: tests pin it to queue a message behind another on any host.
  int slow_work_threads = 0;
};

class KvdirServer {
 public:
  // InvalidArgument naming the option for a bad value; Unavailable naming the address when the
  // gRPC or metrics address cannot be bound; InvalidArgument naming a TLS file it cannot read.
  static absl::StatusOr<std::unique_ptr<KvdirServer>> Create(const KvdirOptions& options);

  ~KvdirServer();
  KvdirServer(const KvdirServer&) = delete;
  KvdirServer& operator=(const KvdirServer&) = delete;

  int port() const { return port_; }  // the bound gRPC port
  int metrics_port() const;           // 0 without a metrics endpoint
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // Tests only: to set DirectoryIndex's test hook before any worker connects.
  DirectoryIndex& index_for_test() { return index_; }

  // Idempotent. Stops the sweeper, cancels open Publish streams (workers reconnect elsewhere or
  // later), waits briefly for in-flight lookups, and stops serving.
  void Shutdown();

 private:
  explicit KvdirServer(const KvdirOptions& options);
  void SweepLoop();

  const KvdirOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  KvdirMetrics metrics_;
  std::unique_ptr<TlsExpiryMetrics> tls_metrics_;
  DirectoryIndex index_;
  PublishStreams streams_;
  SlowWorkPool slow_work_;  // before service_ and server_: outlives every reactor
  KvdirService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;

  // A std::condition_variable, not absl::Mutex::AwaitWithTimeout: the abseil this builds with
  // turns a timeout into a wall-clock deadline, so stepping the clock back would hold the sweeper
  // (and with it lease expiry) for the size of the step; wait_for runs on the steady clock.
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread sweeper_;
};

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_SERVER_H_
