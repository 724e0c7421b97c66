#include "services/worker/server/prep_ticket.h"

#include <utility>

namespace lazyattn {

absl::Status PrepTicket::Submit(PrepPool::Task task, int64_t bytes) {
  absl::StatusOr<uint64_t> ticket = pool_->Submit(std::move(task), bytes);
  if (!ticket.ok()) return ticket.status();
  bool cancel_now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_) return absl::OkStatus();  // a pool thread took it already
    ticket_ = *ticket;
    cancel_now = cancelled_;
  }
  // Cancelled before the ticket was known: take it out now (the task runs with Cancelled).
  if (cancel_now) pool_->Cancel(*ticket);
  return absl::OkStatus();
}

void PrepTicket::Cancel() {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    ticket = started_ ? 0 : ticket_;
  }
  // False when a pool thread has just taken it: Start then sees cancelled_.
  if (ticket != 0) pool_->Cancel(ticket);
}

absl::Status PrepTicket::Start(const absl::Status& pool_status) {
  std::lock_guard<std::mutex> lock(mu_);
  started_ = true;
  ticket_ = 0;
  if (pool_status.ok() && cancelled_) {
    return absl::CancelledError("cancelled while waiting for tokenization");
  }
  return pool_status;
}

}  // namespace lazyattn
