// Fuzzes the KV directory's application of worker streams: WorkerMessages (hello, event,
// heartbeat, snapshot) from a few concurrent streams, converted as the Publish handler does
// (proto_convert.h) and applied to a DirectoryIndex, with disconnects, lease expiry and lookups on
// a fake clock. Messages come either as serialized proto bytes (anything the wire can carry) or
// built from a few bytes over a small set of workers and keys (so that keys collide and sessions
// take over one another often).
//
// A reference model of directory_index.h's contract (sequence numbers, sessions, leases, entries
// per worker, one live holder per worker id and per address) runs beside the index; every outcome,
// Stats() and Lookup() must agree with it. A disagreement traps, so libFuzzer (and the replay test)
// report it with the input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "lazyattn/v1/kvdir.pb.h"
#include "services/kvdir/index/directory_index.h"
#include "services/kvdir/server/proto_convert.h"
#include "tests/fuzz/fuzz_input.h"

namespace lazyattn::kvdir {
namespace {

using fuzz::FuzzInput;

#define FUZZ_CHECK(cond)           \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

constexpr int kMaxOps = 200;
constexpr int kStreams = 3;
constexpr absl::Duration kLease = absl::Seconds(1);

// The reference model of one registered worker.
struct ModelWorker {
  std::string address;
  std::string peer_host;
  uint64_t epoch = 0;
  uint64_t session = 0;
  uint64_t last_seq = 0;
  bool awaiting = true;
  absl::Time lease_expiry;
  std::map<std::pair<DocumentKey, int64_t>, int64_t> entries;  // (key, offset) -> tokens
};

// One Publish stream, as the handler keeps it.
struct Stream {
  std::string worker_id;  // set by its first hello
  uint64_t session = 0;   // 0: no hello yet, or the stream ended
  std::string peer_host;  // the host it connects from, set by its first hello
};

class Harness {
 public:
  // The model keeps every offset of a document; the index's bound on them (64, replacing the
  // oldest) is the limits test's (directory_index_limits_test.cc), so it is lifted here.
  Harness() : index_(kLease, IndexLimits{.max_offsets_per_document = int64_t{1} << 40}) {}

