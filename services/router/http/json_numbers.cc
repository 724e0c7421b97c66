#include "services/router/http/json_numbers.h"

#include <cstddef>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/router/http/openai_fields.h"

namespace lazyattn::router {
namespace {

using nlohmann::json;

// nlohmann's out_of_range error for a number that overflows a double.
constexpr int kNumberOverflow = 406;

// nlohmann's SAX interface: follows the path to the value being read, so that the parse error a
// number beyond a double's range raises (with the number's text) can say where it is.
class Finder {
 public:
  explicit Finder(int max_depth) : max_depth_(static_cast<size_t>(max_depth)) {}

  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(json::number_integer_t) { return Value(); }
  bool number_unsigned(json::number_unsigned_t) { return Value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return Value(); }
  bool string(json::string_t&) { return Value(); }
  bool binary(json::binary_t&) { return Value(); }
  bool start_object(std::size_t) { return Begin(false); }
  bool key(json::string_t& k) {
    frames_.back().key = k;
    return true;
  }
  bool end_object() { return End(); }
  bool start_array(std::size_t) { return Begin(true); }
  bool end_array() { return End(); }
  bool parse_error(std::size_t, const std::string& token, const json::exception& e) {
    if (e.id == kNumberOverflow)
      found_ = OutOfRangeNumber{Field(), TruncateUtf8(token, kQuotedBytes)};
    return false;
  }

  const std::optional<OutOfRangeNumber>& found() const { return found_; }

 private:
  struct Frame {
    bool array;
    std::string key;  // an object's: the member being read
    size_t index;     // an array's: the element being read
  };

  bool Begin(bool array) {
    // As deep as the raw scan lets a body be (openai_json.cc, CheckRawJson): an empty innermost
    // container one past the depth limit.
    if (frames_.size() > max_depth_) return false;
    frames_.push_back(Frame{array, "", 0});
    return true;
  }
  // A value ended: an array's next one has the next index.
  bool Value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool End() {
    frames_.pop_back();
    return Value();
  }

  std::string Field() const {
    if (frames_.empty()) return "body";
    if (frames_.size() >= 2 && !frames_[0].array && frames_[0].key == "logit_bias" &&
        !frames_[1].array) {
      return absl::StrCat("logit_bias: key \"", TruncateUtf8(frames_[1].key, kMaxFieldNameBytes),
                          "\"");
    }
    std::string field;
    for (const Frame& f : frames_) {
      if (f.array) {
        absl::StrAppend(&field, "[", f.index, "]");
      } else {
        absl::StrAppend(&field, field.empty() ? "" : ".", TruncateUtf8(f.key, kMaxFieldNameBytes));
      }
    }
    return field;
  }

  const size_t max_depth_;
  std::vector<Frame> frames_;
  std::optional<OutOfRangeNumber> found_;
};

}  // namespace

std::optional<OutOfRangeNumber> FindOutOfRangeNumber(std::string_view body, int max_depth) {
  Finder finder(max_depth);
  json::sax_parse(body.begin(), body.end(), &finder);
  return finder.found();
}

}  // namespace lazyattn::router
