#include "common/process_metrics.h"

#include <unistd.h>

#include <ctime>

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(ParseProcStatTest, ReadsTheFieldsAfterACommandNameWithSpacesAndParentheses) {
  // Fields 3.. of a real line; comm "(my (odd) prog)". utime 250, stime 50 ticks; starttime
  // 1000 ticks; vsize 123456789; rss 2000 pages.
  const std::string stat =
      "4242 (my (odd) prog) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 1000 "
      "123456789 2000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0";
  auto s = ParseProcStat(stat, 100, 4096, 1.7e9);
  ASSERT_TRUE(s.has_value());
  EXPECT_DOUBLE_EQ(s->cpu_seconds, 3.0);
  EXPECT_DOUBLE_EQ(s->resident_bytes, 2000.0 * 4096);
  EXPECT_DOUBLE_EQ(s->virtual_bytes, 123456789.0);
  EXPECT_DOUBLE_EQ(s->start_time_seconds, 1.7e9 + 10);
}

TEST(ParseProcStatTest, RefusesTextThatIsNotAStatLine) {
  EXPECT_FALSE(ParseProcStat("", 100, 4096, 0).has_value());
  EXPECT_FALSE(ParseProcStat("1 (x) S 1 2 3", 100, 4096, 0).has_value());
  EXPECT_FALSE(ParseProcStat("no parenthesis at all", 100, 4096, 0).has_value());
}

TEST(ProcessCollectorTest, ReportsThisProcess) {
  const auto families = ProcessCollector().Collect();
  auto value = [&](const std::string& name) {
    for (const auto& f : families) {
      if (f.name == name) {
        return f.type == prometheus::MetricType::Counter ? f.metric[0].counter.value
                                                         : f.metric[0].gauge.value;
      }
    }
    return -1.0;
  };
  EXPECT_GT(value("process_resident_memory_bytes"), 1e6);  // a gtest binary is over 1 MB
  EXPECT_GE(value("process_cpu_seconds_total"), 0);
  EXPECT_GE(value("process_open_fds"), 3);  // stdin, stdout, stderr
  EXPECT_GE(value("process_max_fds"), value("process_open_fds"));
  const double start = value("process_start_time_seconds");
  const double now = static_cast<double>(time(nullptr));
  EXPECT_LE(start, now + 2);
  EXPECT_GT(start, now - 3600);  // this test process started within the hour
}

}  // namespace
}  // namespace lazyattn
