#include "services/worker/model/safetensors_shards.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/mapped_file.h"
#include "services/worker/model/model_config.h"

namespace lazyattn {
namespace {

namespace fs = std::filesystem;

// Debian's Abseil is built with its own absl::string_view (not an alias of std::string_view), so
// StrCat and Status messages need std::string_view pieces converted explicitly.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A shard name an index may use: a file name in the model folder. A path (with '/'), "." or ".."
// would let a downloaded index make the loader open any file the process can read.
bool IsPlainFileName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsShards>> SafetensorsShards::Open(const std::string& dir) {
  std::unique_ptr<SafetensorsShards> shards(new SafetensorsShards());
  const std::string index_path = (fs::path(dir) / kSafetensorsIndexName).string();
  std::error_code ec;
  // symlink_status: a dangling link named like the index is an index that cannot be read (an
  // error), not a folder without an index.
  if (fs::symlink_status(index_path, ec).type() != fs::file_type::not_found) {
    RETURN_IF_ERROR(shards->ReadIndex(dir, index_path));
  } else {
    RETURN_IF_ERROR(shards->ReadFolder(dir));
  }
  return shards;
}

absl::Status SafetensorsShards::ReadIndex(const std::string& dir, const std::string& index_path) {
  not_found_ = {index_path, "weight_map"};
  ASSIGN_OR_RETURN(const std::string text,
                   ReadBoundedFile(index_path, kMaxConfigJsonBytes, "a safetensors index"));
  const nlohmann::json index = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": not a JSON object"));
  }
  const auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": weight_map: missing, or not an object"));
  }
  // Every entry's shard must be a present file of the folder (the index decides which files are
  // opened). Whether the shard holds the tensor is asked only of the tensors the model reads
  // (Find), as transformers and vLLM load: an index may list tensors its shards dropped at save
  // time (a tied lm_head.weight, a component this loader does not use).
  std::map<std::string, const SafetensorsFile*> opened;  // shard name -> file
  for (const auto& [name, shard_json] : map_it->items()) {
    auto bad = [&, &tensor = name](std::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map[\"", tensor, "\"]: ", Sv(why)));
    };
    if (!shard_json.is_string()) return bad("not a string");
    const std::string shard = shard_json.get<std::string>();
    if (!IsPlainFileName(shard)) {
      return bad(absl::StrCat("\"", shard,
                              "\" is not a file name in the model folder (refused: an empty name, "
                              "\".\", \"..\" and names with a '/' or a NUL byte)"));
    }
    auto it = opened.find(shard);
    if (it == opened.end()) {
      const std::string path = (fs::path(dir) / shard).string();
      std::error_code ec;
      if (!fs::exists(path, ec)) {
        return bad(absl::StrCat("shard ", shard, " is missing from ", dir));
      }
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
      files_.push_back(std::move(file));
      it = opened.emplace(shard, files_.back().get()).first;
    }
    absl::StatusOr<const SafetensorsTensor*> tensor = it->second->FindTensor(name);
    if (tensor.ok()) {
      tensors_.emplace(name, Found{it->second, *tensor});
    } else {
      mismapped_.emplace(name, bad(absl::StrCat("shard ", shard, " does not hold this tensor")));
    }
  }
  return absl::OkStatus();
}

absl::Status SafetensorsShards::ReadFolder(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code ec;  // the throwing forms would end the worker on a directory it cannot list
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".safetensors") paths.push_back(it->path().string());
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": cannot list the model directory: ", ec.message()));
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no *.safetensors files"));
  not_found_ = {dir, absl::StrJoin(paths, ", ")};
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
    for (const SafetensorsTensor& t : file->tensors()) {
      const auto [it, added] = tensors_.emplace(t.name, Found{file.get(), &t});
      if (!added) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, ": tensor ", t.name, " is in both ", it->second.file->path(), " and ",
                         path, ", and no ", kSafetensorsIndexName, " says which to use"));
      }
    }
    files_.push_back(std::move(file));
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsShards::Found> SafetensorsShards::Find(std::string_view name) const {
  if (auto bad = mismapped_.find(name); bad != mismapped_.end()) return bad->second;
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat(not_found_.first, ": tensor ", Sv(name), " not found in ", not_found_.second));
  }
  return it->second;
}

}  // namespace lazyattn
