#include "services/kvdir/index/directory_index.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>

namespace lazyattn::kvdir {

int64_t DirectoryIndex::Holding::tokens() const {
  int64_t t = 0;
  for (const auto& [offset, tokens] : offsets) t = std::max(t, tokens);
  return t;
}

int64_t DirectoryIndex::Holding::ReusableTokens(ResidencyRule rule, int64_t offset) const {
  switch (rule) {
    case ResidencyRule::kAnyEntry:
      return offsets.empty() ? -1 : tokens();
    case ResidencyRule::kLazy:
      offset = kLazyOffset;
      break;
    case ResidencyRule::kBlock:
      if (offset < 0) return -1;  // unknown placement: no exact hit can be promised
      break;
    case ResidencyRule::kNone:
      return -1;
  }
  for (const auto& [o, t] : offsets) {
    if (o == offset) return t;
  }
  return -1;
}

DirectoryIndex::DirectoryIndex(absl::Duration lease, IndexLimits limits)
    : lease_(lease), limits_(limits) {}

HelloResult DirectoryIndex::Hello(const v1::WorkerStatus& status, uint64_t epoch, uint64_t seq,
                                  absl::Time now, const HelloCaller& caller) {
  HelloResult result = HelloWithoutCleaning(status, epoch, seq, now, caller);
  CleanRetired();
  return result;
}

HelloResult DirectoryIndex::HelloWithoutCleaning(const v1::WorkerStatus& status, uint64_t epoch,
                                                 uint64_t seq, absl::Time now,
                                                 const HelloCaller& caller) {
  absl::MutexLock lock(&mu_);
  HelloResult result;
  if (auto held = workers_.find(status.worker_id()); held != workers_.end()) {
    const Worker& holder = held->second;
    // The holder's own process reconnecting carries its epoch (random per process): it takes
    // its id back whatever address or host it now comes from (a dual-stack name, a new IP).
    // Otherwise the address and the peer host tell a second process from a restart of the
    // holder, which comes back on its own address from its own host. Two processes on one host
    // (or behind one NAT) configured with one address cannot be told apart here.
    const bool live = LeaseHeld(holder, now) || StalledAt(now);
    const bool same_process = holder.epoch == epoch;
    if (holder.session != 0 && holder.session != caller.session && live && !same_process &&
        (holder.status.address() != status.address() || holder.peer_host != caller.peer_host)) {
      result.id_in_use = true;
      result.holder_address = holder.status.address();
      result.holder_peer_host = holder.peer_host;
      return result;
    }
  }
  // One live worker per advertised address (file comment). A scan: Hellos are rare and workers
  // few (max_workers).
  std::vector<std::string> lapsed_at_address;
  if (!status.address().empty()) {
    for (const auto& [other_id, other] : workers_) {
      if (other_id == status.worker_id() || other.status.address() != status.address()) continue;
      if (LeaseHeld(other, now) || StalledAt(now)) {
        result.address_in_use = true;
        result.address_holder_id = other_id;
        return result;
      }
      lapsed_at_address.push_back(other_id);
    }
  }
  // The lapsed holders of the address leave below: they do not count against the bound.
  if (!workers_.contains(status.worker_id()) &&
      static_cast<int64_t>(workers_.size() - lapsed_at_address.size()) >= limits_.max_workers) {
    result.refused = true;
    return result;
  }
  for (const std::string& gone : lapsed_at_address) {
    auto g = workers_.find(gone);
    RetireEntries(g->second);
    workers_.erase(g);
  }
  result.removed_at_address = std::move(lapsed_at_address);
  auto [it, inserted] = workers_.try_emplace(status.worker_id());
  Worker& w = it->second;
  if (inserted) {
    w.handle = next_handle_++;
  } else if (w.epoch != epoch) {
    RetireEntries(w);
    result.entries_dropped = true;
  }
  // A snapshot the previous session was storing ends at its next slice (kNoSession): its
  // reservation goes now.
  entries_ -= w.reserved;
  w.reserved = 0;
  w.status = status;
  w.peer_host = caller.peer_host;
  w.epoch = epoch;
  w.session = next_session_++;
  w.last_seq = seq;
  w.awaiting_snapshot = true;
  w.lease_expiry = now + lease_;
  w.last_seen = now;
  result.session = w.session;
  return result;
}

DirectoryIndex::Worker* DirectoryIndex::OwnedWorker(const std::string& worker_id,
                                                    uint64_t session) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.session != session || session == 0) return nullptr;
  return &it->second;
}

