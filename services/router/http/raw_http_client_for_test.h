// A raw HTTP/1.1 client for the listener's tests: plain sockets to 127.0.0.1, so that a test can
// send what no HTTP library would (trickled bytes, bodies that do not match their headers,
// requests that smuggle a second one) and see every byte of the answer, connection close
// included. Reads and writes that wait longer than 10 s fail: the test then fails on what it read.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_RAW_HTTP_CLIENT_FOR_TEST_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_RAW_HTTP_CLIENT_FOR_TEST_H_

#include <string>

namespace lazyattn::router::testing {

// A connection to 127.0.0.1:port from `source` (empty: the kernel's choice, 127.0.0.1); -1 when
// it cannot be made.
int Connect(int port, const std::string& source = "");

// Sends all of `data`; false when the connection fails first.
bool SendAll(int fd, const std::string& data);

// The status line and headers (until the blank line, the server's close, or 10 s of silence).
std::string ReadHead(int fd);

// Everything until the server closes; `closed` tells a close (EOF or reset) from 10 s of silence.
std::string ReadAll(int fd, bool* closed = nullptr);

// One response: the head, then as many bytes as its Content-Length says.
std::string ReadResponse(int fd);

// How many responses `reply` holds, by their status lines ("HTTP/1.1 " and a status; a body
// follows its response without a line break, so they are counted anywhere).
int CountResponses(const std::string& reply);

}  // namespace lazyattn::router::testing

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_RAW_HTTP_CLIENT_FOR_TEST_H_
