#include "common/metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace lazyattn {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry) {
  auto endpoint = std::make_unique<MetricsEndpoint>();
  try {
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", address, ": ",
                                               e.what()));
  }
  endpoint->exposer_->RegisterCollectable(registry);
  return endpoint;
}

int MetricsEndpoint::port() const {
  const auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace lazyattn
