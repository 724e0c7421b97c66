// Open HTTP connections per client address, capped so that one address cannot hold every
// connection thread (http.max_connections_per_client): a slow or idle client holds its thread
// until a timeout, and without a cap one address opening `http.threads` of them starves the rest.
//
// The address is the peer's IP as the socket reports it (no port); clients behind one proxy or NAT
// share it, which is why the cap is an option.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_CLIENT_SLOTS_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_CLIENT_SLOTS_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace lazyattn::router {

class ClientSlots {
 public:
  // `max_per_client` <= 0: no cap (connections are still counted).
  explicit ClientSlots(int max_per_client) : max_per_client_(max_per_client) {}

  // Held while a connection is served; released on destruction.
  class Slot {
   public:
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    friend class ClientSlots;
    Slot(ClientSlots* owner, std::string address) : owner_(owner), address_(std::move(address)) {}
    ClientSlots* owner_;
    std::string address_;
  };

  // A slot for `address`, or null when the address already holds `max_per_client` of them.
  // The ClientSlots must outlive the slot.
  std::unique_ptr<Slot> TryAcquire(const std::string& address);

  int max_per_client() const { return max_per_client_; }
  int open(const std::string& address) const;  // slots held by `address`
  int open_total() const;                      // slots held by every address

 private:
  void Release(const std::string& address);

  const int max_per_client_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> open_ ABSL_GUARDED_BY(mu_);  // no zero entries
  int total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_CLIENT_SLOTS_H_
