#include "services/worker/model/gguf_file.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// --- A tiny GGUF writer, independent of the reader under test. ---

enum : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kStr = 8,
  kArr = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

class Bytes {
 public:
  template <typename T>
  Bytes& Put(T v) {
    char buf[sizeof(T)];
    std::memcpy(buf, &v, sizeof(T));
    s_.append(buf, sizeof(T));
    return *this;
  }
  Bytes& Str(std::string_view s) {
    Put<uint64_t>(s.size());
    s_.append(s);
    return *this;
  }
  Bytes& Raw(std::string_view s) {
    s_.append(s);
    return *this;
  }
  const std::string& str() const { return s_; }

 private:
  std::string s_;
};

// One encoded key/value pair.
std::string Kv(std::string_view key, uint32_t type, const Bytes& payload) {
  Bytes b;
  b.Str(key).Put<uint32_t>(type).Raw(payload.str());
  return b.str();
}
template <typename T>
std::string KvScalar(std::string_view key, uint32_t type, T v) {
  return Kv(key, type, Bytes().Put<T>(v));
}
std::string KvString(std::string_view key, std::string_view v) {
  return Kv(key, kStr, Bytes().Str(v));
}
template <typename T>
std::string KvArray(std::string_view key, uint32_t elem_type, const std::vector<T>& v) {
  Bytes b;
  b.Put<uint32_t>(elem_type).Put<uint64_t>(v.size());
  for (const T& x : v) b.Put<T>(x);
  return Kv(key, kArr, b);
}
std::string KvStringArray(std::string_view key, const std::vector<std::string>& v) {
  Bytes b;
  b.Put<uint32_t>(kStr).Put<uint64_t>(v.size());
  for (const std::string& x : v) b.Str(x);
  return Kv(key, kArr, b);
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  std::string data;
  std::optional<uint64_t> offset;  // overrides the computed (aligned) offset
};

struct GgufSpec {
  uint32_t version = 3;
  std::vector<std::string> kvs;
  std::vector<TensorSpec> tensors;
  uint64_t alignment = 32;  // used for layout; add a general.alignment kv to declare another
};

// Header, metadata, directory, then tensor data at aligned offsets; the last tensor's data ends
// the file, so any truncation cuts something the reader needs.
std::string BuildGguf(const GgufSpec& spec) {
  Bytes b;
  b.Raw("GGUF").Put<uint32_t>(spec.version).Put<uint64_t>(spec.tensors.size());
  b.Put<uint64_t>(spec.kvs.size());
  for (const std::string& kv : spec.kvs) b.Raw(kv);
  std::vector<uint64_t> offsets;
  uint64_t off = 0;
  for (const TensorSpec& t : spec.tensors) {
    off = (off + spec.alignment - 1) / spec.alignment * spec.alignment;
    offsets.push_back(off);
    off += t.data.size();
  }
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    b.Str(t.name).Put<uint32_t>(t.dims.size());
    for (uint64_t d : t.dims) b.Put<uint64_t>(d);
    b.Put<uint32_t>(t.type).Put<uint64_t>(t.offset.value_or(offsets[i]));
  }
  std::string out = b.str();
  if (spec.tensors.empty()) return out;
  out.resize((out.size() + spec.alignment - 1) / spec.alignment * spec.alignment, '\0');
  const size_t data_start = out.size();
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    out.resize(data_start + offsets[i], '\0');
    out += spec.tensors[i].data;
  }
  return out;
}

class GgufFileTest : public ::testing::Test {
 protected:
  std::string WriteFile(const std::string& bytes, const std::string& name = "t.gguf") {
    const std::string path = dir_ + "/" + name;
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    return path;
  }
  absl::Status OpenStatus(const std::string& bytes) {
    return GgufFile::Open(WriteFile(bytes)).status();
  }

