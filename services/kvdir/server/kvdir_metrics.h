// The directory's Prometheus metrics. Families and their labelled children are built once here;
// the service only bumps the cached children (CONVENTIONS: never Family::Add per request).
//
//   lazyattn_kvdir_workers_alive                 gauge: registered workers (set by the sweeper)
//   lazyattn_kvdir_documents_tracked             gauge: distinct document keys held by any worker
//   lazyattn_kvdir_publish_streams               gauge: open Publish streams, with a hello or
//                                                not (set by the sweeper)
//   lazyattn_kvdir_events_applied_total{kind}    counter: stored / evicted events applied
//   lazyattn_kvdir_snapshots_total{stage}        counter: requested_reconnect, requested_gap,
//                                                applied
//   lazyattn_kvdir_leases_expired_total          counter: workers removed by lease expiry
//   lazyattn_kvdir_workers_left_total            counter: workers removed when their stream
//                                                half-closed cleanly (a drained worker leaving)
//   lazyattn_kvdir_lookup_duration_seconds       histogram: Lookup handling time (index only)
//   lazyattn_kvdir_limit_refusals_total{limit}   counter: Publish streams ended by a bound:
//                                                max_workers, max_entries_per_worker,
//                                                worker_id, status_bytes, unread_replies,
//                                                max_publish_streams,
//                                                max_streams_per_certificate, hello_timeout
//   lazyattn_kvdir_hellos_refused_total{reason}  counter: hellos refused for their worker id
//                                                or address: not_certificate_id (another id
//                                                than the caller's certificate names),
//                                                worker_id_in_use (another live worker holds
//                                                it), address_in_use (another live worker
//                                                advertises the address)
#ifndef LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_METRICS_H_
#define LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/time/time.h"
#include "services/kvdir/index/directory_index.h"

namespace lazyattn::kvdir {

class KvdirMetrics {
 public:
  explicit KvdirMetrics(prometheus::Registry& registry);

  void SetIndexStats(const IndexStats& stats);
  void SetPublishStreams(int64_t open);
  void EventApplied(DocEventKind kind);
  void SnapshotRequested(bool gap);
  void SnapshotApplied();
  void LeasesExpired(int64_t workers);
  void WorkerLeft();
  enum class HelloRefusal {
    kNotCertificateId,
    kWorkerIdInUse,
    kAddressInUse,
    kAddressNotInCertificate,
    kAddressNotDialable,  // a local socket, a DNS server of its own, a local host from afar
  };
  void HelloRefused(HelloRefusal reason);
  void ObserveLookup(absl::Duration d);
  enum class Limit {
    kMaxWorkers,
    kMaxEntriesPerWorker,
    kWorkerId,
    kStatusBytes,
    kUnreadReplies,
    kMaxPublishStreams,
    kMaxStreamsPerCertificate,
    kHelloTimeout,
    kMaxEntries,
    kMaxPublishEntriesPerS,
  };
  void LimitRefused(Limit limit);

 private:
  prometheus::Gauge& workers_alive_;
  prometheus::Gauge& documents_tracked_;
  prometheus::Gauge& publish_streams_;
  prometheus::Family<prometheus::Counter>& events_family_;
  prometheus::Counter& events_stored_;
  prometheus::Counter& events_evicted_;
  prometheus::Family<prometheus::Counter>& snapshots_family_;
  prometheus::Counter& snapshots_requested_reconnect_;
  prometheus::Counter& snapshots_requested_gap_;
  prometheus::Counter& snapshots_applied_;
  prometheus::Counter& workers_left_;
  prometheus::Counter& leases_expired_;
  prometheus::Family<prometheus::Counter>& hellos_refused_family_;
  prometheus::Counter* hellos_refused_[5];
  prometheus::Histogram& lookup_duration_;
  prometheus::Family<prometheus::Counter>& limit_family_;
  prometheus::Counter* limit_refusals_[10];
};

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_SERVER_KVDIR_METRICS_H_
