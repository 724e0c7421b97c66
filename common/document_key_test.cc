#include "common/document_key.h"

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(DocumentKeyTest, Sha256MatchesKnownVector) {
  // FIPS 180-2 test vector.
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(DocumentKeyTest, StableAndContentAddressed) {
  const DocumentKey a = DocumentKeyFromText("m", "t", "the document");
  EXPECT_EQ(a, DocumentKeyFromText("m", "t", "the document"));
  EXPECT_NE(a, DocumentKeyFromText("m", "t", "the document."));
  EXPECT_NE(a, DocumentKeyFromText("m2", "t", "the document"));
  EXPECT_NE(a, DocumentKeyFromText("m", "t2", "the document"));
  // Field boundaries matter: ("ab", "c") and ("a", "bc") differ.
  EXPECT_NE(DocumentKeyFromText("ab", "c", "x"), DocumentKeyFromText("a", "bc", "x"));
  EXPECT_EQ(a.ToHex().size(), 32u);
}

TEST(DocumentKeyTest, TokenAndTextDocumentsNeverCollide) {
  EXPECT_NE(DocumentKeyFromTokens("m", "t", {}), DocumentKeyFromText("m", "t", ""));
  EXPECT_EQ(DocumentKeyFromTokens("m", "t", {1, 2, 3}), DocumentKeyFromTokens("m", "t", {1, 2, 3}));
  EXPECT_NE(DocumentKeyFromTokens("m", "t", {1, 2, 3}), DocumentKeyFromTokens("m", "t", {1, 2, 4}));
}

// The key is part of the cluster's protocol (workers and the KV directory must agree): pinned to
// SHA-256 over length-prefixed fields, as Python's hashlib computes it:
//   f = lambda b: struct.pack('<Q', len(b)) + b
//   sha256(f(b'lazyattn-doc-v1') + f(b'm') + f(b't') + f(b'tokens') +
//          f(b''.join(struct.pack('<i', i) for i in ids))).digest()[:16]
TEST(DocumentKeyTest, TokenKeyMatchesItsSpecification) {
  EXPECT_EQ(DocumentKeyFromTokens("m", "t", {1, 2, 3, -1, 70000}).ToHex(),
            "5264097c5201f577bff9fb86f8859d4a");
}

// A scope's key is derived from the content key, pinned the same way:
//   sha256(f(b'lazyattn-doc-scope-v1') + f(content_key) + f(namespace) + f(salt)).digest()[:16]
// Another namespace or salt gives another key; the shared scope keeps the content key, and a
// namespace and a salt never stand in for each other.
TEST(DocumentKeyTest, ScopedKeysSeparateScopesAndMatchTheirSpecification) {
  const DocumentKey content = DocumentKeyFromText("m", "t", "the document");
  EXPECT_EQ(content.ToHex(), "e04a9565bee7b1347c2f31acefb18589");
  EXPECT_EQ(ScopedDocumentKey(content, {}), content);
  const DocumentKey a = ScopedDocumentKey(content, {"tenant-a", "salt"});
  EXPECT_EQ(a.ToHex(), "73781b5c253b05f1c1a93276b9dba225");
  EXPECT_EQ(a, ScopedDocumentKey(content, {"tenant-a", "salt"}));
  EXPECT_NE(a, ScopedDocumentKey(content, {"tenant-b", "salt"}));
  EXPECT_NE(a, ScopedDocumentKey(content, {"tenant-a", ""}));
  EXPECT_NE(ScopedDocumentKey(content, {"x", ""}), ScopedDocumentKey(content, {"", "x"}));
  EXPECT_NE(ScopedDocumentKey(content, {"x", ""}), content);
}

TEST(DocumentKeyTest, PrefixScopeWordsSeparateScopesAndMatchTheirSpecification) {
  EXPECT_TRUE(PrefixScopeWords({}).empty());
  //   w = sha256(f(b'lazyattn-prefix-scope-v1') + f(b'tenant-a') + f(b'')).digest()
  //   [struct.unpack('>i', w[4 * i:4 * i + 4])[0] for i in range(8)]
  EXPECT_EQ(PrefixScopeWords({"tenant-a", ""}),
            (std::vector<int32_t>{-1625939730, 276730410, 1804220922, 244520165, -301973511,
                                  -1949006528, -743167284, -1468626435}));
  EXPECT_NE(PrefixScopeWords({"tenant-a", ""}), PrefixScopeWords({"tenant-b", ""}));
  EXPECT_NE(PrefixScopeWords({"x", ""}), PrefixScopeWords({"", "x"}));
}

}  // namespace
}  // namespace lazyattn