ApplyResult DirectoryIndex::Advance(Worker& w, uint64_t seq, absl::Time now) {
  ApplyResult result{ApplyOutcome::kApplied, w.last_seq};
  w.lease_expiry = now + lease_;
  w.last_seen = now;
  if (!w.awaiting_snapshot && seq != w.last_seq + 1) {
    w.awaiting_snapshot = true;
    result.outcome = ApplyOutcome::kGap;
  }
  w.last_seq = seq;
  return result;
}

ApplyResult DirectoryIndex::ApplyEvent(const std::string& worker_id, uint64_t session, uint64_t seq,
                                       const DocEvent& event, absl::Time now) {
  const ApplyResult result = ApplyEventWithoutCleaning(worker_id, session, seq, event, now);
  if (result.outcome == ApplyOutcome::kOverLimit ||
      result.outcome == ApplyOutcome::kOverTotalLimit) {
    CleanRetired();
  }
  return result;
}

ApplyResult DirectoryIndex::ApplyEventWithoutCleaning(const std::string& worker_id,
                                                      uint64_t session, uint64_t seq,
                                                      const DocEvent& event, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Worker* w = OwnedWorker(worker_id, session);
  if (w == nullptr) return {ApplyOutcome::kNoSession, 0};
  const bool was_awaiting = w->awaiting_snapshot;
  ApplyResult result = Advance(*w, seq, now);
  if (result.outcome == ApplyOutcome::kGap) return result;
  if (was_awaiting) return {ApplyOutcome::kAwaitingSnapshot, result.last_seq};
  if (event.kind == DocEventKind::kStored) {
    if (!Store(*w, event.entry)) {
      const ApplyOutcome over = w->entries >= limits_.max_entries_per_worker
                                    ? ApplyOutcome::kOverLimit
                                    : ApplyOutcome::kOverTotalLimit;
      RetireEntries(*w);
      return {over, result.last_seq};
    }
  } else {
    Evict(*w, event.entry);
  }
  return result;
}

ApplyResult DirectoryIndex::Heartbeat(const std::string& worker_id, uint64_t session, uint64_t seq,
                                      const v1::WorkerLoad& load, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Worker* w = OwnedWorker(worker_id, session);
  if (w == nullptr) return {ApplyOutcome::kNoSession, 0};
  *w->status.mutable_load() = load;
  return Advance(*w, seq, now);
}

ApplyResult DirectoryIndex::ApplySnapshot(const std::string& worker_id, uint64_t session,
                                          uint64_t seq, absl::Span<const DocEntry> entries,
                                          const v1::WorkerLoad* load, absl::Time now) {
  // A slice at a time, the lock released between (file comment, "Large changes"). Between slices
  // no message of this worker is applied (its stream is read one message at a time); another
  // stream may take the worker over, or its lease be swept, which the session check below sees.
  uint64_t last_seq = 0;
  bool over_limit = false;
  {
    absl::MutexLock lock(&mu_);
    Worker* w = OwnedWorker(worker_id, session);
    if (w == nullptr) return {ApplyOutcome::kNoSession, 0};
    last_seq = w->last_seq;
    w->lease_expiry = now + lease_;  // a message: the lease runs while the slices are applied
    w->last_seen = now;
    w->awaiting_snapshot = true;
    const int64_t old_entries = w->entries;
    RetireEntries(*w);
    over_limit = static_cast<int64_t>(entries.size()) > limits_.max_entries_per_worker;
    if (!over_limit) {
      // The room the old entries held stays this snapshot's while its slices are stored: another
      // worker storing in between must not take it, or a worker re-sending the entries it had
      // would be refused for room it held, and the other admitted past the bound in its place.
      w->reserved = std::min(old_entries, static_cast<int64_t>(entries.size()));
      entries_ += w->reserved;
    }
  }
  CleanRetired();  // the old entries go before the new ones come: memory stays bounded
  if (over_limit) return {ApplyOutcome::kOverLimit, last_seq};
  size_t next = 0;
  for (;; LetLookupsIn()) {
    absl::MutexLock lock(&mu_);
    Worker* w = OwnedWorker(worker_id, session);
    if (w == nullptr) return {ApplyOutcome::kNoSession, last_seq};
    // Checked whole, before anything is stored (replacements among the entries would need fewer).
    if (next == 0) {
      const int64_t size = static_cast<int64_t>(entries.size());
      if (entries_ - w->reserved + size > limits_.max_entries) {
        RetireEntries(*w);  // nothing stored yet: gives the reservation back
        return {ApplyOutcome::kOverTotalLimit, last_seq};
      }
      // It fits whole: all of it is reserved, so a snapshot larger than the one it replaces is
      // not refused partway because others stored between its slices.
      entries_ += size - w->reserved;
      w->reserved = size;
      // Empty (retired above): reserving now moves nothing, where growing would move every key
      // already stored at each doubling, under the lock.
      w->keys.reserve(entries.size());
    }
    const size_t end = std::min(entries.size(), next + kSnapshotSlice);
    bool stored = true;
    for (; stored && next < end; ++next) stored = Store(*w, entries[next]);
    if (!stored) {
      // Other workers stored between the slices and the directory reached max_entries.
      RetireEntries(*w);
      break;
    }
    if (next == entries.size()) {
      entries_ -= w->reserved;  // what replacements among the entries left unused
      w->reserved = 0;
      if (load != nullptr) *w->status.mutable_load() = *load;
      w->awaiting_snapshot = false;
      w->last_seq = seq;
      w->lease_expiry = now + lease_;
      w->last_seen = now;
      return {ApplyOutcome::kApplied, last_seq};
    }
  }
  CleanRetired();
  return {ApplyOutcome::kOverTotalLimit, last_seq};
}

