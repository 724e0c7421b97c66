#include "services/router/http/client_slots.h"

namespace lazyattn::router {

ClientSlots::Slot::~Slot() { owner_->Release(address_); }

std::unique_ptr<ClientSlots::Slot> ClientSlots::TryAcquire(const std::string& address) {
  absl::MutexLock lock(&mu_);
  int& n = open_[address];
  if (max_per_client_ > 0 && n >= max_per_client_) return nullptr;
  ++n;
  ++total_;
  return std::unique_ptr<Slot>(new Slot(this, address));
}

void ClientSlots::Release(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(address);
  if (it == open_.end()) return;
  --total_;
  if (--it->second == 0) open_.erase(it);
}

int ClientSlots::open(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(address);
  return it == open_.end() ? 0 : it->second;
}

int ClientSlots::open_total() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

}  // namespace lazyattn::router
