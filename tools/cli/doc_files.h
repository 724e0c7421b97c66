// The document files of `lazyattn client`, `prefetch` and `generate` (--doc), read with a bound:
// a path such as /dev/zero must be refused, not read until memory runs out.
#ifndef LAZYATTN_TOOLS_CLI_DOC_FILES_H_
#define LAZYATTN_TOOLS_CLI_DOC_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/request_validator.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {

// --max-doc-bytes's default: the router's and the workers' default limits.max_document_bytes, so
// that a file the CLI reads is one a default cluster takes; raised with theirs.
inline constexpr int64_t kDefaultMaxDocBytes = ApiLimits{}.max_document_bytes;

// Declares --doc (repeated; `help` its help line) and --max-doc-bytes.
void DeclareDocFlags(CliArgs& args, const std::string& help);

// The texts of the --doc files, in order, each at most --max-doc-bytes (in [1, 2^31 - 1], the
// range of limits.max_document_bytes): a regular file read whole through ReadStampedFile (a
// symbolic link to one is followed); a pipe (`<(cmd)`, /dev/stdin), a device or a /proc file
// (which reports no size) read as a stream and refused once it passes the limit, so /dev/zero
// ends in an error instead of filling memory. A directory or an unreadable path is refused too.
// InvalidArgument names the flag and the path ("--doc: cannot read PATH: ..."), or
// --max-doc-bytes for a bad value of it: a bad argument (exit 2).
absl::StatusOr<std::vector<std::string>> ReadDocFiles(const CliArgs& args);

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CLI_DOC_FILES_H_
