// Finds stop strings in streamed text without ever emitting text that a stop string later
// swallows: text that could be the start of a stop string is held back until it is decided.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_STOP_MATCHER_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_STOP_MATCHER_H_

#include <string>
#include <string_view>
#include <vector>

namespace lazyattn {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Appends `text`; returns the text that is now safe to emit. After a stop string is found,
  // `stopped()` is true, the returned text ends just before it, and later calls return "".
  std::string Push(std::string_view text);
  // The held-back text, when generation ends for another reason.
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_STOP_MATCHER_H_
