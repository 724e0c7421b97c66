// The host part of a gRPC peer string (grpc::ServerContextBase::peer()), which kvdir keeps per
// worker to tell two processes advertising one address apart (directory_index.h, "One live
// process per worker id").
#ifndef LAZYATTN_SERVICES_KVDIR_SERVER_PEER_HOST_H_
#define LAZYATTN_SERVICES_KVDIR_SERVER_PEER_HOST_H_

#include <string>

#include "absl/strings/string_view.h"

namespace lazyattn::kvdir {

// "ipv4:10.0.0.5:53422" -> "10.0.0.5"; "ipv6:[::1]:5000" (or gRPC's percent-encoded form
// "ipv6:%5B::1%5D:5000") -> "[::1]". The port goes: each connection of one host has its own.
// Any other peer ("unix:/run/kvdir.sock", "unix-abstract:...", "") is returned whole: every
// client of a Unix socket runs on this host, so they share one host.
std::string PeerHost(absl::string_view peer);

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_SERVER_PEER_HOST_H_
