#include "services/worker/model/tokenizer/pre_tokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/model/tokenizer/unicode.h"

namespace lazyattn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct SplitCase {
  const char* text;
  std::vector<std::string> words;
};

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
const SplitCase kSmollmCases[] = {
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
    {"12345 678 9", {"1", "2", "3", "4", "5", " ", "6", "7", "8", " ", "9"}},
    {"x1y22z333 4444", {"x", "1", "y", "2", "2", "z", "3", "3", "3", " ", "4", "4", "4", "4"}},
    {"3.14159, 1,000,000",
     {"3", ".", "1", "4", "1", "5", "9", ",", " ", "1", ",", "0", "0", "0", ",", "0", "0", "0"}},
    {"Version 2.0.1-beta", {"Version", " ", "2", ".", "0", ".", "1", "-", "beta"}},
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
      " roman", " ",
      "\xc2\xb2"
      "",
      " ",
      "\xc2\xbd"
      "",
      " ",
      "\xd9\xa3"
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
     {"def", " foo", "(", "x", "):", "\n   ", " return", " x", " *", " ", "2", "\n"}},
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
    {"mixed 123abc def456", {"mixed", " ", "1", "2", "3", "abc", " def", "4", "5", "6"}},
    {"'''", {"'''"}},
    {"it''s", {"it", "''", "s"}},
    {" 'll", {" '", "ll"}},
    {"don't\nstop", {"don", "'t", "\n", "stop"}},
};
const SplitCase kLlama3Cases[] = {
    {"Hello world", {"Hello", " world"}},
    {" Hello world", {" Hello", " world"}},
    {"Hello  world", {"Hello", " ", " world"}},
    {"Hello   world  ", {"Hello", "  ", " world", "  "}},
    {"   ", {"   "}},
    {"I'm can't we'll they've she'd it's you're",
     {"I", "'m", " can", "'t", " we", "'ll", " they", "'ve", " she", "'d", " it", "'s", " you",
      "'re"}},
    {"I'M CAN'T WE'LL THEY'VE", {"I", "'M", " CAN", "'T", " WE", "'LL", " THEY", "'VE"}},
    {"'sup 'x ''s", {"'s", "up", " '", "x", " ''", "s"}},
    {"12345 678 9", {"123", "45", " ", "678", " ", "9"}},
    {"x1y22z333 4444", {"x", "1", "y", "22", "z", "333", " ", "444", "4"}},
    {"3.14159, 1,000,000", {"3", ".", "141", "59", ",", " ", "1", ",", "000", ",", "000"}},
    {"Version 2.0.1-beta", {"Version", " ", "2", ".", "0", ".", "1", "-beta"}},
    {"line1\nline2\n\nline3\r\n\r\nend\n",
     {"line", "1", "\n", "line", "2", "\n\n", "line", "3", "\r\n\r\n", "end", "\n"}},
    {"\n\n\n", {"\n\n\n"}},
    {" \n \n", {" \n \n"}},
    {"\t\tindented\n\t\tcode", {"\t", "\tindented", "\n", "\t", "\tcode"}},
    {"a \n b", {"a", " \n", " b"}},
    {"!!!??? ... --- ***", {"!!!???", " ...", " ---", " ***"}},
    {"hello!!! world??", {"hello", "!!!", " world", "??"}},
    {" ?!", {" ?!"}},
    {"(a+b)*c = d/e;", {"(a", "+b", ")*", "c", " =", " d", "/e", ";"}},
    {"email@example.com https://x.org/a?b=c",
     {"email", "@example", ".com", " https", "://", "x", ".org", "/a", "?b", "=c"}},
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
      " roman", " ",
      "\xc2\xb2"
      "",
      " ",
      "\xc2\xbd"
      "",
      " ",
      "\xd9\xa3"
      "",
      " digits"}},
    {"\xc2\xa0"
     "nbsp\xe2\x80\x83"
     "emspace\xe3\x80\x80"
     "ideographic",
     {"\xc2\xa0"
      "nbsp",
      "\xe2\x80\x83"
      "emspace",
      "\xe3\x80\x80"
      "ideographic"}},
    {"tab\there", {"tab", "\there"}},
    {"a\xe2\x80\xa8"
     "b\xc2\x85"
     "c",
     {"a",
      "\xe2\x80\xa8"
      "b",
      "\xc2\x85"
      "c"}},
    {"def foo(x):\n    return x * 2\n",
     {"def", " foo", "(x", "):\n", "   ", " return", " x", " *", " ", "2", "\n"}},
    {"    four spaces", {"   ", " four", " spaces"}},
    {"trailing spaces   ", {"trailing", " spaces", "   "}},
    {"   leading", {"  ", " leading"}},
    {"x  \n  y", {"x", "  \n", " ", " y"}},
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
    {"mixed 123abc def456", {"mixed", " ", "123", "abc", " def", "456"}},
    {"'''", {"'''"}},
    {"it''s", {"it", "''", "s"}},
    {" 'll", {" '", "ll"}},
    {"don't\nstop", {"don", "'t", "\n", "stop"}},
};

