// serve's API key from its flags, its file or the environment (resolve_api_key in serve_options.h).
#include <fmt/format.h>

#include "server/serve_options.h"
#include "util/error.h"
#include "util/file.h"

namespace qs {

std::string resolve_api_key(const std::string& flag_key, const std::filesystem::path& key_file, const char* env) {
  if (!flag_key.empty()) return flag_key;
  if (key_file.empty()) return env ? env : "";
  std::string key;
  try {
    key = read_file(key_file);
  } catch (const Error& e) {
    throw Error(fmt::format("--api-key-file: {}", e.what()));
  }
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ' || key.back() == '\t'))
    key.pop_back();
  if (key.empty()) throw Error(fmt::format("--api-key-file {}: the file is empty; expected the key on one line",
                                           key_file.string()));
  if (key.find('\n') != std::string::npos)
    throw Error(fmt::format("--api-key-file {}: expected the key on one line, found several", key_file.string()));
  return key;
}

}  // namespace qs
