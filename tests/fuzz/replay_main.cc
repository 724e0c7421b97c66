// Replays fuzz inputs without libFuzzer: each regular file under the directories named on the command
// line (recursively, in sorted order) goes through LLVMFuzzerTestOneInput once. This is how the seed
// corpus and the inputs that once crashed run in every normal build (GCC included) as a CTest test.
// A directory that does not exist is skipped (a target may have no regressions yet), but finding no
// input at all is a failure: a replay test that runs nothing must not pass.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

// Collects the regular files under `path` (or `path` itself when it is a file). Returns false on an
// error other than "does not exist".
bool CollectInputs(const fs::path& path, std::vector<fs::path>& out) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || status.type() == fs::file_type::not_found) {
    std::fprintf(stderr, "replay: %s does not exist, skipped\n", path.c_str());
    return true;
  }
  if (fs::is_regular_file(status)) {
    out.push_back(path);
    return true;
  }
  if (!fs::is_directory(status)) {
    std::fprintf(stderr, "replay: %s is neither a file nor a directory\n", path.c_str());
    return false;
  }
  std::vector<fs::path> found;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file()) found.push_back(it->path());
  }
  if (ec) {
    std::fprintf(stderr, "replay: cannot list %s: %s\n", path.c_str(), ec.message().c_str());
    return false;
  }
  std::sort(found.begin(), found.end());
  out.insert(out.end(), found.begin(), found.end());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!CollectInputs(argv[i], inputs)) return 1;
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "replay: no input found; a fuzz target needs a seed corpus\n");
    return 1;
  }
  for (const fs::path& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
      return 1;
    }
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Named before running so that a crash's report follows the name of the input that caused it.
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replay: ran %zu inputs\n", inputs.size());
  return 0;
}