void ExpectSplits(PreTokenizerType type, const SplitCase* cases, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(PreTokenize(type, cases[i].text), cases[i].words)
        << PreTokenizerTypeName(type) << " case " << i << ": \"" << cases[i].text << "\"";
  }
}

TEST(PreTokenizerTest, Gpt2MatchesReference) {
  ExpectSplits(PreTokenizerType::kGpt2, kGpt2Cases, std::size(kGpt2Cases));
}

TEST(PreTokenizerTest, SmolLMMatchesReference) {
  ExpectSplits(PreTokenizerType::kSmolLM, kSmollmCases, std::size(kSmollmCases));
}

TEST(PreTokenizerTest, Llama3MatchesReference) {
  ExpectSplits(PreTokenizerType::kLlama3, kLlama3Cases, std::size(kLlama3Cases));
}

TEST(PreTokenizerTest, SmolLMSplitsEveryDigit) {
  EXPECT_THAT(PreTokenize(PreTokenizerType::kSmolLM, "in 2024: 1st"),
              ElementsAre("in", " ", "2", "0", "2", "4", ":", " ", "1", "st"));
}

TEST(PreTokenizerTest, Llama3GroupsDigitsByThree) {
  EXPECT_THAT(PreTokenize(PreTokenizerType::kLlama3, "1234567"), ElementsAre("123", "456", "7"));
}

TEST(PreTokenizerTest, Llama3ContractionsIgnoreAsciiCase) {
  EXPECT_THAT(PreTokenize(PreTokenizerType::kLlama3, "DON'T"), ElementsAre("DON", "'T"));
  EXPECT_THAT(PreTokenize(PreTokenizerType::kGpt2, "DON'T"), ElementsAre("DON", "'", "T"));
}

TEST(PreTokenizerTest, WhitespaceBeforeWordKeepsOneSpace) {
  // \s+(?!\S) leaves the last space to prefix the next word.
  EXPECT_THAT(PreTokenize(PreTokenizerType::kGpt2, "a    b"), ElementsAre("a", "   ", " b"));
  EXPECT_THAT(PreTokenize(PreTokenizerType::kLlama3, "a    b"), ElementsAre("a", "   ", " b"));
  EXPECT_THAT(PreTokenize(PreTokenizerType::kLlama3, "a  \n\n  b"),
              ElementsAre("a", "  \n\n", " ", " b"));
}

TEST(PreTokenizerTest, InvalidUtf8BecomesReplacementCharacters) {
  // Each bad byte is one U+FFFD (an "other" character), as in llama.cpp.
  const std::string bad = "ab\xff\xfe cd\xc3";
  EXPECT_THAT(PreTokenize(PreTokenizerType::kGpt2, bad),
              ElementsAre("ab", "\xEF\xBF\xBD\xEF\xBF\xBD", " cd", "\xEF\xBF\xBD"));
}

TEST(PreTokenizerTest, EmptyInput) {
  EXPECT_TRUE(PreTokenize(PreTokenizerType::kSmolLM, "").empty());
  EXPECT_TRUE(PreTokenize(PreTokenizerType::kLlama3, "").empty());
}

