#include "common/yaml_config.h"

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(YamlConfigTest, TypedValuesDefaultsAndErrorsNamingTheKey) {
  YamlConfig cfg;
  ASSERT_TRUE(cfg.LoadString("server:\n  port: 8080\n  name: w1\nratio: 0.5\nflag: yes\n"
                             "bad: many\nlist: [a, b]\n", "w.yaml").ok());
  EXPECT_EQ(*cfg.Int("server.port", 0), 8080);
  EXPECT_EQ(*cfg.String("server.name", ""), "w1");
  EXPECT_EQ(*cfg.Double("ratio", 0), 0.5);
  EXPECT_TRUE(*cfg.Bool("flag", false));
  EXPECT_EQ(*cfg.Int("server.missing", 7), 7);
  EXPECT_EQ(cfg.StringList("list")->size(), 2u);
  auto bad = cfg.Int("bad", 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "w.yaml: bad: expected an integer, got \"many\"");
  EXPECT_TRUE(cfg.Finish().ok()) << cfg.Finish();
}

TEST(YamlConfigTest, BoundedIntegersNameTheKeyAndTheRange) {
  YamlConfig cfg;
  ASSERT_TRUE(cfg.LoadString("a: 5\nb: 0\nc: x\nl:\n  - n: 9\n", "r.yaml").ok());
  EXPECT_EQ(*cfg.IntIn("a", 1, 1, 5), 5);
  EXPECT_EQ(*cfg.IntIn("missing", 3, 1, 5), 3);
  EXPECT_EQ(cfg.IntIn("b", 1, 1, 5).status().message(), "r.yaml: b: must be in [1, 5], got 0");
  EXPECT_EQ(cfg.IntIn("c", 1, 1, 5).status().message(),
            "r.yaml: c: expected an integer, got \"x\"");
  auto list = cfg.List("l");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ((*list)[0].IntIn("n", 1, 1, 5).status().message(),
            "r.yaml: l[0].n: must be in [1, 5], got 9");
}

TEST(YamlConfigTest, UnknownKeysAreErrors) {
  YamlConfig cfg;
  ASSERT_TRUE(cfg.LoadString("server:\n  port: 1\n  prot: 2\nextra: 3\n", "c.yaml").ok());
  (void)cfg.Int("server.port", 0);
  const absl::Status s = cfg.Finish();
  EXPECT_NE(s.message().find("server.prot"), std::string::npos) << s;
  EXPECT_NE(s.message().find("extra"), std::string::npos) << s;
}

TEST(YamlConfigTest, ListsOfMapsAndMalformedYaml) {
  YamlConfig cfg;
  ASSERT_TRUE(cfg.LoadString("workers:\n  - port: 1\n  - port: x\n", "l.yaml").ok());
  auto workers = cfg.List("workers");
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 2u);
  EXPECT_EQ(*(*workers)[0].Int("port", 0), 1);
  EXPECT_NE((*workers)[1].Int("port", 0).status().message().find("workers[1].port"),
            std::string::npos);
  YamlConfig broken;
  EXPECT_EQ(broken.LoadString("a: [1, 2\n", "b.yaml").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(broken.LoadFile("/nonexistent.yaml").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lazyattn
