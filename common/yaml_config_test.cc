#include "common/yaml_config.h"

#include "absl/strings/str_cat.h"
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

// The docs name keys by their dotted paths, and a key written that way in a file
// (`metrics.bearer_token_file: F`) was read as nothing and, its path marked read, not reported
// unknown: the setting was silently lost. A key holding a '.' is refused at load, anywhere.
TEST(YamlConfigTest, AKeyWithADotIsRefusedNamingItAndTheNestedForm) {
  YamlConfig top;
  const absl::Status s =
      top.LoadString("model: {path: m.gguf}\nmetrics.bearer_token_file: /t\n", "w.yaml");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "w.yaml: key \"metrics.bearer_token_file\": a key may not contain '.'; nest the parts "
            "as maps (write metrics: {bearer_token_file: ...})");
  YamlConfig nested;
  const absl::Status n = nested.LoadString("server:\n  tls.cert_file: c.pem\n", "r.yaml");
  EXPECT_EQ(n.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(n.message().find("r.yaml: server: key \"tls.cert_file\""), std::string::npos) << n;
  YamlConfig listed;
  EXPECT_EQ(listed.LoadString("workers:\n  - {address: a, a.b: 1}\n", "l.yaml").code(),
            absl::StatusCode::kInvalidArgument);
  // Dots in values are values.
  YamlConfig values;
  ASSERT_TRUE(values.LoadString("model: {path: dir.v2/m.gguf}\nlisten: 127.0.0.1:1\n").ok());
  EXPECT_EQ(*values.String("model.path", ""), "dir.v2/m.gguf");
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

// A chain of aliases (each list ten of the one before) is 10^12 nodes to any walk of the tree
// from 600 bytes of text: every service spun on it at start-up. It is refused at once now, while
// an anchor reused a few times, as defaults are, loads. A second document was silently ignored.
TEST(YamlConfigTest, AliasBombsAndSecondDocumentsAreRefused) {
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 12; ++i) {
    bomb += absl::StrCat("a", i, ": &a", i, " [");
    for (int j = 0; j < 10; ++j) absl::StrAppend(&bomb, j ? ", " : "", "*a", i - 1);
    bomb += "]\n";
  }
  YamlConfig cfg;
  const absl::Status s = cfg.LoadString(bomb, "bomb.yaml");  // (it spun for hours)
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("aliases"), std::string::npos) << s;

  YamlConfig defaults;
  EXPECT_TRUE(defaults
                  .LoadString("base: &base {a: 1, b: [1, 2, 3], c: {d: x}}\n"
                              "one: *base\ntwo: *base\nthree: *base\n",
                              "defaults.yaml")
                  .ok());

  YamlConfig two;
  const absl::Status docs = two.LoadString("insecure: true\n---\ninsecure: false\n", "two.yaml");
  EXPECT_EQ(docs.code(), absl::StatusCode::kInvalidArgument) << docs;
  EXPECT_EQ(docs.message(),
            "two.yaml: 2 YAML documents (separated by ---); the file must hold one");
  YamlConfig empty;
  EXPECT_TRUE(empty.LoadString("", "empty.yaml").ok());
}

// A key given twice in one map is refused at load, at any depth (yaml-cpp keeps both, and every
// lookup would find the first).
TEST(YamlConfigTest, AKeyGivenTwiceIsRefusedNamingIt) {
  YamlConfig top;
  EXPECT_EQ(top.LoadString("lease_ms: 3000\nother: 1\nlease_ms: 0\n", "d.yaml").message(),
            "d.yaml: lease_ms: given twice (again on line 3)");
  YamlConfig nested;
  EXPECT_EQ(nested.LoadString("server:\n  listen: a\n  listen: b\n", "d.yaml").message(),
            "d.yaml: server.listen: given twice (again on line 3)");
  YamlConfig sections;
  EXPECT_EQ(sections.LoadString("server: {listen: a}\nserver: {drain_timeout_s: 5}\n", "d.yaml")
                .message(),
            "d.yaml: server: given twice (again on line 2)");
  YamlConfig in_list;
  EXPECT_EQ(in_list.LoadString("workers:\n  - port: 1\n    port: 2\n", "d.yaml").message(),
            "d.yaml: workers[0].port: given twice (again on line 3)");
  YamlConfig fine;
  EXPECT_TRUE(fine.LoadString("a: {x: 1}\nb: {x: 1}\nl: [1, 1]\n", "d.yaml").ok());
}

// Integers are decimal whatever their leading zeros (yaml-cpp alone read 010 as octal 8 and 0x10
// as 16), within 64 bits.
TEST(YamlConfigTest, IntegersAreDecimalAndBounded) {
  YamlConfig cfg;
  ASSERT_TRUE(cfg.LoadString("a: 010\nb: -0042\nc: +7\nd: 0x10\ne: 9223372036854775807\n"
                             "f: 9223372036854775808\ng: -9223372036854775808\nh: 1e3\ni: 1.0\n"
                             "j: \"-\"\n",
                             "i.yaml")
                  .ok());
  EXPECT_EQ(*cfg.Int("a", 0), 10);
  EXPECT_EQ(*cfg.Int("b", 0), -42);
  EXPECT_EQ(*cfg.Int("c", 0), 7);
  EXPECT_EQ(cfg.Int("d", 0).status().message(), "i.yaml: d: expected an integer, got \"0x10\"");
  EXPECT_EQ(*cfg.Int("e", 0), INT64_MAX);
  EXPECT_EQ(cfg.Int("f", 0).status().message(),
            "i.yaml: f: 9223372036854775808 is out of the range of a 64-bit integer");
  EXPECT_EQ(*cfg.Int("g", 0), INT64_MIN);
  EXPECT_EQ(cfg.Int("h", 0).status().message(), "i.yaml: h: expected an integer, got \"1e3\"");
  EXPECT_EQ(cfg.Int("i", 0).status().message(), "i.yaml: i: expected an integer, got \"1.0\"");
  EXPECT_EQ(cfg.Int("j", 0).status().message(), "i.yaml: j: expected an integer, got \"-\"");
}

// A config path that is not a regular file is refused at once: a directory read as empty, and a
// FIFO blocked start-up (and its stop signals) until something wrote to it.
TEST(YamlConfigTest, AConfigThatIsNoRegularFileIsRefused) {
  YamlConfig dir;
  EXPECT_EQ(dir.LoadFile("/tmp").message(), "config file: cannot read /tmp: not a regular file");
  YamlConfig zero;
  EXPECT_EQ(zero.LoadFile("/dev/zero").message(),
            "config file: cannot read /dev/zero: not a regular file");
}

}  // namespace
}  // namespace lazyattn
