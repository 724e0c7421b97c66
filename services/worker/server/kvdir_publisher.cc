#include "services/worker/server/kvdir_publisher.h"

#include <algorithm>
#include <iostream>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/kvdir_stream_trailer.h"
#include "common/log.h"
#include "common/monotonic_time.h"

namespace lazyattn {
namespace {

// MakeChannel (watched TLS files: a rotated client certificate is presented on the next
// connection to kvdir) plus gRPC's own reconnect backoff bounded by ours: with gRPC's defaults
// (up to 120 s) a restarted kvdir would stay unreached long after it is back.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeKvdirChannel(const KvdirPublisherOptions& o) {
  grpc::ChannelArguments args;
  const int min_ms = static_cast<int>(absl::ToInt64Milliseconds(o.min_backoff));
  const int max_ms = static_cast<int>(absl::ToInt64Milliseconds(o.max_backoff));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, min_ms);
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC reads it as the least time a connection attempt
  // gets, and at ~100 ms a TLS handshake with a busy kvdir would time out and back off further.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_ms);
  auto channel =
      MakeChannel(o.address, KvdirClientTls(o.tls), o.max_message_bytes, nullptr, std::move(args));
  if (!channel.ok()) {  // name the worker's own key: kvdir.tls.ca_file, not tls.ca_file
    return absl::Status(channel.status().code(), absl::StrCat("kvdir.", channel.status().message()));
  }
  return channel;
}

uint64_t RandomEpoch() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  return r == 0 ? 1 : r;
}

void ToProto(const DocCacheKey& key, int64_t tokens, v1::DocEntry* out) {
  out->mutable_key()->set_hi(key.doc.hi);
  out->mutable_key()->set_lo(key.doc.lo);
  out->set_tokens(tokens);
  out->set_offset(key.offset);
}

// Statuses with which kvdir refuses this worker (over its limits, a bad identity or message,
// its worker id held by another live worker): retrying soon gets the same answer.
bool IsRefusal(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::ALREADY_EXISTS:
      return true;
    default:
      return false;
  }
}

// The leases taken from kvdir: its own bounds (kvdir.lease_ms, 50 ms to 1 h). A broken or hostile
// directory granting 1 ms would otherwise turn the heartbeats (every lease/3) into a busy loop.
constexpr absl::Duration kMinGrantedLease = absl::Milliseconds(50);
constexpr absl::Duration kMaxGrantedLease = absl::Hours(1);

// A read fails at the stream's end and also on a message that does not parse (a string field
// that is not UTF-8). kvdir's status comes with the end, so Finish returns at once; after a
// message that did not parse the stream may stay open, and Finish would wait for ever (this
// thread would never reconnect). Past `grace` the call is cancelled, which ends Finish.
constexpr absl::Duration kFinishGrace = absl::Seconds(2);

grpc::Status FinishWithin(grpc::ClientReaderWriter<v1::WorkerMessage, v1::DirectoryMessage>& stream,
                          grpc::ClientContext& call, absl::Duration grace) {
  absl::Notification finished;
  std::thread guard([&] {
    if (!finished.WaitForNotificationWithTimeout(grace)) call.TryCancel();
  });
  grpc::Status status = stream.Finish();
  finished.Notify();
  guard.join();
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvdirPublisher>> KvdirPublisher::Create(
    const KvdirPublisherOptions& options, PublisherSource source) {
  if (options.address.empty()) return absl::InvalidArgumentError("kvdir.address: empty");
  if (options.lease < absl::Milliseconds(3)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvdir.lease_ms: ", absl::ToInt64Milliseconds(options.lease),
                     " is too short (heartbeats go every lease/3)"));
  }
  if (options.min_backoff <= absl::ZeroDuration() || options.max_backoff < options.min_backoff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kvdir.reconnect_min_ms / reconnect_max_ms: need 0 < min <= max, got ",
        absl::ToInt64Milliseconds(options.min_backoff), " and ",
        absl::ToInt64Milliseconds(options.max_backoff)));
  }
  if (options.max_queued_events < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvdir.max_queued_events: ", options.max_queued_events, " must be >= 1"));
  }
  auto channel = MakeKvdirChannel(options);
  if (!channel.ok()) return channel.status();
  KvdirPublisherOptions o = options;
  if (o.epoch == 0) o.epoch = RandomEpoch();
  return std::unique_ptr<KvdirPublisher>(
      new KvdirPublisher(o, std::move(source), *std::move(channel)));
}

