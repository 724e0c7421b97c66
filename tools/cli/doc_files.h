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

// The texts of the --doc files, in order, each read whole through ReadStampedFile: only a regular
// file (a symbolic link to one is followed) of at most --max-doc-bytes (in [1, 2^31 - 1], the
// range of limits.max_document_bytes). A device would be read for ever and a FIFO waited on.
// InvalidArgument otherwise, naming the flag and the path ("--doc: cannot read PATH: not a
// regular file ..."), or --max-doc-bytes for a bad value of it: a bad argument (exit 2).
absl::StatusOr<std::vector<std::string>> ReadDocFiles(const CliArgs& args);

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CLI_DOC_FILES_H_
