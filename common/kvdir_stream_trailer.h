// Metadata between a worker and kvdir on KvDirectory.Publish.
#ifndef LAZYATTN_COMMON_KVDIR_STREAM_TRAILER_H_
#define LAZYATTN_COMMON_KVDIR_STREAM_TRAILER_H_

namespace lazyattn {

// Trailing metadata of a Publish stream that kvdir ends with ALREADY_EXISTS because another live
// worker holds the hello's worker id: the address that worker advertised, as the status message
// shows it (its first 256 characters, any outside [A-Za-z0-9._:[]-] as '?'; absent when empty).
// The refused worker logs it, so an operator reads where the other copy runs without parsing the
// status message.
inline constexpr char kWorkerIdHolderKey[] = "lazyattn-worker-id-holder";

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_KVDIR_STREAM_TRAILER_H_
