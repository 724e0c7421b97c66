#include "services/kvdir/server/publish_reactor.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/kvdir_stream_trailer.h"
#include "common/log.h"
#include "common/monotonic_time.h"
#include "common/worker_id.h"
#include "services/kvdir/server/peer_host.h"
#include "services/kvdir/server/proto_convert.h"

namespace lazyattn::kvdir {
namespace {

// The number after the last ':' of `address` when it is all digits (more than 12 digits read as
// int64's maximum, out of every range), else nullopt.
std::optional<int64_t> TrailingPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  const std::string_view digits = std::string_view(address).substr(colon + 1);
  if (digits.empty() ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  if (digits.size() > 12) return std::numeric_limits<int64_t>::max();
  int64_t port = 0;
  for (char c : digits) port = port * 10 + (c - '0');
  return port;
}

// What a log line or an error may show of a worker id that failed validation, or of an
// address a worker advertised: its first `max` characters, any outside the id charset as '?'.
std::string Printable(const std::string& id, size_t max = 64) {
  std::string out;
  for (char c : id.substr(0, max)) out.push_back(IsWorkerIdChar(c) ? c : '?');
  return out;
}

}  // namespace

PublishReactor::PublishReactor(grpc::CallbackServerContext* call, const ServiceContext& ctx,
                               Caller caller)
    : call_(call),
      peer_host_(PeerHost(call->peer())),
      ctx_(ctx),
      bound_worker_id_(std::move(caller.worker_id)),
      certificate_serial_(std::move(caller.certificate_serial)),
      certificate_names_(std::move(caller.certificate_names)) {
  if (ctx_.streams != nullptr) {
    bool per_certificate = false;
    grpc::CallbackServerContext* call_to_cancel = call;
    absl::StatusOr<uint64_t> id = ctx_.streams->Open(
        bound_worker_id_, peer_host_, MonotonicNow(),
        [call_to_cancel] { call_to_cancel->TryCancel(); }, &per_certificate);
    if (!id.ok()) {
      ctx_.metrics->LimitRefused(per_certificate ? KvdirMetrics::Limit::kMaxStreamsPerCertificate
                                                 : KvdirMetrics::Limit::kMaxPublishStreams);
      LogWarning("kvdir")
          .Str("certificate", bound_worker_id_.empty() ? "none" : bound_worker_id_)
          .Str("peer_host", peer_host_)
          .Str("error", std::string(id.status().message()))
          .Msg("refused a Publish stream");
      Close(ToGrpcStatus(id.status()));
      return;
    }
    stream_id_ = *id;
  }
  StartRead(&in_bytes_);
}

void PublishReactor::OnReadDone(bool ok) {
  if (!ok) {  // the worker half-closed, went away, or the server is shutting down
    // A clean half-close is a worker leaving (KvdirPublisher::Stop, the end of its drain): its
    // entries go now. Counted as a lease expiry, every rolling restart warned of a crash.
    if (session_ != 0 && !call_->IsCancelled() && ctx_.index->Leave(worker_id_, session_)) {
      session_ = 0;
      if (ctx_.metrics != nullptr) ctx_.metrics->WorkerLeft();
      LogInfo("kvdir").Str("worker", worker_id_).Msg("worker left; its entries are dropped");
    }
    Close(grpc::Status::OK);
    return;
  }
  in_.Clear();
  if (!grpc::SerializationTraits<v1::WorkerMessage>::Deserialize(&in_bytes_, &in_).ok()) {
    LogWarning("kvdir")
        .Str("worker", worker_id_.empty() ? "(no hello yet)" : worker_id_)
        .Str("peer_host", peer_host_)
        .Msg("ended a Publish stream whose message does not parse as a WorkerMessage");
    AfterHandle(absl::InvalidArgumentError(
        "request: not a valid protobuf message for /lazyattn.v1.KvDirectory/Publish (its bytes "
        "do not parse as the method's request type)"));
    return;
  }
  // Fields this build does not know are dropped from what is kept: proto3 keeps them, and a
  // worker's status and load are stored and copied into every Lookup and ListWorkers answer, so a
  // load carrying megabytes under an unknown tag (checked by size at Hello only) would slow every
  // router's lookup. (A snapshot's entries are converted, so theirs go anyway; walking 262,144 of
  // them by reflection would cost the reactor thread tens of milliseconds.)
  if (in_.has_hello()) in_.mutable_hello()->mutable_status()->DiscardUnknownFields();
  if (in_.has_heartbeat()) in_.mutable_heartbeat()->mutable_load()->DiscardUnknownFields();
  if (in_.has_snapshot() && in_.snapshot().has_load()) {
    in_.mutable_snapshot()->mutable_load()->DiscardUnknownFields();
  }
  if (ctx_.slow_work != nullptr && (in_.has_snapshot() || in_.has_hello())) {
    // Off gRPC's callback threads (slow_work_pool.h). No read is outstanding until the task
    // ends, so the read side is the task's alone meanwhile, and the reactor, which ends only
    // once Finish is called, outlives it. The worker's heartbeats wait behind the snapshot in
    // the stream: its lease must not pass while the pool is busy with others.
    // Only a mark the index made is taken back: a stream taken over by a newer one of its worker
    // makes none, and taking one for it would drop the newer stream's mark.
    const bool held =
        session_ != 0 && ctx_.index->MessageQueued(worker_id_, session_, MonotonicNow());
    ctx_.slow_work->Run([this, held](bool stopping) {
      absl::Status status;
      if (stopping) {
        status = absl::UnavailableError("kvdir shutting down");
      } else if (call_->IsCancelled() ||
                 (ctx_.streams != nullptr && ctx_.streams->CancelledSilent(stream_id_))) {
        // Gone while it waited (the worker left, the hello timeout, shutdown): nothing of it
        // is applied, a hello least of all (it would take the id from a live stream). The
        // hello timeout's cancel is read from the registry too: IsCancelled() turns true only
        // once gRPC has processed the TryCancel, and on a loaded host the hello could run
        // first (a queued hello was then applied after its stream had been cancelled).
        status = absl::CancelledError("the stream ended while its message waited");
      } else {
        status = Handle(in_);
      }
      // Only now: a snapshot's slices can take longer than a lease (262,144 entries, a busy
      // host, a short lease), and its worker, whose heartbeats wait unread behind it, must not
      // expire meanwhile. The lease runs again from here. Before AfterHandle, which may end the
      // call and with it this reactor.
      if (held) ctx_.index->MessageTaken(worker_id_, session_, MonotonicNow());
      AfterHandle(std::move(status));
    });
    return;
  }
  AfterHandle(Handle(in_));
}

void PublishReactor::AfterHandle(absl::Status status) {
  bool unread = false;
  {
    absl::MutexLock lock(&mu_);
    unread = replies_unread_;
  }
  if (unread && status.ok()) status = RepliesUnread();
  if (!status.ok()) {
    // The worker reads none of its replies, so the write in flight would never end, nor the
    // stream with it: cancelling fails that write, and the close then finishes. Before the
    // close, which may finish the call and let OnDone delete this reactor.
    if (unread) call_->TryCancel();
    Close(ToGrpcStatus(status));
    return;
  }
  StartRead(&in_bytes_);
}

absl::Status PublishReactor::RepliesUnread() {
  ctx_.metrics->LimitRefused(KvdirMetrics::Limit::kUnreadReplies);
  LogWarning("kvdir")
      .Str("worker", worker_id_.empty() ? "(no hello yet)" : worker_id_)
      .Str("peer_host", peer_host_)
      .Msg("ended a Publish stream whose worker does not read its replies");
  return absl::ResourceExhaustedError(
      absl::StrCat("the worker has not read ", kMaxUnreadReplies,
                   " of kvdir's replies (lease grants, snapshot requests): ended"));
}

absl::Status PublishReactor::ChargeWork(const v1::WorkerMessage& msg) {
  if (ctx_.streams == nullptr || stream_id_ == 0) return absl::OkStatus();
  // A snapshot over limits.max_entries_per_worker is refused below, unconverted, but it was
  // parsed all the same: charged as a full snapshot, so that a certificate opening stream after
  // stream to send one runs out of budget as one sending full snapshots does.
  const int64_t entries = msg.has_snapshot() ? std::min<int64_t>(msg.snapshot().entries_size(),
                                                                 ctx_.max_entries_per_worker)
                                             : 1;
  absl::Status charged = ctx_.streams->Charge(stream_id_, entries, MonotonicNow());
  if (!charged.ok()) {
    ctx_.metrics->LimitRefused(KvdirMetrics::Limit::kMaxPublishEntriesPerS);
    LogWarning("kvdir")
        .Str("worker", worker_id_.empty() ? "(no hello yet)" : worker_id_)
        .Str("certificate", bound_worker_id_.empty() ? "none" : bound_worker_id_)
        .Str("peer_host", peer_host_)
        .Str("error", std::string(charged.message()))
        .Msg("ended a Publish stream past its rate of directory work");
  }
  return charged;
}

absl::Status PublishReactor::Handle(const v1::WorkerMessage& msg) {
  // Before anything is applied: what the worker may no longer do must not be done.
  if (absl::Status charged = ChargeWork(msg); !charged.ok()) return charged;
  if (msg.has_hello()) return HandleHello(msg);
  if (msg.body_case() == v1::WorkerMessage::BODY_NOT_SET) {
    return absl::InvalidArgumentError(
        "body: empty WorkerMessage (expected hello, event, "
        "heartbeat or snapshot)");
  }
  if (session_ == 0) {
    return absl::FailedPreconditionError("the first message on a Publish stream must be hello");
  }
  const absl::Time now = MonotonicNow();
  DirectoryIndex& index = *ctx_.index;
  switch (msg.body_case()) {
    case v1::WorkerMessage::kEvent: {
      auto event = EventFromProto(msg.event());
      if (!event.ok()) return event.status();
      const ApplyResult r = index.ApplyEvent(worker_id_, session_, msg.seq(), *event, now);
      if (r.outcome == ApplyOutcome::kApplied) ctx_.metrics->EventApplied(event->kind);
      return AfterApply(r, msg.seq());
    }
    case v1::WorkerMessage::kHeartbeat:
      return AfterApply(
          index.Heartbeat(worker_id_, session_, msg.seq(), msg.heartbeat().load(), now), msg.seq());
    case v1::WorkerMessage::kSnapshot: {
      const v1::Snapshot& snap = msg.snapshot();
      if (snap.entries_size() > ctx_.max_entries_per_worker) {
        // Refused before the entries are converted: a copy of an oversized snapshot is what
        // the bound exists to avoid.
        index.DropWorkerEntries(worker_id_, session_);
        return OverEntryLimit(absl::StrCat("snapshot.entries: ", snap.entries_size(), " entries"));
      }
      std::vector<DocEntry> entries;
      entries.reserve(snap.entries_size());
      for (int i = 0; i < snap.entries_size(); ++i) {
        auto e = EntryFromProto(snap.entries(i), absl::StrCat("snapshot.entries[", i, "]"));
        if (!e.ok()) return e.status();
        entries.push_back(*e);
      }
      const ApplyResult r = index.ApplySnapshot(worker_id_, session_, msg.seq(), entries,
                                                snap.has_load() ? &snap.load() : nullptr, now);
      if (r.outcome == ApplyOutcome::kApplied) ctx_.metrics->SnapshotApplied();
      if (r.outcome == ApplyOutcome::kOverTotalLimit) {
        return OverTotalEntryLimit(absl::StrCat("snapshot.entries: ", entries.size(), " entries"));
      }
      return AfterApply(r, msg.seq());
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("body: unknown WorkerMessage body ", msg.body_case()));
  }
}

absl::Status PublishReactor::HandleHello(const v1::WorkerMessage& msg) {
  const v1::Hello& hello = msg.hello();
  const std::string& id = hello.status().worker_id();
  if (id.empty()) {
    return absl::InvalidArgumentError("hello.status.worker_id: must not be empty");
  }
  if (!IsValidWorkerId(id, static_cast<size_t>(ctx_.max_worker_id_length))) {
    ctx_.metrics->LimitRefused(KvdirMetrics::Limit::kWorkerId);
    LogWarning("kvdir")
        .Str("worker_id", Printable(id))
        .Int("bytes", static_cast<int64_t>(id.size()))
        .Msg(absl::StrCat("refused hello: the worker id is not 1..", ctx_.max_worker_id_length,
                          " of [A-Za-z0-9._:[]-]"));
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.status.worker_id: expected 1 to ", ctx_.max_worker_id_length,
        " of [A-Za-z0-9._:[]-] (limits.max_worker_id_length), got ", id.size(), " bytes \"",
        Printable(id), "\""));
  }
  if (const size_t bytes = hello.status().ByteSizeLong();
      bytes > static_cast<size_t>(ctx_.max_status_bytes)) {
    ctx_.metrics->LimitRefused(KvdirMetrics::Limit::kStatusBytes);
    LogWarning("kvdir")
        .Str("worker", id)
        .Int("status_bytes", static_cast<int64_t>(bytes))
        .Msg("refused hello: status too large");
    return absl::InvalidArgumentError(absl::StrCat("hello.status: ", bytes, " bytes, at most ",
                                                   ctx_.max_status_bytes));
  }
  if (!bound_worker_id_.empty() && id != bound_worker_id_) {
    // The id is the directory's key: taking another worker's would replace its entries and
    // steer its users' requests to the caller.
    ctx_.metrics->HelloRefused(KvdirMetrics::HelloRefusal::kNotCertificateId);
    LogWarning("kvdir")
        .Str("certificate", "lazyattn://worker/" + bound_worker_id_)
        .Str("claimed_worker_id", id.substr(0, 128))
        .Msg("refused hello: worker id is not the certificate's");
    return absl::PermissionDeniedError(absl::StrCat(
        "hello.status.worker_id: \"", id.substr(0, 128), "\" is not this caller's id; its certificate "
        "names lazyattn://worker/", bound_worker_id_));
  }
  // A port gRPC would dial modulo 65536 (99999 as 34463) is refused by every router; taken, it
  // would also spell one endpoint two ways past the one-worker-per-address check. (Addresses of
  // other forms are left to the checks below and to the routers.)
  if (std::optional<int64_t> port = TrailingPort(hello.status().address());
      port.has_value() && (*port < 1 || *port > 65535)) {
    ctx_.metrics->HelloRefused(KvdirMetrics::HelloRefusal::kAddressNotDialable);
    const std::string shown = Printable(hello.status().address(), 256);
    LogWarning("kvdir")
        .Str("worker", id)
        .Str("address", shown)
        .Msg("refused hello: the advertised port is outside 1-65535");
    return absl::InvalidArgumentError(absl::StrCat("hello.status.address: \"", shown,
                                                   "\": the port must be a number from 1 to "
                                                   "65535 (gRPC would dial it modulo 65536)"));
  }
  if (!bound_worker_id_.empty()) {
    if (absl::Status s = CheckAddressIsCertified(id, hello.status().address()); !s.ok()) return s;
  }
  if (!worker_id_.empty() && id != worker_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.status.worker_id: this stream belongs to ", worker_id_, ", got ", id));
  }
  const HelloResult r = ctx_.index->Hello(hello.status(), hello.epoch(), msg.seq(), MonotonicNow(),
                                          {.session = session_, .peer_host = peer_host_});
  if (r.id_in_use) return WorkerIdInUse(id, r, hello.status().address());
  if (r.address_in_use) {
    // Refused, not shared: routers key workers by address, so the last hello's model and load
    // would replace the holder's there, and with mutual TLS any worker certificate could so take
    // another worker out of its model's plans.
    ctx_.metrics->HelloRefused(KvdirMetrics::HelloRefusal::kAddressInUse);
    const std::string address = Printable(hello.status().address(), 256);
    LogWarning("kvdir")
        .Str("worker", id)
        .Str("address", address)
        .Str("holder", r.address_holder_id)
        .Str("peer_host", peer_host_)
        .Str("certificate_serial", certificate_serial_.empty() ? "none" : certificate_serial_)
        .Msg("refused hello: another live worker advertises this address");
    return absl::AlreadyExistsError(absl::StrCat(
        "hello.status.address: ", address, " is advertised by live worker ", r.address_holder_id,
        "; each worker needs its own address (worker.advertise_address)"));
  }
  if (r.refused) {
    ctx_.metrics->LimitRefused(KvdirMetrics::Limit::kMaxWorkers);
    LogWarning("kvdir").Str("worker", id).Msg(
        "refused hello from a new worker: limits.max_workers reached");
    return absl::ResourceExhaustedError(absl::StrCat(
        "hello: the directory holds its maximum number of workers (limits.max_workers ",
        ctx_.index->limits().max_workers, "); worker ", id, " is not registered"));
  }
  for (const std::string& gone : r.removed_at_address) {
    LogWarning("kvdir")
        .Str("worker", gone)
        .Str("address", Printable(hello.status().address(), 256))
        .Str("new_worker", id)
        .Msg("removed a worker whose lease had passed: a new worker took its address");
  }
  worker_id_ = id;
  session_ = r.session;
  if (ctx_.streams != nullptr) ctx_.streams->SaidHello(stream_id_);
  LogInfo("kvdir")
      .Str("worker", id)
      .Str("address", hello.status().address())
      .Int("epoch", static_cast<int64_t>(hello.epoch()))
      .Str("entries", r.entries_dropped ? "dropped (new epoch)" : "kept")
      .Str("certificate_serial", certificate_serial_.empty() ? "none" : certificate_serial_)
      .Msg("hello from worker");
  v1::DirectoryMessage lease;
  lease.mutable_lease()->set_lease_ms(ctx_.lease_ms);
  Send(std::move(lease));
  RequestSnapshot("reconnect", /*gap=*/false);
  return absl::OkStatus();
}

