#include "util/file.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "util/error.h"

namespace qs {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot read", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(fmt::format("{}: read failed", path.string()));
  return ss.str();
}

}  // namespace qs