  void SetUp() override {
    dir_ = ::testing::TempDir() + "/gguf_file_test_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

std::string F32Data(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A Q8_0 block: scale 0.5 (fp16 0x3800) and values j - 16.
std::string Q8Block() {
  Bytes b;
  b.Put<uint16_t>(0x3800);
  for (int j = 0; j < 32; ++j) b.Put<int8_t>(static_cast<int8_t>(j - 16));
  return b.str();
}

GgufSpec SmallSpec() {
  GgufSpec spec;
  spec.kvs = {KvString("general.architecture", "llama"),
              KvScalar<uint32_t>("llama.block_count", kU32, 2),
              KvStringArray("tokenizer.ggml.tokens", {"a", "bc"})};
  spec.tensors = {{"w.f32", {3, 2}, 0, F32Data({1, 2, 3, 4, 5, 6}), std::nullopt},
                  {"w.q8", {32}, 8, Q8Block(), std::nullopt}};
  return spec;
}

TEST_F(GgufFileTest, MetadataRoundTripEveryType) {
  GgufSpec spec;
  spec.version = 2;
  spec.kvs = {
      KvScalar<uint8_t>("u8", kU8, 200),
      KvScalar<int8_t>("i8", kI8, -5),
      KvScalar<uint16_t>("u16", kU16, 60000),
      KvScalar<int16_t>("i16", kI16, -30000),
      KvScalar<uint32_t>("u32", kU32, 4000000000u),
      KvScalar<int32_t>("i32", kI32, -2000000000),
      KvScalar<uint64_t>("u64", kU64, uint64_t{1} << 62),
      KvScalar<int64_t>("i64", kI64, -(int64_t{1} << 62)),
      KvScalar<float>("f32", kF32, 1.5f),
      KvScalar<double>("f64", kF64, -2.25e100),
      KvScalar<uint8_t>("yes", kBool, 1),
      KvScalar<uint8_t>("no", kBool, 0),
      KvString("str", "h\xc3\xa9llo"),
      KvString("empty", ""),
      KvArray<uint8_t>("a.u8", kU8, {1, 255}),
      KvArray<int16_t>("a.i16", kI16, {-1, 7}),
      KvArray<int32_t>("a.i32", kI32, {-3, 0, 3}),
      KvArray<uint64_t>("a.u64", kU64, {0, uint64_t{1} << 40}),
      KvArray<float>("a.f32", kF32, {0.25f, -1.0f}),
      KvArray<double>("a.f64", kF64, {1e-300}),
      KvArray<uint8_t>("a.bool", kBool, {1, 0, 1}),
      KvStringArray("a.str", {"x", "", "yz"}),
      KvArray<int32_t>("a.empty", kI32, {}),
  };
  auto file = GgufFile::Open(WriteFile(BuildGguf(spec)));
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.metadata().size(), spec.kvs.size());
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(*f.GetInt("u8"), 200);
  EXPECT_EQ(*f.GetInt("i8"), -5);
  EXPECT_EQ(*f.GetInt("u16"), 60000);
  EXPECT_EQ(*f.GetInt("i16"), -30000);
  EXPECT_EQ(*f.GetInt("u32"), 4000000000LL);
  EXPECT_EQ(*f.GetInt("i32"), -2000000000LL);
  EXPECT_EQ(*f.GetInt("u64"), int64_t{1} << 62);
  EXPECT_EQ(*f.GetInt("i64"), -(int64_t{1} << 62));
  EXPECT_EQ(*f.GetFloat("f32"), 1.5);
  EXPECT_EQ(*f.GetFloat("f64"), -2.25e100);
  EXPECT_EQ(*f.GetFloat("u8"), 200.0);  // integers widen to float
  EXPECT_TRUE(*f.GetBool("yes"));
  EXPECT_FALSE(*f.GetBool("no"));
  EXPECT_EQ(*f.GetString("str"), "h\xc3\xa9llo");
  EXPECT_EQ(*f.GetString("empty"), "");
  EXPECT_THAT(*f.GetIntArray("a.u8"), ElementsAre(1, 255));
  EXPECT_THAT(*f.GetIntArray("a.i16"), ElementsAre(-1, 7));
  EXPECT_THAT(*f.GetIntArray("a.i32"), ElementsAre(-3, 0, 3));
  EXPECT_THAT(*f.GetIntArray("a.u64"), ElementsAre(0, int64_t{1} << 40));
  EXPECT_THAT(*f.GetFloatArray("a.f32"), ElementsAre(0.25, -1.0));
  EXPECT_THAT(*f.GetFloatArray("a.f64"), ElementsAre(1e-300));
  EXPECT_THAT(*f.GetFloatArray("a.i32"), ElementsAre(-3.0, 0.0, 3.0));
  EXPECT_THAT(*f.GetStringArray("a.str"), ElementsAre("x", "", "yz"));
  EXPECT_TRUE(f.GetIntArray("a.empty")->empty());
  const auto& bools =
      std::get<std::vector<bool>>(std::get<GgufValue::Array>(f.metadata().at("a.bool").value));
  EXPECT_THAT(bools, ElementsAre(true, false, true));
  EXPECT_TRUE(f.Has("str"));
  EXPECT_FALSE(f.Has("nope"));

  // Getter errors name the key; type mismatches are InvalidArgument, absence NotFound.
  absl::Status s = f.GetInt("str").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'str'"), HasSubstr("string")));
  s = f.GetString("missing.key").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("missing.key"));
  EXPECT_EQ(f.GetBool("u8").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetStringArray("a.i32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetIntArray("a.f32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetFloat("str").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GgufFileTest, BadMetadataValues) {
  struct Case {
    std::string kv;
    std::string expect;
  };
  std::vector<Case> cases = {
      {KvScalar<uint64_t>("big.u64", kU64, uint64_t{1} << 63), "big.u64"},
      {KvArray<uint64_t>("big.arr", kU64, {1, ~uint64_t{0}}), "big.arr"},
      {KvScalar<uint8_t>("bad.bool", kBool, 2), "bad.bool"},
      {KvScalar<uint32_t>("bad.type", 13, 0), "bad.type"},
      {Kv("nested", kArr,
          Bytes().Put<uint32_t>(kArr).Put<uint64_t>(1).Put<uint32_t>(kI32).Put<uint64_t>(0)),
       "nested"},
      {Kv("bad.elem", kArr, Bytes().Put<uint32_t>(77).Put<uint64_t>(0)), "bad.elem"},
  };
  for (const Case& c : cases) {
    GgufSpec spec;
    spec.kvs = {KvString("general.name", "x"), c.kv};
    absl::Status s = OpenStatus(BuildGguf(spec));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.expect << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.expect));
    EXPECT_THAT(s.message(), HasSubstr(dir_));
  }
  GgufSpec dup;
  dup.kvs = {KvString("k", "x"), KvString("k", "y")};
  absl::Status s = OpenStatus(BuildGguf(dup));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'k'"), HasSubstr("duplicate")));
}

TEST_F(GgufFileTest, TensorLookupAndData) {
  GgufSpec spec = SmallSpec();
  // Q4_1 tensor of two rows, to check multi-dim extents: one 20-byte block per row.
  spec.tensors.push_back({"w.q41", {32, 2}, 3, std::string(40, '\x11'), std::nullopt});
  auto file = GgufFile::Open(WriteFile(BuildGguf(spec)));
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetInt("llama.block_count"), 2);
  EXPECT_THAT(*f.GetStringArray("tokenizer.ggml.tokens"), ElementsAre("a", "bc"));