absl::Status PublishReactor::CheckAddressIsCertified(const std::string& id,
                                                     const std::string& address) {
  // Routers dial the address and accept only a certificate naming its host; an address this
  // certificate could not serve is another's (or no one's), and taking it would refuse the
  // worker it belongs to (one live worker per address) or draw that worker's traffic by
  // claiming documents under it.
  const std::optional<std::string> host = DialedHost(address);
  if (host && !DialsOverTheNetwork(address)) {
    ctx_.metrics->HelloRefused(KvdirMetrics::HelloRefusal::kAddressNotDialable);
    const std::string shown = Printable(address, 256);
    LogWarning("kvdir")
        .Str("worker", id)
        .Str("address", shown)
        .Str("peer_host", peer_host_)
        .Msg(
            "refused hello: the advertised address is a local socket, picks its DNS server or "
            "spells its host ambiguously");
    return absl::PermissionDeniedError(absl::StrCat(
        "hello.status.address: \"", shown,
        "\" is a local socket, names its own DNS server or spells its host ambiguously (one "
        "host, no '%', an IPv4 address as a dotted quad); advertise host:port, [v6]:port or "
        "dns:///host:port"));
  }
  const bool local_peer = IsLocalHost(peer_host_) || absl::StartsWith(peer_host_, "unix");
  if (host && IsLocalHost(*host) && !local_peer) {
    ctx_.metrics->HelloRefused(KvdirMetrics::HelloRefusal::kAddressNotDialable);
    LogWarning("kvdir")
        .Str("worker", id)
        .Str("address", Printable(address, 256))
        .Str("peer_host", peer_host_)
        .Msg("refused hello: a worker connected from another host advertises a local address");
    return absl::PermissionDeniedError(
        absl::StrCat("hello.status.address: \"", Printable(address, 256),
                     "\" is the dialler's own host, and "
                     "this worker connected from ",
                     Printable(peer_host_, 64),
                     ": every router would dial itself; advertise an address of this worker's host "
                     "(worker.advertise_address)"));
  }
  if (host && certificate_names_.Names(*host)) return absl::OkStatus();
  ctx_.metrics->HelloRefused(KvdirMetrics::HelloRefusal::kAddressNotInCertificate);
  const std::string shown = Printable(address, 256);
  LogWarning("kvdir")
      .Str("worker", id)
      .Str("address", shown)
      .Str("certificate_names", certificate_names_.ToString())
      .Str("peer_host", peer_host_)
      .Str("certificate_serial", certificate_serial_.empty() ? "none" : certificate_serial_)
      .Msg("refused hello: the advertised address is not one the worker's certificate names");
  if (!host) {
    return absl::PermissionDeniedError(
        absl::StrCat("hello.status.address: \"", shown,
                     "\" has no host a certificate could name (expected host:port, [v6]:port, "
                     "dns:///host:port or unix:path)"));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "hello.status.address: host \"", Printable(*host, 256), "\" of ", shown,
      " is not named by this worker's certificate (", certificate_names_.ToString(),
      "); routers verify a worker's certificate against the host they dial: advertise a name "
      "of the certificate (worker.advertise_address) or add the host to it (tools/gen-certs "
      "--host)"));
}

