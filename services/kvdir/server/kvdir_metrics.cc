#include "services/kvdir/server/kvdir_metrics.h"

namespace lazyattn::kvdir {

KvdirMetrics::KvdirMetrics(prometheus::Registry& registry)
    : workers_alive_(prometheus::BuildGauge()
                         .Name("lazyattn_kvdir_workers_alive")
                         .Help("Workers registered in the directory (lease not yet swept)")
                         .Register(registry)
                         .Add({})),
      documents_tracked_(prometheus::BuildGauge()
                             .Name("lazyattn_kvdir_documents_tracked")
                             .Help("Distinct document keys held by at least one worker")
                             .Register(registry)
                             .Add({})),
      publish_streams_(prometheus::BuildGauge()
                           .Name("lazyattn_kvdir_publish_streams")
                           .Help("Open Publish streams, whether or not they said hello "
                                 "(limits.max_publish_streams bounds them)")
                           .Register(registry)
                           .Add({})),
      events_family_(prometheus::BuildCounter()
                         .Name("lazyattn_kvdir_events_applied_total")
                         .Help("Worker cache events applied to the index, by kind")
                         .Register(registry)),
      events_stored_(events_family_.Add({{"kind", "stored"}})),
      events_evicted_(events_family_.Add({{"kind", "evicted"}})),
      snapshots_family_(prometheus::BuildCounter()
                            .Name("lazyattn_kvdir_snapshots_total")
                            .Help("Snapshots requested from workers (by reason) and applied")
                            .Register(registry)),
      snapshots_requested_reconnect_(snapshots_family_.Add({{"stage", "requested_reconnect"}})),
      snapshots_requested_gap_(snapshots_family_.Add({{"stage", "requested_gap"}})),
      snapshots_applied_(snapshots_family_.Add({{"stage", "applied"}})),
      workers_left_(prometheus::BuildCounter()
                        .Name("lazyattn_kvdir_workers_left_total")
                        .Help("Workers removed, with all their entries, when their Publish "
                              "stream half-closed cleanly: a drained worker leaving (not a "
                              "lease expiry)")
                        .Register(registry)
                        .Add({})),
      leases_expired_(
          prometheus::BuildCounter()
              .Name("lazyattn_kvdir_leases_expired_total")
              .Help("Workers removed, with all their entries, because their lease passed")
              .Register(registry)
              .Add({})),
      hellos_refused_family_(
          prometheus::BuildCounter()
              .Name("lazyattn_kvdir_hellos_refused_total")
              .Help("Publish streams refused for the worker id or address their hello claimed, "
                    "by reason: not the id in the caller's certificate, an id held by another "
                    "live worker, or an address another live worker advertises")
              .Register(registry)),
      lookup_duration_(
          prometheus::BuildHistogram()
              .Name("lazyattn_kvdir_lookup_duration_seconds")
              .Help("Time to answer a Lookup from the index")
              .Register(registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5,
                                                               5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
                                                               2.5e-3, 5e-3, 1e-2})),
      limit_family_(prometheus::BuildCounter()
                        .Name("lazyattn_kvdir_limit_refusals_total")
                        .Help("Publish streams ended because a worker went past a bound of the "
                              "directory (limits.*), by bound")
                        .Register(registry)) {
  limit_refusals_[0] = &limit_family_.Add({{"limit", "max_workers"}});
  limit_refusals_[1] = &limit_family_.Add({{"limit", "max_entries_per_worker"}});
  limit_refusals_[2] = &limit_family_.Add({{"limit", "worker_id"}});
  limit_refusals_[3] = &limit_family_.Add({{"limit", "status_bytes"}});
  limit_refusals_[4] = &limit_family_.Add({{"limit", "unread_replies"}});
  limit_refusals_[5] = &limit_family_.Add({{"limit", "max_publish_streams"}});
  limit_refusals_[6] = &limit_family_.Add({{"limit", "max_streams_per_certificate"}});
  limit_refusals_[7] = &limit_family_.Add({{"limit", "hello_timeout"}});
  limit_refusals_[8] = &limit_family_.Add({{"limit", "max_entries"}});
  limit_refusals_[9] = &limit_family_.Add({{"limit", "max_publish_entries_per_s"}});
  hellos_refused_[0] = &hellos_refused_family_.Add({{"reason", "not_certificate_id"}});
  hellos_refused_[1] = &hellos_refused_family_.Add({{"reason", "worker_id_in_use"}});
  hellos_refused_[2] = &hellos_refused_family_.Add({{"reason", "address_in_use"}});
  hellos_refused_[3] = &hellos_refused_family_.Add({{"reason", "address_not_in_certificate"}});
  hellos_refused_[4] = &hellos_refused_family_.Add({{"reason", "address_not_dialable"}});
}

void KvdirMetrics::HelloRefused(HelloRefusal reason) {
  hellos_refused_[static_cast<int>(reason)]->Increment();
}

void KvdirMetrics::LimitRefused(Limit limit) {
  limit_refusals_[static_cast<int>(limit)]->Increment();
}

void KvdirMetrics::SetIndexStats(const IndexStats& stats) {
  workers_alive_.Set(static_cast<double>(stats.workers));
  documents_tracked_.Set(static_cast<double>(stats.documents));
}

void KvdirMetrics::SetPublishStreams(int64_t open) {
  publish_streams_.Set(static_cast<double>(open));
}

void KvdirMetrics::EventApplied(DocEventKind kind) {
  (kind == DocEventKind::kStored ? events_stored_ : events_evicted_).Increment();
}

void KvdirMetrics::SnapshotRequested(bool gap) {
  (gap ? snapshots_requested_gap_ : snapshots_requested_reconnect_).Increment();
}

void KvdirMetrics::SnapshotApplied() { snapshots_applied_.Increment(); }

void KvdirMetrics::LeasesExpired(int64_t workers) {
  leases_expired_.Increment(static_cast<double>(workers));
}

void KvdirMetrics::WorkerLeft() { workers_left_.Increment(); }

void KvdirMetrics::ObserveLookup(absl::Duration d) {
  lookup_duration_.Observe(absl::ToDoubleSeconds(d));
}

}  // namespace lazyattn::kvdir