  // `peer_host`: the host a stream that starts with this message connects from (a stream keeps
  // the host of its first message).
  void Message(int s, const v1::WorkerMessage& msg, const std::string& peer_host) {
    Stream& st = streams_[s];
    if (st.worker_id.empty() && st.session == 0) st.peer_host = peer_host;
    if (msg.has_hello()) {
      const std::string& id = msg.hello().status().worker_id();
      if (id.empty() || (!st.worker_id.empty() && id != st.worker_id)) return EndStream(s);
      const HelloResult r = index_.Hello(msg.hello().status(), msg.hello().epoch(), msg.seq(), now_,
                                         {.session = st.session, .peer_host = st.peer_host});
      const std::string& address = msg.hello().status().address();
      if (auto held = model_.find(id); held != model_.end()) {
        // Another live, connected holder (another epoch: another process) at another address or
        // from another host keeps the id; the handler ends the new stream (ALREADY_EXISTS).
        const ModelWorker& h = held->second;
        const bool in_use = h.session != 0 && h.session != st.session && h.lease_expiry > now_ &&
                            h.epoch != msg.hello().epoch() &&
                            (h.address != address || h.peer_host != st.peer_host);
        FUZZ_CHECK(r.id_in_use == in_use);
        if (in_use) {
          FUZZ_CHECK(r.session == 0 && !r.entries_dropped && r.holder_address == h.address &&
                     r.holder_peer_host == h.peer_host);
          return EndStream(s);
        }
      }
      FUZZ_CHECK(!r.id_in_use);
      // One live worker per address: another id's holder of the address keeps it while its lease
      // runs (the handler ends the new stream, ALREADY_EXISTS); one whose lease passed leaves,
      // with its entries.
      std::vector<std::string> lapsed;
      if (!address.empty()) {
        for (const auto& [other_id, other] : model_) {
          if (other_id == id || other.address != address) continue;
          if (other.lease_expiry > now_) {
            FUZZ_CHECK(r.address_in_use && r.address_holder_id == other_id && r.session == 0);
            return EndStream(s);
          }
          lapsed.push_back(other_id);
        }
      }
      std::vector<std::string> removed = r.removed_at_address;  // in the index's own order
      std::sort(removed.begin(), removed.end());
      FUZZ_CHECK(!r.address_in_use && removed == lapsed);
      for (const std::string& gone : lapsed) model_.erase(gone);
      auto [it, inserted] = model_.try_emplace(id);
      ModelWorker& w = it->second;
      const bool dropped = !inserted && w.epoch != msg.hello().epoch();
      FUZZ_CHECK(r.entries_dropped == dropped);
      if (dropped) w.entries.clear();
      // A new session id, never one seen before.
      FUZZ_CHECK(r.session != 0 && sessions_.insert(r.session).second);
      w.address = address;
      w.peer_host = st.peer_host;
      w.epoch = msg.hello().epoch();
      w.session = r.session;
      w.last_seq = msg.seq();
      w.awaiting = true;
      w.lease_expiry = now_ + kLease;
      st.worker_id = id;
      st.session = r.session;
      return;
    }
    if (st.session == 0) return;  // the handler refuses anything before hello
    ModelWorker* w = Owned(st);
    std::optional<ApplyResult> r;
    switch (msg.body_case()) {
      case v1::WorkerMessage::kEvent: {
        absl::StatusOr<DocEvent> event = EventFromProto(msg.event());
        if (!event.ok()) return EndStream(s);  // InvalidArgument ends the stream
        r = index_.ApplyEvent(st.worker_id, st.session, msg.seq(), *event, now_);
        const ApplyOutcome expected = Advance(w, msg.seq(), /*event=*/true);
        FUZZ_CHECK(r->outcome == expected);
        if (expected == ApplyOutcome::kApplied) {
          const auto k = std::make_pair(event->entry.key, event->entry.offset);
          if (event->kind == DocEventKind::kStored) {
            w->entries[k] = event->entry.tokens;
          } else {
            w->entries.erase(k);
          }
        }
        break;
      }
      case v1::WorkerMessage::kHeartbeat:
        r = index_.Heartbeat(st.worker_id, st.session, msg.seq(), msg.heartbeat().load(), now_);
        FUZZ_CHECK(r->outcome == Advance(w, msg.seq(), /*event=*/false));
        break;
      case v1::WorkerMessage::kSnapshot: {
        std::vector<DocEntry> entries;
        for (int i = 0; i < msg.snapshot().entries_size(); ++i) {
          absl::StatusOr<DocEntry> e = EntryFromProto(msg.snapshot().entries(i), "snapshot.entries");
          if (!e.ok()) return EndStream(s);
          entries.push_back(*e);
        }
        r = index_.ApplySnapshot(st.worker_id, st.session, msg.seq(), entries,
                                 msg.snapshot().has_load() ? &msg.snapshot().load() : nullptr, now_);
        if (w == nullptr) {
          FUZZ_CHECK(r->outcome == ApplyOutcome::kNoSession);
          break;
        }
        FUZZ_CHECK(r->outcome == ApplyOutcome::kApplied);
        w->entries.clear();
        for (const DocEntry& e : entries) w->entries[{e.key, e.offset}] = e.tokens;  // last wins
        w->awaiting = false;
        w->last_seq = msg.seq();
        w->lease_expiry = now_ + kLease;
        break;
      }
      default:
        return EndStream(s);  // an empty body: refused
    }
    if (r->outcome == ApplyOutcome::kNoSession) EndStream(s);  // Aborted: the worker reconnects
  }

  // The stream closed (by the worker, or by the handler after an error); the next message on
  // slot `s` starts a new stream.
  void EndStream(int s) {
    Stream& st = streams_[s];
    if (st.session != 0) {
      index_.Disconnect(st.worker_id, st.session);
      if (ModelWorker* w = Owned(st)) w->session = 0;
    }
    st = Stream{};
  }