absl::Status PublishReactor::WorkerIdInUse(const std::string& id, const HelloResult& held,
                                           const std::string& claimant) {
  // Refused rather than taken over: a takeover would be answered by the holder's reconnect and
  // hello, and the two would drop each other's entries in turn forever, with nothing said.
  ctx_.metrics->HelloRefused(KvdirMetrics::HelloRefusal::kWorkerIdInUse);
  // Printable: a metadata value must be visible ASCII, and a worker may advertise anything. The
  // peer hosts come from the connections, not from the worker, and are shown as they are.
  const std::string holder = Printable(held.holder_address, 256);
  const std::string refused = Printable(claimant, 256);
  LogWarning("kvdir")
      .Str("worker", id)
      .Str("holder_address", holder)
      .Str("holder_peer_host", held.holder_peer_host)
      .Str("refused_address", refused)
      .Str("refused_peer_host", peer_host_)
      .Str("certificate_serial", certificate_serial_.empty() ? "none" : certificate_serial_)
      .Msg(
          "refused hello: another live worker holds this worker id; each worker needs its own "
          "worker id (worker.id / --worker-id)");
  if (!holder.empty()) call_->AddTrailingMetadata(kWorkerIdHolderKey, holder);
  // With one address on both sides, only the hosts tell the reader which copy is which.
  const std::string why =
      held.holder_address == claimant
          ? ": two processes advertise one address from two hosts (a scaled or copied service)"
          : "";
  return absl::AlreadyExistsError(absl::StrCat(
      "hello.status.worker_id: \"", id, "\" is held by a live worker at ", holder,
      " (connected from ", held.holder_peer_host, "); this hello came from ", refused,
      " (connected from ", peer_host_, ")", why,
      ". Each worker needs its own worker id (worker.id / --worker-id); kvdir accepts this one "
      "once the holder disconnects or its lease passes"));
}

