#include "services/router/server/client_write_watch.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "common/log.h"

namespace lazyattn::router {

ClientWriteWatch::ClientWriteWatch(Limits limits, std::function<void()> on_cut)
    : limits_(limits), on_cut_(std::move(on_cut)) {
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
    grpc::CallbackServerContext* context, std::string request_id,
    std::function<void(const char* limit)> before_cut) {
  std::shared_ptr<Stream> stream(
      new Stream(this, context, std::move(request_id), std::move(before_cut)));
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

void ClientWriteWatch::Stream::WriteStarted(absl::Duration allowance) {
  waits_.Started(SteadyNanos(), absl::ToInt64Nanoseconds(allowance));
}

void ClientWriteWatch::Stream::WriteDone() { waits_.Done(SteadyNanos()); }

const char* ClientWriteWatch::Stream::Overdue(const Limits& limits, int64_t now_ns) const {
  const WriteWaits::Waits w = waits_.At(now_ns);
  if (limits.timeout > absl::ZeroDuration() &&
      w.current_ns >= absl::ToInt64Nanoseconds(limits.timeout)) {
    return "routing.client_write_timeout_ms";
  }
  if (limits.wait_budget > absl::ZeroDuration() &&
      w.counted_ns >= absl::ToInt64Nanoseconds(limits.wait_budget)) {
    return "routing.client_write_wait_budget_ms";
  }
  return nullptr;
}

void ClientWriteWatch::Stream::Close() {
  {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    context_ = nullptr;
  }
  absl::MutexLock lock(&watch_->mu_);
  watch_->streams_.erase(this);
}

void ClientWriteWatch::Sweep() {
  const int64_t now = SteadyNanos();
  std::vector<std::shared_ptr<Stream>> overdue;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [raw, s] : streams_) {
      if (s->Overdue(limits_, now) != nullptr) overdue.push_back(s);
    }
  }
  for (const auto& s : overdue) {
    std::lock_guard<std::recursive_mutex> lock(s->mu_);
    const char* limit = s->context_ == nullptr || s->cut_ ? nullptr : s->Overdue(limits_, now);
    if (limit == nullptr) continue;  // closed or cut, or its write completed meanwhile
    if (on_cut_) on_cut_();
    const WriteWaits::Waits w = s->waits_.At(now);
    LogWarning("router")
        .Str("request_id", s->request_id_)
        .Str("peer", s->context_->peer())
        .Str("limit", limit)
        .Int("waiting_ms", w.current_ns / 1000000)
        .Int("waited_in_all_ms", w.counted_ns / 1000000)  // past each write's first 5 ms
        .Msg("a client took too long to read its call's answer; call cancelled");
    s->cut_ = true;
    if (s->before_cut_) s->before_cut_(limit);
    // May run the call's reactions on this thread (Close among them: the lock is recursive).
    s->context_->TryCancel();
  }
}

void ClientWriteWatch::Loop() {
  absl::Duration shortest = absl::InfiniteDuration();
  for (absl::Duration limit : {limits_.timeout, limits_.wait_budget}) {
    if (limit > absl::ZeroDuration()) shortest = std::min(shortest, limit);
  }
  const absl::Duration every = std::clamp(shortest / 4, absl::Milliseconds(10), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.Unlock();
    Sweep();
    mu_.Lock();
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), every);
  }
}

}  // namespace lazyattn::router
