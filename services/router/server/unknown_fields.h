// Fields of a client's message that this router's proto does not know. The router checks every
// field it knows before a request reaches a worker; an unknown one would pass to the worker
// unchecked, and a worker built from a newer proto would act on it. So requests are forwarded
// without them: a client on a newer proto loses only what this router could not have checked.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_UNKNOWN_FIELDS_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_UNKNOWN_FIELDS_H_

#include <google/protobuf/message.h>

#include <memory>

namespace lazyattn::router {

// Whether `message` or any message inside it (repeated and map fields included) holds fields
// its descriptor does not know. Costs a walk over the set fields; copies nothing.
bool HasUnknownFields(const google::protobuf::Message& message);

// `message` itself when it holds no unknown fields (the common case: no copy); otherwise a copy
// without them, kept in `copy`, which must outlive every use of the result.
template <typename M>
const M* WithoutUnknownFields(const M* message, std::unique_ptr<M>& copy) {
  if (!HasUnknownFields(*message)) return message;
  copy = std::make_unique<M>(*message);
  copy->DiscardUnknownFields();
  return copy.get();
}

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_UNKNOWN_FIELDS_H_