bool DirectoryIndex::MessageQueued(const std::string& worker_id, uint64_t session, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Worker* w = OwnedWorker(worker_id, session);
  if (w == nullptr) return false;
  w->lease_expiry = now + lease_;
  w->last_seen = now;
  ++w->messages_queued;
  return true;
}

void DirectoryIndex::MessageTaken(const std::string& worker_id, uint64_t session, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  Worker& w = it->second;
  if (w.messages_queued > 0) --w.messages_queued;  // whichever session queued it
  if (w.session == session && session != 0) {
    w.lease_expiry = now + lease_;  // its handling ended: the lease runs from here
    w.last_seen = now;
  }
}

void DirectoryIndex::Disconnect(const std::string& worker_id, uint64_t session) {
  absl::MutexLock lock(&mu_);
  if (Worker* w = OwnedWorker(worker_id, session)) w->session = 0;
}

bool DirectoryIndex::Leave(const std::string& worker_id, uint64_t session) {
  {
    absl::MutexLock lock(&mu_);
    if (OwnedWorker(worker_id, session) == nullptr) return false;
    auto it = workers_.find(worker_id);
    RetireEntries(it->second);
    workers_.erase(it);
  }
  CleanRetired();
  return true;
}

void DirectoryIndex::DropWorkerEntries(const std::string& worker_id, uint64_t session) {
  {
    absl::MutexLock lock(&mu_);
    if (Worker* w = OwnedWorker(worker_id, session)) RetireEntries(*w);
  }
  CleanRetired();
}

void DirectoryIndex::ShrinkIfSparse() {
  // Erasing from a flat_hash_map keeps its slot array; after a large worker leaves, that array
  // would hold the memory of every entry it ever had. Rehash to fit once it is mostly empty
  // (rare: only after big removals, and O(size) when it happens).
  for (DocTable& docs : docs_) {
    if (docs.capacity() > 1024 && docs.size() * 8 < docs.capacity()) docs.rehash(0);
  }
}

std::vector<std::string> DirectoryIndex::ExpireLeases(absl::Time now) {
  std::vector<std::string> expired;
  {
    absl::MutexLock lock(&mu_);
    expired = ExpireLocked(now);
  }
  CleanRetired();
  return expired;
}

absl::Time DirectoryIndex::SweeperAwayFrom() const {
  return std::max(last_sweep_, sweeper_waiting_since_);
}

bool DirectoryIndex::StalledAt(absl::Time now) const {
  return last_sweep_ != absl::InfinitePast() && now - SweeperAwayFrom() > stall_after();
}

void DirectoryIndex::SweeperWaits(absl::Time now) {
  absl::MutexLock lock(&mu_);
  sweeper_waiting_since_ = now;
}

