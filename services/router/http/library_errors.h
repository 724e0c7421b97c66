// The body of an HTTP error that no handler wrote: the library's own answers (unknown path 404,
// body over the limit 413, malformed request 400, headers over the cap 431, request line over
// 8 KiB 414, a Range it cannot parse 416) and the pre-routing handler's (wrong method 405, with
// its Allow header set). OpenAI's error shape, with a message and code saying what was wrong.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_LIBRARY_ERRORS_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_LIBRARY_ERRORS_H_

#include <httplib.h>

#include "services/router/http/http_options.h"

namespace lazyattn::router {

// Writes `res`'s body for its status (a 400 for headers that were too many bytes becomes the
// 431 it is). For the server's error handler, on the thread serving `req`.
void WriteUnhandledError(const HttpOptions& options, const httplib::Request& req,
                         httplib::Response& res);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_LIBRARY_ERRORS_H_
