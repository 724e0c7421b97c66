// The open Publish streams and the bounds on them: how many at once, how many per worker
// certificate, how long a stream may stay open without saying hello, and how much directory
// work a certificate's streams may cause a second. A stream costs the directory a reactor and a
// receive buffer for up to limits.max_message_bytes whether or not it ever says hello, and each
// message work under the index's lock, so neither the count, the silence nor the rate may be
// left to the peer.
//
//   PublishStreams streams({.max_streams = 4096, .max_per_certificate = 4,
//                           .hello_timeout = absl::Seconds(10)});
//   ASSIGN_OR_RETURN(uint64_t id, streams.Open(certificate_id, now, [call] { call->TryCancel();
//   }));
//   ... streams.SaidHello(id);   // once the hello is accepted
//   ... RETURN_IF_ERROR(streams.Charge(id, entries, now));   // before a message is applied
//   ... streams.Close(id);       // in OnDone, before the reactor is deleted
//   // The sweeper, every tick: cancels the streams silent past hello_timeout.
//   for (const SilentStream& s : streams.CancelSilent(now)) { log s.certificate_id ... }
//
// Thread-safe. `cancel` runs under the registry's lock, so Close (which takes it) cannot return
// while a cancel of its stream is running: the reactor, and the call the cancel names, outlive
// every cancel. gRPC runs an application's reactions on its own threads, never inside TryCancel
// called from another thread, so a cancel does not re-enter Close.
#ifndef LAZYATTN_SERVICES_KVDIR_SERVER_PUBLISH_STREAMS_H_
#define LAZYATTN_SERVICES_KVDIR_SERVER_PUBLISH_STREAMS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lazyattn::kvdir {

struct PublishStreamLimits {
  int64_t max_streams = 4096;     // limits.max_publish_streams
  int max_per_certificate = 4;    // limits.max_streams_per_certificate (mutual TLS only)
  absl::Duration hello_timeout = absl::Seconds(10);  // limits.hello_timeout_ms
  // limits.max_publish_entries_per_s: directory entries the streams of one worker certificate
  // may store, remove or replace a second (Charge), in bursts of up to kBurstSeconds times that;
  // 0: no bound. Without mutual TLS each stream has a budget of its own.
  int64_t entries_per_s = 262'144;
  // A full budget holds this many seconds of the rate: with a rate of at least
  // limits.max_entries_per_worker (kvdir's rule), four full snapshots back to back, as a worker
  // reconnecting or falling behind sends them, and then one a second.
  static constexpr double kBurstSeconds = 4;
};

// A stream CancelSilent cancelled: who opened it, for the log line.
struct SilentStream {
  std::string certificate_id;  // empty without mutual TLS
  std::string peer_host;
  absl::Duration open_for;
};

class PublishStreams {
 public:
  explicit PublishStreams(PublishStreamLimits limits) : limits_(limits) {}

  // Registers a stream opened at `now`. `certificate_id`: the worker name in the peer's
  // certificate, empty without mutual TLS (then only max_streams bounds the peer).
  // RESOURCE_EXHAUSTED naming limits.max_publish_streams or limits.max_streams_per_certificate
  // when the stream would pass one (`*per_certificate` says which, where given); it is then not
  // registered.
  absl::StatusOr<uint64_t> Open(const std::string& certificate_id, const std::string& peer_host,
                                absl::Time now, std::function<void()> cancel,
                                bool* per_certificate = nullptr);
  // The stream's hello was accepted: no hello deadline from here on. Unknown ids are ignored.
  void SaidHello(uint64_t id);
  // CancelSilent cancelled the stream. True from the moment it did, while the call's own
  // IsCancelled() may still read false: gRPC marks a server-side TryCancel on its own threads.
  bool CancelledSilent(uint64_t id) const;
  // Charges one message's directory work at `now` to the stream's certificate (without one,
  // to the stream): `entries` is what it stores, removes or replaces (an event 1, a snapshot
  // its entries), at least 1 (a heartbeat or hello costs one). Removing what the worker holds
  // (a snapshot replacing it, a new epoch's hello dropping it) is not charged again: those
  // entries were charged when stored, by the same certificate (a worker id is bound to its
  // certificate), so the work of removals is at most that of the stores before them and the
  // directory's work stays within twice the rate. RESOURCE_EXHAUSTED naming
  // limits.max_publish_entries_per_s, and nothing charged, when the budget holds less: the
  // message must not be applied. Unknown ids pass.
  absl::Status Charge(uint64_t id, int64_t entries, absl::Time now);
  // Unregisters the stream; unknown ids are ignored.
  void Close(uint64_t id);
  // Cancels (once) every stream opened at or before now - hello_timeout that has not said
  // hello, and returns them. Also forgets the budgets of certificates without an open stream
  // that have refilled by `now` (a full budget is what a new one would be).
  std::vector<SilentStream> CancelSilent(absl::Time now);

  int64_t open_streams() const;
  const PublishStreamLimits& limits() const { return limits_; }

 private:
  // Entries left, refilled at limits_.entries_per_s up to kBurstSeconds of it.
  struct Budget {
    double entries = 0;
    absl::Time refilled = absl::InfinitePast();
  };
  double Burst() const;  // entries a full budget holds
  Budget FullBudget(absl::Time now) const;
  // `budget` refilled up to `now`.
  void Refill(Budget& budget, absl::Time now) const;

  struct Stream {
    std::string certificate_id;
    std::string peer_host;
    absl::Time opened;
    bool said_hello = false;
    bool cancelled = false;
    std::function<void()> cancel;
    Budget budget;  // without a certificate only
  };

  const PublishStreamLimits limits_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Stream> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> per_certificate_ ABSL_GUARDED_BY(mu_);
  // Kept after a certificate's last stream closes, so reconnecting does not refill it.
  absl::flat_hash_map<std::string, Budget> budgets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_SERVER_PUBLISH_STREAMS_H_
