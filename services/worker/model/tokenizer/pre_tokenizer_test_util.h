// The pre-tokenizer reference tests' shape (pre_tokenizer_{gpt2,smollm,llama3}_test.cc): a text
// and the words a reference implementation splits it into, checked case by case.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_PRE_TOKENIZER_TEST_UTIL_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_PRE_TOKENIZER_TEST_UTIL_H_

#include <cstddef>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/worker/model/tokenizer/pre_tokenizer.h"

namespace lazyattn {

struct SplitCase {
  const char* text;
  std::vector<std::string> words;
};

// Expects PreTokenize(type, text) == words for each of the n cases, naming the failing one.
inline void ExpectSplits(PreTokenizerType type, const SplitCase* cases, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(PreTokenize(type, cases[i].text), cases[i].words)
        << PreTokenizerTypeName(type) << " case " << i << ": \"" << cases[i].text << "\"";
  }
}

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_PRE_TOKENIZER_TEST_UTIL_H_