KvdirPublisher::KvdirPublisher(const KvdirPublisherOptions& options, PublisherSource source,
                               std::shared_ptr<grpc::Channel> channel)
    : options_(options),
      source_(std::move(source)),
      stub_(v1::KvDirectory::NewStub(std::move(channel))),
      lease_(options.lease) {
  thread_ = std::thread([this] { Run(); });
}

KvdirPublisher::~KvdirPublisher() { Stop(); }

void KvdirPublisher::OnCacheEvent(const CacheEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  // Not connected: kvdir asks for a snapshot after the next Hello. Snapshot pending: it is taken
  // after this event, so it covers it.
  if (!connected_ || snapshot_wanted_) {
    ++stats_.events_dropped;
    return;
  }
  if (static_cast<int>(queue_.size()) >= options_.max_queued_events) {
    stats_.events_dropped += static_cast<int64_t>(queue_.size()) + 1;
    queue_.clear();
    snapshot_wanted_ = true;
  } else {
    queue_.push_back(event);
  }
  cv_.notify_all();
}

void KvdirPublisher::Stop() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!thread_.joinable()) return;
  stop_ = true;
  cv_.notify_all();
  // The publisher thread half-closes and waits for kvdir to end the stream; a stream stuck in a
  // write (kvdir not reading) is cancelled after a grace period.
  if (!cv_.wait_for(lock, std::chrono::seconds(2), [&] { return call_ == nullptr; })) {
    call_->TryCancel();
  }
  lock.unlock();
  thread_.join();
}

