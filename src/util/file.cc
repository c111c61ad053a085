#include "util/file.h"

#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "util/error.h"

namespace qs {

void drop_mapped_pages(const std::byte* p, uint64_t n) {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t begin = reinterpret_cast<uint64_t>(p), first = (begin + page - 1) / page * page,
                 last = (begin + n) / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot read", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(fmt::format("{}: read failed", path.string()));
  return ss.str();
}

}  // namespace qs
