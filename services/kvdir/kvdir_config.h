// lazyattn-kvdir's YAML configuration (every key, default and meaning: docs/kvdir.md), read into
// KvdirOptions and validated in one place.
#ifndef LAZYATTN_SERVICES_KVDIR_KVDIR_CONFIG_H_
#define LAZYATTN_SERVICES_KVDIR_KVDIR_CONFIG_H_

#include "absl/status/statusor.h"
#include "common/yaml_config.h"
#include "services/kvdir/server/kvdir_server.h"

namespace lazyattn::kvdir {

// InvalidArgument naming the key (and the bad value) for a wrong type, an out-of-range value, an
// inconsistent TLS setting or an unknown key.
absl::StatusOr<KvdirOptions> KvdirOptionsFromYaml(const YamlConfig& config);

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_KVDIR_CONFIG_H_