  auto a = f.FindTensor("w.f32");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->type, GgmlType::kF32);
  EXPECT_THAT((*a)->dims, ElementsAre(3, 2));
  EXPECT_EQ((*a)->num_elements, 6);
  EXPECT_EQ((*a)->num_bytes, 24u);
  float vals[6];
  ASSERT_TRUE(DequantizeToF32((*a)->type, (*a)->data, 6, vals).ok());
  EXPECT_THAT(vals, ElementsAre(1, 2, 3, 4, 5, 6));

  auto q = f.FindTensor("w.q8");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ((*q)->type, GgmlType::kQ8_0);
  EXPECT_EQ((*q)->num_bytes, 34u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*q)->data) - reinterpret_cast<uintptr_t>((*a)->data),
            32u);  // next aligned offset
  float qv[32];
  ASSERT_TRUE(DequantizeToF32((*q)->type, (*q)->data, 32, qv).ok());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(qv[j], 0.5f * (j - 16));

  auto q41 = f.FindTensor("w.q41");
  ASSERT_TRUE(q41.ok());
  EXPECT_EQ((*q41)->num_elements, 64);
  EXPECT_EQ((*q41)->num_bytes, 40u);
  EXPECT_EQ(std::memcmp((*q41)->data, std::string(40, '\x11').data(), 40), 0);

  absl::Status s = f.FindTensor("output.weight").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("output.weight"), HasSubstr(f.path())));
}

