#include "common/log.h"

#include <unistd.h>

#include <algorithm>
#include <string>

#include "common/yaml_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

// Captures the lines written while it lives.
class Capture {
 public:
  Capture() {
    EXPECT_EQ(pipe(fds_), 0);
    SetLogSinkForTest(fds_[1]);
  }
  ~Capture() {
    SetLogSinkForTest(STDERR_FILENO);
    ConfigureLogging({});
    close(fds_[0]);
  }
  std::string Take() {
    close(fds_[1]);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = read(fds_[0], buf, sizeof(buf))) > 0) out.append(buf, n);
    return out;
  }

 private:
  int fds_[2];
};

TEST(LogTest, TextLinesCarryTimestampLevelComponentAndFields) {
  Capture capture;
  ConfigureLogging({.level = LogLevel::kInfo, .format = LogFormat::kText});
  LogInfo("router").Str("request_id", "abc").Int("attempts", 2).Str("note", "a b").Msg("done");
  LogDebug("router").Str("prompt", "secret").Msg("hidden");
  EXPECT_THAT(capture.Take(),
              MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{12}Z INFO router: done "
                           "request_id=abc attempts=2 note=\"a b\"\n"));
}

TEST(LogTest, JsonLinesAreEscapedAndDebugAppearsOnlyAtDebugLevel) {
  Capture capture;
  ConfigureLogging({.level = LogLevel::kDebug, .format = LogFormat::kJson});
  LogWarning("worker").Str("text", "q\"\\\n\x01").Num("ttft_s", 0.25).Msg("slow");
  LogDebug("worker").Str("prompt", "visible").Msg("d");
  const std::string out = capture.Take();
  EXPECT_THAT(out, MatchesRegex("\\{\"ts\":\"[0-9T:.-]+Z\",\"level\":\"warning\",\"component\":"
                                "\"worker\",\"msg\":\"slow\",\"text\":\"q\\\\\"\\\\\\\\\\\\n"
                                "\\\\u0001\",\"ttft_s\":0.25\\}\n.*"));
  EXPECT_THAT(out, HasSubstr("\"level\":\"debug\",\"component\":\"worker\",\"msg\":\"d\","
                             "\"prompt\":\"visible\"}\n"));
}

// A message or value from a client or a peer (a worker's error message relayed by the router)
// cannot forge a line of its own, nor carry a terminal's control sequence, nor make a JSON line
// that is not UTF-8 (which a JSON reader refuses whole).
TEST(LogTest, TextFromPeersCannotForgeOrBreakALine) {
  const std::string forged =
      "x\n2026-12-06T00:00:00.000Z INFO router: request status=ok\r\x1b[2J\xc2\x9b"
      "1m";
  {
    Capture capture;
    ConfigureLogging({.level = LogLevel::kInfo, .format = LogFormat::kText});
    LogWarning("router").Str("error", forged).Msg(forged);
    const std::string out = capture.Take();
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    EXPECT_THAT(out, HasSubstr("router: x\\n2026-12-06T00:00:00.000Z INFO router: request "
                               "status=ok\\r\\u001b[2J\\u009b1m error=\"x\\n"));
  }
  {
    Capture capture;
    ConfigureLogging({.level = LogLevel::kInfo, .format = LogFormat::kJson});
    LogWarning("router").Str("error", "bad \xff\xfe utf-8 \xc3").Msg("m\xc3\xa9 \xe2\x82");
    const std::string out = capture.Take();
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    // Valid UTF-8 (é) as is; every byte that is not as U+FFFD.
    EXPECT_THAT(out, HasSubstr("\"msg\":\"m\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd\""));
    EXPECT_THAT(out, HasSubstr("\"error\":\"bad \xef\xbf\xbd\xef\xbf\xbd utf-8 \xef\xbf\xbd\""));
  }
}

TEST(LogTest, ErrorLevelDropsInfo) {
  Capture capture;
  ConfigureLogging({.level = LogLevel::kError});
  LogInfo("kvdir").Msg("dropped");
  LogError("kvdir").Msg("kept");
  const std::string out = capture.Take();
  EXPECT_THAT(out, Not(HasSubstr("dropped")));
  EXPECT_THAT(out, HasSubstr("ERROR kvdir: kept"));
}

TEST(ReadLogOptionsTest, ParsesAndNamesBadKeys) {
  YamlConfig c;
  ASSERT_TRUE(c.LoadString("log: {level: debug, format: json}").ok());
  auto o = ReadLogOptions(c);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->level, LogLevel::kDebug);
  EXPECT_EQ(o->format, LogFormat::kJson);
  EXPECT_TRUE(c.Finish().ok());

  YamlConfig defaults;
  ASSERT_TRUE(defaults.LoadString("other: 1").ok());
  auto d = ReadLogOptions(defaults);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->level, LogLevel::kInfo);
  EXPECT_EQ(d->format, LogFormat::kText);

  for (const char* bad : {"log: {level: loud}", "log: {format: xml}"}) {
    YamlConfig b;
    ASSERT_TRUE(b.LoadString(bad).ok());
    auto r = ReadLogOptions(b);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr(std::string(bad).find("level") !=
                                                        std::string::npos
                                                    ? "log.level"
                                                    : "log.format"));
  }
}

TEST(RequestIdTest, FreshIdsAreDistinctHexAndClientIdsAreChecked) {
  const std::string a = NewRequestId(), b = NewRequestId();
  EXPECT_THAT(a, MatchesRegex("[0-9a-f]{32}"));
  EXPECT_NE(a, b);
  EXPECT_TRUE(IsValidRequestId(a));
  EXPECT_TRUE(IsValidRequestId("client-7:trace_1.2"));
  EXPECT_FALSE(IsValidRequestId(""));
  EXPECT_FALSE(IsValidRequestId(std::string(129, 'a')));
  EXPECT_FALSE(IsValidRequestId("has space"));
  EXPECT_FALSE(IsValidRequestId("line\nbreak"));
  EXPECT_FALSE(IsValidRequestId("quote\""));
}

TEST(StatusCodeNameTest, NamesEveryCodeAsMetricsLabelThem) {
  EXPECT_STREQ(StatusCodeName(0), "ok");
  EXPECT_STREQ(StatusCodeName(3), "invalid_argument");
  EXPECT_STREQ(StatusCodeName(14), "unavailable");
  EXPECT_STREQ(StatusCodeName(16), "unauthenticated");
  EXPECT_STREQ(StatusCodeName(17), "unknown");
  EXPECT_STREQ(StatusCodeName(-1), "unknown");
}

TEST(RequestIdTest, AValidReceivedIdIsAdoptedAndAnythingElseReplaced) {
  EXPECT_EQ(AdoptRequestId("7f3a-router.id"), "7f3a-router.id");
  EXPECT_THAT(AdoptRequestId(""), MatchesRegex("[0-9a-f]{32}"));
  EXPECT_THAT(AdoptRequestId("bad id\n"), MatchesRegex("[0-9a-f]{32}"));
}

}  // namespace
}  // namespace lazyattn
