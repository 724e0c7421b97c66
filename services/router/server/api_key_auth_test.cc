#include "services/router/server/api_key_auth.h"

#include <gtest/gtest.h>

namespace lazyattn::router {
namespace {

const std::string kHash(64, 'a');

TEST(ParseApiKeys, ReadsNamesHashesAndScopes) {
  auto t = ParseApiKeys("keys:\n  - name: demo\n    sha256: " + kHash +
                            "\n    scopes: [generate]\n  - name: ops\n    sha256: " +
                            std::string(64, 'B') + "\n    scopes: [generate, admin]\n",
                        "k.yaml");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ(t->at(kHash).name, "demo");
  EXPECT_TRUE(t->at(kHash).generate);
  EXPECT_FALSE(t->at(kHash).admin);
  EXPECT_TRUE(t->at(std::string(64, 'b')).admin);  // hashes compare in lower case
}

// A key's cache namespace is its name unless the entry names one (keys of one tenant share it).
TEST(ParseApiKeys, ACacheNamespaceDefaultsToTheKeysName) {
  auto t = ParseApiKeys(
      "keys:\n  - name: demo\n    sha256: " + kHash +
          "\n    scopes: [generate]\n  - name: ops\n    sha256: " + std::string(64, 'b') +
          "\n    scopes: [admin]\n    cache_namespace: acme.prod\n",
      "k.yaml");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->at(kHash).cache_namespace, "demo");
  EXPECT_EQ(t->at(std::string(64, 'b')).cache_namespace, "acme.prod");
}

TEST(ParseApiKeys, AnEmptyListIsValid) {
  auto t = ParseApiKeys("keys: []\n", "k.yaml");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->empty());
}

TEST(ParseApiKeys, NamesTheBadEntry) {
  struct Case {
    std::string yaml, needle;
  } cases[] = {
      {"nokeys: 1\n", "keys: expected a list"},
      {"keys: [", "not YAML"},
      // One document, each key once, nothing but keys: a repeated sha256 silently kept the last,
      // a second document was ignored.
      {"keys:\n  - name: a\n    sha256: " + kHash + "\n    sha256: " + std::string(64, 'c') + "\n",
       "keys[0].sha256: given twice"},
      {"keys: []\n---\nkeys:\n  - name: a\n    sha256: " + kHash + "\n", "2 YAML documents"},
      {"keys: []\nextra: 1\n", "extra: unknown key"},
      {"keys: []\nkeys: []\n", "keys: given twice"},
      {"keys:\n  - name: a\n    sha256: abc\n", "keys[0].sha256"},
      {"keys:\n  - name: a b\n    sha256: " + kHash + "\n", "keys[0].name"},
      {"keys:\n  - name: a\n    sha256: " + kHash + "\n    scopes: [root]\n", "unknown scope"},
      {"keys:\n  - name: a\n    sha256: " + kHash + "\n    scopes: []\n",
       "keys[0].scopes: none for key \"a\"; give generate, admin or both"},
      {"keys:\n  - name: a\n    sha256: " + kHash + "\n", "keys[0].scopes: none for key \"a\""},
      {"keys:\n  - name: a\n    sha256: " + kHash + "\n    extra: 1\n", "unknown field extra"},
      {"keys:\n  - name: a\n    sha256: " + kHash + "\n    cache_namespace: \"a b\"\n",
       "keys[0].cache_namespace: expected 1 to 64 of [A-Za-z0-9._-]"},
      {"keys:\n  - name: a\n    sha256: " + kHash + "\n    cache_namespace: \"\"\n",
       "keys[0].cache_namespace"},
      {"keys:\n  - name: a\n    sha256: " + kHash + "\n    cache_namespace: [a, b]\n", "keys[0]"},
      {"keys:\n  - name: a\n    sha256: " + kHash + "\n    cache_namespace: \"a\\nb\"\n",
       "keys[0].cache_namespace"},
      {"keys:\n  - name: a\n    sha256: " + kHash +
           "\n    scopes: [generate]\n  - name: a\n"
           "    sha256: " +
           std::string(64, 'c') + "\n    scopes: [generate]\n",
       "keys[1].name: duplicate"},
      {"keys:\n  - name: a\n    sha256: " + kHash +
           "\n    scopes: [generate]\n  - name: b\n"
           "    sha256: " +
           kHash + "\n    scopes: [generate]\n",
       "keys[1].sha256: the same key"},
  };
  for (const Case& c : cases) {
    auto t = ParseApiKeys(c.yaml, "k.yaml");
    ASSERT_FALSE(t.ok()) << c.yaml;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.needle), std::string::npos) << t.status();
    EXPECT_NE(t.status().message().find("k.yaml"), std::string::npos) << t.status();
  }
}

}  // namespace
}  // namespace lazyattn::router
