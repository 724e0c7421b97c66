#include "services/router/server/client_write_watch.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "common/log.h"

namespace lazyattn::router {

ClientWriteWatch::ClientWriteWatch(absl::Duration timeout, std::function<void()> on_cut)
    : timeout_(timeout), on_cut_(std::move(on_cut)) {
  sweeper_ = std::thread([this] { Loop(); });
}

ClientWriteWatch::~ClientWriteWatch() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sweeper_.join();
}

std::shared_ptr<ClientWriteWatch::Stream> ClientWriteWatch::Watch(
    grpc::CallbackServerContext* context, std::string request_id) {
  std::shared_ptr<Stream> stream(new Stream(this, context, std::move(request_id)));
  absl::MutexLock lock(&mu_);
  streams_.emplace(stream.get(), stream);
  return stream;
}

namespace {
// Monotonic: a step of the wall clock must not cut every stream with a write in progress.
int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void ClientWriteWatch::Stream::WriteStarted() {
  write_started_ns_.store(std::max<int64_t>(1, SteadyNanos()), std::memory_order_relaxed);
}

void ClientWriteWatch::Stream::WriteDone() { write_started_ns_.store(0, std::memory_order_relaxed); }

void ClientWriteWatch::Stream::Close() {
  {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    context_ = nullptr;
  }
  absl::MutexLock lock(&watch_->mu_);
  watch_->streams_.erase(this);
}

void ClientWriteWatch::Sweep() {
  const int64_t cutoff = SteadyNanos() - absl::ToInt64Nanoseconds(timeout_);
  std::vector<std::shared_ptr<Stream>> stalled;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [raw, s] : streams_) {
      const int64_t started = s->write_started_ns_.load(std::memory_order_relaxed);
      if (started != 0 && started <= cutoff) stalled.push_back(s);
    }
  }
  for (const auto& s : stalled) {
    std::lock_guard<std::recursive_mutex> lock(s->mu_);
    const int64_t started = s->write_started_ns_.load(std::memory_order_relaxed);
    if (s->context_ == nullptr || started == 0 || started > cutoff) continue;
    if (on_cut_) on_cut_();
    LogWarning("router")
        .Str("request_id", s->request_id_)
        .Str("peer", s->context_->peer())
        .Int("timeout_ms", absl::ToInt64Milliseconds(timeout_))
        .Msg(
            "a client read nothing of its stream for routing.client_write_timeout_ms; call "
            "cancelled");
    s->write_started_ns_.store(0, std::memory_order_relaxed);  // cut once
    // May run the call's reactions on this thread (Close among them: the lock is recursive).
    s->context_->TryCancel();
  }
}

void ClientWriteWatch::Loop() {
  const absl::Duration every = std::clamp(timeout_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.Unlock();
    Sweep();
    mu_.Lock();
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), every);
  }
}

}  // namespace lazyattn::router
