// A byte-level tokenizer over 300 ids (256 bytes, <eos> = 256, 43 control fillers): the tokenizer
// of random-weight models (tests, and workers serving `random:` model shapes for benchmarks),
// whose vocabularies are at least 300 ids. Text round-trips exactly; ids 257-299 never appear in
// encoded text.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_BYTE_TOKENIZER_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_BYTE_TOKENIZER_H_

#include <memory>
#include <string>

#include "services/worker/model/tokenizer/tokenizer.h"

namespace lazyattn {

// `chat_template`: the Jinja text the tokenizer reports (tests of chat prompts); empty: none.
std::unique_ptr<Tokenizer> MakeByteTokenizer(std::string chat_template = "");

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_BYTE_TOKENIZER_H_
