// The KV directory's index: which documents' KV sits in which worker's memory, and which workers
// are alive. Soft state, rebuilt from the workers' event streams (DESIGN.md section 4).
//
// Per worker the index keeps its status (identity, address, model, latest load), the epoch of the
// worker process, the stream session that currently owns it, the last sequence number applied,
// whether a snapshot is awaited, its lease expiry and when it was last heard from. Per document
// key it keeps, per worker, the cached entries by offset (-1 = position-agnostic/lazy entry; mode
// block entries exist per offset) with their token counts.
//
// Sequence numbers: every message a worker sends on its stream carries `seq`, from 1, counting all
// message kinds. After a Hello the index expects the next message to carry Hello's seq + 1. An
// event or heartbeat whose seq is not last + 1 is a gap: the index returns kGap and ignores the
// worker's events (heartbeats still renew the lease) until a snapshot arrives, which replaces the
// worker's entries whatever its seq. A Hello always leaves the worker awaiting a snapshot (the
// service asks for one with reason "reconnect"); a Hello with a new epoch also drops the worker's
// entries at once, because a restarted worker's cache is empty.
//
// Sessions: each Hello opens a new session; every later call names the session it comes from. A
// call from a session that no longer owns the worker (a newer Hello took over, or the lease
// expired and the worker was removed) returns kNoSession and changes nothing (a snapshot that
// loses its session between two slices keeps what it stored, which the new session's own
// snapshot replaces); the stream should end and the worker say Hello again.
//
// One live process per worker id: a Hello takes the id over only from a holder that cannot be a
// second live process. It is refused (HelloResult::id_in_use, nothing changes) while the holder
// is connected (a session that has not disconnected), its lease has not passed (or the directory
// stalled, as for Lookup), and either it advertised another address than the new Hello or its
// stream came from another peer host (HelloCaller::peer_host). Two workers started with one id
// would otherwise take turns forever, each Hello dropping the other's entries. The peer host
// catches copies that also advertise one address (a compose service scaled to two, a copied
// service whose config still names the first one). The same address from the same host (a
// restart on the same port, a reconnect the old stream has not noticed yet), a disconnected
// holder (a crash closes its stream) or a lapsed lease (a frozen process) all let the new Hello
// take over, as a restarted or moved worker needs. Workers behind one NAT (or one proxy) share a
// peer host, so among them only the address tells a copy apart, as when the host is unknown.
//
// One live worker per address: routers dial a worker at the address it advertises and tell
// workers apart by it, so a second id advertising a held address would overwrite the holder's
// entry there (its model, load and residency) and could take it out of its model's plans. A Hello
// advertising the address of another id is refused (HelloResult::address_in_use, nothing changes)
// while that holder's lease has not passed (or the directory stalled), connected or not: a worker
// whose stream broke for a moment must find its address free when it reconnects. A holder of the
// address whose lease passed is removed with its entries instead (HelloResult::removed_at_address;
// a worker restarted under a new id waits one lease at most). An empty address is not compared.
//
// Leases: every message from the owning session renews the lease to now + lease. Closing the
// stream does not end the lease; the worker stays live (and keeps its entries) until the lease
// passes, so a quick reconnect loses nothing. ExpireLeases removes workers whose lease has passed,
// with all their entries; Lookup already hides them before the sweep.
//
// Stalls of the directory itself: a lease only means something while the directory reads its
// streams. When it stops (SIGSTOP, a paused VM, a long swap-in) the workers' heartbeats wait
// unread in its sockets, and on resume every lease looks passed at once. Sweep, the periodic
// sweeper's call, tells this apart: when the time since the previous Sweep (since the sweeper
// began waiting after it, where it says so: SweeperWaits) is more than stall_after() (lease / 2;
// the sweeper runs every lease / 4 or more often), it expires nobody
// and extends every lease to now + lease instead, so the live workers' next heartbeats (sent
// every lease / 3) renew them and only really dead workers expire, one lease later. Between the
// resume and that sweep, Lookup likewise counts every registered worker as live (its lease
// passed while nothing could renew it). Without Sweep calls (ExpireLeases alone) none of this
// applies.
//
// Bounds (IndexLimits): a Hello of a new worker when max_workers are registered is refused
// (HelloResult::refused, nothing changes). A snapshot of more than max_entries_per_worker entries,
// or a stored event that would take the worker past it, returns kOverLimit and drops all of the
// worker's entries (it stays registered until its lease passes; its stream should end); past
// max_entries, all workers' entries together, the same with kOverTotalLimit: the directory's
// memory stays bounded by max_entries entries (~150 bytes each). A worker
// holds one document at no more than max_offsets_per_document offsets: a stored event at a new
// offset past it replaces the oldest one (the work of every store and lookup of a key stays
// bounded whatever a worker sends). Memory of
// removed entries is given back: the document table shrinks when it is mostly empty.
//
// Large changes: a snapshot replaces up to max_entries_per_worker entries, and a worker that
// expires, restarts or goes past a bound takes as many with it; under one hold of the lock that
// is ~180 ms (262,144 entries, tools/bench/kvdir_index_bench.cc), while every router's lookup
// waits with a 50 ms deadline, and after a kvdir restart all workers snapshot at once. So a
// worker's old entries are retired in O(its keys) copying: their holdings stay in the document
// table under a handle no live worker has any more, which lookups skip at once, and are erased a
// slice of kCleanSlice keys at a time, the lock released between slices, before the call that
// retired them returns. A snapshot stores its entries kSnapshotSlice at a time the same way;
// meanwhile lookups may see the worker with part of the new entries (a routing hint for a
// moment, as a snapshot a moment later would be). The room its old entries held in max_entries
// is reserved for it, and once its size is checked, its whole size: another worker storing
// between the slices can neither take that room nor get it refused partway. The memory bound
// counts live entries and reservations: retired ones are gone before the call that retired them
// returns, and Stats().documents may count their keys until then.
//
// Time is passed in by the caller (absl::Time), so tests drive a fake clock; kvdir passes the
// monotonic clock (common/monotonic_time.h), so stepping the wall clock moves no lease.
// Thread-safe: one mutex guards everything. Lookup and Stats take it shared; every other public
// method takes it exclusively, once, or once per slice (above).
#ifndef LAZYATTN_SERVICES_KVDIR_INDEX_DIRECTORY_INDEX_H_
#define LAZYATTN_SERVICES_KVDIR_INDEX_DIRECTORY_INDEX_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/document_key.h"
#include "lazyattn/v1/worker.pb.h"