TEST_F(GgufFileTest, CustomAlignment) {
  GgufSpec spec = SmallSpec();
  spec.alignment = 64;
  spec.kvs.push_back(KvScalar<uint32_t>("general.alignment", kU32, 64));
  auto file = GgufFile::Open(WriteFile(BuildGguf(spec)));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*file)->tensors()[1].data) -
                reinterpret_cast<uintptr_t>((*file)->tensors()[0].data),
            64u);

  spec.kvs.back() = KvScalar<uint32_t>("general.alignment", kU32, 48);
  absl::Status s = OpenStatus(BuildGguf(spec));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("general.alignment"), HasSubstr("power of two")));

  spec.kvs.back() = KvScalar<uint32_t>("general.alignment", kU32, 0);
  EXPECT_FALSE(OpenStatus(BuildGguf(spec)).ok());
  spec.kvs.back() = KvString("general.alignment", "64");
  EXPECT_THAT(OpenStatus(BuildGguf(spec)).message(), HasSubstr("general.alignment"));
}

TEST_F(GgufFileTest, EveryTruncationFails) {
  const std::string full = BuildGguf(SmallSpec());
  const std::string path = WriteFile(full);
  ASSERT_TRUE(GgufFile::Open(path).ok());
  // Shrinking one file in place (rather than writing every prefix anew) keeps this fast.
  for (size_t cut = full.size(); cut-- > 0;) {
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(cut)), 0);
    absl::Status s = GgufFile::Open(path).status();
    EXPECT_FALSE(s.ok()) << "cut at " << cut << " of " << full.size();
  }
}

// Byte offset of the first kv's value payload (after its key and type) in a BuildGguf file.
size_t FirstValueOffset(std::string_view key) { return 24 + 8 + key.size() + 4; }

template <typename T>
void Patch(std::string& s, size_t off, T v) {
  std::memcpy(s.data() + off, &v, sizeof(T));
}

