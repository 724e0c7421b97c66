// The fixture of the malformed-model tests (model_bounds_test.cc: GGUF files and HF configs;
// model_safetensors_bounds_test.cc: safetensors files, their index and tokenizer.json): copies of
// the tiny models in tests/data/tiny with header bytes or JSON keys rewritten, and the checks that
// a loader refuses each with a Status naming the file and the field.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_MALFORMED_MODEL_TEST_FIXTURE_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_MALFORMED_MODEL_TEST_FIXTURE_H_

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/model_config.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/model_weights.h"
#include "services/worker/model/safetensors_file.h"

namespace lazyattn::malformed_model_test {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

inline constexpr char kTinyGguf[] = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf";
inline constexpr char kTinyHf[] = "tests/data/tiny/tiny-llama/hf-f32";

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Where each metadata value and each tensor's data offset sits in a GGUF file (v3, as the tiny
// models are), so a test can rewrite them in place.
struct GgufLayout {
  std::map<std::string, std::pair<uint32_t, size_t>> values;  // key -> (type id, offset)
  std::map<std::string, size_t> tensor_offsets;               // name -> offset of its data offset
  size_t directory_end = 0;                                   // the tensor directory's end
};

inline GgufLayout Walk(const std::string& b) {
  GgufLayout layout;
  size_t p = 8;
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, b.data() + at, 4);
    return v;
  };
  auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, b.data() + at, 8);
    return v;
  };
  const uint64_t n_tensors = u64(p), n_kv = u64(p + 8);
  p += 16;
  auto str = [&]() {
    const uint64_t n = u64(p);
    std::string s = b.substr(p + 8, n);
    p += 8 + n;
    return s;
  };
  auto skip = [&](uint32_t t) {
    static const std::map<uint32_t, size_t> kSize = {
        {0, 1}, {1, 1}, {2, 2}, {3, 2}, {4, 4}, {5, 4}, {6, 4}, {7, 1}, {10, 8}, {11, 8}, {12, 8}};
    if (t == 8) {
      str();
    } else {
      p += kSize.at(t);
    }
  };
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = str();
    const uint32_t type = u32(p);
    p += 4;
    layout.values[key] = {type, p};
    if (type == 9) {
      const uint32_t et = u32(p);
      const uint64_t n = u64(p + 4);
      p += 12;
      for (uint64_t k = 0; k < n; ++k) skip(et);
    } else {
      skip(type);
    }
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const std::string name = str();
    const uint32_t n_dims = u32(p);
    p += 4 + 8 * n_dims + 4;
    layout.tensor_offsets[name] = p;
    p += 8;
  }
  layout.directory_end = p;
  return layout;
}

class MalformedModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lazyattn_bounds_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    gguf_ = ReadBytes(kTinyGguf);
    ASSERT_GT(gguf_.size(), 4096u) << kTinyGguf;
    layout_ = Walk(gguf_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The tiny GGUF with `key`'s value (a uint32 or float32 there) replaced by `value`'s bytes.
  template <typename T>
  std::string GgufWith(const std::string& key, T value) {
    auto it = layout_.values.find(key);
    EXPECT_NE(it, layout_.values.end()) << key;
    if (it == layout_.values.end()) return "";
    std::string b = gguf_;
    static_assert(sizeof(T) == 4);
    std::memcpy(b.data() + it->second.second, &value, sizeof(T));
    return Save("model.gguf", b);
  }

  std::string Save(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    WriteBytes(path, bytes);
    return path;
  }

  // A copy of the tiny HF model with config.json (or tokenizer.json) edited by `edit`.
  std::string HfWith(const std::string& file, const std::function<void(nlohmann::json&)>& edit,
                     const std::string& from = kTinyHf) {
    const fs::path out = dir_ / "hf";
    fs::create_directories(out);
    for (const auto& f : fs::directory_iterator(from)) {
      fs::copy_file(f.path(), out / f.path().filename(), fs::copy_options::overwrite_existing);
    }
    nlohmann::json j = nlohmann::json::parse(ReadBytes((out / file).string()));
    edit(j);
    WriteBytes((out / file).string(), j.dump());
    return out.string();
  }

  // A copy of the GGUF at `from` with `bytes` written over tensor `name`'s data, `byte_offset`
  // bytes in; `type` receives the tensor's ggml type id.
  std::string GgufWithTensorBytes(const std::string& from, const std::string& name,
                                  size_t byte_offset, const std::string& bytes, uint32_t* type) {
    std::string b = ReadBytes(from);
    const GgufLayout layout = Walk(b);
    const size_t field = layout.tensor_offsets.at(name);
    std::memcpy(type, b.data() + field - 4, 4);  // the type id precedes the data offset
    uint64_t offset;
    std::memcpy(&offset, b.data() + field, 8);
    const size_t data_start = (layout.directory_end + 31) / 32 * 32;  // the default alignment
    b.replace(data_start + offset + byte_offset, bytes.size(), bytes);
    return Save(fs::path(from).filename().string(), b);
  }

  // The tensors of the tiny HF model: name -> (header entry, data bytes).
  static std::map<std::string, std::pair<nlohmann::json, std::string>> TinyHfTensors(
      const std::string& from = kTinyHf) {
    const std::string bytes = ReadBytes((fs::path(from) / "model.safetensors").string());
    uint64_t header_len;
    std::memcpy(&header_len, bytes.data(), 8);
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
    std::map<std::string, std::pair<nlohmann::json, std::string>> tensors;
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      const uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
      tensors[name] = {entry, bytes.substr(8 + header_len + begin, end - begin)};
    }
    return tensors;
  }

  // A safetensors file of `tensors` (name -> (header entry, bytes)) at `path`.
  static void WriteSafetensors(
      const std::string& path,
      const std::map<std::string, std::pair<nlohmann::json, std::string>>& tensors) {
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const auto& [name, t] : tensors) {
      nlohmann::json entry = t.first;
      entry["data_offsets"] = {data.size(), data.size() + t.second.size()};
      header[name] = entry;
      data += t.second;
    }
    const std::string text = header.dump();
    std::string out(8, '\0');
    const uint64_t n = text.size();
    std::memcpy(out.data(), &n, 8);
    WriteBytes(path, out + text + data);
  }

  // The tiny HF model in a fresh folder whose weights are `shards` (file name -> tensors), with
  // `index` as model.safetensors.index.json unless empty.
  std::string ShardedHf(
      const std::map<std::string, std::map<std::string, std::pair<nlohmann::json, std::string>>>&
          shards,
      const std::string& index) {
    const fs::path out = dir_ / "sharded";
    fs::remove_all(out);
    fs::create_directories(out);
    for (const char* file : {"config.json", "tokenizer.json"}) {
      fs::copy_file(fs::path(kTinyHf) / file, out / file);
    }
    for (const auto& [name, tensors] : shards) WriteSafetensors((out / name).string(), tensors);
    if (!index.empty()) WriteBytes((out / "model.safetensors.index.json").string(), index);
    return out.string();
  }

  fs::path dir_;
  std::string gguf_;
  GgufLayout layout_;
};

// Both entry points a worker uses fail with InvalidArgument naming the file and the key.
inline void ExpectRefused(const std::string& path, const std::string& field,
                          absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  auto weights = LoadModelWeights(path);
  ASSERT_FALSE(weights.ok()) << path << " " << field;
  EXPECT_EQ(weights.status().code(), code) << weights.status();
  EXPECT_THAT(std::string(weights.status().message()), HasSubstr(field));
  EXPECT_THAT(std::string(weights.status().message()), HasSubstr(path));
  EXPECT_TRUE(IsModelFileError(weights.status())) << weights.status();
  auto model = LoadModel(path);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status(), weights.status());
}

// A NaN or Inf weight is refused in both forms the loader makes (fp32, and packed for the CPU
// backend), naming the file, the tensor, the element (in the file's order) and its value.
inline void ExpectNonFiniteRefused(const std::string& path, const std::string& tensor,
                                   int64_t element, const std::string& value) {
  ExpectRefused(path, absl::StrCat("tensor ", tensor, " has a non-finite value at element ",
                                   element, " (", value, ")"));
  auto packed = LoadModelWeights(path, {.packed = true});
  ASSERT_FALSE(packed.ok());
  EXPECT_EQ(packed.status(), LoadModelWeights(path).status());
}

}  // namespace lazyattn::malformed_model_test

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_MALFORMED_MODEL_TEST_FIXTURE_H_
