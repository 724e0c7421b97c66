#include "services/router/server/unknown_fields.h"

#include <vector>

namespace lazyattn::router {

bool HasUnknownFields(const google::protobuf::Message& message) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* reflection = message.GetReflection();
  if (!reflection->GetUnknownFields(message).empty()) return true;
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);  // only the fields that are set
  for (const FieldDescriptor* field : fields) {
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (field->is_repeated()) {  // map fields too: their entries are messages
      const int n = reflection->FieldSize(message, field);
      for (int i = 0; i < n; ++i) {
        if (HasUnknownFields(reflection->GetRepeatedMessage(message, field, i))) return true;
      }
    } else if (HasUnknownFields(reflection->GetMessage(message, field))) {
      return true;
    }
  }
  return false;
}

}  // namespace lazyattn::router
