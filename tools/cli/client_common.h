// What the commands that talk to a router (`client`, `trace`) share.
#ifndef LAZYATTN_TOOLS_CLI_CLIENT_COMMON_H_
#define LAZYATTN_TOOLS_CLI_CLIENT_COMMON_H_

#include "lazyattn/v1/inference.pb.h"
#include "services/worker/cache/cache_mode.h"

namespace lazyattn {

v1::CacheMode ToProtoMode(CacheMode mode);

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CLI_CLIENT_COMMON_H_
