// Worker listings for the router's registry tests (model_groups_test.cc,
// worker_registry_test.cc): a worker of a named model as kvdir lists it, and a listing of several.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_LISTING_FOR_TEST_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_LISTING_FOR_TEST_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyattn/v1/kvdir.pb.h"

namespace lazyattn::router::listing_test {

// Model fingerprints (kFpA2 shares 12 digits with kFpA) and tokenizer fingerprints.
inline constexpr char kFpA[] = "aaaaaaaaaaaa1111aaaa";
inline constexpr char kFpA2[] = "aaaaaaaaaaaa2222aaaa";
inline constexpr char kFpB[] = "bbbbbbbbbbbb0000bbbb";
inline constexpr char kTok1[] = "7070707070701234";
inline constexpr char kTok2[] = "8080808080805678";

// Worker `id` of model `name` (fingerprint `mfp`, tokenizer kTok1) at 127.0.0.1:1<id's digits>.
inline lazyattn::v1::WorkerResidency Worker(const std::string& id, const std::string& name,
                                            const std::string& mfp, int64_t vocab = 1000,
                                            int32_t max_documents = 0) {
  lazyattn::v1::WorkerResidency w;
  auto* s = w.mutable_worker();
  s->set_worker_id(id);
  s->set_address(absl::StrCat("127.0.0.1:1", id.substr(1)));
  s->mutable_model()->set_name(name);
  s->mutable_model()->set_model_fingerprint(mfp);
  s->mutable_model()->set_tokenizer_fingerprint(kTok1);
  s->mutable_model()->set_vocab_size(vocab);
  s->mutable_model()->set_max_documents(max_documents);
  return w;
}

inline google::protobuf::RepeatedPtrField<lazyattn::v1::WorkerResidency> Listing(
    std::vector<lazyattn::v1::WorkerResidency> workers) {
  google::protobuf::RepeatedPtrField<lazyattn::v1::WorkerResidency> out;
  for (auto& w : workers) *out.Add() = std::move(w);
  return out;
}

// Worker `id` of model A listed at `address`.
inline lazyattn::v1::WorkerResidency WorkerAt(const std::string& id, const std::string& address) {
  lazyattn::v1::WorkerResidency w = Worker(id, "llama", kFpA);
  w.mutable_worker()->set_address(address);
  return w;
}

}  // namespace lazyattn::router::listing_test

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_LISTING_FOR_TEST_H_
