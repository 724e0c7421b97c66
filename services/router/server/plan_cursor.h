// Which of a plan's workers a call tries next. The workers come in the plan's order. One whose
// circuit breaker refused a permit (it opened, or its probe was taken, after the plan was made) is
// set aside; when the plan runs out before any of the call's requests has left, the set-aside
// workers are offered again, to be sent regardless of their breakers. That is what the selector
// does when it finds every worker out (breaker panic), so a race between planning and sending
// does not turn "all are out: try them anyway" into a refusal (a model served by one worker whose
// breaker is half-open would otherwise refuse every request but its probe).
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_PLAN_CURSOR_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_PLAN_CURSOR_H_

#include <cstddef>
#include <optional>
#include <vector>

namespace lazyattn::router {

class PlanCursor {
 public:
  struct Next {
    size_t index;        // into the plan's workers
    bool bypass_breaker;  // a set-aside worker, offered again: send without a breaker's permit
  };

  // The next worker, or none when the plan is exhausted. `nothing_sent`: none of the call's
  // requests has left for a worker yet (only then are set-aside workers offered again).
  std::optional<Next> Advance(size_t plan_size, bool nothing_sent) {
    if (next_ < plan_size) return Next{.index = next_++, .bypass_breaker = false};
    if ((nothing_sent || reoffering_) && !set_aside_.empty()) {
      reoffering_ = true;
      const size_t index = set_aside_.front();
      set_aside_.erase(set_aside_.begin());
      return Next{.index = index, .bypass_breaker = true};
    }
    return std::nullopt;
  }
  // The worker Advance just gave was refused by its breaker.
  void SetAside(size_t index) { set_aside_.push_back(index); }
  // How many of the plan's workers Advance has given in order (not counting offers again).
  size_t consumed() const { return next_; }

 private:
  size_t next_ = 0;
  std::vector<size_t> set_aside_;
  bool reoffering_ = false;
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_PLAN_CURSOR_H_
