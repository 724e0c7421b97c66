// The GPT-2 pre-tokenizer against its reference splits. Apart from the other
// pre-tokenizers' tests because the reference table is long.
#include <iterator>

#include "gtest/gtest.h"
#include "services/worker/model/tokenizer/pre_tokenizer.h"
#include "services/worker/model/tokenizer/pre_tokenizer_test_util.h"

namespace lazyattn {
namespace {

// Expected splits produced by Hugging Face `tokenizers` 0.23 with the models' own pre-tokenizer
// configurations (ByteLevel; Sequence[Digits(individual_digits), ByteLevel]; Sequence[Split(Llama-3
// regex, Isolated), ByteLevel(use_regex=false)]), byte-level decoded back to UTF-8.
const SplitCase kGpt2Cases[] = {
    {"Hello world", {"Hello", " world"}},
    {" Hello world", {" Hello", " world"}},
    {"Hello  world", {"Hello", " ", " world"}},
    {"Hello   world  ", {"Hello", "  ", " world", "  "}},
    {"   ", {"   "}},
    {"I'm can't we'll they've she'd it's you're",
     {"I", "'m", " can", "'t", " we", "'ll", " they", "'ve", " she", "'d", " it", "'s", " you",
      "'re"}},
    {"I'M CAN'T WE'LL THEY'VE",
     {"I", "'", "M", " CAN", "'", "T", " WE", "'", "LL", " THEY", "'", "VE"}},
    {"'sup 'x ''s", {"'s", "up", " '", "x", " ''", "s"}},
    {"12345 678 9", {"12345", " 678", " 9"}},
    {"x1y22z333 4444", {"x", "1", "y", "22", "z", "333", " 4444"}},
    {"3.14159, 1,000,000", {"3", ".", "14159", ",", " 1", ",", "000", ",", "000"}},
    {"Version 2.0.1-beta", {"Version", " 2", ".", "0", ".", "1", "-", "beta"}},
    {"line1\nline2\n\nline3\r\n\r\nend\n",
     {"line", "1", "\n", "line", "2", "\n", "\n", "line", "3", "\r\n\r", "\n", "end", "\n"}},
    {"\n\n\n", {"\n\n\n"}},
    {" \n \n", {" \n \n"}},
    {"\t\tindented\n\t\tcode", {"\t", "\t", "indented", "\n\t", "\t", "code"}},
    {"a \n b", {"a", " \n", " b"}},
    {"!!!??? ... --- ***", {"!!!???", " ...", " ---", " ***"}},
    {"hello!!! world??", {"hello", "!!!", " world", "??"}},
    {" ?!", {" ?!"}},
    {"(a+b)*c = d/e;", {"(", "a", "+", "b", ")*", "c", " =", " d", "/", "e", ";"}},
    {"email@example.com https://x.org/a?b=c",
     {"email", "@", "example", ".", "com", " https", "://", "x", ".", "org", "/", "a", "?", "b",
      "=", "c"}},
    {"\xe4\xbd\xa0"
     "\xe5\xa5\xbd"
     "\xe4\xb8\x96"
     "\xe7\x95\x8c"
     "\xef\xbc\x8c"
     "\xe8\xbf\x99"
     "\xe6\x98\xaf"
     "\xe4\xb8\x80"
     "\xe4\xb8\xaa"
     "\xe6\xb5\x8b"
     "\xe8\xaf\x95"
     "\xe3\x80\x82"
     "",
     {"\xe4\xbd\xa0"
      "\xe5\xa5\xbd"
      "\xe4\xb8\x96"
      "\xe7\x95\x8c"
      "",
      "\xef\xbc\x8c"
      "",
      "\xe8\xbf\x99"
      "\xe6\x98\xaf"
      "\xe4\xb8\x80"
      "\xe4\xb8\xaa"
      "\xe6\xb5\x8b"
      "\xe8\xaf\x95"
      "",
      "\xe3\x80\x82"
      ""}},
    {"\xe6\x97\xa5"
     "\xe6\x9c\xac"
     "\xe8\xaa\x9e"
     "\xe3\x81\xae"
     "\xe3\x83\x86"
     "\xe3\x82\xad"
     "\xe3\x82\xb9"
     "\xe3\x83\x88"
     "",
     {"\xe6\x97\xa5"
      "\xe6\x9c\xac"
      "\xe8\xaa\x9e"
      "\xe3\x81\xae"
      "\xe3\x83\x86"
      "\xe3\x82\xad"
      "\xe3\x82\xb9"
      "\xe3\x83\x88"
      ""}},
    {"\xed\x95\x9c"
     "\xea\xb5\xad"
     "\xec\x96\xb4"
     " \xed\x85\x8d"
     "\xec\x8a\xa4"
     "\xed\x8a\xb8"
     "",
     {"\xed\x95\x9c"
      "\xea\xb5\xad"
      "\xec\x96\xb4"
      "",
      " \xed\x85\x8d"
      "\xec\x8a\xa4"
      "\xed\x8a\xb8"
      ""}},
    {"\xd0\x9f"
     "\xd1\x80"
     "\xd0\xb8"
     "\xd0\xb2"
     "\xd0\xb5"
     "\xd1\x82"
     ", \xd0\xbc"
     "\xd0\xb8"
     "\xd1\x80"
     "!",
     {"\xd0\x9f"
      "\xd1\x80"
      "\xd0\xb8"
      "\xd0\xb2"
      "\xd0\xb5"
      "\xd1\x82"
      "",
      ",",
      " \xd0\xbc"
      "\xd0\xb8"
      "\xd1\x80"
      "",
      "!"}},
    {"\xd9\x85"
     "\xd8\xb1"
     "\xd8\xad"
     "\xd8\xa8"
     "\xd8\xa7"
     " \xd8\xa8"
     "\xd8\xa7"
     "\xd9\x84"
     "\xd8\xb9"
     "\xd8\xa7"
     "\xd9\x84"
     "\xd9\x85"
     "",
     {"\xd9\x85"
      "\xd8\xb1"
      "\xd8\xad"
      "\xd8\xa8"
      "\xd8\xa7"
      "",
      " \xd8\xa8"
      "\xd8\xa7"
      "\xd9\x84"
      "\xd8\xb9"
      "\xd8\xa7"
      "\xd9\x84"
      "\xd9\x85"
      ""}},
    {"\xd7\xa9"
     "\xd7\x9c"
     "\xd7\x95"
     "\xd7\x9d"
     " \xd7\xa2"
     "\xd7\x95"
     "\xd7\x9c"
     "\xd7\x9d"
     "",
     {"\xd7\xa9"
      "\xd7\x9c"
      "\xd7\x95"
      "\xd7\x9d"
      "",
      " \xd7\xa2"
      "\xd7\x95"
      "\xd7\x9c"
      "\xd7\x9d"
      ""}},
    {"\xf0\x9f\xa6\x99"
     " llamas \xf0\x9f\xa6\x99"
     "\xf0\x9f\xa6\x99"
     " emoji \xf0\x9f\x91\xa8"
     "\xe2\x80\x8d"
     "\xf0\x9f\x91\xa9"
     "\xe2\x80\x8d"
     "\xf0\x9f\x91\xa7"
     " family",
     {"\xf0\x9f\xa6\x99"
      "",
      " llamas",
      " \xf0\x9f\xa6\x99"
      "\xf0\x9f\xa6\x99"
      "",
      " emoji",
      " \xf0\x9f\x91\xa8"
      "\xe2\x80\x8d"
      "\xf0\x9f\x91\xa9"
      "\xe2\x80\x8d"
      "\xf0\x9f\x91\xa7"
      "",
      " family"}},
    {"caf\xc3\xa9"
     " na\xc3\xaf"
     "ve r\xc3\xa9"
     "sum\xc3\xa9"
     " \xc3\x85"
     "ngstr\xc3\xb6"
     "m",
     {"caf\xc3\xa9"
      "",
      " na\xc3\xaf"
      "ve",
      " r\xc3\xa9"
      "sum\xc3\xa9"
      "",
      " \xc3\x85"
      "ngstr\xc3\xb6"
      "m"}},
    {"e\xcc\x81"
     " combining",
     {"e",
      "\xcc\x81"
      "",
      " combining"}},
    {"\xef\xac\x81"
     " ligature",
     {"\xef\xac\x81"
      "",
      " ligature"}},
    {"\xe2\x85\xab"
     " roman \xc2\xb2"
     " \xc2\xbd"
     " \xd9\xa3"
     " digits",
     {"\xe2\x85\xab"
      "",
      " roman",
      " \xc2\xb2"
      "",
      " \xc2\xbd"
      "",
      " \xd9\xa3"
      "",
      " digits"}},
    {"\xc2\xa0"
     "nbsp\xe2\x80\x83"
     "emspace\xe3\x80\x80"
     "ideographic",
     {"\xc2\xa0"
      "",
      "nbsp",
      "\xe2\x80\x83"
      "",
      "emspace",
      "\xe3\x80\x80"
      "",
      "ideographic"}},
    {"tab\there", {"tab", "\t", "here"}},
    {"a\xe2\x80\xa8"
     "b\xc2\x85"
     "c",
     {"a",
      "\xe2\x80\xa8"
      "",
      "b",
      "\xc2\x85"
      "",
      "c"}},
    {"def foo(x):\n    return x * 2\n",
     {"def", " foo", "(", "x", "):", "\n   ", " return", " x", " *", " 2", "\n"}},
    {"    four spaces", {"   ", " four", " spaces"}},
    {"trailing spaces   ", {"trailing", " spaces", "   "}},
    {"   leading", {"  ", " leading"}},
    {"x  \n  y", {"x", "  \n ", " y"}},
    {"\x0b"
     "\x0c"
     " vertical",
     {"\x0b"
      "\x0c"
      "",
      " vertical"}},
    {"\x1c"
     "\x1d"
     " info sep",
     {"\x1c"
      "\x1d"
      "",
      " info", " sep"}},
    {"mixed 123abc def456", {"mixed", " 123", "abc", " def", "456"}},
    {"'''", {"'''"}},
    {"it''s", {"it", "''", "s"}},
    {" 'll", {" '", "ll"}},
    {"don't\nstop", {"don", "'t", "\n", "stop"}},
};

TEST(PreTokenizerTest, Gpt2MatchesReference) {
  ExpectSplits(PreTokenizerType::kGpt2, kGpt2Cases, std::size(kGpt2Cases));
}

}  // namespace
}  // namespace lazyattn