  void Expire() {
    std::vector<std::string> expired = index_.ExpireLeases(now_);
    std::set<std::string> got(expired.begin(), expired.end());
    FUZZ_CHECK(got.size() == expired.size());
    std::set<std::string> want;
    for (auto it = model_.begin(); it != model_.end();) {
      if (it->second.lease_expiry <= now_) {
        want.insert(it->first);
        it = model_.erase(it);
      } else {
        ++it;
      }
    }
    FUZZ_CHECK(got == want);
  }

  void Advance(absl::Duration d) { now_ += d; }

  // Stats and Lookup over every key the model has seen (plus `extra`) agree with the model.
  void Check(const std::vector<DocumentKey>& extra) {
    const IndexStats stats = index_.Stats();
    std::set<DocumentKey> keys(extra.begin(), extra.end());
    int64_t entries = 0;
    for (const auto& [id, w] : model_) {
      entries += static_cast<int64_t>(w.entries.size());
      for (const auto& [k, tokens] : w.entries) keys.insert(k.first);
    }
    std::set<DocumentKey> held;
    for (const auto& [id, w] : model_) {
      for (const auto& [k, tokens] : w.entries) held.insert(k.first);
    }
    FUZZ_CHECK(stats.workers == static_cast<int64_t>(model_.size()));
    FUZZ_CHECK(stats.entries == entries);
    FUZZ_CHECK(stats.documents == static_cast<int64_t>(held.size()));

    std::vector<DocumentKey> asked(keys.begin(), keys.end());
    if (!asked.empty()) asked.push_back(asked.front());  // a repeated key counts twice
    const std::vector<WorkerResidency> got = index_.Lookup(asked, now_);
    size_t i = 0;
    for (const auto& [id, w] : model_) {  // std::map: sorted by worker id, as Lookup is
      if (w.lease_expiry <= now_) continue;
      FUZZ_CHECK(i < got.size());
      const WorkerResidency& r = got[i++];
      FUZZ_CHECK(r.status.worker_id() == id);
      FUZZ_CHECK(r.resident.size() == asked.size());
      __int128 tokens = 0;
      for (size_t k = 0; k < asked.size(); ++k) {
        int64_t best = -1;
        for (const auto& [entry, t] : w.entries) {
          if (entry.first == asked[k]) best = std::max(best, t);
        }
        FUZZ_CHECK(r.resident[k] == (best >= 0));
        if (best > 0) tokens += best;
      }
      // The sum saturates (a worker may report any token count a proto carries).
      FUZZ_CHECK(std::min<__int128>(tokens, INT64_MAX) == r.resident_tokens);
    }
    FUZZ_CHECK(i == got.size());
  }

 private:
  ModelWorker* Owned(const Stream& st) {
    auto it = model_.find(st.worker_id);
    if (it == model_.end() || st.session == 0 || it->second.session != st.session) return nullptr;
    return &it->second;
  }

  // The contract's sequence bookkeeping for an event or heartbeat from `w` (null: not owned). A
  // heartbeat is applied even while a snapshot is awaited (it renews the lease); an event is not.
  ApplyOutcome Advance(ModelWorker* w, uint64_t seq, bool event) {
    if (w == nullptr) return ApplyOutcome::kNoSession;
    w->lease_expiry = now_ + kLease;
    ApplyOutcome outcome = ApplyOutcome::kApplied;
    if (w->awaiting) {
      if (event) outcome = ApplyOutcome::kAwaitingSnapshot;
    } else if (seq != w->last_seq + 1) {
      w->awaiting = true;
      outcome = ApplyOutcome::kGap;
    }
    w->last_seq = seq;
    return outcome;
  }