namespace lazyattn::kvdir {

// Offset of a position-agnostic (lazy) entry.
inline constexpr int64_t kLazyOffset = -1;

struct DocEntry {
  DocumentKey key;
  int64_t tokens = 0;  // >= 0
  int64_t offset = kLazyOffset;
};

enum class DocEventKind { kStored, kEvicted };

struct DocEvent {
  DocEventKind kind = DocEventKind::kStored;
  // kStored: adds or replaces the (key, offset) entry. kEvicted: removes the (key, offset) entry
  // (tokens unused); evicting an entry the index does not hold is not an error.
  DocEntry entry;
};

enum class ApplyOutcome {
  kApplied,           // the message was applied
  kGap,               // seq != last + 1: the caller asks for a snapshot; events ignored until then
  kAwaitingSnapshot,  // an event that arrived while a snapshot is awaited: ignored
  kNoSession,         // the session no longer owns the worker: nothing changed
  kOverLimit,         // over max_entries_per_worker: the worker's entries were dropped
  kOverTotalLimit,    // over max_entries (all workers): the worker's entries were dropped
};

struct IndexLimits {
  int64_t max_workers = 1024;
  int64_t max_entries_per_worker = 262'144;
  int64_t max_entries = 2'097'152;  // all workers' together
  // Offsets one worker holds one document at (mode block keeps an entry per offset a request
  // placed it at; lazy one at kLazyOffset). A store past it replaces the key's oldest offset.
  int64_t max_offsets_per_document = 64;
};

struct ApplyResult {
  ApplyOutcome outcome = ApplyOutcome::kApplied;
  uint64_t last_seq = 0;  // the worker's last seq before this message (for the gap message)
};

struct HelloResult {
  uint64_t session = 0;          // pass to every later call from the same stream
  bool entries_dropped = false;  // a new epoch: the worker's entries were removed
  bool refused = false;          // a new worker beyond max_workers: not registered, session 0
  // Another live worker holds the id, advertising `holder_address`, on a stream from
  // `holder_peer_host` (file comment): session 0, the holder keeps its session, lease and entries.
  bool id_in_use = false;
  std::string holder_address;
  std::string holder_peer_host;
  // Another live worker, `address_holder_id`, advertises the same address (file comment):
  // session 0, nothing changes.
  bool address_in_use = false;
  std::string address_holder_id;
  // Workers whose lease had passed, removed with their entries because this Hello took their
  // address (file comment).
  std::vector<std::string> removed_at_address;
};

// Who says a Hello: the stream it comes on.
struct HelloCaller {
  // The session this stream already owns, if any: a second Hello on one stream is never a
  // duplicate of itself.
  uint64_t session = 0;
  // The host the stream connects from, without the port (kvdir's PeerHost()); "" when unknown.
  // Compared as a string: callers pass one form for every Hello.
  std::string peer_host;
};

// Which of a worker's entries of a key a Lookup counts as resident: what a request of that cache
// mode can reuse without computing the document (DESIGN.md section 3, docs/kvdir.md).
enum class ResidencyRule {
  kAnyEntry,  // an entry at any offset (mode unknown: routers that do not send one)
  kLazy,      // only the position-agnostic entry (offset -1): lazy KV is valid anywhere
  kBlock,     // only the entry at the offset the request places the key at: block KV is rotated
              // for one position (another offset would be a copy, not a hit)
  kNone,      // nothing (modes prefix and full reuse the worker's prefix tree, not indexed here)
};

// Mode kBlock: an offset the caller cannot know (such a key is never resident).
inline constexpr int64_t kUnknownOffset = -1;

// One live worker as Lookup and ListWorkers report it.
struct WorkerResidency {
  v1::WorkerStatus status;      // from Hello, with the latest load (heartbeat or snapshot)
  // Sum over the requested keys (each occurrence) of the tokens held, saturating at INT64_MAX.
  int64_t resident_tokens = 0;
  std::vector<bool> resident;   // per requested key, in request order
  // Rule kBlock: tokens of the requested keys held only at other offsets (or position-free),
  // which a block request copies rather than encodes (each occurrence, largest count; saturating).
  int64_t copyable_tokens = 0;
  absl::Time last_seen;         // the last message from the worker
};

struct SweepResult {
  std::vector<std::string> expired;  // workers removed, with their entries
  // Non-zero: the time since the previous Sweep (or since the sweeper began waiting after it,
  // SweeperWaits), which was more than stall_after(). Nobody
  // expired; the leases of all `extended` registered workers run until now + lease at least.
  absl::Duration stalled = absl::ZeroDuration();
  int64_t extended = 0;
};

struct IndexStats {
  int64_t workers = 0;    // registered workers (including any whose lease passed but not swept)
  int64_t documents = 0;  // distinct document keys held by at least one worker
  int64_t entries = 0;    // (worker, key, offset) entries
};

class DirectoryIndex {
 public:
  // `lease`: how long a worker stays live after its last message. Must be positive. `limits`
  // must be positive.
  explicit DirectoryIndex(absl::Duration lease, IndexLimits limits = {});

