// The safetensors files of an HF model folder, and which of them holds each tensor.
//
// With a model.safetensors.index.json in the folder (what transformers and vLLM follow), its
// "weight_map" names the shard of every tensor: only the shards it names are opened, and each
// tensor is taken from its named shard, never from another file that happens to hold a tensor of
// that name (a stale shard left beside a re-sharded model). The index is refused, with
// InvalidArgument naming the index file and the key, when it is not a JSON object of at most
// kMaxConfigJsonBytes, has no "weight_map" object, or maps a tensor to a shard that is not a
// plain file name in the folder (no '/', not "." or "..") or is missing; Find refuses a tensor
// the model reads whose named shard does not hold it (an unread one may be listed but absent,
// as transformers and vLLM allow).
//
// Without an index: every *.safetensors file in the folder; a tensor held by two of them is
// refused (InvalidArgument naming both files), since which copy is meant cannot be told.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_SAFETENSORS_SHARDS_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_SAFETENSORS_SHARDS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/model/safetensors_file.h"

namespace lazyattn {

inline constexpr char kSafetensorsIndexName[] = "model.safetensors.index.json";

class SafetensorsShards {
 public:
  // Opens the shards of the model folder `dir` (each shard's header checked by
  // SafetensorsFile::Open). NotFound when the folder has neither an index nor *.safetensors.
  static absl::StatusOr<std::unique_ptr<SafetensorsShards>> Open(const std::string& dir);

  struct Found {
    const SafetensorsFile* file;
    const SafetensorsTensor* tensor;
  };
  // The shard that holds `name`; NotFound naming the index (or the folder and its shards).
  absl::StatusOr<Found> Find(std::string_view name) const;

 private:
  SafetensorsShards() = default;
  absl::Status ReadIndex(const std::string& dir, const std::string& index_path);
  absl::Status ReadFolder(const std::string& dir);

  // What a NotFound names: (index file, "weight_map"), or (folder, its shards).
  std::pair<std::string, std::string> not_found_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Found, std::less<>> tensors_;
  // Index entries whose named shard lacks the tensor: the error Find gives for each.
  std::map<std::string, absl::Status, std::less<>> mismapped_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_SAFETENSORS_SHARDS_H_
