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

}  // namespace
}  // namespace lazyattn
