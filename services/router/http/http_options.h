// The router's optional OpenAI-compatible HTTP listener: where it listens and its limits (YAML keys
// `http.*`, docs/router.md). Off unless http.listen is set.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_OPTIONS_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/yaml_config.h"

namespace lazyattn::router {

struct HttpOptions {
  std::string listen;  // host:port; empty: no HTTP listener (port 0: the OS picks)
  // Requests with a larger body are refused with 413 before it is read. Each connection thread may
  // buffer this much, so the default is small (4 MiB); raise it for large documents.
  int64_t max_body_bytes = 4 << 20;
  // Connections served at once, one thread each (a streaming response holds its thread). Further
  // connections wait in the pool's queue, at most `max_queued_connections`; beyond that as many
  // more wait for one thread that answers them 503, and beyond those the router stops accepting
  // (they wait in the kernel's accept backlog), so open sockets stay bounded.
  int threads = 32;
  int max_queued_connections = 64;
  // Slow clients: a read that waits read_timeout for a byte, or a response write that makes no
  // progress for write_timeout, closes the connection.
  absl::Duration read_timeout = absl::Seconds(30);
  absl::Duration write_timeout = absl::Seconds(30);
  // A response that is not streamed must be sent within write_timeout plus its bytes at this
  // rate, or the connection is closed (a client reading a byte at a time otherwise held a thread
  // for as long as it liked). 64 KiB/s gives a 10 MB answer 190 s; 0: no such bound. Streams are
  // bounded by write_timeout per write, and by write_wait_budget.
  int64_t min_send_bytes_per_s = 64 << 10;
  // A response's writes may wait for the client this long in all, or the connection is closed:
  // a streaming client reading just enough to stay inside write_timeout would otherwise hold a
  // connection thread for as long as it liked. One that reads as tokens come never waits, and
  // the bytes sent earn waiting time at min_send_bytes_per_s (a client reading at least that
  // fast is never cut). Zero: no such bound.
  absl::Duration write_wait_budget = absl::Seconds(120);
  // A request's line and headers must be in within this (a new connection's from when a thread
  // takes it up, its TLS handshake included; a kept-alive one's from the request's first byte),
  // however steadily the bytes trickle in; else the connection is closed (guarded_server.h).
  absl::Duration header_timeout = absl::Seconds(10);
  // A request's line and headers may total this many bytes; more is answered 431 (a request line
  // that long: closed) and the connection closed. cpp-httplib keeps every header line it reads
  // (~20 bytes of memory per byte sent), so this, not header_timeout, bounds what one
  // unauthenticated connection makes the router hold. 64 KiB is twice what nginx holds by default
  // (large_client_header_buffers 4 8k); a single header line stays limited to 8 KiB by
  // the library's build.
  int64_t max_header_bytes = 64 << 10;
  // A request's body must be in within this of its headers' end, however steadily it trickles in
  // (read_timeout bounds only each read); else 408 and the connection is closed.
  absl::Duration body_timeout = absl::Seconds(30);
  // Connections one client address may have served at once; the excess is answered 503 (TLS:
  // closed) at once. -1: half of `threads` (at least 1); 0: no cap. Clients behind one proxy or
  // NAT share an address: there, set it to `threads` or 0.
  int max_connections_per_client = -1;
  absl::Duration keep_alive_timeout = absl::Seconds(5);  // idle keep-alive connection closed
  int keep_alive_max_count = 100;                        // requests per connection
  // HTTP has no deadline of its own: each request's deadline is its arrival plus this (the gRPC
  // API takes the call's deadline instead).
  absl::Duration request_timeout = absl::Seconds(600);
  // A request that is not streamed and asks for log probabilities is refused (400, `param`
  // logprobs or top_logprobs) when n x max_tokens x (1 + top_logprobs) exceeds this: its entries
  // are all held until its end (tens of bytes each, several times that as a JSON tree), where a
  // stream sends each token's as it goes. max_tokens is the request's, or limits.max_tokens when
  // it sets none; a completion's `logprobs: k` counts as top_logprobs k. The default takes n = 8
  // at 4096 tokens with 20 alternatives each (688,128 entries), n = 1 uses ~86K.
  int64_t max_logprob_entries = int64_t{1} << 20;
};

// max_connections_per_client with -1 resolved (half of threads, at least 1); 0 means no cap.
int EffectiveMaxConnectionsPerClient(const HttpOptions& options);

// Reads the `http.*` keys (defaults from HttpOptions); InvalidArgument naming the key for a wrong
// type, a value out of range or a listen address that is not host:port.
absl::StatusOr<HttpOptions> HttpOptionsFromYaml(const YamlConfig& config);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_OPTIONS_H_
