#include "services/router/policy/claim_credit.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"

namespace lazyattn::router {

double ClaimCredit::CreditOf(const Entry& e) const {
  if (e.count < options_.min_observations || e.weight <= 0) return 1;
  const double share = std::clamp(e.shares / e.weight, 0.0, 1.0);
  return share < options_.distrust_below ? share : 1;
}

ClaimCreditChange ClaimCredit::Observe(const std::string& worker, int64_t claimed, int64_t reused) {
  ClaimCreditChange change;
  if (claimed <= 0) return change;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  if (it == entries_.end()) {
    if (entries_.size() >= kMaxWorkers) return change;
    it = entries_.emplace(worker, Entry{}).first;
  }
  Entry& e = it->second;
  const double before = e.credit;
  const double share =
      static_cast<double>(std::clamp<int64_t>(reused, 0, claimed)) / static_cast<double>(claimed);
  e.shares = e.shares * options_.decay + share;
  e.weight = e.weight * options_.decay + 1;
  ++e.count;
  e.credit = CreditOf(e);
  change.lost = before == 1 && e.credit < 1;
  change.regained = before < 1 && e.credit == 1;
  change.credit = e.credit;
  change.share = e.shares / e.weight;
  return change;
}

double ClaimCredit::Credit(const std::string& worker) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(worker);
  return it == entries_.end() ? 1 : it->second.credit;
}

void ClaimCredit::Retain(const std::vector<std::string>& known) {
  const absl::flat_hash_set<std::string> keep(known.begin(), known.end());
  absl::MutexLock lock(&mu_);
  absl::erase_if(entries_, [&](const auto& entry) {
    return entry.second.credit == 1 && !keep.contains(entry.first);
  });
}

int64_t ClaimCredit::Distrusted(const std::vector<std::string>& among) const {
  absl::MutexLock lock(&mu_);
  return std::count_if(among.begin(), among.end(), [this](const std::string& worker) {
    auto it = entries_.find(worker);
    return it != entries_.end() && it->second.credit < 1;
  });
}

}  // namespace lazyattn::router