KvdirPublisher::Stats KvdirPublisher::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void KvdirPublisher::Run() {
  absl::Duration backoff = options_.min_backoff;
  // Each wait is 80-120 % of the backoff: after a kvdir restart its workers do not all
  // reconnect, and send their whole snapshots, in the same instant.
  std::minstd_rand jitter(std::random_device{}());
  std::uniform_real_distribution<double> spread(0.8, 1.2);
  while (true) {
    const StreamEnd end = RunStream();
    // A Hello that went through is not enough to reset: a refused worker would re-send its whole
    // snapshot every min_backoff, forever.
    if (end.refused) {
      backoff = options_.max_backoff;
    } else if (end.accepted) {
      backoff = options_.min_backoff;
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) return;
    cv_.wait_for(lock, absl::ToChronoMilliseconds(backoff * spread(jitter)), [&] { return stop_; });
    if (stop_) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

KvdirPublisher::StreamEnd KvdirPublisher::RunStream() {
  grpc::ClientContext call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return {};
    call_ = &call;
    stream_ended_ = false;
    snapshot_wanted_ = false;
    queue_.clear();
  }
  auto stream = stub_->Publish(&call);
  uint64_t seq = 0;
  auto send = [&](v1::WorkerMessage& m) {
    m.set_seq(++seq);
    return stream->Write(m);
  };

  v1::WorkerMessage hello;
  *hello.mutable_hello()->mutable_status() = source_.status();
  hello.mutable_hello()->set_epoch(options_.epoch);
  bool ok = send(hello);
  const bool hello_sent = ok;
  // Times of this stream on the monotonic clock: a wall clock stepped back would otherwise hold
  // the heartbeats, and the worker would expire in kvdir though alive.
  const absl::Time hello_time = MonotonicNow();
  std::thread reader;
  if (ok) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      connected_ = true;
      stats_.connected = true;
      ++stats_.connections;
    }
    reader = std::thread([this, s = stream.get()] { ReadLoop(s); });
    if (reported_unreachable_) {
      LogInfo("worker").Str("kvdir", options_.address).Msg("connected to kvdir");
      reported_unreachable_ = false;
    }
  }

  uint64_t covered = 0;  // events up to this version are in a snapshot already sent
  absl::Time next_heartbeat = MonotonicNow();
  while (ok) {
    std::deque<CacheEvent> events;
    bool snapshot = false;
    bool heartbeat = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, ToSteadyTimePoint(next_heartbeat),
                     [&] { return stop_ || stream_ended_ || !queue_.empty() || snapshot_wanted_; });
      if (stop_ || stream_ended_) break;
      snapshot = snapshot_wanted_;
      snapshot_wanted_ = false;  // cleared before the snapshot is taken: later events queue
      events.swap(queue_);
      const absl::Time now = MonotonicNow();
      if (now >= next_heartbeat) {
        heartbeat = true;
        next_heartbeat = now + lease_ / 3;
      }
    }
    if (snapshot) {
      const CacheSnapshot snap = source_.snapshot();
      covered = std::max(covered, snap.version);
      v1::WorkerMessage m;
      v1::Snapshot* s = m.mutable_snapshot();
      for (const CachedDocumentInfo& d : snap.documents) ToProto(d.key, d.num_tokens, s->add_entries());
      *s->mutable_load() = source_.load();
      ok = send(m);
      if (ok) {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.snapshots_sent;
      }
    }
    int64_t sent = 0;
    for (const CacheEvent& e : events) {
      if (!ok) break;
      if (e.version <= covered) continue;
      v1::WorkerMessage m;
      m.mutable_event()->set_kind(e.stored ? v1::DocEvent::STORED : v1::DocEvent::EVICTED);
      ToProto(e.key, e.num_tokens, m.mutable_event()->mutable_entry());
      ok = send(m);
      sent += ok ? 1 : 0;
    }
    if (ok && heartbeat) {
      v1::WorkerMessage m;
      *m.mutable_heartbeat()->mutable_load() = source_.load();
      ok = send(m);
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.events_sent += sent;
    if (ok && heartbeat) ++stats_.heartbeats_sent;
  }

  bool stopping;
  {
    std::unique_lock<std::mutex> lock(mu_);
    connected_ = false;
    stats_.connected = false;
    stats_.events_dropped += static_cast<int64_t>(queue_.size());
    queue_.clear();
    stopping = stop_;
    if (stopping && ok) {
      lock.unlock();
      stream->WritesDone();  // kvdir ends the stream with OK on a half-close
      lock.lock();
      cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stream_ended_; });
    }
  }
  bool ended = false;
  {
    // When kvdir ended the stream (e.g. it refused this worker's identity) the reader has seen
    // it or soon will: a cancel now would make Finish report CANCELLED instead of kvdir's status.
    std::unique_lock<std::mutex> lock(mu_);
    if (!stopping && hello_sent) {  // without a hello sent there is no reader to see the end
      cv_.wait_for(lock, std::chrono::milliseconds(500), [&] { return stream_ended_; });
    }
    ended = stream_ended_;
  }
  // Unblocks the reader if kvdir has not ended the stream. Without a hello sent the stream is
  // already over (its write failed) and has no reader: a cancel could only turn kvdir's own
  // status (a refusal before any read, e.g. limits.max_publish_streams) into CANCELLED.
  if (!ended && hello_sent) call.TryCancel();
  if (reader.joinable()) reader.join();
  const grpc::Status status = FinishWithin(*stream, call, kFinishGrace);
  const StreamEnd end{.hello_sent = hello_sent,
                      .accepted = hello_sent && !IsRefusal(status) &&
                                  MonotonicNow() - hello_time >= options_.max_backoff,
                      .refused = IsRefusal(status)};
  if (end.refused) {
    const std::string refusal = absl::StrCat(status.error_code(), ": ", status.error_message());
    // kvdir names the field: a worker id in use, or an address another worker advertises (its
    // other refusals of the address, not dialable or not certified, are not ALREADY_EXISTS).
    const bool address_in_use = status.error_code() == grpc::StatusCode::ALREADY_EXISTS &&
                                absl::StartsWith(status.error_message(), "hello.status.address");
    if (!stopping && refusal != last_refusal_ && address_in_use) {
      LogError("worker")
          .Str("kvdir", options_.address)
          .Str("worker", hello.hello().status().worker_id())
          .Str("address", hello.hello().status().address())
          .Str("status", refusal)
          .Str("retry_every", absl::FormatDuration(options_.max_backoff))
          .Msg(
              "another live worker advertises this worker's address; each worker needs its own "
              "worker.advertise_address. Until that worker's lease passes this one is not "
              "published and gets no requests; retrying at the maximum backoff (logged once "
              "until the refusal changes)");
    } else if (!stopping && refusal != last_refusal_ &&
               status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      // Waiting does not fix this one: an operator started two workers with one id. An error,
      // not a warning; the retries go on so that this worker takes over once the other leaves.
      const auto& trailers = call.GetServerTrailingMetadata();
      const auto it = trailers.find(kWorkerIdHolderKey);
      const std::string holder = it == trailers.end()
                                     ? "an address kvdir did not send (see status)"
                                     : std::string(it->second.data(), it->second.size());
      const std::string& id = hello.hello().status().worker_id();
      LogError("worker")
          .Str("kvdir", options_.address)
          .Str("worker", id)
          .Str("address", hello.hello().status().address())
          .Str("holder_address", holder)
          .Str("status", refusal)
          .Str("retry_every", absl::FormatDuration(options_.max_backoff))
          .Msg(absl::StrCat(
              "another live worker holds worker id ", id, " at ", holder,
              "; each worker needs its own worker.id (--worker-id). Until that worker "
              "disconnects or its lease passes this one is not published and gets no requests; "
              "retrying at the maximum backoff (logged once until the refusal changes)"));
    } else if (!stopping && refusal != last_refusal_) {
      LogWarning("worker")
          .Str("kvdir", options_.address)
          .Str("status", refusal)
          .Str("retry_every", absl::FormatDuration(options_.max_backoff))
          .Msg("kvdir refused this worker; retrying at the maximum backoff (logged once until "
               "the refusal changes)");
    }
    last_refusal_ = refusal;
  } else if (!stopping && (hello_sent || !reported_unreachable_)) {
    const absl::Duration lived = hello_sent ? MonotonicNow() - hello_time : absl::ZeroDuration();
    const bool routine = hello_sent && status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                         lived >= options_.routine_stream_age;
    LogLine line(routine ? LogLevel::kInfo : LogLevel::kWarning, "worker");
    line.Str("kvdir", options_.address)
        .Str("status",
             status.ok() ? "OK" : absl::StrCat(status.error_code(), ": ", status.error_message()))
        .Str("max_backoff", absl::FormatDuration(options_.max_backoff));
    if (hello_sent) line.Int("stream_age_s", absl::ToInt64Seconds(lived));
    line.Msg(routine      ? "kvdir closed the stream after its connection age; reconnecting"
             : hello_sent ? "lost the kvdir stream; retrying with backoff"
                          : "cannot reach kvdir; retrying with backoff");
    reported_unreachable_ = !hello_sent;
  }
  if (end.accepted) last_refusal_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  if (end.refused) ++stats_.refusals;
  call_ = nullptr;
  cv_.notify_all();
  return end;
}

void KvdirPublisher::ReadLoop(
    grpc::ClientReaderWriter<v1::WorkerMessage, v1::DirectoryMessage>* stream) {
  v1::DirectoryMessage m;
  while (stream->Read(&m)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (m.has_snapshot_request()) snapshot_wanted_ = true;
    if (m.has_lease() && m.lease().lease_ms() > 0) {
      lease_ =
          std::clamp(absl::Milliseconds(m.lease().lease_ms()), kMinGrantedLease, kMaxGrantedLease);
    }
    cv_.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu_);
  stream_ended_ = true;
  cv_.notify_all();
}

}  // namespace lazyattn