absl::Status PublishReactor::AfterApply(const ApplyResult& result, uint64_t seq) {
  switch (result.outcome) {
    case ApplyOutcome::kApplied:
    case ApplyOutcome::kAwaitingSnapshot:
      return absl::OkStatus();
    case ApplyOutcome::kGap:
      RequestSnapshot(absl::StrCat("sequence gap after ", result.last_seq, ", got ", seq),
                      /*gap=*/true);
      return absl::OkStatus();
    case ApplyOutcome::kOverLimit:
      return OverEntryLimit(absl::StrCat("event.stored (seq ", seq, ")"));
    case ApplyOutcome::kOverTotalLimit:
      return OverTotalEntryLimit(absl::StrCat("event.stored (seq ", seq, ")"));
    case ApplyOutcome::kNoSession:
      session_ = 0;
      return absl::AbortedError(absl::StrCat(
          "this stream no longer owns worker ", worker_id_,
          " (its lease expired or a newer stream said hello); reconnect and say hello"));
  }
  return absl::OkStatus();
}

absl::Status PublishReactor::OverTotalEntryLimit(const std::string& what) {
  ctx_.metrics->LimitRefused(KvdirMetrics::Limit::kMaxEntries);
  LogWarning("kvdir")
      .Str("worker", worker_id_)
      .Str("what", what)
      .Msg("over limits.max_entries (all workers); the worker's entries are dropped");
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": the directory holds limits.max_entries (", ctx_.max_entries,
      ") entries of all workers; the entries of worker ", worker_id_, " were dropped"));
}