TEST(PreTokenizerTest, WordsPartitionRandomInput) {
  // Random mixes of classes: the words must be non-empty and concatenate to the decoded input.
  const std::vector<std::string> atoms = {
      "a", "Z", " ", "  ", "\n", "\r\n", "\t",   "'",      "'s",     "7", "42",
      "!", "?", ".", "é",  "中", "🦙", "\xff", "\u00a0", "\u3000", "٣", "'LL"};
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) text += atoms[rng() % atoms.size()];
    std::string decoded;
    for (uint32_t cp : DecodeUtf8Lenient(text)) AppendUtf8(cp, &decoded);
    for (PreTokenizerType type :
         {PreTokenizerType::kGpt2, PreTokenizerType::kSmolLM, PreTokenizerType::kLlama3}) {
      std::string joined;
      for (const std::string& w : PreTokenize(type, text)) {
        ASSERT_FALSE(w.empty()) << text;
        joined += w;
      }
      EXPECT_EQ(joined, decoded) << PreTokenizerTypeName(type);
    }
  }
}

TEST(PreTokenizerTest, Names) {
  EXPECT_EQ(*PreTokenizerTypeFromName("smollm"), PreTokenizerType::kSmolLM);
  EXPECT_EQ(*PreTokenizerTypeFromName("llama-bpe"), PreTokenizerType::kLlama3);
  EXPECT_EQ(*PreTokenizerTypeFromName("gpt-2"), PreTokenizerType::kGpt2);
  absl::StatusOr<PreTokenizerType> bad = PreTokenizerTypeFromName("qwen2");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("qwen2"));
  EXPECT_FALSE(PreTokenizerTypeFromName("default").ok());
}

TEST(UnicodeTest, Classes) {
  EXPECT_TRUE(IsLetter('a'));
  EXPECT_TRUE(IsLetter(0x4E2D));   // 中
  EXPECT_TRUE(IsLetter(0x00E9));   // é
  EXPECT_FALSE(IsLetter(0x0301));  // combining acute (Mn)
  EXPECT_TRUE(IsNumber('7'));
  EXPECT_TRUE(IsNumber(0x00B2));  // ²
  EXPECT_TRUE(IsNumber(0x216B));  // Ⅻ
  EXPECT_TRUE(IsWhitespace(0x3000));
  EXPECT_TRUE(IsWhitespace(0x0085));
  EXPECT_FALSE(IsWhitespace(0x001C));     // str.isspace() but not White_Space
  EXPECT_FALSE(IsWhitespace(0x200B));     // zero width space is Cf
  EXPECT_EQ(CodepointFlags(0x1F999), 0);  // 🦙
  EXPECT_EQ(CodepointFlags(0x110000), 0);
  EXPECT_STREQ(UnicodeTablesVersion(), "15.1.0");
}

TEST(UnicodeTest, LenientDecoding) {
  EXPECT_THAT(DecodeUtf8Lenient("a\xC3\xA9\xF0\x9F\xA6\x99"), ElementsAre('a', 0xE9, 0x1F999));
  EXPECT_THAT(DecodeUtf8Lenient("\x80\xC3"), ElementsAre(0xFFFD, 0xFFFD));
  EXPECT_THAT(DecodeUtf8Lenient("\xF4\x90\x80\x80"),  // above U+10FFFF
              ElementsAre(0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD));
}

TEST(UnicodeTest, CompletePrefix) {
  const std::string llama = "\xF0\x9F\xA6\x99";
  EXPECT_EQ(Utf8CompletePrefixLength("ab"), 2u);
  EXPECT_EQ(Utf8CompletePrefixLength("ab" + llama.substr(0, 1)), 2u);
  EXPECT_EQ(Utf8CompletePrefixLength("ab" + llama.substr(0, 3)), 2u);
  EXPECT_EQ(Utf8CompletePrefixLength("ab" + llama), 6u);
  EXPECT_EQ(Utf8CompletePrefixLength("\x80\x80"), 2u);  // stray continuations: nothing to wait for
  EXPECT_EQ(Utf8CompletePrefixLength("a\xFF"), 2u);
  EXPECT_EQ(Utf8CompletePrefixLength("a\xE0\x80"), 3u);  // E0 80 can never be valid
}

}  // namespace
}  // namespace lazyattn
