#include "services/worker/model/safetensors_file.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// --- A tiny safetensors writer: the JSON header is passed as text so tests can corrupt it. ---

std::string BuildSafetensors(const std::string& header_json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header_json.size();
  std::memcpy(out.data(), &n, 8);
  return out + header_json + data;
}

template <typename T>
std::string Raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class SafetensorsFileTest : public ::testing::Test {
 protected:
  std::string WriteFile(const std::string& bytes, const std::string& name = "t.safetensors") {
    const std::string path = dir_ + "/" + name;
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    return path;
  }
  absl::Status OpenStatus(const std::string& bytes) {
    return SafetensorsFile::Open(WriteFile(bytes)).status();
  }
  absl::Status OpenStatus(const std::string& header, const std::string& data) {
    return OpenStatus(BuildSafetensors(header, data));
  }

  void SetUp() override {
    dir_ = ::testing::TempDir() + "/safetensors_file_test_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

// Data section: a F32[2,3] @0..24, b F16[4] @24..32, c BF16[] @32..34, d I64[2] @34..50,
// e F8_E8M0[3] (a dtype this reader does not know) @50..53.
std::string SampleData() {
  return Raw<float>({1, -2, 3.5f, 0, 1e-3f, -1e30f}) +
         Raw<uint16_t>({0x3C00, 0x0001, 0xFC00, 0xB800}) + Raw<uint16_t>({0x4049}) +
         Raw<int64_t>({7, -7}) + std::string("\x01\x02\x03", 3);
}
const char kSampleHeader[] =
    R"({"__metadata__": {"format": "pt"},
        "b": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},
        "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "c": {"dtype": "BF16", "shape": [], "data_offsets": [32, 34]},
        "d": {"dtype": "I64", "shape": [2], "data_offsets": [34, 50]},
        "e": {"dtype": "F8_E8M0", "shape": [3], "data_offsets": [50, 53]}}   )";

TEST_F(SafetensorsFileTest, ReadsTensors) {
  auto file = SafetensorsFile::Open(WriteFile(BuildSafetensors(kSampleHeader, SampleData())));
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& f = **file;
  ASSERT_EQ(f.tensors().size(), 5u);  // __metadata__ is not a tensor
  std::vector<std::string> names;
  for (const auto& t : f.tensors()) names.push_back(t.name);
  EXPECT_THAT(names, ElementsAre("a", "b", "c", "d", "e"));

  auto a = f.FindTensor("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->dtype, SafetensorsDtype::kF32);
  EXPECT_EQ((*a)->dtype_name, "F32");
  EXPECT_TRUE((*a)->supported);
  EXPECT_THAT((*a)->shape, ElementsAre(2, 3));  // row-major: 2 rows of 3
  EXPECT_EQ((*a)->num_elements, 6);
  EXPECT_EQ((*a)->num_bytes, 24u);
  float av[6];
  ASSERT_TRUE(f.ReadAsF32(**a, av).ok());
  EXPECT_THAT(av, ElementsAre(1, -2, 3.5f, 0, 1e-3f, -1e30f));

  auto b = f.FindTensor("b");
  ASSERT_TRUE(b.ok());
  float bv[4];
  ASSERT_TRUE(f.ReadAsF32(**b, bv).ok());
  EXPECT_EQ(bv[0], 1.0f);
  EXPECT_EQ(bv[1], std::ldexp(1.0f, -24));
  EXPECT_EQ(bv[2], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(bv[3], -0.5f);

  auto c = f.FindTensor("c");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->shape.empty());
  EXPECT_EQ((*c)->num_elements, 1);
  float cv;
  ASSERT_TRUE(f.ReadAsF32(**c, &cv).ok());
  EXPECT_EQ(cv, 3.140625f);

  auto d = f.FindTensor("d");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->dtype, SafetensorsDtype::kI64);
  EXPECT_FALSE((*d)->supported);
  float dv[2];
  absl::Status s = f.ReadAsF32(**d, dv);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'d'"), HasSubstr("I64")));

  auto e = f.FindTensor("e");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->dtype, SafetensorsDtype::kUnknown);
  EXPECT_EQ((*e)->dtype_name, "F8_E8M0");
  EXPECT_EQ((*e)->num_bytes, 3u);
  s = f.ReadAsF32(**e, dv);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'e'"), HasSubstr("F8_E8M0")));

  s = f.FindTensor("model.norm.weight").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("model.norm.weight"), HasSubstr(f.path())));

  // A tensor of some other file is refused rather than read through a dangling pointer.
  SafetensorsTensor foreign = **a;
  float buf[6];
  foreign.data = reinterpret_cast<const uint8_t*>(buf);
  EXPECT_EQ(f.ReadAsF32(foreign, av).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsFileTest, EmptyHeaderIsValid) {
  auto file = SafetensorsFile::Open(WriteFile(BuildSafetensors("{}", "")));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->tensors().empty());
}