absl::Status PublishReactor::OverEntryLimit(const std::string& what) {
  ctx_.metrics->LimitRefused(KvdirMetrics::Limit::kMaxEntriesPerWorker);
  LogWarning("kvdir")
      .Str("worker", worker_id_)
      .Str("what", what)
      .Msg("over limits.max_entries_per_worker; its entries are dropped");
  return absl::ResourceExhaustedError(
      absl::StrCat(what, ": more than limits.max_entries_per_worker (",
                   ctx_.max_entries_per_worker, ") for worker ", worker_id_,
                   "; its entries were dropped"));
}

void PublishReactor::RequestSnapshot(const std::string& reason, bool gap) {
  // Counted before the request is sent: once it is on the wire the worker may act on it (and a
  // scrape or test may look) before this thread increments the counter.
  ctx_.metrics->SnapshotRequested(gap);
  v1::DirectoryMessage m;
  m.mutable_snapshot_request()->set_reason(reason);
  Send(std::move(m));
}

void PublishReactor::Send(v1::DirectoryMessage msg) {
  grpc::ByteBuffer bytes;
  bool own_buffer = false;
  if (!grpc::SerializationTraits<v1::DirectoryMessage>::Serialize(msg, &bytes, &own_buffer).ok()) {
    return;  // cannot happen for a message this process built; nothing to send then
  }
  const grpc::ByteBuffer* next = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (finish_wanted_) return;
    if (out_.size() >= kMaxUnreadReplies) {
      // Each hello or gap queues replies; a peer that sends them and never reads would grow
      // the queue without bound. The read side ends the stream.
      replies_unread_ = true;
      return;
    }
    out_.push_back(std::move(bytes));  // deque: references to queued elements stay valid
    if (writing_) return;
    writing_ = true;
    next = &out_.front();
  }
  StartWrite(next);
}

