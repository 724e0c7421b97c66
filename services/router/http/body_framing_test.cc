// A request body's framing, judged from its headers before any of it is read.
#include "services/router/http/body_framing.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazyattn::router {
namespace {

using ::testing::HasSubstr;
using Kind = BodyFraming::Kind;

constexpr int64_t kMax = 1 << 20;

BodyFraming Check(std::vector<std::string> length, std::vector<std::string> encoding = {}) {
  return CheckBodyFraming(length, encoding, /*body_required=*/true, kMax);
}

TEST(BodyFramingTest, AcceptsALengthUpToTheLimitAndChunked) {
  BodyFraming f = Check({"1048576"});
  ASSERT_TRUE(f.ok()) << f.message;
  EXPECT_EQ(f.kind, Kind::kLength);
  EXPECT_EQ(f.length, kMax);
  f = Check({" 0 "});
  ASSERT_TRUE(f.ok()) << f.message;
  EXPECT_EQ(f.length, 0);
  f = Check({}, {"Chunked"});
  ASSERT_TRUE(f.ok()) << f.message;
  EXPECT_EQ(f.kind, Kind::kChunked);
}

TEST(BodyFramingTest, ALengthOverTheLimitIs413NamingBodyAndTheKey) {
  const BodyFraming f = Check({"1048577"});
  EXPECT_EQ(f.error_status, 413);
  EXPECT_THAT(f.message, HasSubstr("body: larger than http.max_body_bytes (1048576 bytes)"));
  EXPECT_EQ(f.code, "body_too_large");
  // Beyond int64 is over the limit too, not a wrapped small number; leading zeros are no length.
  EXPECT_EQ(Check({"99999999999999999999999"}).error_status, 413);
  EXPECT_TRUE(Check({"000000000000000000000000001"}).ok());
}

TEST(BodyFramingTest, ALengthThatIsNoNonNegativeIntegerIs400) {
  for (const char* bad : {"-1", "-0", "+5", "12abc", "", "1 2", "0x10"}) {
    const BodyFraming f = Check({bad});
    EXPECT_EQ(f.error_status, 400) << bad;
    EXPECT_THAT(f.message, HasSubstr("Content-Length")) << bad;
  }
}

TEST(BodyFramingTest, AmbiguousFramingIsRefused) {
  EXPECT_EQ(Check({"5", "5"}).error_status, 400);                  // twice
  EXPECT_EQ(Check({"5"}, {"chunked"}).error_status, 400);          // both
  EXPECT_EQ(Check({}, {"gzip, chunked"}).error_status, 501);       // another coding
  EXPECT_EQ(Check({}, {"chunked", "chunked"}).error_status, 501);  // twice
  EXPECT_THAT(Check({}, {"identity"}).message, HasSubstr("Transfer-Encoding"));
}

TEST(BodyFramingTest, NoFramingIs411OnlyWhereABodyIsRequired) {
  const BodyFraming f = Check({});
  EXPECT_EQ(f.error_status, 411);
  EXPECT_THAT(f.message, HasSubstr("Content-Length"));
  const BodyFraming none = CheckBodyFraming({}, {}, /*body_required=*/false, kMax);
  EXPECT_TRUE(none.ok());
  EXPECT_EQ(none.kind, Kind::kNone);
}

// The endpoints read JSON; any other type (form data, which the library would parse itself) is
// refused before the body is read.
TEST(BodyFramingTest, OnlyJsonOrNoContentTypeIsAccepted) {
  for (const char* ok : {"application/json", "Application/JSON",
                         " application/json ; charset=utf-8", "application/json;charset=UTF-8"}) {
    EXPECT_TRUE(CheckContentType({ok}).ok()) << ok;
  }
  EXPECT_TRUE(CheckContentType({}).ok());  // absent: read as JSON
  for (const char* bad : {"multipart/form-data; boundary=x", "application/x-www-form-urlencoded",
                          "text/plain", "application/jsonx", "", "application/json-seq"}) {
    const BodyFraming f = CheckContentType({bad});
    EXPECT_EQ(f.error_status, 415) << bad;
    EXPECT_THAT(f.message, HasSubstr("Content-Type: expected application/json, got \"")) << bad;
    EXPECT_EQ(f.code, "unsupported_media_type");
  }
  EXPECT_THAT(CheckContentType({std::string(100, 'x')}).message,
              HasSubstr("got \"" + std::string(32, 'x') + "...\""));
  EXPECT_EQ(CheckContentType({"application/json", "text/plain"}).error_status, 400);
}

// Only the codings cpp-httplib decodes pass; any other body would reach the JSON parser as it
// came (a zstd body as bytes), so it is refused before it is read.
TEST(BodyFramingTest, OnlyTheCodingsTheLibraryDecodesAreAccepted) {
  EXPECT_TRUE(CheckContentEncoding({}).ok());
  for (const char* ok : {"gzip", "deflate", "br", "identity", "IDENTITY", " gzip "}) {
    EXPECT_TRUE(CheckContentEncoding({ok}).ok()) << ok;
  }
  // "GZIP" and "abra" (which the library's substring test would take for br) are not decoded as
  // they are spelled; a list would be decoded once at most.
  for (const char* bad : {"zstd", "compress", "GZIP", "abra", "gzip, gzip", "gzip, identity", ""}) {
    const BodyFraming f = CheckContentEncoding({bad});
    EXPECT_EQ(f.error_status, 415) << bad;
    EXPECT_THAT(f.message,
                HasSubstr("Content-Encoding: expected gzip, deflate, br or identity, got \""))
        << bad;
    EXPECT_EQ(f.code, "unsupported_media_type");
  }
  EXPECT_THAT(CheckContentEncoding({std::string(100, 'z')}).message,
              HasSubstr("got \"" + std::string(32, 'z') + "...\""));
  const BodyFraming twice = CheckContentEncoding({"gzip", "gzip"});
  EXPECT_EQ(twice.error_status, 415);
  EXPECT_THAT(twice.message, HasSubstr("Content-Encoding: given more than once"));
}

}  // namespace
}  // namespace lazyattn::router
