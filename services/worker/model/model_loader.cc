#include "services/worker/model/model_loader.h"

#include <filesystem>
#include <new>
#include <stdexcept>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/tokenizer/tokenizer_spec.h"

namespace lazyattn {

namespace {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerUnguarded(const std::string& model_path) {
  ASSIGN_OR_RETURN(ModelFormat format, DetectModelFormat(model_path));
  TokenizerSpec spec;
  if (format == ModelFormat::kGguf) {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(model_path));
    ASSIGN_OR_RETURN(spec, TokenizerSpecFromGguf(*file));
  } else {
    namespace fs = std::filesystem;
    std::error_code ec;  // not the throwing form: an unreadable path is an error, not an abort
    const fs::path dir = fs::is_directory(model_path, ec) ? fs::path(model_path)
                                                          : fs::path(model_path).parent_path();
    ASSIGN_OR_RETURN(spec, TokenizerSpecFromTokenizerJson((dir / "tokenizer.json").string()));
  }
  return Tokenizer::Create(std::move(spec));
}

}  // namespace

bool IsModelFileError(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_path) {
  // The specs are bounded before anything is sized by them (tokenizer_spec.h); this is the last
  // resort that keeps a worker alive.
  try {
    return LoadTokenizerUnguarded(model_path);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(model_path, ": out of memory loading the tokenizer"));
  } catch (const std::length_error&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(model_path, ": out of memory loading the tokenizer"));
  } catch (const std::filesystem::filesystem_error& e) {
    return absl::FailedPreconditionError(absl::StrCat(model_path, ": ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFor(const std::string& model_path,
                                                            const ModelConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(model_path));
  if (tokenizer->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": the tokenizer has ", tokenizer->vocab_size(),
                     " tokens but the model only ", config.vocab_size, " embeddings"));
  }
  return tokenizer;
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& path, const WeightLoadOptions& options) {
  LoadedModel m;
  ASSIGN_OR_RETURN(m.weights, LoadModelWeights(path, options));
  ASSIGN_OR_RETURN(m.tokenizer, LoadTokenizerFor(path, m.weights->config));
  return m;
}

}  // namespace lazyattn
