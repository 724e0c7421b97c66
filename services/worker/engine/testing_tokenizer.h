// Test helper: a byte-level tokenizer over 300 ids (256 bytes, <eos> = 256, 43 control fillers)
// for tiny random models with vocab 300.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_TESTING_TOKENIZER_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_TESTING_TOKENIZER_H_

#include <memory>

#include "services/worker/model/tokenizer/tokenizer.h"

namespace lazyattn {

std::unique_ptr<Tokenizer> MakeByteTokenizer();

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_TESTING_TOKENIZER_H_