TEST_F(SafetensorsFileTest, EveryTruncationFails) {
  const std::string full = BuildSafetensors(kSampleHeader, SampleData());
  const std::string path = WriteFile(full);
  ASSERT_TRUE(SafetensorsFile::Open(path).ok());
  // Shrinking one file in place (rather than writing every prefix anew) keeps this fast.
  for (size_t cut = full.size(); cut-- > 0;) {
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(cut)), 0);
    absl::Status s = SafetensorsFile::Open(path).status();
    EXPECT_FALSE(s.ok()) << "cut at " << cut << " of " << full.size();
  }
}

TEST_F(SafetensorsFileTest, CorruptHeaders) {
  const std::string data = Raw<float>({1, 2});
  auto header = [](const std::string& entry) { return R"({"w": )" + entry + "}"; };
  struct Case {
    std::string header;
    absl::StatusCode code;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"{not json", absl::StatusCode::kInvalidArgument, {"JSON"}},
      {"[1, 2]", absl::StatusCode::kInvalidArgument, {"object"}},
      {header("3"), absl::StatusCode::kInvalidArgument, {"'w'"}},
      {header(R"({"shape": [2], "data_offsets": [0, 8]})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "dtype"}},
      {header(R"({"dtype": 5, "shape": [2], "data_offsets": [0, 8]})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "dtype"}},
      {header(R"({"dtype": "F32", "data_offsets": [0, 8]})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "shape"}},
      {header(R"({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "shape"}},
      {header(R"({"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "shape"}},
      {header(R"({"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "shape"}},
      {header(R"({"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "overflow"}},
      {header(R"({"dtype": "F32", "shape": [2], "data_offsets": [0]})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "data_offsets"}},
      {header(R"({"dtype": "F32", "shape": [2], "data_offsets": "0-8"})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "data_offsets"}},
      {header(R"({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "reversed"}},
      {header(R"({"dtype": "F32", "shape": [4], "data_offsets": [0, 16]})"),
       absl::StatusCode::kDataLoss,
       {"'w'", "past the end"}},
      {header(R"({"dtype": "F32", "shape": [2], "data_offsets": [8, 16]})"),
       absl::StatusCode::kDataLoss,
       {"'w'", "past the end"}},
      {header(R"({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "shape needs"}},
      {header(R"({"dtype": "F16", "shape": [2], "data_offsets": [0, 8]})"),
       absl::StatusCode::kInvalidArgument,
       {"'w'", "F16"}},
      // Tensors sharing bytes: every copy of such a file claims more memory than it holds.
      {R"({"v": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
       absl::StatusCode::kDataLoss,
       {"tensor 'w' data [0, +8) overlaps tensor 'v' data [0, +4)"}},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       absl::StatusCode::kDataLoss,
       {"tensor 'b'", "overlaps tensor 'a'"}},
  };
  for (const Case& c : cases) {
    absl::Status s = OpenStatus(c.header, data);
    EXPECT_EQ(s.code(), c.code) << c.header << " -> " << s;
    EXPECT_THAT(s.message(), HasSubstr(dir_)) << c.header;
    for (const std::string& p : c.parts) EXPECT_THAT(s.message(), HasSubstr(p)) << c.header;
  }

  // An empty tensor shares no byte with the one at its offset.
  EXPECT_TRUE(OpenStatus(R"({"z": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
                            "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                         data)
                  .ok());

  // Header length larger than the file.
  std::string bad = BuildSafetensors("{}", data);
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(bad.data(), &huge, 8);
  absl::Status s = OpenStatus(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("header length"));

  EXPECT_EQ(OpenStatus(std::string("\x02\0\0", 3)).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(SafetensorsFile::Open(dir_ + "/missing.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lazyattn