void PublishReactor::OnWriteDone(bool ok) {
  const grpc::ByteBuffer* next = nullptr;
  bool finish = false;
  grpc::Status status;
  {
    absl::MutexLock lock(&mu_);
    out_.pop_front();
    if (!ok) out_.clear();  // the stream is broken; the read side will see it too
    if (!out_.empty()) {
      next = &out_.front();
    } else {
      writing_ = false;
      if (finish_wanted_ && !finished_) {
        finished_ = true;
        finish = true;
        status = final_status_;
      }
    }
  }
  if (next != nullptr) StartWrite(next);
  if (finish) Finish(status);
}

void PublishReactor::Close(const grpc::Status& status) {
  if (session_ != 0) {
    ctx_.index->Disconnect(worker_id_, session_);
    session_ = 0;
  }
  bool finish = false;
  {
    absl::MutexLock lock(&mu_);
    if (finish_wanted_) return;
    finish_wanted_ = true;
    final_status_ = status;
    if (!writing_) {
      finished_ = true;
      finish = true;
    }
  }
  if (finish) Finish(status);
}

void PublishReactor::OnDone() {
  if (session_ != 0) ctx_.index->Disconnect(worker_id_, session_);
  // Before the delete: a cancel the sweeper runs holds the registry's lock (publish_streams.h).
  if (ctx_.streams != nullptr) ctx_.streams->Close(stream_id_);
  delete this;
}

}  // namespace lazyattn::kvdir
