// The router's YAML configuration -> RouterOptions, validated in one place. Every error names the
// key and the bad value; unknown keys are errors. docs/router.md documents every key.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_CONFIG_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_CONFIG_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/yaml_config.h"
#include "services/router/server/router_options.h"

namespace lazyattn::router {

// The command-line flags that may replace a configured value (--listen, --metrics, --kvdir,
// --http).
struct FlagOverrides {
  std::optional<std::string> listen;   // server.listen
  std::optional<std::string> metrics;  // metrics.listen ("" turns the endpoint off)
  std::optional<std::string> kvdir;    // kvdir.address ("" means no directory)
  std::optional<std::string> http;     // http.listen ("" turns the HTTP listener off)
};

// Reads every key (defaults for absent ones), applies the overrides, validates, and calls
// config.Finish() so an unknown key is an error.
absl::StatusOr<RouterOptions> RouterOptionsFromYaml(const YamlConfig& config,
                                                    const FlagOverrides& overrides = {});

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_ROUTER_CONFIG_H_