SweepResult DirectoryIndex::Sweep(absl::Time now) {
  SweepResult result;
  {
    absl::MutexLock lock(&mu_);
    if (StalledAt(now)) {
      result.stalled = now - SweeperAwayFrom();
      for (auto& [id, w] : workers_) w.lease_expiry = std::max(w.lease_expiry, now + lease_);
      result.extended = static_cast<int64_t>(workers_.size());
    } else {
      result.expired = ExpireLocked(now);
    }
    last_sweep_ = now;
  }
  CleanRetired();
  return result;
}

std::vector<std::string> DirectoryIndex::ExpireLocked(absl::Time now) {
  std::vector<std::string> expired;
  for (auto& [id, w] : workers_) {
    if (!LeaseHeld(w, now)) expired.push_back(id);
  }
  for (const std::string& id : expired) {
    auto it = workers_.find(id);
    RetireEntries(it->second);
    workers_.erase(it);
  }
  return expired;
}

bool DirectoryIndex::Store(Worker& w, const DocEntry& entry) {
  Holding* h = nullptr;
  DocTable& docs = DocsOf(entry.key);
  if (auto d = docs.find(entry.key); d != docs.end()) {
    auto held = std::find_if(d->second.begin(), d->second.end(),
                             [&](const Holding& x) { return x.worker == w.handle; });
    if (held != d->second.end()) h = &*held;
  }
  if (h != nullptr) {
    for (auto& [offset, tokens] : h->offsets) {
      if (offset == entry.offset) {  // a replacement never counts against the bounds
        tokens = entry.tokens;
        return true;
      }
    }
    if (static_cast<int64_t>(h->offsets.size()) >= limits_.max_offsets_per_document) {
      // Every later store, evict and lookup of the key walks its offsets under the one lock, so
      // a worker claiming a document at a huge number of offsets would stall the directory.
      // The oldest goes instead: the index is a routing hint, and the count stays as it was.
      h->offsets.erase(h->offsets.begin());
      h->offsets.emplace_back(entry.offset, entry.tokens);
      return true;
    }
  }
  // Checked before inserting anything, so a refused entry leaves no empty holder behind. A
  // snapshot's reserved room is counted in entries_ already.
  if (w.entries >= limits_.max_entries_per_worker ||
      (w.reserved == 0 && entries_ >= limits_.max_entries)) {
    return false;
  }
  if (h == nullptr) {
    Holders& holders = docs[entry.key];
    holders.push_back(Holding{w.handle, {}});
    h = &holders.back();
    w.keys.insert(entry.key);
  }
  h->offsets.emplace_back(entry.offset, entry.tokens);
  if (w.reserved > 0) {
    --w.reserved;
  } else {
    ++entries_;
  }
  ++w.entries;
  return true;
}

void DirectoryIndex::Evict(Worker& w, const DocEntry& entry) {
  DocTable& docs = DocsOf(entry.key);
  auto d = docs.find(entry.key);
  if (d == docs.end()) return;
  Holders& holders = d->second;
  auto h = std::find_if(holders.begin(), holders.end(),
                        [&](const Holding& x) { return x.worker == w.handle; });
  if (h == holders.end()) return;
  auto o = std::find_if(h->offsets.begin(), h->offsets.end(),
                        [&](const auto& p) { return p.first == entry.offset; });
  if (o == h->offsets.end()) return;
  h->offsets.erase(o);
  --entries_;
  --w.entries;
  if (!h->offsets.empty()) return;
  holders.erase(h);
  w.keys.erase(entry.key);
  if (holders.empty()) docs.erase(d);
}

void DirectoryIndex::RetireEntries(Worker& w) {
  if (!w.keys.empty()) {
    retired_.push_back(Retired{w.handle, std::vector<DocumentKey>(w.keys.begin(), w.keys.end())});
    // A fresh handle: lookups know holdings by the live workers' handles, so the old ones are
    // skipped from here on although CleanRetired erases them later.
    w.handle = next_handle_++;
  }
  entries_ -= w.entries + w.reserved;
  w.reserved = 0;
  w.keys.clear();
  w.keys.rehash(0);  // a worker's own key set gives its memory back too
  w.entries = 0;
}