  DirectoryIndex(const DirectoryIndex&) = delete;
  DirectoryIndex& operator=(const DirectoryIndex&) = delete;

  absl::Duration lease() const { return lease_; }
  // A gap between two Sweep calls longer than this is a stall of the directory (file comment).
  absl::Duration stall_after() const { return lease_ / 2; }
  const IndexLimits& limits() const { return limits_; }

  // Registers or re-registers the worker named by status.worker_id (must be non-empty) with a new
  // session, seq as its last seq, a fresh lease, awaiting a snapshot. A different epoch than the
  // registered one drops the worker's entries. A worker not yet registered when max_workers are
  // is refused; one held by another live worker at another address or from another peer host is
  // refused with id_in_use, one advertising the address of another live worker with
  // address_in_use (file comment). The caller's peer host is kept as the holder's.
  HelloResult Hello(const v1::WorkerStatus& status, uint64_t epoch, uint64_t seq, absl::Time now,
                    const HelloCaller& caller = {}) ABSL_LOCKS_EXCLUDED(mu_);

  ApplyResult ApplyEvent(const std::string& worker_id, uint64_t session, uint64_t seq,
                         const DocEvent& event, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Renews the lease and records the load, even while a snapshot is awaited; a seq gap still
  // returns kGap (a message was lost, maybe an event).
  ApplyResult Heartbeat(const std::string& worker_id, uint64_t session, uint64_t seq,
                        const v1::WorkerLoad& load, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Replaces all of the worker's entries with `entries` (a repeated (key, offset) keeps the last)
  // and ends any wait for a snapshot, whatever its seq. `load` may be null (keep the last one).
  // More than max_entries_per_worker entries: kOverLimit; more than max_entries leaves room for:
  // kOverTotalLimit; either way the worker is left with none.
  ApplyResult ApplySnapshot(const std::string& worker_id, uint64_t session, uint64_t seq,
                            absl::Span<const DocEntry> entries, const v1::WorkerLoad* load,
                            absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // A message of the session's stream waits in kvdir to be handled (snapshots go to kvdir's own
  // threads, which may be busy with other workers' snapshots): renews the lease, and until the
  // matching MessageTaken, which kvdir calls once the message was handled, the worker does not
  // expire and counts as live, since only the directory is slow (as in a stall): a snapshot's
  // slices may take longer than a lease. True when the mark was made; false (nothing done) for a
  // session that does not own the worker, whose message then needs no MessageTaken.
  bool MessageQueued(const std::string& worker_id, uint64_t session, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Its handling ended (or it was dropped): one queued mark of the worker goes (whichever session
  // made it, as the worker may have been taken over meanwhile), and the lease runs from `now` if
  // `session` owns it. Called once for every MessageQueued that returned true, whatever came of
  // the message.
  void MessageTaken(const std::string& worker_id, uint64_t session, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The session's stream closed. The worker keeps its entries until its lease passes.
  void Disconnect(const std::string& worker_id, uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);

  // The session's worker left on purpose (its stream half-closed cleanly: a drained worker's
  // last act): removed now with all its entries, as if its lease had passed. True if `session`
  // owned it.
  bool Leave(const std::string& worker_id, uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops every entry of the worker if `session` owns it (a stream refused for its size).
  void DropWorkerEntries(const std::string& worker_id, uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes every worker whose lease expiry is <= now, with all its entries. Returns their ids.
  std::vector<std::string> ExpireLeases(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // The sweeper's call, every lease / 4 or more often: ExpireLeases, unless the previous Sweep
  // was more than stall_after() before `now`; then the stall rule of the file comment (nobody
  // expires, every lease is extended to now + lease). The first Sweep is never a stall.
  SweepResult Sweep(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // The sweeper has done its work after a Sweep and now waits for the next: the stall rule then
  // counts from `now`, not from that Sweep, so the sweeper's own work in between (metrics, a
  // lock wait behind a large snapshot, giving memory back) never reads as the directory stopped.
  // Optional: without it, the gap is measured from the previous Sweep.
  void SweeperWaits(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Every worker whose lease has not passed at `now` (every registered worker while the sweeper
  // is overdue by more than stall_after(): see the file comment), sorted by worker id, with, for
  // `keys`, which of them it holds under `rule` and the sum of the counted entries' tokens (each
  // occurrence in `keys` counts). kAnyEntry takes a key held at several offsets with its largest
  // token count. kBlock reads the key's offset from `offsets` (same length as `keys`; a shorter
  // span or kUnknownOffset leaves the key not resident); the other rules ignore `offsets`.
  std::vector<WorkerResidency> Lookup(absl::Span<const DocumentKey> keys, ResidencyRule rule,
                                      absl::Span<const int64_t> offsets, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // kAnyEntry.
  std::vector<WorkerResidency> Lookup(absl::Span<const DocumentKey> keys, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    return Lookup(keys, ResidencyRule::kAnyEntry, {}, now);
  }

  IndexStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // Tests only: `hook` runs between two slices of a large change (file comment), with the lock
  // released, on the thread making the change; it may call this index. Set before any use.
  void SetBetweenSlicesHookForTest(std::function<void()> hook) {
    between_slices_for_test_ = std::move(hook);
  }

 private:
  // Never reused (a worker gets a new one whenever its entries are retired): 64 bits.
  using WorkerHandle = uint64_t;

  // One worker's entries for one document: (offset, tokens) pairs, usually one.
  struct Holding {
    WorkerHandle worker = 0;
    absl::InlinedVector<std::pair<int64_t, int64_t>, 1> offsets;
    int64_t tokens() const;
    // The tokens of the entry a request reuses under `rule` (placing the key at `offset` for
    // kBlock), or -1 when none counts.
    int64_t ReusableTokens(ResidencyRule rule, int64_t offset) const;
  };
  using Holders = absl::InlinedVector<Holding, 2>;

  struct Worker {
    WorkerHandle handle = 0;
    v1::WorkerStatus status;
    std::string peer_host;  // of the last accepted Hello's stream
    uint64_t epoch = 0;
    uint64_t session = 0;  // 0: no stream owns it
    uint64_t last_seq = 0;
    int64_t entries = 0;  // (key, offset) entries held
    // Messages MessageQueued counted and MessageTaken not yet: the lease holds meanwhile.
    int messages_queued = 0;
    // While a snapshot's slices are stored: room of max_entries kept for it (counted in
    // entries_): the entries it replaced until its size is checked, then its whole size; each
    // entry stored takes one back.
    int64_t reserved = 0;
    bool awaiting_snapshot = true;
    absl::Time lease_expiry;
    absl::Time last_seen;
    absl::flat_hash_set<DocumentKey> keys;  // documents this worker holds (keys of docs_)
  };

  // The worker if `session` owns it, else null.
  Worker* OwnedWorker(const std::string& worker_id, uint64_t session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Common seq bookkeeping of heartbeats and events: renews the lease, detects a gap.
  ApplyResult Advance(Worker& w, uint64_t seq, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // False (nothing stored) when a new entry would take the worker past max_entries_per_worker,
  // or the directory past max_entries.
  bool Store(Worker& w, const DocEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Evict(Worker& w, const DocEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lease has not passed, or a message of the worker waits to be handled (MessageQueued).
  static bool LeaseHeld(const Worker& w, absl::Time now) {
    return w.lease_expiry > now || w.messages_queued > 0;
  }
  // Takes every entry of `w` out of the counts and gives `w` a fresh handle; the holdings under
  // the old one wait in retired_ for CleanRetired. O(w's keys), copying.
  void RetireEntries(Worker& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases up to kCleanSlice retired keys' holdings; whether any remain.
  bool CleanRetiredSlice() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases every retired holding, a slice per hold of the lock.
  void CleanRetired() ABSL_LOCKS_EXCLUDED(mu_);
  // Between two slices: waits (yielding, kLookupsInLimit at most) until no Lookup waits for the
  // lock.
  void LetLookupsIn() const ABSL_LOCKS_EXCLUDED(mu_);
  HelloResult HelloWithoutCleaning(const v1::WorkerStatus& status, uint64_t epoch, uint64_t seq,
                                   absl::Time now, const HelloCaller& caller)
      ABSL_LOCKS_EXCLUDED(mu_);
  ApplyResult ApplyEventWithoutCleaning(const std::string& worker_id, uint64_t session,
                                        uint64_t seq, const DocEvent& event, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Gives the document table's memory back once most of it is empty.
  void ShrinkIfSparse() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sweeps are tracked and the last one is more than stall_after() before `now`.
  bool StalledAt(absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The later of the last Sweep and the sweeper's SweeperWaits since.
  absl::Time SweeperAwayFrom() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Entries per hold of the lock (file comment, "Large changes"): ~3 ms each on a slow core.
  static constexpr size_t kSnapshotSlice = 2048;
  static constexpr size_t kCleanSlice = 2048;
  static constexpr std::chrono::milliseconds kLookupsInLimit{2};

  using DocTable = absl::flat_hash_map<DocumentKey, Holders>;
  static constexpr size_t kDocShards = 64;
  // The hash's top bits: its low 7 are each table's control bytes (SwissTable's H2), which a
  // shard fixed by them would leave two values for, and every probe would compare keys.
  static size_t ShardOf(const DocumentKey& key) {
    static_assert(kDocShards == 64 && sizeof(size_t) == 8);
    return absl::Hash<DocumentKey>{}(key) >> 58;
  }
  DocTable& DocsOf(const DocumentKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return docs_[ShardOf(key)];
  }
  const DocTable& DocsOf(const DocumentKey& key) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return docs_[ShardOf(key)];
  }

  // The holdings of one retired handle still in docs_.
  struct Retired {
    WorkerHandle handle = 0;
    std::vector<DocumentKey> keys;  // erased from the back
  };

  const absl::Duration lease_;
  const IndexLimits limits_;
  mutable absl::Mutex mu_;
  mutable std::atomic<int> lookups_waiting_{0};  // Lookup calls waiting for mu_
  std::function<void()> between_slices_for_test_;
  absl::flat_hash_map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
  // The document table in kDocShards parts by key hash: a flat hash map grows by moving all its
  // elements at once, which at 2 million keys held the lock for ~280 ms; a part moves 1/64.
  std::array<DocTable, kDocShards> docs_ ABSL_GUARDED_BY(mu_);
  // Live workers' entries and snapshots' reserved room (Worker::reserved); retired ones not.
  int64_t entries_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Retired> retired_ ABSL_GUARDED_BY(mu_);
  WorkerHandle next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // InfinitePast: none yet
  absl::Time sweeper_waiting_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_INDEX_DIRECTORY_INDEX_H_
