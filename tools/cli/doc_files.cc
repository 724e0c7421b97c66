#include "tools/cli/doc_files.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_stamp.h"
#include "common/status_macros.h"

namespace lazyattn {

void DeclareDocFlags(CliArgs& args, const std::string& help) {
  args.Declare("doc", CliArgs::Kind::kRepeated, help);
  args.Declare("max-doc-bytes", CliArgs::Kind::kValue,
               absl::StrCat("the largest --doc file read, in bytes (default ", kDefaultMaxDocBytes,
                            ": the router's default limits.max_document_bytes)"));
}

absl::StatusOr<std::vector<std::string>> ReadDocFiles(const CliArgs& args) {
  constexpr int64_t kMaxLimit = std::numeric_limits<int32_t>::max();
  ASSIGN_OR_RETURN(const int64_t max_bytes, args.Int("max-doc-bytes", kDefaultMaxDocBytes));
  if (max_bytes < 1 || max_bytes > kMaxLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-doc-bytes: ", max_bytes, " outside [1, ", kMaxLimit, "]"));
  }
  std::vector<std::string> texts;
  for (const std::string& path : args.Strings("doc")) {
    absl::StatusOr<StampedText> read = ReadStampedFile(path, max_bytes);
    if (!read.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--doc: ", read.status().message(),
                                                     " (--doc takes a regular file of at most ",
                                                     max_bytes, " bytes: --max-doc-bytes)"));
    }
    texts.push_back(std::move(read->text));
  }
  return texts;
}

}  // namespace lazyattn
