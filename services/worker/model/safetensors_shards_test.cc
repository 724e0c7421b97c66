// The shard names a safetensors index may use: a refused one is refused saying exactly which
// names are (model_bounds_test's SafetensorsBadIndex covers the refusals themselves).
#include "services/worker/model/safetensors_shards.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lazyattn {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SafetensorsShardNameTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("shard_names_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The error of opening the folder whose index maps one tensor to `shard`.
  std::string OpenWithShard(const std::string& shard) {
    const nlohmann::json index = {{"weight_map", {{"model.norm.weight", shard}}}};
    std::ofstream(dir_ / kSafetensorsIndexName) << index.dump();
    auto shards = SafetensorsShards::Open(dir_.string());
    EXPECT_FALSE(shards.ok()) << shard;
    return shards.ok() ? "" : std::string(shards.status().message());
  }

  fs::path dir_;
};

TEST_F(SafetensorsShardNameTest, ARefusedNameIsRefusedSayingWhichNamesAre) {
  constexpr char kWhy[] =
      "\" is not a file name in the model folder (refused: an empty name, \".\", \"..\" and names "
      "with a '/' or a NUL byte)";
  const std::vector<std::string> refused = {"..",
                                            ".",
                                            "",
                                            "../model.safetensors",
                                            "/etc/passwd",
                                            "sub/model.safetensors",
                                            std::string("model\0.safetensors", 18)};
  for (const std::string& shard : refused) {
    SCOPED_TRACE(shard);
    EXPECT_THAT(OpenWithShard(shard),
                HasSubstr("weight_map[\"model.norm.weight\"]: \"" + shard + kWhy));
  }
}

// Names that only start or end with dots are plain file names: they get as far as the folder
// (here: missing from it), as the message's list says.
TEST_F(SafetensorsShardNameTest, NamesWithDotsThatAreFileNamesPassTheNameCheck) {
  for (const std::string shard : {"..model.safetensors", "model.safetensors..", "...", ".hidden"}) {
    SCOPED_TRACE(shard);
    const std::string message = OpenWithShard(shard);
    EXPECT_THAT(message, HasSubstr("shard " + shard + " is missing from " + dir_.string()));
    EXPECT_THAT(message, ::testing::Not(HasSubstr("is not a file name")));
  }
}

}  // namespace
}  // namespace lazyattn
