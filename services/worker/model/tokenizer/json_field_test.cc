#include "services/worker/model/tokenizer/json_field.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;

const nlohmann::json kDoc = nlohmann::json::parse(R"({
  "flag": true, "name": "x", "nothing": null, "number": 2.5,
  "list": [{"special": "yes"}, {"special": false}]
})");

std::string MessageOf(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(JsonFieldTest, TypedReads) {
  const JsonField root(kDoc, "f.json");
  EXPECT_EQ(*root.Get("flag").Bool(), true);
  EXPECT_EQ(*root.Get("name").String(), "x");
  EXPECT_EQ(*root.Get("absent").BoolOr(true), true);
  EXPECT_EQ(*root.Get("nothing").StringOr("fallback"), "fallback");  // null is "not set"
  EXPECT_EQ(*root.Get("list").At(1).Get("special").BoolOr(true), false);
  EXPECT_TRUE(root.Get("list").ExpectArray().ok());
  EXPECT_FALSE(root.Get("list").At(2).is_set());
  EXPECT_FALSE(root.Get("name").Get("child").is_set());  // a member of a non-object
}

TEST(JsonFieldTest, ErrorsNameTheFileAndThePath) {
  const JsonField root(kDoc, "f.json");
  EXPECT_EQ(MessageOf(root.Get("list").At(0).Get("special").Bool().status()),
            "f.json: list[0].special: expected a boolean, got a string (\"yes\")");
  EXPECT_EQ(MessageOf(root.Get("number").String().status()),
            "f.json: number: expected a string, got a number (2.5)");
  EXPECT_EQ(MessageOf(root.Get("flag").ExpectObject()),
            "f.json: flag: expected an object, got a boolean (true)");
  EXPECT_EQ(MessageOf(root.Get("list").ExpectObject()),
            "f.json: list: expected an object, got an array");
  EXPECT_EQ(MessageOf(root.Get("absent").Bool().status()), "f.json: absent: missing");
  EXPECT_EQ(MessageOf(root.Get("nothing").ExpectArray()), "f.json: nothing: missing");
  EXPECT_EQ(MessageOf(root.Error("not a JSON object")), "f.json: not a JSON object");
}

TEST(JsonFieldTest, ShownValuesAreCutAndNeverThrow) {
  const std::string long_text(200, 'a');
  EXPECT_THAT(JsonField::Shown(nlohmann::json(long_text)), HasSubstr("..."));
  EXPECT_LE(JsonField::Shown(nlohmann::json(long_text)).size(), 67u);
  // Invalid UTF-8 in a string is replaced, not thrown on.
  EXPECT_THAT(JsonField::Described(nlohmann::json(std::string("\xff"))), HasSubstr("a string"));
}

}  // namespace
}  // namespace lazyattn
