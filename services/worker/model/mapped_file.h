// A whole file mapped read-only (the model readers parse in place, without copying).
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_MAPPED_FILE_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lazyattn {

class MappedFile {
 public:
  // NotFound / PermissionDenied / FailedPrecondition when the file cannot be opened,
  // InvalidArgument when it is not a regular file, DataLoss when it is shorter than `min_bytes`
  // (the message says "shorter than <too_short_what>"), Internal when mmap fails. Messages start
  // with the path.
  static absl::StatusOr<MappedFile> Open(const std::string& path, size_t min_bytes,
                                         const std::string& too_short_what);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// InvalidArgument ("PATH: not a regular file") when `path` exists and is not a regular file (a
// symbolic link to one is followed): a FIFO, opened with a stream to be read, waits for a writer
// for good (a worker hung at "loading the model"), a directory reads as empty. OK otherwise,
// missing paths included (the caller's open says so).
absl::Status RefuseIfNotRegularFile(const std::string& path);

// The whole text of the small file at `path` (config.json, an index), read in chunks and
// refused once past `max_bytes`: a huge (or endless) file is never read whole, and a small one
// costs no up-front buffer of the limit's size. InvalidArgument "PATH: not a regular file" or
// "PATH: larger than N bytes; not <what>"; NotFound "cannot open PATH".
absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, int64_t max_bytes,
                                            const std::string& what);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_MAPPED_FILE_H_