bool DirectoryIndex::CleanRetiredSlice() {
  size_t budget = kCleanSlice;
  while (budget > 0 && !retired_.empty()) {
    Retired& r = retired_.front();
    for (; budget > 0 && !r.keys.empty(); --budget) {
      const DocumentKey key = r.keys.back();
      r.keys.pop_back();
      DocTable& docs = DocsOf(key);
      auto d = docs.find(key);
      if (d == docs.end()) continue;
      Holders& holders = d->second;
      holders.erase(std::remove_if(holders.begin(), holders.end(),
                                   [&](const Holding& h) { return h.worker == r.handle; }),
                    holders.end());
      if (holders.empty()) docs.erase(d);
    }
    if (r.keys.empty()) retired_.pop_front();
  }
  if (!retired_.empty()) return true;
  ShrinkIfSparse();
  return false;
}

void DirectoryIndex::CleanRetired() {
  for (;; LetLookupsIn()) {
    absl::MutexLock lock(&mu_);
    if (!CleanRetiredSlice()) return;
  }
}

void DirectoryIndex::LetLookupsIn() const {
  if (between_slices_for_test_) between_slices_for_test_();
  // absl::Mutex lets the thread that just released it take it again at once, ahead of threads
  // already waiting: a loop of slices would keep lookups out as long as one long hold did (the
  // bench saw one lookup in 3 s). Bounded, so a flood of lookups cannot hold a snapshot back.
  const auto until = std::chrono::steady_clock::now() + kLookupsInLimit;
  while (lookups_waiting_.load(std::memory_order_acquire) > 0 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
}

std::vector<WorkerResidency> DirectoryIndex::Lookup(absl::Span<const DocumentKey> keys,
                                                    ResidencyRule rule,
                                                    absl::Span<const int64_t> offsets,
                                                    absl::Time now) const {
  lookups_waiting_.fetch_add(1, std::memory_order_acq_rel);
  absl::ReaderMutexLock lock(&mu_);  // lookups run side by side
  lookups_waiting_.fetch_sub(1, std::memory_order_acq_rel);
  // Overdue sweeper: the directory itself was not running, so a passed lease says nothing.
  const bool stalled = StalledAt(now);
  std::vector<const Worker*> live;
  live.reserve(workers_.size());
  for (const auto& [id, w] : workers_) {
    if (stalled || LeaseHeld(w, now)) live.push_back(&w);
  }
  std::sort(live.begin(), live.end(), [](const Worker* a, const Worker* b) {
    return a->status.worker_id() < b->status.worker_id();
  });
  std::vector<WorkerResidency> out(live.size());
  // Handle -> slot in `out`; a handful of workers, so a flat map beats anything cleverer.
  absl::flat_hash_map<WorkerHandle, size_t> slot;
  slot.reserve(live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    out[i].status = live[i]->status;
    out[i].last_seen = live[i]->last_seen;
    out[i].resident.assign(keys.size(), false);
    slot.emplace(live[i]->handle, i);
  }
  if (keys.empty() || live.empty() || rule == ResidencyRule::kNone) return out;
  for (size_t k = 0; k < keys.size(); ++k) {
    const int64_t offset = k < offsets.size() ? offsets[k] : kUnknownOffset;
    const DocTable& docs = DocsOf(keys[k]);
    auto d = docs.find(keys[k]);
    if (d == docs.end()) continue;
    for (const Holding& h : d->second) {
      auto s = slot.find(h.worker);
      if (s == slot.end()) continue;  // lease passed, not swept yet
      const int64_t t = h.ReusableTokens(rule, offset);
      if (t < 0) {
        if (rule == ResidencyRule::kBlock && !h.offsets.empty()) {
          int64_t& copy = out[s->second].copyable_tokens;
          const int64_t c = h.tokens();
          copy = c > std::numeric_limits<int64_t>::max() - copy ? std::numeric_limits<int64_t>::max()
                                                               : copy + c;
        }
        continue;
      }
      out[s->second].resident[k] = true;
      // Saturates: a worker may report any non-negative count a proto carries, and the sum of
      // two such counts must not overflow (it only ranks workers).
      int64_t& sum = out[s->second].resident_tokens;
      sum = t > std::numeric_limits<int64_t>::max() - sum ? std::numeric_limits<int64_t>::max()
                                                          : sum + t;
    }
  }
  return out;
}

IndexStats DirectoryIndex::Stats() const {
  absl::ReaderMutexLock lock(&mu_);
  size_t documents = 0;
  for (const DocTable& docs : docs_) documents += docs.size();
  return IndexStats{static_cast<int64_t>(workers_.size()), static_cast<int64_t>(documents),
                    entries_};
}

}  // namespace lazyattn::kvdir