  DirectoryIndex index_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  Stream streams_[kStreams];
  std::map<std::string, ModelWorker> model_;
  std::set<uint64_t> sessions_;
};

DocumentKey SmallKey(uint32_t i) { return DocumentKey{i, i * 0x9e3779b97f4a7c15ull}; }

void SetKey(v1::DocEntry* e, uint32_t i) {
  e->mutable_key()->set_hi(SmallKey(i).hi);
  e->mutable_key()->set_lo(SmallKey(i).lo);
}

// A message from a few bytes: few workers, few keys, seqs near each other, tokens small or huge.
v1::WorkerMessage CompactMessage(FuzzInput& in, uint64_t& seq) {
  v1::WorkerMessage msg;
  const uint8_t b = in.Byte();
  seq = (b & 0x80) ? seq + in.Range(0, 3) : seq + 1;  // mostly in order, sometimes a gap or repeat
  msg.set_seq(seq);
  auto tokens = [&in]() -> int64_t {
    const uint8_t t = in.Byte();
    if (t == 255) return INT64_MAX;
    if (t == 254) return -1;
    return t;
  };
  switch (b % 4) {
    case 0: {
      v1::Hello* h = msg.mutable_hello();
      h->mutable_status()->set_worker_id("w" + std::to_string(in.Range(0, 2)));
      // One of two addresses, from a bit of `b` the other fields leave unused: a second stream
      // says hello from the holder's address (a takeover) or another one (refused while live).
      h->mutable_status()->set_address((b >> 2) & 1 ? "h1:7000" : "h0:7000");
      h->set_epoch(in.Range(0, 2));
      break;
    }
    case 1: {
      v1::DocEvent* e = msg.mutable_event();
      e->set_kind(static_cast<v1::DocEvent::Kind>(in.Range(0, 3)));
      SetKey(e->mutable_entry(), in.Range(0, 5));
      e->mutable_entry()->set_tokens(tokens());
      e->mutable_entry()->set_offset(static_cast<int64_t>(in.Range(0, 4)) - 2);
      break;
    }
    case 2:
      msg.mutable_heartbeat()->mutable_load()->set_running_requests(in.Byte());
      break;
    default: {
      v1::Snapshot* snap = msg.mutable_snapshot();
      const int n = static_cast<int>(in.Range(0, 6));
      for (int i = 0; i < n; ++i) {
        v1::DocEntry* e = snap->add_entries();
        SetKey(e, in.Range(0, 5));
        e->set_tokens(tokens());
        e->set_offset(static_cast<int64_t>(in.Range(0, 3)) - 1);
      }
      if (in.Bool()) snap->mutable_load()->set_free_blocks(in.Byte());
      break;
    }
  }
  return msg;
}

}  // namespace
}  // namespace lazyattn::kvdir

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lazyattn::kvdir;
  FuzzInput in(data, size);
  Harness h;
  uint64_t seq[kStreams] = {};
  std::vector<lazyattn::DocumentKey> extra;
  for (uint32_t i = 0; i < 6; ++i) extra.push_back(SmallKey(i));
  for (int op = 0; op < kMaxOps && !in.empty(); ++op) {
    const uint8_t choice = in.Byte();
    const int s = choice % kStreams;
    // One of two peer hosts, from the bits the stream and the operation leave: copies of one
    // worker on one host and on two hosts.
    const std::string host = (choice / (kStreams * 6)) % 2 ? "10.0.0.2" : "10.0.0.1";
    switch ((choice / kStreams) % 6) {
      case 0:
      case 1:
        h.Message(s, CompactMessage(in, seq[s]), host);
        break;
      case 2: {  // serialized proto bytes, as the wire would carry them
        const std::string bytes = in.Bytes(in.Byte());
        lazyattn::v1::WorkerMessage msg;
        if (msg.ParseFromString(bytes)) h.Message(s, msg, host);
        break;
      }
      case 3:
        h.EndStream(s);
        break;
      case 4:
        h.Advance(absl::Milliseconds(in.Range(0, 1500)));
        break;
      default:
        h.Expire();
        break;
    }
    h.Check(extra);
  }
  return 0;
}