TEST_F(GgufFileTest, CorruptHeader) {
  const std::string good = BuildGguf(SmallSpec());

  std::string bad = good;
  bad[0] = 'X';
  absl::Status s = OpenStatus(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("magic"), HasSubstr(dir_)));

  for (uint32_t version : {0u, 1u, 4u, 0x03000000u}) {
    bad = good;
    Patch<uint32_t>(bad, 4, version);
    s = OpenStatus(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("version"));
  }

  bad = good;
  Patch<uint64_t>(bad, 8, uint64_t{1} << 40);  // tensor count
  s = OpenStatus(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor count"));

  bad = good;
  Patch<uint64_t>(bad, 16, ~uint64_t{0});  // kv count
  s = OpenStatus(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("metadata count"));

  bad = good;
  Patch<uint64_t>(bad, 24, uint64_t{1} << 50);  // first key's length
  EXPECT_EQ(OpenStatus(bad).code(), absl::StatusCode::kDataLoss);

  bad = good;
  Patch<uint64_t>(bad, FirstValueOffset("general.architecture"), ~uint64_t{0});  // string length
  s = OpenStatus(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("general.architecture"));

  // Array length: after the element type of tokenizer.ggml.tokens (third kv).
  GgufSpec arr;
  arr.kvs = {KvStringArray("tokenizer.ggml.tokens", {"a", "bc"})};
  bad = BuildGguf(arr);
  Patch<uint64_t>(bad, FirstValueOffset("tokenizer.ggml.tokens") + 4, uint64_t{1} << 60);
  s = OpenStatus(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tokenizer.ggml.tokens"));
  // A string element's length past the end.
  bad = BuildGguf(arr);
  Patch<uint64_t>(bad, FirstValueOffset("tokenizer.ggml.tokens") + 12, uint64_t{1} << 33);
  s = OpenStatus(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tokenizer.ggml.tokens"));
}

TEST_F(GgufFileTest, CorruptTensors) {
  auto expect_error = [&](GgufSpec spec, absl::StatusCode code, std::vector<std::string> parts) {
    absl::Status s = OpenStatus(BuildGguf(spec));
    EXPECT_EQ(s.code(), code) << s;
    for (const std::string& p : parts) EXPECT_THAT(s.message(), HasSubstr(p));
  };

  GgufSpec spec = SmallSpec();
  spec.tensors[1].offset = 40;  // data section offset not a multiple of 32
  expect_error(spec, absl::StatusCode::kInvalidArgument, {"w.q8", "alignment"});

  spec = SmallSpec();
  spec.tensors[1].offset = 1024;  // aligned, but past the end
  expect_error(spec, absl::StatusCode::kDataLoss, {"w.q8", "past the end"});

  spec = SmallSpec();
  spec.tensors[1].type = 99;
  expect_error(spec, absl::StatusCode::kUnimplemented, {"w.q8", "99"});

  spec = SmallSpec();
  spec.tensors[0].dims = {};
  expect_error(spec, absl::StatusCode::kInvalidArgument, {"w.f32", "n_dims"});
  spec.tensors[0].dims = {1, 1, 1, 1, 6};
  expect_error(spec, absl::StatusCode::kInvalidArgument, {"w.f32", "n_dims"});

  spec = SmallSpec();
  spec.tensors[1].dims = {16, 2};  // 32 elements, but a row is half a Q8_0 block
  expect_error(spec, absl::StatusCode::kInvalidArgument, {"w.q8", "block"});

  spec = SmallSpec();
  spec.tensors[0].dims = {uint64_t{1} << 62, 8};
  expect_error(spec, absl::StatusCode::kInvalidArgument, {"w.f32", "overflow"});

  spec = SmallSpec();
  spec.tensors[0].dims = {uint64_t{1} << 40, 2};  // fits int64, but far larger than the file
  expect_error(spec, absl::StatusCode::kDataLoss, {"w.f32"});

  spec = SmallSpec();
  spec.tensors[1].name = "w.f32";
  expect_error(spec, absl::StatusCode::kInvalidArgument, {"w.f32", "duplicate"});

  // Both tensors' data at offset 0: each in the file, but sharing bytes (a file of a few MB
  // could so claim gigabytes of weights).
  spec = SmallSpec();
  spec.tensors[1].offset = 0;
  expect_error(spec, absl::StatusCode::kDataLoss,
               {"tensor 'w.q8' data [0, +34) overlaps tensor 'w.f32' data [0, +24)"});
}

TEST_F(GgufFileTest, NotAFile) {
  absl::Status s = GgufFile::Open(dir_ + "/does_not_exist.gguf").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("does_not_exist.gguf"));
  EXPECT_FALSE(GgufFile::Open(dir_).ok());  // a directory
  EXPECT_EQ(OpenStatus("").code(), absl::StatusCode::kDataLoss);
}

TEST(GgufRealModelTest, SmolLm2Q4_1) {
  const std::string path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " not present (run from the repo root with the model downloaded)";
  }
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(*f.GetInt("llama.block_count"), 30);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  auto emb = f.FindTensor("token_embd.weight");
  ASSERT_TRUE(emb.ok()) << emb.status();
  EXPECT_EQ((*emb)->type, GgmlType::kQ8_0);
  EXPECT_THAT((*emb)->dims, ElementsAre(576, 49152));
  // The first row dequantizes to finite, not-all-zero values.
  std::vector<float> row(576);
  ASSERT_TRUE(DequantizeToF32((*emb)->type, (*emb)->data, 576, row.data()).ok());
  bool nonzero = false;
  for (float v : row) {
    EXPECT_TRUE(std::isfinite(v));
    nonzero |= v != 0.0f;
  }
  EXPECT_TRUE(nonzero);
}

}  // namespace
}  // namespace lazyattn
