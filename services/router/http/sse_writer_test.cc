// Server-sent events framing.
#include "services/router/http/sse_writer.h"

#include <string>

#include "gtest/gtest.h"

namespace lazyattn::router {
namespace {

TEST(SseWriterTest, OneDataFieldPerLine) {
  EXPECT_EQ(SseEvent(R"({"a":1})"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(SseEvent("a\nb"), "data: a\ndata: b\n\n");
  EXPECT_EQ(SseEvent("a\r\nb\rc"), "data: a\ndata: b\ndata: c\n\n");
  EXPECT_EQ(SseEvent(""), "data: \n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(SseWriterTest, StopsWritingAfterAFailedWrite) {
  std::string out;
  int calls = 0;
  SseWriter w([&](const char* d, size_t n) {
    ++calls;
    if (calls == 2) return false;
    out.append(d, n);
    return true;
  });
  EXPECT_TRUE(w.Event("x"));
  EXPECT_FALSE(w.Event("y"));
  EXPECT_FALSE(w.Done());
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(out, "data: x\n\n");
}

}  // namespace
}  // namespace lazyattn::router
