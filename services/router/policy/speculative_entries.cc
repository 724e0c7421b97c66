#include "services/router/policy/speculative_entries.h"

#include <algorithm>

namespace lazyattn::router {

void SpeculativeEntries::SweepLocked(absl::Time now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& holders = it->second;
    holders.erase(std::remove_if(holders.begin(), holders.end(),
                                 [&](const Holder& h) { return h.expires <= now; }),
                  holders.end());
    if (holders.empty()) {
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
}

void SpeculativeEntries::Record(std::span<const DocumentKey> keys, const std::string& worker,
                                absl::Time now, std::optional<absl::Duration> hold) {
  if (options_.ttl <= absl::ZeroDuration() || options_.max_keys <= 0) return;
  const absl::Time expires = now + std::max(absl::ZeroDuration(), hold.value_or(options_.ttl));
  absl::MutexLock lock(&mu_);
  if (entries_.size() + keys.size() > static_cast<size_t>(options_.max_keys) &&
      now >= next_sweep_) {
    SweepLocked(now);
    next_sweep_ = now + kFullSweepInterval;
  }
  for (const DocumentKey& key : keys) {
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      if (entries_.size() >= static_cast<size_t>(options_.max_keys)) continue;
      it = entries_.emplace(key, std::vector<Holder>()).first;
    }
    auto& holders = it->second;
    auto h = std::find_if(holders.begin(), holders.end(),
                          [&](const Holder& x) { return x.worker == worker; });
    if (h != holders.end()) {
      h->expires = expires;
    } else {
      holders.push_back({worker, expires});
    }
  }
}

std::vector<std::string> SpeculativeEntries::Holders(const DocumentKey& key, absl::Time now) const {
  std::vector<std::string> out;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return out;
  for (const Holder& h : it->second) {
    if (h.expires > now) out.push_back(h.worker);
  }
  return out;
}

size_t SpeculativeEntries::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace lazyattn::router
